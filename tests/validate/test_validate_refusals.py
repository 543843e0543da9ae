"""``validate`` refuses, as unsupported input (exit 3) and before anything is written, the
Speculators dirs specconv does not describe (issue 24 item 4): a ``speculators_model_type``
no description of ``specconv/format/algorithms.py`` names, and quantized weights. The
converter registry's own detection decides (``speculators_other``, ``quantized_drafter``),
so ``convert``, ``inspect`` and ``validate`` say the same words.

Inputs are written by speculators 0.9.0 itself: ``from_training_args`` + ``save_pretrained``
of its DFlash2, XPress and EAGLE-3 models, and its MTP config (an MTP model needs a verifier
with native ``mtp.*`` weights; the type is all the refusal reads). The FP8-block drafter is a
speculators DFlash whose Linear weights are stored the way compressed-tensors' FP8-block
scheme writes them (``float8_e4m3fn`` weight + float32 ``weight_scale`` per 128×128 block,
``quantization_config.quant_method: compressed-tensors``, ``format: float-quantized``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("speculators")

import fixtures_peagle as fp  # noqa: E402
from cli_runner import invoke, validate  # noqa: E402

UNDESCRIBED = ("xpress", "eagle3", "mtp")


def _block_config(v: Path):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(v)
    cfg.num_hidden_layers, cfg.layer_types = 1, ["sliding_attention"]
    cfg.sliding_window, cfg.use_sliding_window = 32, True
    return cfg


def _speculators_dir(kind: str, v: Path, out: Path) -> Path:
    """A drafter of speculators type ``kind`` saved by speculators 0.9.0."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models import DFlash2DraftModel, Eagle3DraftModel, MTPSpeculatorConfig
    from speculators.models.xpress import XPressDraftModel
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import AutoConfig

    block = dict(verifier_name_or_path=str(v), draft_vocab_size=256, block_size=4, target_layer_ids=[1, 3, 4],
                 mask_token_id=5, draft_attn_impl="eager")
    if kind in ("dflash2", "xpress"):
        cls = DFlash2DraftModel if kind == "dflash2" else XPressDraftModel
        cls.from_training_args(_block_config(v), **block).save_pretrained(out)
    elif kind == "eagle3":
        Eagle3DraftModel.from_training_args(AutoConfig.from_pretrained(v), verifier_name_or_path=str(v), num_layers=1,
                                            draft_vocab_size=256, target_layer_ids=[1, 3, 4],
                                            norm_before_residual=False, ttt_steps=3,
                                            draft_attn_impl="eager").save_pretrained(out)
    else:
        sc = SpeculatorsConfig(algorithm="mtp", default_proposal_method="greedy",
                               proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
                               verifier=VerifierConfig.from_pretrained(str(v)))
        MTPSpeculatorConfig(transformer_layer_config=AutoConfig.from_pretrained(v),
                            speculators_config=sc).save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["speculators_model_type"] == kind
    return out


#: compressed-tensors' FP8-block preset as it lands in ``config.json`` (``QuantizationScheme``
#: FP8_BLOCK: 8-bit float weights, symmetric, static 128×128 blocks; dynamic per-group activations).
FP8_BLOCK = {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
             "ignore": ["lm_head"], "config_groups": {"group_0": {
                 "targets": ["Linear"],
                 "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "block",
                             "block_structure": [128, 128], "dynamic": False},
                 "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "group",
                                       "group_size": 128, "dynamic": True}}}}


def _fp8_block(src: Path, out: Path) -> Path:
    """``src`` (a speculators DFlash dir) with its decoder Linear weights FP8-block quantized."""
    from safetensors.torch import load_file, save_file

    out.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "quantization_config": FP8_BLOCK}, indent=2))
    tensors = {}
    for name, t in load_file(src / "model.safetensors").items():
        if name.startswith("layers.") and name.endswith("_proj.weight"):
            rows, cols = t.shape
            tensors[name] = t.float().to(torch.float8_e4m3fn)
            tensors[name + "_scale"] = torch.ones(math.ceil(rows / 128), math.ceil(cols / 128))
        else:
            tensors[name] = t
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, tiny_verifier_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("unsupported")
    out = {kind: _speculators_dir(kind, tiny_verifier_dir, root / kind) for kind in (*UNDESCRIBED, "dflash2")}
    dflash = fp.build_speculators_block(tiny_verifier_dir, root / "dflash", "dflash")
    out["fp8_block"] = _fp8_block(dflash, root / "fp8_block")
    return out


def _snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def _validate(d: Path, verifier: Path, tmp_path: Path) -> dict:
    before = _snapshot(d)
    r = validate(d, verifier, "--report-dir", tmp_path / "report", catch=True)
    assert r.code == 3, r.output
    assert _snapshot(d) == before and not (tmp_path / "report").exists()  # nothing written, anywhere
    return json.loads(r.stdout)


@pytest.mark.parametrize("kind", UNDESCRIBED)
def test_validate_refuses_an_undescribed_type_before_writing(dirs, tiny_verifier_dir, tmp_path, kind):
    from specconv.format.algorithms import algorithm_names

    out = _validate(dirs[kind], tiny_verifier_dir, tmp_path)
    assert out["error"] == "unsupported_format", out
    assert f"(speculators_other, speculators_model_type {kind!r})" in out["message"]
    assert f"specconv describes only {', '.join(algorithm_names())}" in out["message"]


def test_the_refusal_asks_the_algorithm_table(dirs, monkeypatch):
    """A type gains validation when a description names it: no list of refused names anywhere."""
    from specconv.format import algorithms
    from specconv.validate.run import _refuse_unsupported

    _refuse_unsupported(dirs["dflash2"], "dflash2")  # described since DFlash2 got its description: not refused
    with pytest.raises(Exception, match="speculators_other"):
        _refuse_unsupported(dirs["xpress"], "xpress")
    monkeypatch.setattr(algorithms, "ALGORITHMS", {**algorithms.ALGORITHMS, "xpress": algorithms.DFLASH})
    _refuse_unsupported(dirs["xpress"], "xpress")  # described now: not refused


def test_a_quantized_speculators_dir_is_refused_with_what_is_true(dirs, tiny_verifier_dir, tmp_path):
    """An FP8-block (compressed-tensors) Speculators drafter: not validated, not converted, and
    told that it serves as it is (speculators and vLLM load it), in the same words everywhere."""
    from specconv.converters import REGISTRY

    d = dirs["fp8_block"]
    reason = REGISTRY["quantized_drafter"].refusal
    assert "does not convert or validate quantized drafters" in reason and "serves as it is" in reason
    assert "no place" not in reason
    out = _validate(d, tiny_verifier_dir, tmp_path)
    assert out["error"] == "unsupported_format" and reason in out["message"], out
    r = invoke("convert", d, "--verifier", tiny_verifier_dir, "-o", tmp_path / "out", catch=True)
    assert r.code == 3 and reason in json.loads(r.stdout)["message"] and not (tmp_path / "out").exists()
    r = invoke("inspect", d, catch=True)
    assert r.code == 3 and json.loads(r.stdout)["reason"] == reason  # inspect: a refused format is exit 3
