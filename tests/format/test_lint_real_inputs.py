"""Issue 8 item 4, lint side: rules that failed on real inputs, and what vLLM 0.33 loads
without a word but the lint must catch.

Drafters are built and saved by speculators 0.9.0 (tests/fixtures_peagle.py), converted by
specconv, then broken one way at a time; the verifier facts come from a real verifier
directory (the tiny random Qwen3 one; SmolLM2-135M-Instruct for the tokenizer and the
hidden-size cases). Each case asserts the unbroken directory has no such finding.
"""

from __future__ import annotations

import json
import shutil

import pytest

import fixtures_peagle as fp
from cli_runner import invoke

pytestmark = pytest.mark.peer
pytest.importorskip("speculators")

HUB = "org/tiny"


def _convert(src, verifier, out, **opts):
    from specconv.convert import convert
    from specconv.converters import ConvertOptions

    return convert(str(src), verifier=str(verifier), output=out, options=ConvertOptions(**opts), verifier_name=HUB)


def _facts(verifier_dir, name=HUB):
    from specconv.verifier import resolve_verifier

    return resolve_verifier(str(verifier_dir), name=name).facts()


def _codes(findings, level=None):
    return {f.code for f in findings if level is None or f.level == level}


def _copy(d, tmp_path, name="case"):
    out = tmp_path / name
    shutil.copytree(d, out)
    return out


def _patch_config(d, **changes):
    cfg = fp.read_json(d / "config.json")
    for path, v in changes.items():
        node = cfg
        *parents, last = path.split(".")
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if v is _DROP:
            node.pop(last)
        else:
            node[last] = v
    fp.write_json(d / "config.json", cfg)


_DROP = object()
_K = "speculators_config.proposal_methods.0.speculative_tokens"


@pytest.fixture(scope="module")
def converted(tiny_verifier_dir, tmp_path_factory):
    """specconv conversions of speculators-built DFlash, DSpark and pruned P-EAGLE drafters."""
    root = tmp_path_factory.mktemp("lint_real")
    refs = {
        "dflash": fp.build_speculators_block(tiny_verifier_dir, root / "ref_df", "dflash"),
        "dspark": fp.build_speculators_block(tiny_verifier_dir, root / "ref_ds", "dspark", sample_from_anchor=True),
        "peagle": fp.build_speculators_peagle(tiny_verifier_dir, root / "ref_pe", vd=64),
    }
    out = {}
    for algo, ref in refs.items():
        out[algo] = root / f"out_{algo}"
        _convert(ref, tiny_verifier_dir, out[algo])
    return out


@pytest.fixture(scope="module")
def facts(tiny_verifier_dir):
    return _facts(tiny_verifier_dir)


@pytest.mark.parametrize("algo", ["dflash", "dspark", "peagle"])
def test_converted_dirs_lint_without_errors(converted, facts, algo):
    from specconv.format import lint_dir

    f = lint_dir(converted[algo], facts, serve_method={"peagle": "eagle3"}.get(algo, algo))
    assert not _codes(f, "error"), f


# ------------------------------------------------------- what vLLM 0.33 accepts silently


def test_missing_tensor_is_an_error(converted, facts, tmp_path):
    from specconv.format import lint_dir

    d = _copy(converted["dflash"], tmp_path)
    t = fp.load_tensors(d)
    del t["layers.0.mlp.down_proj.weight"]
    fp.save_tensors(d, t)
    hits = [f for f in lint_dir(d, facts) if f.code == "tensor-missing"]
    assert [f.key for f in hits] == ["layers.0.mlp.down_proj.weight"] and hits[0].level == "error"


def test_pruned_peagle_without_d2t_is_an_error(converted, facts, tmp_path):
    from specconv.format import lint_dir

    d = _copy(converted["peagle"], tmp_path)
    assert fp.read_json(d / "config.json")["draft_vocab_size"] == 64
    t = fp.load_tensors(d)
    del t["d2t"]
    fp.save_tensors(d, t)
    assert "d2t-missing" in _codes(lint_dir(d, facts), "error")
    assert "d2t-missing" not in _codes(lint_dir(converted["peagle"], facts))


