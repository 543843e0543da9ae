"""F9 — AWS P-EAGLE / vLLM "eagle3 + parallel drafting" layout → Speculators peagle.

The reference drafter is built by speculators 0.9.0 (``PEagleDraftModel.from_training_args``
on the tiny Llama verifier) and re-laid-out in the vLLM/AWS layout
(tests/fixtures_peagle.py); the conversion must give back exactly the reference's tensors
and a config speculators loads and runs.
"""

from __future__ import annotations

import json

import pytest

import fixtures_peagle as fp
from cli_runner import invoke

pytestmark = pytest.mark.peer
pytest.importorskip("speculators")
pytest.importorskip("loguru")

HUB = "org/tiny-llama"


def convert(src, verifier, out=None, *, dry_run=False, **opts):
    from specconv.convert import convert as _convert
    from specconv.converters import ConvertOptions

    return _convert(str(src), verifier=str(verifier), output=out, options=ConvertOptions(**opts),
                    verifier_name=HUB, dry_run=dry_run or out is None)


def codes(rep, level=None):
    return {f["code"] for f in rep.findings if level is None or f["level"] == level}


@pytest.fixture(scope="module")
def ref(tiny_llama_verifier_dir, tmp_path_factory):
    """Pruned-vocab (Vd=64) 2-layer Llama P-EAGLE built by speculators."""
    return fp.build_speculators_peagle(tiny_llama_verifier_dir, tmp_path_factory.mktemp("ref") / "peagle", vd=64)


@pytest.fixture(scope="module")
def ref1(tiny_llama_verifier_dir, tmp_path_factory):
    """Single-layer, full-vocab, 2 aux layers, norm_before_residual=false."""
    return fp.build_speculators_peagle(tiny_llama_verifier_dir, tmp_path_factory.mktemp("ref1") / "peagle",
                                       layers=1, aux=[2, 5], nbr=False, seed=1)


def test_end_to_end_loads_in_speculators_and_matches_reference(ref, tiny_llama_verifier_dir, tmp_path):
    from interop import load_with_speculators, run_speculators_forward

    src = fp.to_aws(ref, tmp_path / "aws")
    out = tmp_path / "out"
    rep = convert(src, tiny_llama_verifier_dir, out, speculative_tokens=4)
    assert rep.format == "aws_peagle" and rep.algorithm == "peagle"
    cfg = json.loads((out / "config.json").read_text())
    spec = fp.read_json(ref / "config.json")
    assert cfg["speculators_model_type"] == "peagle" and "model_type" not in cfg
    assert cfg["mask_token_id"] == spec["mask_token_id"]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == spec["eagle_aux_hidden_state_layer_ids"]
    assert cfg["norm_before_residual"] is spec["norm_before_residual"]
    assert cfg["draft_vocab_size"] == 64
    assert cfg["transformer_layer_config"]["model_type"] == "llama"
    assert "num_aux_hidden_states" not in cfg["transformer_layer_config"]  # A == 3
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == HUB
    got, want = fp.load_tensors(out), fp.load_tensors(ref)
    assert sorted(got) == sorted(want)
    import torch

    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k
    record = json.loads((out / "specconv.json").read_text())["conversion"]
    assert record["tensors"]["mask_hidden"]["fate"] == "reshaped"
    assert record["tensors"]["t2d"]["fate"] == "generated"
    assert record["tensors"]["d2t"]["fate"] == "copied"
    model = load_with_speculators(out, tiny_llama_verifier_dir)
    logits = run_speculators_forward(model)
    assert logits.shape[-1] == 64


def test_midlayer_single_layer_renamed(ref1, tiny_llama_verifier_dir, tmp_path):
    src = fp.to_aws(ref1, tmp_path / "aws", midlayer=True, mask_hidden_2d=False, num_depths=6)
    names = set(fp.load_tensors(src))
    assert any(n.startswith("midlayer.") for n in names) and not any(n.startswith("layers.") for n in names)
    out = tmp_path / "out"
    rep = convert(src, tiny_llama_verifier_dir, out)
    record = json.loads((out / "specconv.json").read_text())["conversion"]
    assert record["tensors"]["layers.0.self_attn.q_proj.weight"] == {
        **record["tensors"]["layers.0.self_attn.q_proj.weight"], "fate": "renamed",
        "source": "midlayer.self_attn.q_proj.weight"}
    assert record["tensors"]["mask_hidden"]["fate"] == "copied"  # already [1,1,A·H]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["norm_before_residual"] is False
    # trained K from num_depths, recorded for the lint
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 6 and cfg["num_depths"] == 6
    # Llama with 2 aux layers: vLLM needs num_aux_hidden_states (speculators_format.md §8.4 rule 2)
    assert cfg["transformer_layer_config"]["num_aux_hidden_states"] == 2
    assert "peagle-llama-aux-count" not in codes(rep)
    got, want = fp.load_tensors(out), fp.load_tensors(ref1)
    assert sorted(got) == sorted(want)


