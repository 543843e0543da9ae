"""specforge_dspark: SpecForge DSparkDraftModel HF export → Speculators dspark.

Fixture: ``tests/fixtures_dspark.make_specforge_dspark`` (spec-built, external_formats.md §6.3–§6.4).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _dspark_helpers import detected, out_tensors, plan_for, record

from cli_runner import invoke
from fixtures_dflash import cli_convert, read
from fixtures_dspark import make_specforge_dspark, verifier_tensor
from specconv.errors import InvalidInputError, UnsupportedFormatError

FMT = "specforge_dspark"  # the shared conversion tests read: conftest ``converted``


def test_convert_end_to_end(converted):
    out, rep = converted.out, converted.rep
    cfg = read(out)
    # the head keys hoisted from dflash_config: test_convert_dspark.py
    assert cfg["aux_hidden_state_layer_ids"] == [2, 4, 6]
    # SpecForge DSpark is trained 1+N and its export records no layout
    assert cfg["sample_from_anchor"] is False
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == cfg["block_size"] - 1
    assert "confidence_head_alpha" not in json.dumps(cfg)
    notes = rep["plan"]["notes"]
    assert any("confidence_head_alpha=1.0" in n and "training" in n for n in notes)
    src, dst = out_tensors(converted.src), out_tensors(out)
    assert set(dst) == set(src)


def test_top_level_head_keys(tmp_path, tiny_verifier_dir):
    src = make_specforge_dspark(tmp_path / "s", tiny_verifier_dir, head_location="top", markov_rank=4)
    _, plan = plan_for(src, tiny_verifier_dir)
    assert plan.config.markov_rank == 4
    assert any("markov_rank=4 (markov_rank)" == n for n in plan.notes)


def test_nested_and_top_level_disagree(tmp_path, tiny_verifier_dir):
    src = make_specforge_dspark(tmp_path / "s", tiny_verifier_dir, extra_cfg={"markov_rank": 16})
    with pytest.raises(InvalidInputError,
                       match=r"markov_rank disagrees between dflash_config\.markov_rank=8 and markov_rank=16"):
        plan_for(src, tiny_verifier_dir)


def test_missing_markov_rank_names_key(tmp_path, tiny_verifier_dir):
    src = make_specforge_dspark(tmp_path / "s", tiny_verifier_dir)
    cfg = json.loads((src / "config.json").read_text())
    del cfg["dflash_config"]["markov_rank"]
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InvalidInputError, match=r"dflash_config\.markov_rank"):
        plan_for(src, tiny_verifier_dir)


def test_logit_head_prefix_stripped(tmp_path, tiny_verifier_dir):
    src = make_specforge_dspark(tmp_path / "s", tiny_verifier_dir, logit_head=True)
    out = tmp_path / "o"
    code, rep, err = cli_convert(src, tiny_verifier_dir, out)
    assert code == 0, err
    s, d = out_tensors(src), out_tensors(out)
    assert "logit_head.markov_head.markov_w1.weight" in s
    assert bool((d["markov_head.markov_w1.weight"] == s["logit_head.markov_head.markov_w1.weight"]).all())
    assert bool((d["confidence_head.proj.weight"] == s["logit_head.confidence_head.proj.weight"]).all())
    assert not [k for k in d if k.startswith("logit_head.")]
    assert record(out)["tensors"]["markov_head.markov_w2.weight"]["fate"] == "renamed"
    assert any("logit_head." in n for n in rep["plan"]["notes"])


def test_domino_head_tensors_refused(tmp_path, tiny_verifier_dir):
    src = make_specforge_dspark(tmp_path / "s", tiny_verifier_dir, logit_head=True, domino_tensors=True)
    with pytest.raises(UnsupportedFormatError, match=r"logit_head\.prefix_gru\.weight_hh_l0 \(Domino"):
        plan_for(src, tiny_verifier_dir)


def test_attention_mode_mla_refused(tmp_path, tiny_verifier_dir):
    src = make_specforge_dspark(tmp_path / "s", tiny_verifier_dir, attention_mode="mla")
    assert detected(src) == "mla_dspark"
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "o")
    assert code == 3 and rep["error"] == "unsupported_format"
    # the converter itself also refuses MLA (defence in depth)
    from specconv.converters import ConvertOptions, SourceInfo
    from specconv.converters.specforge_dspark import SpecForgeDSpark
    from specconv.verifier import resolve_verifier

    with pytest.raises(UnsupportedFormatError, match="mla"):
        SpecForgeDSpark().plan(SourceInfo.open(src), resolve_verifier(str(tiny_verifier_dir)), ConvertOptions())


def test_checkpoint_layout_key_wins(tmp_path, tiny_verifier_dir):
    src = make_specforge_dspark(tmp_path / "s", tiny_verifier_dir, extra_dflash={"sample_from_anchor": True})
    _, plan = plan_for(src, tiny_verifier_dir)
    assert plan.config.sample_from_anchor is True
    assert plan.config.speculators_config.proposal_methods[0].speculative_tokens == 4
    with pytest.raises(InvalidInputError, match="contradicts"):
        plan_for(src, tiny_verifier_dir, sample_from_anchor=False)


def test_flag_fills_layout_only_when_checkpoint_silent(converted, tiny_verifier_dir):
    _, plan = plan_for(converted.src, tiny_verifier_dir, sample_from_anchor=True)
    assert plan.config.sample_from_anchor is True
    assert any(f.code == "layout-from-flag" and f.level == "warning" for f in plan.findings)


def test_confidence_enabled_without_with_markov_key(tmp_path, tiny_verifier_dir):
    src = make_specforge_dspark(tmp_path / "s", tiny_verifier_dir)
    cfg = json.loads((src / "config.json").read_text())
    del cfg["dflash_config"]["confidence_head_with_markov"]
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InvalidInputError, match="confidence_head_with_markov"):
        plan_for(src, tiny_verifier_dir)


def test_vocab_mapping_takes_lm_head_rows_from_verifier(converted, tiny_verifier_dir, tmp_path):
    V, Vd = 256, 32
    tgt = np.sort(np.concatenate([[3, 4], np.random.default_rng(1).choice(np.arange(5, V), Vd - 2, replace=False)]))
    path = tmp_path / "d2t.npy"
    np.save(path, (tgt - np.arange(Vd)).astype(np.int64))
    out = tmp_path / "o"
    code, rep, err = cli_convert(converted.src, tiny_verifier_dir, out, "--vocab-mapping", path)
    assert code == 0, err
    d, s = out_tensors(out), out_tensors(converted.src)
    vh = verifier_tensor(tiny_verifier_dir, "lm_head").to(d["lm_head.weight"].dtype)
    assert bool((d["lm_head.weight"] == vh[tgt]).all())
    assert bool((d["markov_head.markov_w2.weight"] == s["markov_head.markov_w2.weight"][tgt]).all())
    assert int(d["t2d"].sum()) == Vd  # rebuilt from d2t
    fates = record(out)["tensors"]
    assert fates["lm_head.weight"]["origin"] == "verifier" and fates["lm_head.weight"]["fate"] == "sliced"
    assert fates["t2d"]["fate"] == "generated"


def test_inspect_reports_supported(converted):
    code, rep, _ = invoke("inspect", converted.src).code_json_stderr
    assert code == 0
    assert rep["format"] == "specforge_dspark" and rep["supported"] is True
