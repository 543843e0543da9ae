"""Self-checks of tests/interop.py: it loads dirs written by speculators 0.9.0 itself for
all three algorithms, runs their forward, and catches a dir whose tensors do not land."""

from __future__ import annotations

import json
import shutil

import pytest

pytestmark = pytest.mark.peer

pytest.importorskip("speculators")
pytest.importorskip("loguru")

from interop import check_loaded, load_with_speculators, run_speculators_forward  # noqa: E402


def _layer_cfg():
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, num_hidden_layers=2, max_position_embeddings=512,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def _saved(algo, verifier, out):
    from speculators.models import DFlashDraftModel, DSparkDraftModel, PEagleDraftModel

    common = dict(verifier_name_or_path=str(verifier), draft_vocab_size=256, mask_token_id=255, draft_attn_impl="eager")
    if algo == "dflash":
        m = DFlashDraftModel.from_training_args(_layer_cfg(), block_size=4, target_layer_ids=[1, 3, 6], **common)
    elif algo == "dspark":
        m = DSparkDraftModel.from_training_args(_layer_cfg(), block_size=4, target_layer_ids=[1, 3, 6], markov_rank=8,
                                                **common)
    else:
        m = PEagleDraftModel.from_training_args(_layer_cfg(), target_layer_ids=[2, 3, 6], num_depths=4, **common)
    m.save_pretrained(out)
    # our outputs record a Hub id; speculators' own save records the path it was given
    cfg = json.loads((out / "config.json").read_text())
    cfg["speculators_config"]["verifier"]["name_or_path"] = "org/not-reachable"
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.mark.parametrize("algo", ["dflash", "dspark", "peagle"])
def test_loads_and_runs_speculators_saved_dirs(algo, tiny_verifier_dir, tmp_path):
    out = _saved(algo, tiny_verifier_dir, tmp_path / algo)
    m = load_with_speculators(out, tiny_verifier_dir)  # the recorded Hub id is never contacted
    assert m.config.speculators_model_type == algo
    logits = run_speculators_forward(m, num_blocks=2)
    assert logits.shape[0] == 1 and logits.shape[-1] == 256
    if algo != "peagle":
        assert logits.shape[1] == 2 * 4
    # same seed, same inputs, same logits (the helper is deterministic)
    assert (run_speculators_forward(m, num_blocks=2) == logits).all()


def test_check_catches_a_tensor_speculators_does_not_know(tiny_verifier_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    out = _saved("dflash", tiny_verifier_dir, tmp_path / "d")
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    t = load_file(str(bad / "model.safetensors"))
    t["fc_renamed.weight"] = t.pop("fc.weight")
    save_file(t, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(AssertionError, match="fc_renamed.weight"):
        load_with_speculators(bad, tiny_verifier_dir)
    m = load_with_speculators(bad, tiny_verifier_dir, check=False)
    with pytest.raises(AssertionError):
        check_loaded(m, bad)
