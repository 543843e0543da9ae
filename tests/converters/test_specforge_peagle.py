"""F4 — SpecForge P-EAGLE export (``PEagleDraftModel``) → Speculators peagle.

Reference drafters are built by speculators 0.9.0 and re-laid-out as SpecForge ``--to hf``
exports (flat llama config, no mask id, default all-true ``t2d`` / all-zero ``d2t``
buffers for a full vocabulary; external_formats.md §6.3–§6.5).
"""

from __future__ import annotations

import json

import pytest

import fixtures_peagle as fp

pytestmark = pytest.mark.peer
pytest.importorskip("speculators")
pytest.importorskip("loguru")

HUB = "org/tiny-llama"
FLAGS = dict(mask_token_id=fp.MASK, aux_layer_ids=fp.AUX, speculative_tokens=4)


def convert(src, verifier, out=None, **opts):
    from specconv.convert import convert as _convert
    from specconv.converters import ConvertOptions

    return _convert(str(src), verifier=str(verifier), output=out, options=ConvertOptions(**opts),
                    verifier_name=HUB, dry_run=out is None)


@pytest.fixture(scope="module")
def ref_full(tiny_llama_verifier_dir, tmp_path_factory):
    return fp.build_speculators_peagle(tiny_llama_verifier_dir, tmp_path_factory.mktemp("ref") / "full", layers=2,
                                       seed=2)


@pytest.fixture(scope="module")
def ref_pruned(tiny_llama_verifier_dir, tmp_path_factory):
    return fp.build_speculators_peagle(tiny_llama_verifier_dir, tmp_path_factory.mktemp("refp") / "pruned", vd=48,
                                       seed=3)


def test_end_to_end_full_vocab_drops_default_mapping(ref_full, tiny_llama_verifier_dir, tmp_path):
    import torch

    from interop import load_with_speculators, run_speculators_forward

    src = fp.to_specforge(ref_full, tmp_path / "sf")
    t = fp.load_tensors(src)
    assert bool(t["t2d"].all()) and not t["d2t"].any()  # the SpecForge defaults
    out = tmp_path / "out"
    rep = convert(src, tiny_llama_verifier_dir, out, **FLAGS)
    assert rep.format == "specforge_peagle"
    dropped = {d["name"]: d["reason"] for d in rep.plan["dropped"]}
    assert set(dropped) == {"t2d", "d2t"}
    assert "all-true t2d" in dropped["t2d"] and "all-zero d2t" in dropped["d2t"]
    got, want = fp.load_tensors(out), fp.load_tensors(ref_full)
    assert sorted(got) == sorted(want) and "t2d" not in got
    for k in want:
        assert torch.equal(got[k], want[k]), k
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["mask_token_id"] == fp.MASK and cfg["draft_vocab_size"] == cfg["transformer_layer_config"]["vocab_size"]
    assert "--mask-token-id" in " ".join(rep.plan["notes"])
    run_speculators_forward(load_with_speculators(out, tiny_llama_verifier_dir))


def test_mask_token_required(ref_full, tiny_llama_verifier_dir, tmp_path):
    from specconv.errors import InvalidInputError

    src = fp.to_specforge(ref_full, tmp_path / "sf")
    with pytest.raises(InvalidInputError) as e:
        convert(src, tiny_llama_verifier_dir, aux_layer_ids=fp.AUX, speculative_tokens=4)
    assert e.value.code == "missing_mask_token" and "--mask-token-id" in e.value.hint
    with pytest.raises(InvalidInputError, match="outside the verifier vocab"):
        convert(src, tiny_llama_verifier_dir, **{**FLAGS, "mask_token_id": 256})


def test_aux_ids_required_unless_in_config(ref_full, tiny_llama_verifier_dir, tmp_path):
    from specconv.errors import InvalidInputError

    src = fp.to_specforge(ref_full, tmp_path / "sf")
    with pytest.raises(InvalidInputError) as e:
        convert(src, tiny_llama_verifier_dir, mask_token_id=fp.MASK, speculative_tokens=4)
    assert e.value.code == "missing_layer_ids"
    src = fp.to_specforge(ref_full, tmp_path / "sf2", aux_in_config=True, num_depths=4)
    rep = convert(src, tiny_llama_verifier_dir, mask_token_id=fp.MASK)
    assert rep.plan["layer_ids"]["source_key"] == "eagle_aux_hidden_state_layer_ids"
    assert rep.plan["config"]["eagle_aux_hidden_state_layer_ids"] == fp.AUX


def test_pruned_vocab_all_true_t2d_rebuilt_from_d2t(ref_pruned, tiny_llama_verifier_dir, tmp_path):
    import torch
    from safetensors.torch import save_file

    from interop import load_with_speculators

    src = fp.to_specforge(ref_pruned, tmp_path / "sf")
    t = fp.load_tensors(src)
    ref_t2d = t["t2d"].clone()
    t["t2d"] = torch.ones_like(t["t2d"])  # left at SpecForge's default
    save_file(t, str(src / "model.safetensors"))
    out = tmp_path / "out"
    rep = convert(src, tiny_llama_verifier_dir, out, **FLAGS)
    assert any(f["code"] == "t2d-default-all-true" for f in rep.findings)
    rec = json.loads((out / "specconv.json").read_text())["conversion"]
    assert rec["tensors"]["t2d"]["fate"] == "generated"
    assert torch.equal(fp.load_tensors(out)["t2d"], ref_t2d)
    load_with_speculators(out, tiny_llama_verifier_dir)


def test_pruned_vocab_all_zero_d2t_refused(ref_pruned, tiny_llama_verifier_dir, tmp_path):
    import torch
    from safetensors.torch import save_file

    from specconv.errors import InvalidInputError

    src = fp.to_specforge(ref_pruned, tmp_path / "sf")
    t = fp.load_tensors(src)
    t["d2t"] = torch.zeros_like(t["d2t"])
    save_file(t, str(src / "model.safetensors"))
    with pytest.raises(InvalidInputError, match="#222") as e:
        convert(src, tiny_llama_verifier_dir, **FLAGS)
    assert e.value.code == "vocab_map_all_zero" and "--vocab-mapping" in e.value.hint
    # the trainer's vocab-mapping file repairs it (SpecForge keeps it outside the weights)
    ref = fp.load_tensors(ref_pruned)
    vm = tmp_path / "vocab_mapping.pt"
    torch.save({"d2t": ref["d2t"], "t2d": ref["t2d"]}, vm)
    with pytest.raises(InvalidInputError, match="differs from the checkpoint"):
        convert(src, tiny_llama_verifier_dir, vocab_mapping=vm, **FLAGS)
    t.pop("d2t")
    t.pop("t2d")
    save_file(t, str(src / "model.safetensors"))
    rep = convert(src, tiny_llama_verifier_dir, vocab_mapping=vm, **FLAGS)
    assert any("--vocab-mapping vocab_mapping.pt" in n for n in rep.plan["notes"])


def test_speculators_output_is_not_specforge(ref_full, tmp_path):
    from specconv.converters import SourceInfo, detect

    assert detect(SourceInfo.open(ref_full)).format_id == "speculators_peagle"
    assert detect(SourceInfo.open(fp.to_specforge(ref_full, tmp_path / "sf"))).format_id == "specforge_peagle"
