"""Converter rules that failed on real inputs (issue 8 item 4), each on a tiny real-layout input.

* ``norm_before_residual`` of a speculators-trainer P-EAGLE comes from the checkpoint or
  ``--(no-)norm-before-residual`` — never the class default — and absent P-EAGLE norm
  flags are filled from the tensors, each fill a finding;
* a verifier whose embedding is padded past its config ``vocab_size`` is matched by its
  rows; a draft vocabulary covering the verifier's logical vocabulary is the identity;
* M-RoPE keys are stripped with a finding; conflicting RoPE values are an error; the one
  resolved θ is written in both forms; KV widths vLLM cannot page together are flagged;
* ``attn_output_gate`` on a DeepSpec DFlash (``markov_rank`` 0) is refused by name;
* a bad ``d2t`` from ``--vocab-mapping`` names that file;
* P-EAGLE ``lm_head``: a ``lm-head-frozen`` finding only for producers known to freeze it,
  and ``validate``'s structure gate fails a differing head only then;
* absent decoder keys (``head_dim``, ``num_key_value_heads``, ...) come from the tensors or
  transformers' class default, each fill a finding.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import fixtures_peagle as fp
from fixtures_dflash import DELETE, api_convert, codes, make_source, read
from specconv.errors import InvalidInputError, UnsupportedFormatError

HUB = "org/tiny"


def _patch(d: Path, **kv) -> None:
    cfg = json.loads((d / "config.json").read_text())
    for k, v in kv.items():
        if v is DELETE:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def speculators_peagle(tiny_llama_verifier_dir, tmp_path_factory):
    """A P-EAGLE written by speculators 0.9.0 itself (full vocabulary)."""
    pytest.importorskip("speculators")
    return fp.build_speculators_peagle(tiny_llama_verifier_dir, tmp_path_factory.mktemp("pe") / "pe", nbr=True)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------ norm_before_residual
def test_trainer_peagle_without_norm_before_residual_needs_the_flag(speculators_peagle, tiny_llama_verifier_dir,
                                                                    tmp_path):
    d = _copy(speculators_peagle, tmp_path / "src")
    _patch(d, norm_before_residual=DELETE)
    with pytest.raises(InvalidInputError) as e:
        api_convert(d, tiny_llama_verifier_dir, dry_run=True)
    assert e.value.code == "missing_norm_before_residual" and "--norm-before-residual" in e.value.hint
    for flag in (False, True):
        out = tmp_path / f"out-{flag}"
        rep = api_convert(d, tiny_llama_verifier_dir, out, norm_before_residual=flag)
        assert read(out)["norm_before_residual"] is flag  # the flag, not the class default
        assert "norm-before-residual-from-flag" in codes(rep.findings)


def test_trainer_peagle_flag_must_agree_with_checkpoint(speculators_peagle, tiny_llama_verifier_dir, tmp_path):
    with pytest.raises(InvalidInputError) as e:
        api_convert(speculators_peagle, tiny_llama_verifier_dir, dry_run=True, norm_before_residual=False)
    assert e.value.code == "conflicting_flag"
    rep = api_convert(speculators_peagle, tiny_llama_verifier_dir, tmp_path / "o", norm_before_residual=True)
    assert read(tmp_path / "o")["norm_before_residual"] is True
    assert "norm-before-residual-from-flag" not in codes(rep.findings)


def test_trainer_peagle_absent_norm_flags_come_from_tensors(speculators_peagle, tiny_llama_verifier_dir, tmp_path):
    d = _copy(speculators_peagle, tmp_path / "src")
    _patch(d, norm_before_fc=DELETE, fc_norm=DELETE)
    rep = api_convert(d, tiny_llama_verifier_dir, tmp_path / "o")
    cfg = read(tmp_path / "o")
    assert cfg["norm_before_fc"] is False and cfg["fc_norm"] is False  # no input_norm / fc_norm.* tensors
    filled = [f for f in rep.findings if f["code"] == "peagle-norm-flag-from-tensors"]
    assert sorted(f["key"] for f in filled) == ["fc_norm", "norm_before_fc"]
    _patch(d, norm_before_fc=True)  # contradicts the tensors (no input_norm.weight)
    with pytest.raises(InvalidInputError) as e:
        api_convert(d, tiny_llama_verifier_dir, dry_run=True)
    assert e.value.code == "conflicting_keys" and "input_norm" in e.value.message


# ------------------------------------------------------------------ padded vocab
def _padded_verifier(verifier: Path, dst: Path, logical: int) -> Path:
    d = _copy(verifier, dst)
    _patch(d, vocab_size=logical)  # config: logical vocabulary; embedding keeps its 256 rows
    return d


def _plan(src: Path, verifier: Path, **opts):
    """The converter's plan (the lint, which compares with the verifier's config vocab, is
    not run: that rule lives in ``specconv.format``)."""
    from specconv.converters import ConvertOptions, SourceInfo, detect
    from specconv.verifier import resolve_verifier

    s = SourceInfo.open(src)
    return detect(s)().plan(s, resolve_verifier(str(verifier), name=HUB), ConvertOptions(**opts))


def test_padded_verifier_vocab_is_matched_by_embedding_rows(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, "zlab_dflash", verifier_dir=tiny_verifier_dir)  # vocab_size 256
    v = _padded_verifier(tiny_verifier_dir, tmp_path / "v", 252)
    rep = api_convert(src, v, tmp_path / "out")  # converter and lint alike
    assert read(tmp_path / "out")["transformer_layer_config"]["vocab_size"] == 256
    assert "verifier-vocab-padded" in codes(rep.findings, "info")
    assert "vocab-size-mismatch" not in codes(rep.findings)
    # a draft vocabulary matching neither the config nor the rows is still refused
    src2 = make_source(tmp_path / "b", "zlab_dflash", verifier_dir=tiny_verifier_dir,
                       config_updates={"vocab_size": 260})
    with pytest.raises(InvalidInputError) as e:
        _plan(src2, v)
    assert e.value.code == "verifier_mismatch" and "256 rows" in e.value.message


def test_draft_vocab_covering_the_logical_vocab_is_identity(tiny_llama_verifier_dir, tmp_path):
    pytest.importorskip("speculators")
    built = fp.build_speculators_peagle(tiny_llama_verifier_dir, tmp_path / "pe", vd=252)
    t = fp.load_tensors(built)
    assert "d2t" in t and "t2d" in t
    t = {k: v for k, v in t.items() if k not in ("d2t", "t2d")}  # as a padded-vocab export ships it
    fp.save_tensors(built, t)
    with pytest.raises(InvalidInputError) as e:  # against the unpadded verifier: a real pruned draft
        _plan(built, tiny_llama_verifier_dir)
    assert e.value.code == "vocab_map_missing"
    rep = api_convert(built, _padded_verifier(tiny_llama_verifier_dir, tmp_path / "v", 252), tmp_path / "out")
    assert "vocab-logical-identity" in codes(rep.findings)
    out = fp.load_tensors(tmp_path / "out")
    assert not out["d2t"].any() and out["d2t"].shape[0] == 252
    assert out["t2d"][:252].all() and not out["t2d"][252:].any()
    rec = json.loads((tmp_path / "out" / "specconv.json").read_text())
    fates = rec.get("conversion", rec)["tensors"]
    assert fates["d2t"]["fate"] == fates["t2d"]["fate"] == "generated"


# ------------------------------------------------------------------------- RoPE
def test_mrope_keys_are_stripped_with_a_finding(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, "zlab_dflash", verifier_dir=tiny_verifier_dir, config_updates={
        "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}})
    rep = api_convert(src, tiny_verifier_dir, tmp_path / "out")
    tlc = read(tmp_path / "out")["transformer_layer_config"]
    assert "mrope-stripped" in codes(rep.findings, "warning")
    assert not {"mrope_section", "mrope_interleaved"} & set(tlc["rope_parameters"])
    assert "rope_scaling" not in tlc and tlc["rope_theta"] == tlc["rope_parameters"]["rope_theta"]


def test_mrope_keys_in_a_speculators_dir_are_stripped(tiny_verifier_dir, tmp_path):
    pytest.importorskip("speculators")
    d = fp.build_speculators_block(tiny_verifier_dir, tmp_path / "df", "dflash")
    cfg = json.loads((d / "config.json").read_text())
    cfg["transformer_layer_config"]["rope_parameters"].update(mrope_section=[2, 3, 3], mrope_interleaved=True)
    (d / "config.json").write_text(json.dumps(cfg))
    rep = api_convert(d, tiny_verifier_dir, tmp_path / "out")
    assert "mrope-stripped" in codes(rep.findings, "warning")
    rp = read(tmp_path / "out")["transformer_layer_config"]["rope_parameters"]
    assert "mrope_section" not in rp and "mrope_interleaved" not in rp


@pytest.mark.parametrize("updates,keys", [
    ({"rope_theta": 10000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
     ("rope_parameters.rope_theta", "rope_theta")),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0},
      "rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}},
     ("rope_scaling.factor", "rope_parameters.factor")),
])
def test_conflicting_rope_values_are_an_error(updates, keys, tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, "zlab_dflash", verifier_dir=tiny_verifier_dir, config_updates=updates)
    with pytest.raises(InvalidInputError) as e:
        api_convert(src, tiny_verifier_dir, dry_run=True)
    assert e.value.code == "conflicting_rope"
    assert all(k in e.value.message for k in keys)


def test_equal_rope_values_in_both_places_are_one_value(tiny_verifier_dir, tmp_path):
    src = make_source(tmp_path, "zlab_dflash", verifier_dir=tiny_verifier_dir, config_updates={
        "rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 2.0},
        "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}})
    api_convert(src, tiny_verifier_dir, tmp_path / "out")
    tlc = read(tmp_path / "out")["transformer_layer_config"]
    assert tlc["rope_theta"] == tlc["rope_parameters"]["rope_theta"] == 10000.0
    assert tlc["rope_parameters"]["factor"] == 2.0 and tlc["rope_parameters"]["rope_type"] == "linear"


@pytest.mark.parametrize("heads,flagged", [((2, 16), False), ((4, 16), False), ((2, 24), True), ((1, 160), True)])
def test_kv_width_vllm_cannot_page_is_flagged(heads, flagged):
    from types import SimpleNamespace

    from specconv.converters import _common as c

    verifier = SimpleNamespace(config={"num_key_value_heads": 1, "head_dim": 128, "hidden_size": 512,
                                       "num_attention_heads": 4})
    if heads == (1, 160):
        lcfg = {"num_key_value_heads": 1, "head_dim": 160}  # 160 beside the verifier's 128: no common page
    else:
        verifier.config.update(num_key_value_heads=2, head_dim=16)
        lcfg = {"num_key_value_heads": heads[0], "head_dim": heads[1]}
    findings: list = []
    c.kv_page_finding(lcfg, verifier, findings)
    assert [f.code for f in findings] == (["kv-page-size-mismatch"] if flagged else [])


# ------------------------------------------------------------- attn_output_gate
def test_attn_output_gate_on_deepspec_dflash_refused(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path, "deepspec_dflash", verifier_dir=tiny_verifier_dir,
                      config_updates={"attn_output_gate": True})
    with pytest.raises(UnsupportedFormatError, match="attn_output_gate") as e:
        api_convert(src, tiny_verifier_dir, dry_run=True)
    assert e.value.format_id == "deepspec_dflash"


# --------------------------------------------------------- errors name the file
def test_bad_d2t_from_vocab_mapping_names_that_file(speculators_peagle, tiny_llama_verifier_dir, tmp_path):
    from specconv.converters import ConvertOptions, SourceInfo
    from specconv.converters import _vocab as vb

    bad = tmp_path / "mapping.npz"
    np.savez(bad, d2t=np.full(8, 1000, dtype=np.int64))  # every target out of range
    d = tmp_path / "src"
    d.mkdir()
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(d / "model.safetensors"))
    (d / "config.json").write_text("{}")
    with pytest.raises(InvalidInputError) as e:
        vb.resolve_vocab(SourceInfo.open(d), ConvertOptions(vocab_mapping=bad), vocab_size=32, draft_vocab_size=8)
    assert str(bad) in e.value.message and f"{d}:" not in e.value.message


# -------------------------------------------------------------- P-EAGLE lm_head
def test_lm_head_findings_by_producer(speculators_peagle, tiny_llama_verifier_dir, tmp_path):
    rep = api_convert(speculators_peagle, tiny_llama_verifier_dir, dry_run=True)
    assert "lm-head-frozen" in codes(rep.findings)
    sf = fp.to_specforge(speculators_peagle, tmp_path / "sf")
    rep = api_convert(sf, tiny_llama_verifier_dir, dry_run=True, mask_token_id=fp.MASK,
                      aux_layer_ids=list(fp.AUX), speculative_tokens=4)
    f = next(f for f in rep.findings if f["code"] == "lm-head-trainable")
    assert "specforge/modeling/draft/peagle.py" in f["message"] and "vLLM uses the file's lm_head" in f["message"]
    assert "lm-head-frozen" not in codes(rep.findings)


def test_structure_gate_fails_a_differing_peagle_head_only_when_frozen(speculators_peagle, tiny_llama_verifier_dir,
                                                                      tmp_path):
    import torch

    from specconv.validate.gates import gate_structure
    from specconv.verifier import resolve_verifier

    out = tmp_path / "out"
    api_convert(speculators_peagle, tiny_llama_verifier_dir, out)
    t = fp.load_tensors(out)
    t["lm_head.weight"] = t["lm_head.weight"] + torch.ones_like(t["lm_head.weight"])  # a trained head
    fp.save_tensors(out, t)
    v = resolve_verifier(str(tiny_llama_verifier_dir))
    frozen = gate_structure(out, v)
    assert any("lm_head.weight differs" in e for e in frozen.errors)  # speculators freezes it
    rec = json.loads((out / "specconv.json").read_text())
    sec = rec.get("conversion", rec)
    sec["findings"] = [f for f in sec["findings"] if f["code"] != "lm-head-frozen"]
    (out / "specconv.json").write_text(json.dumps(rec))
    trained = gate_structure(out, v)
    assert not any("lm_head" in e for e in trained.errors)
    assert any("lm_head.weight differs" in w and "vLLM uses this file's head" in w for w in trained.warnings)


# ------------------------------------------------- absent decoder keys: evidence, each a finding
def test_absent_decoder_keys_come_from_the_tensors(tiny_verifier_dir, tmp_path):
    keys = ("head_dim", "num_key_value_heads", "attention_bias", "rms_norm_eps", "hidden_act")
    src = make_source(tmp_path, "zlab_dflash", verifier_dir=tiny_verifier_dir,
                      config_updates={k: DELETE for k in keys})
    cfg = json.loads((src / "config.json").read_text())
    assert not set(keys) & set(cfg)
    rep = api_convert(src, tiny_verifier_dir, tmp_path / "out")
    tlc = read(tmp_path / "out")["transformer_layer_config"]
    # tiny verifier: 4 query heads of 16, 2 KV heads (k_proj has 32 rows) — not num_attention_heads
    assert (tlc["head_dim"], tlc["num_key_value_heads"], tlc["attention_bias"]) == (16, 2, False)
    assert (tlc["rms_norm_eps"], tlc["hidden_act"]) == (1e-6, "silu")
    f = next(f for f in rep.findings if f["code"] == "layer-config-filled")
    assert "k_proj.weight rows / head_dim" in f["message"] and "transformers' qwen3 config default" in f["message"]


def test_trainer_dir_fill_is_a_finding(tiny_verifier_dir, tmp_path):
    pytest.importorskip("speculators")
    d = fp.build_speculators_block(tiny_verifier_dir, tmp_path / "df", "dflash")
    cfg = json.loads((d / "config.json").read_text())
    cfg["transformer_layer_config"].pop("rms_norm_eps", None)
    (d / "config.json").write_text(json.dumps(cfg))
    rep = api_convert(d, tiny_verifier_dir, dry_run=True)
    f = next(f for f in rep.findings if f["code"] == "layer-config-filled")
    assert "rms_norm_eps" in f["message"]


def test_trainer_dspark_absent_head_keys_come_from_tensors(tiny_verifier_dir, tmp_path):
    pytest.importorskip("speculators")
    d = fp.build_speculators_block(tiny_verifier_dir, tmp_path / "ds", "dspark", markov_rank=8)
    cfg = json.loads((d / "config.json").read_text())
    want = {k: cfg[k] for k in ("markov_rank", "markov_head_type", "enable_confidence_head",
                                "confidence_head_with_markov")}
    for k in want:
        cfg.pop(k)  # as an export that left them to the class defaults (markov_rank 256, ...)
    (d / "config.json").write_text(json.dumps(cfg))
    rep = api_convert(d, tiny_verifier_dir, tmp_path / "out")
    out = read(tmp_path / "out")
    assert {k: out[k] for k in want} == want and want["markov_rank"] == 8
    filled = [f for f in rep.findings if f["code"] == "dspark-head-from-tensors"]
    assert sorted(f["key"] for f in filled) == sorted(want)