@pytest.mark.parametrize("keys",
                         [("ptd_token_id",), ("mask_token_id",), ("pard_token", "ptd_token_id", "mask_token_id")])
def test_mask_token_under_any_vllm_key(ref, tiny_llama_verifier_dir, tmp_path, keys):
    src = fp.to_aws(ref, tmp_path / "aws", mask_keys=keys)
    rep = convert(src, tiny_llama_verifier_dir, speculative_tokens=4)
    assert rep.plan["config"]["mask_token_id"] == fp.MASK
    assert f"mask_token_id from {keys[0]}" in rep.plan["notes"]


def test_disagreeing_mask_keys_are_an_error(ref, tiny_llama_verifier_dir, tmp_path):
    from specconv.errors import InvalidInputError

    src = fp.to_aws(ref, tmp_path / "aws", mask_keys=("pard_token", "ptd_token_id"), mask_values={"ptd_token_id": 7})
    with pytest.raises(InvalidInputError, match="pard_token=250.*ptd_token_id=7") as e:
        convert(src, tiny_llama_verifier_dir, speculative_tokens=4)
    assert e.value.code == "conflicting_keys"
    # the flag may not contradict the checkpoint either
    src = fp.to_aws(ref, tmp_path / "aws2")
    with pytest.raises(InvalidInputError, match="contradicts"):
        convert(src, tiny_llama_verifier_dir, speculative_tokens=4, mask_token_id=3)