@pytest.mark.parametrize("algo", ["dflash", "dspark"])
def test_k_larger_than_the_block_is_an_error(converted, facts, tmp_path, algo):
    from specconv.format import lint_dir

    d = _copy(converted[algo], tmp_path)
    B = fp.read_json(d / "config.json")["block_size"]
    _patch_config(d, **{_K: B + 1})
    hits = [f for f in lint_dir(d, facts) if f.code == "speculative-tokens-mismatch"]
    assert hits and hits[0].level == "error" and str(B + 1) in hits[0].message


@pytest.mark.parametrize("algo,wrong", [("dflash", "eagle3"), ("dspark", "dflash"), ("peagle", "dflash")])
def test_wrong_serve_method_is_an_error(converted, facts, algo, wrong):
    from specconv.format import algorithm, lint_dir

    method = algorithm(algo).vllm.method
    hits = [f for f in lint_dir(converted[algo], facts, serve_method=wrong) if f.code == "serve-method-mismatch"]
    assert hits and hits[0].level == "error" and method in hits[0].message
    assert "serve-method-mismatch" not in _codes(lint_dir(converted[algo], facts, serve_method=method))


def test_aux_id_beyond_the_verifier_is_an_error(converted, facts, tmp_path):
    from specconv.format import lint_dir

    d = _copy(converted["dspark"], tmp_path)
    ids = fp.read_json(d / "config.json")["aux_hidden_state_layer_ids"]
    _patch_config(d, aux_hidden_state_layer_ids=[*ids[:-1], facts.num_hidden_layers + 1])
    assert "aux-ids-out-of-range" in _codes(lint_dir(d, facts), "error")


def test_verifier_with_another_hidden_size_is_an_error(converted, smollm2_dir):
    from specconv.format import lint_dir

    f = lint_dir(converted["dflash"], _facts(smollm2_dir, "HuggingFaceTB/SmolLM2-135M-Instruct"))
    hits = [x for x in f if x.code == "hidden-size-mismatch"]
    assert hits and hits[0].level == "error" and "576" in hits[0].message


# ------------------------------------------------------- rules that failed on real inputs


def test_aux_id_equal_to_verifier_layers_is_a_warning(converted, facts, tmp_path):
    from specconv.format import lint_dir

    d = _copy(converted["dflash"], tmp_path)
    n = facts.num_hidden_layers
    ids = fp.read_json(d / "config.json")["aux_hidden_state_layer_ids"]
    _patch_config(d, aux_hidden_state_layer_ids=[*ids[:-1], n])
    hits = [f for f in lint_dir(d, facts) if f.code == "aux-ids-final-hidden-state"]
    assert hits and hits[0].level == "warning"
    assert "vLLM" in hits[0].message and "#36063" in hits[0].message and "--vllm-load-check" in hits[0].message
    assert "aux-ids-final-hidden-state" not in _codes(lint_dir(converted["dflash"], facts))


def test_peagle_with_four_aux_layers_warns_about_mask_hidden(tiny_verifier_dir, facts, tmp_path):
    from specconv.format import lint_dir

    ref = fp.build_speculators_peagle(tiny_verifier_dir, tmp_path / "ref4", aux=[1, 2, 4, 5])
    out = tmp_path / "out4"
    _convert(ref, tiny_verifier_dir, out)
    hits = [f for f in lint_dir(out, facts) if f.code == "peagle-aux-count"]
    assert hits and hits[0].level == "warning" and "3·H" in hits[0].message and "256" in hits[0].message


def test_mask_token_every_eos_id_and_added_special_tokens(converted, tmp_path):
    """A verifier whose eos is a list and whose tokenizer has added special tokens."""
    from specconv.format import lint_dir

    v = tmp_path / "verifier"
    v.mkdir()
    cfg = dict(fp.read_json(converted["dflash"] / "config.json")["transformer_layer_config"])
    cfg.update(architectures=["Qwen3ForCausalLM"], num_hidden_layers=6, bos_token_id=1, eos_token_id=[2, 7])
    fp.write_json(v / "config.json", cfg)
    mask = fp.read_json(converted["dflash"] / "config.json")["mask_token_id"]
    added = {"added_tokens": [{"id": 0, "content": "<|endoftext|>", "special": True},
                              {"id": 9, "content": "<|fim|>", "special": True},
                              {"id": 11, "content": "plain", "special": False}]}
    fp.write_json(v / "tokenizer.json", added)
    facts = _facts(v)
    assert facts.eos_token_id == [2, 7] and facts.added_special_tokens == {0: "<|endoftext|>", 9: "<|fim|>"}
    for m, hit in [(7, "eos"), (9, "<|fim|>"), (11, None), (mask, None)]:
        d = _copy(converted["dflash"], tmp_path, f"m{m}")
        _patch_config(d, mask_token_id=m)
        hits = [f for f in lint_dir(d, facts) if f.code == "mask-token-special"]
        if hit is None:
            assert not hits, (m, hits)
        else:
            assert len(hits) == 1 and hits[0].level == "warning" and hit in hits[0].message, (m, hits)


