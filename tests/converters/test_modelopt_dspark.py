"""modelopt_dspark: NVIDIA ModelOpt DSpark export (top-level head tensors) → Speculators dspark.

Fixture: ``tests/fixtures_dspark.make_modelopt_dspark`` (spec-built, external_formats.md §7).
"""

from __future__ import annotations

import json

import pytest
from _dspark_helpers import detected, out_tensors, plan_for, record

from fixtures_dflash import read
from fixtures_dspark import draft_dims, make_modelopt_dspark
from specconv.errors import InvalidInputError

FMT = "modelopt_dspark"  # the shared conversion tests read: conftest ``converted``


def test_convert_end_to_end(converted):
    out, rep = converted.out, converted.rep
    cfg = read(out)
    assert cfg["sample_from_anchor"] is True  # shift_label: true
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == cfg["block_size"]
    assert cfg["enable_confidence_head"] is True  # from use_confidence_head
    assert cfg["aux_hidden_state_layer_ids"] == [2, 4, 6]
    assert any(f["code"] == "modelopt-layer-id-convention" for f in rep["findings"])
    s, d = out_tensors(converted.src), out_tensors(out)
    renames = {
        "markov_w1.weight": "markov_head.markov_w1.weight",
        "markov_w2.weight": "markov_head.markov_w2.weight",
        "confidence_proj.weight": "confidence_head.proj.weight",
        "confidence_proj.bias": "confidence_head.proj.bias",
    }
    for a, b in renames.items():
        assert a not in d and bool((d[b] == s[a]).all()), a
        assert record(out)["tensors"][b]["fate"] == "renamed"
    # body tensors that share a head suffix keep their names
    assert bool((d["layers.0.mlp.gate_proj.weight"] == s["layers.0.mlp.gate_proj.weight"]).all())
    assert set(d) == {renames.get(k, k) for k in s}


def test_gated_top_level_gate_proj_renamed(tmp_path, tiny_verifier_dir):
    src = make_modelopt_dspark(tmp_path / "s", tiny_verifier_dir, markov_head_type="gated")
    _, plan = plan_for(src, tiny_verifier_dir)
    by_out = {t.out: t for t in plan.tensors}
    H, r = draft_dims(tiny_verifier_dir)["H"], 8
    assert by_out["markov_head.gate_proj.weight"].source == "gate_proj.weight"
    assert by_out["markov_head.gate_proj.weight"].shape == (r, H + r)
    assert by_out["layers.1.mlp.gate_proj.weight"].source == "layers.1.mlp.gate_proj.weight"


def test_shift_label_false_is_one_plus_n(tmp_path, tiny_verifier_dir):
    src = make_modelopt_dspark(tmp_path / "s", tiny_verifier_dir, shift_label=False)
    _, plan = plan_for(src, tiny_verifier_dir)
    assert plan.config.sample_from_anchor is False
    assert plan.config.speculators_config.proposal_methods[0].speculative_tokens == 3


def test_missing_shift_label_needs_the_flag(tmp_path, tiny_verifier_dir):
    src = make_modelopt_dspark(tmp_path / "s", tiny_verifier_dir, shift_label=None)
    assert detected(src) == "modelopt_dspark"  # still ModelOpt: top-level head tensors
    with pytest.raises(InvalidInputError, match=r"dflash_config\.shift_label") as e:
        plan_for(src, tiny_verifier_dir)
    assert "--sample-from-anchor" in e.value.hint
    _, plan = plan_for(src, tiny_verifier_dir, sample_from_anchor=True)
    assert plan.config.sample_from_anchor is True


def test_confidence_disabled(tmp_path, tiny_verifier_dir):
    src = make_modelopt_dspark(tmp_path / "s", tiny_verifier_dir, use_confidence_head=False)
    _, plan = plan_for(src, tiny_verifier_dir)
    assert plan.config.enable_confidence_head is False
    assert plan.config.confidence_head_with_markov is False


def test_confidence_width_without_markov_contradicts_modelopt(tmp_path, tiny_verifier_dir):
    import torch
    from safetensors.torch import load_file, save_file

    src = make_modelopt_dspark(tmp_path / "s", tiny_verifier_dir)
    sd = load_file(str(src / "model.safetensors"))
    sd["confidence_proj.weight"] = torch.zeros(1, 64, dtype=torch.bfloat16)
    save_file(sd, str(src / "model.safetensors"))
    with pytest.raises(InvalidInputError, match=r"confidence_proj\.weight.*implies confidence_head_with_markov=false"):
        plan_for(src, tiny_verifier_dir)


def test_detected_by_keys_without_head_tensors(tmp_path, tiny_verifier_dir):
    # rank 0 and no confidence head: no top-level head tensor, ModelOpt keys identify it
    src = make_modelopt_dspark(tmp_path / "s", tiny_verifier_dir, markov_rank=0, use_confidence_head=False)
    assert detected(src) == "modelopt_dspark"
    _, plan = plan_for(src, tiny_verifier_dir)
    assert plan.config.markov_rank == 0


def test_missing_use_confidence_head(tmp_path, tiny_verifier_dir):
    src = make_modelopt_dspark(tmp_path / "s", tiny_verifier_dir)
    cfg = json.loads((src / "config.json").read_text())
    del cfg["dflash_config"]["use_confidence_head"]
    (src / "config.json").write_text(json.dumps(cfg))
    assert detected(src) == "modelopt_dspark"
    with pytest.raises(InvalidInputError, match=r"dflash_config\.use_confidence_head"):
        plan_for(src, tiny_verifier_dir)