def test_aux_ids_never_defaulted(ref, tiny_llama_verifier_dir, tmp_path):
    from specconv.errors import InvalidInputError

    src = fp.to_aws(ref, tmp_path / "aws", aux_in_config=False)
    with pytest.raises(InvalidInputError) as e:
        convert(src, tiny_llama_verifier_dir, speculative_tokens=4)
    assert e.value.code == "missing_layer_ids"
    assert "eagle_config.eagle_aux_hidden_state_layer_ids" in e.value.message + (e.value.hint or "")
    assert "--aux-layer-ids" in (e.value.hint or "")
    rep = convert(src, tiny_llama_verifier_dir, speculative_tokens=4, aux_layer_ids=[1, 3, 5])
    assert rep.plan["config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]
    assert rep.plan["layer_ids"]["source_convention"] == "override"
    # a wrong count contradicts the aux-feature width (mask_hidden / fc)
    with pytest.raises(InvalidInputError, match="2 aux layers"):
        convert(src, tiny_llama_verifier_dir, speculative_tokens=4, aux_layer_ids=[1, 3])
    # out of the verifier's range [0, 6]
    with pytest.raises(InvalidInputError, match="outside"):
        convert(src, tiny_llama_verifier_dir, speculative_tokens=4, aux_layer_ids=[1, 3, 7])


def test_speculative_tokens_required_and_bounded(ref, tiny_llama_verifier_dir, tmp_path):
    from specconv.errors import InvalidInputError

    src = fp.to_aws(ref, tmp_path / "aws")
    with pytest.raises(InvalidInputError) as e:
        convert(src, tiny_llama_verifier_dir)
    assert e.value.code == "missing_speculative_tokens" and "--speculative-tokens" in e.value.hint
    src = fp.to_aws(ref, tmp_path / "aws2", num_depths=4)
    assert convert(src, tiny_llama_verifier_dir).plan["config"]["speculators_config"]["proposal_methods"][0][
        "speculative_tokens"] == 4
    rep = convert(src, tiny_llama_verifier_dir, speculative_tokens=2)
    assert rep.plan["config"]["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 2
    with pytest.raises(InvalidInputError, match="exceeds the 4 depths"):
        convert(src, tiny_llama_verifier_dir, speculative_tokens=5)


def test_norm_before_residual_config_or_flag(ref, tiny_llama_verifier_dir, tmp_path):
    from specconv.errors import InvalidInputError

    src = fp.to_aws(ref, tmp_path / "aws", nbr_in_config=False)
    with pytest.raises(InvalidInputError) as e:
        convert(src, tiny_llama_verifier_dir, speculative_tokens=4)
    assert e.value.code == "missing_norm_before_residual" and "--norm-before-residual" in e.value.hint
    rep = convert(src, tiny_llama_verifier_dir, speculative_tokens=4, norm_before_residual=True)
    assert rep.plan["config"]["norm_before_residual"] is True
    src = fp.to_aws(ref, tmp_path / "aws2")  # config says true
    with pytest.raises(InvalidInputError, match="contradicts"):
        convert(src, tiny_llama_verifier_dir, speculative_tokens=4, norm_before_residual=False)


def test_qwen3_layers_give_qwen3_model_type(tiny_verifier_dir, tmp_path):
    from interop import load_with_speculators, run_speculators_forward

    ref = fp.build_speculators_peagle(tiny_verifier_dir, tmp_path / "ref", layers=1, seed=4)
    assert any("q_norm" in n for n in fp.load_tensors(ref))
    src = fp.to_aws(ref, tmp_path / "aws")
    cfg = fp.read_json(src / "config.json")
    assert cfg["model_type"] == "llama"  # the AWS config says llama; the tensors decide
    out = tmp_path / "out"
    rep = convert(src, tiny_verifier_dir, out, speculative_tokens=3)
    assert rep.plan["config"]["transformer_layer_config"]["model_type"] == "qwen3"
    assert "peagle-model-type-from-tensors" in codes(rep)
    run_speculators_forward(load_with_speculators(out, tiny_verifier_dir))


def test_missing_embedding_taken_from_verifier(ref1, tiny_llama_verifier_dir, tmp_path):
    import torch

    src = fp.to_aws(ref1, tmp_path / "aws", keep_embed=False)
    out = tmp_path / "out"
    rep = convert(src, tiny_llama_verifier_dir, out, speculative_tokens=2)
    assert "embed-from-verifier" in codes(rep)
    rec = json.loads((out / "specconv.json").read_text())["conversion"]
    assert rec["tensors"]["embed_tokens.weight"]["fate"] == "from_verifier"
    v = fp.load_tensors(tiny_llama_verifier_dir)
    assert torch.equal(fp.load_tensors(out)["embed_tokens.weight"], v["model.embed_tokens.weight"])


def test_bad_mask_hidden_and_missing_mask_hidden(ref, tiny_llama_verifier_dir, tmp_path):
    from safetensors.torch import save_file

    from specconv.errors import InvalidInputError

    src = fp.to_aws(ref, tmp_path / "aws")
    t = fp.load_tensors(src)
    t["mask_hidden"] = t["mask_hidden"][:, :128].contiguous()
    save_file(t, str(src / "model.safetensors"))
    with pytest.raises(InvalidInputError, match="mask_hidden.*needs 192") as e:
        convert(src, tiny_llama_verifier_dir, speculative_tokens=4)
    assert e.value.code == "mask_hidden_shape"
    t.pop("mask_hidden")
    save_file(t, str(src / "model.safetensors"))
    cfg = fp.read_json(src / "config.json")
    assert "pard_token" in cfg  # still detected as F9 through the config key
    with pytest.raises(InvalidInputError, match="no mask_hidden"):
        convert(src, tiny_llama_verifier_dir, speculative_tokens=4)


def test_unknown_tensor_refused_by_name(ref, tiny_llama_verifier_dir, tmp_path):
    import torch
    from safetensors.torch import save_file

    from specconv.errors import UnsupportedFormatError

    src = fp.to_aws(ref, tmp_path / "aws")
    t = fp.load_tensors(src)
    t["medusa_head.0.weight"] = torch.zeros(4, 4)
    save_file(t, str(src / "model.safetensors"))
    with pytest.raises(UnsupportedFormatError, match="medusa_head.0.weight"):
        convert(src, tiny_llama_verifier_dir, speculative_tokens=4)


def test_detection(ref, tmp_path):
    from specconv.converters import SourceInfo, detect

    src = fp.to_aws(ref, tmp_path / "aws")
    assert detect(SourceInfo.open(src)).format_id == "aws_peagle"
    cfg = fp.read_json(src / "config.json")
    cfg.pop("pard_token")
    fp.write_json(src / "config.json", cfg)  # mask_hidden alone is enough (§16 rule 5)
    assert detect(SourceInfo.open(src)).format_id == "aws_peagle"


def test_cli_flags_reach_the_converter(ref, tiny_llama_verifier_dir, tmp_path):
    src = fp.to_aws(ref, tmp_path / "aws", aux_in_config=False, nbr_in_config=False)
    base = ["convert", src, "--verifier", tiny_llama_verifier_dir, "--verifier-name", HUB]
    r = invoke(*base, "-o", tmp_path / "bad", catch=True)
    assert r.code == 3 and not (tmp_path / "bad").exists()
    out = tmp_path / "out"
    r = invoke(*base, "-o", out, "--aux-layer-ids", "1,3,5", "--speculative-tokens", "4", "--norm-before-residual",
               catch=True)
    assert r.code == 0, r.output
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5] and cfg["norm_before_residual"] is True
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