def test_mask_token_added_special_token_of_smollm2(smollm2_dir):
    """The real SmolLM2 tokenizer: id 16 is the added special token <empty_output>."""
    facts = _facts(smollm2_dir, "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert facts.added_special_tokens[16] == "<empty_output>"
    assert facts.added_special_tokens[2] == "<|im_end|>"


def test_inspect_and_convert_refuse_a_dspark_dir_whose_layout_readings_disagree(tiny_verifier_dir, tmp_path):
    """speculators 0.9.0 saved a 1+N DSpark (K = B-1) and the key is gone, as speculators#737's
    converter writes it: the K rule reads false, speculators itself reads its DSpark default true
    (checked with speculators' own config loader). inspect (lint error) and convert (exit 3) both
    refuse, naming both readings and the flag; the flag then decides and is recorded."""
    from speculators import SpeculatorModelConfig

    d = fp.build_speculators_block(tiny_verifier_dir, tmp_path / "legacy", "dspark", sample_from_anchor=False)
    cfg = fp.read_json(d / "config.json")
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == cfg["block_size"] - 1
    _patch_config(d, sample_from_anchor=_DROP)
    assert SpeculatorModelConfig.from_pretrained(str(d)).sample_from_anchor is True  # the owner's reading
    r = invoke("inspect", d, "--verifier", tiny_verifier_dir, "--verifier-name", HUB)
    rep = json.loads(r.stdout)
    assert r.code == 3, rep
    hit = [f for f in rep["findings"] if f["code"] == "sample-from-anchor-disputed"]
    assert hit and hit[0]["level"] == "error", rep["findings"]
    for part in ("the K rule reads false", "speculators 0.9.0 reads its DSpark default true", "--sample-from-anchor"):
        assert part in hit[0]["message"], hit[0]["message"]
    assert "sample-from-anchor-legacy" not in {f["code"] for f in rep["findings"]}
    r = invoke("convert", d, "--verifier", tiny_verifier_dir, "--verifier-name", HUB, "-o", tmp_path / "o")
    err = json.loads(r.stdout)
    assert r.code == 3 and err["error"] == "ambiguous_sample_from_anchor", err
    assert "K rule reads false" in err["message"] and "DSpark default true" in err["message"], err
    assert "--no-sample-from-anchor" in err["hint"] and not (tmp_path / "o").exists()
    out = tmp_path / "out"
    r = invoke("convert", d, "--verifier", tiny_verifier_dir, "--verifier-name", HUB, "-o", out,
               "--no-sample-from-anchor")
    assert r.code == 0, r.stdout
    assert fp.read_json(out / "config.json")["sample_from_anchor"] is False
    assert "layout-from-flag" in {f["code"] for f in json.loads(r.stdout)["findings"]}
    assert fp.read_json(out / "specconv.json")["conversion"]["options"]["sample_from_anchor"] is False


def test_legacy_dspark_undecidable_k_is_an_error_in_inspect_and_convert(tiny_verifier_dir, tmp_path):
    from specconv.errors import InvalidInputError
    from specconv.format import lint_dir

    d = fp.build_speculators_block(tiny_verifier_dir, tmp_path / "legacy", "dspark", sample_from_anchor=False)
    _patch_config(d, sample_from_anchor=_DROP, **{_K: 2})  # block 4: neither 3 nor 4
    hits = [f for f in lint_dir(d) if f.code == "speculative-tokens-mismatch"]
    assert hits and "cannot be told" in hits[0].message
    with pytest.raises(InvalidInputError) as e:
        _convert(d, tiny_verifier_dir, tmp_path / "out")
    assert e.value.code == "missing_sample_from_anchor"
