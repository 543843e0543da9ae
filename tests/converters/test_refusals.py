"""converters/refusals.py: every refused format is detected by name, reported by
``specconv inspect`` (exit 3, JSON ``format``/``supported: false``/``reason``) without
reading tensor data, refused by ``specconv convert`` before anything is written, and wins
over the supported format it would otherwise be mistaken for.

Inputs: ``tests/fixtures_dspark.make_refusal`` (the smallest trigger per rule;
``REFUSAL_CASES`` lists every (trigger, format id) pair). Refused ids covered:
dflash2_variant, lilicorr, laguna_dflash, mimo_dflash, domino, causal_dflash, gemma4_dspark, mla_dspark,
deepseek_v4_dspark, quantized_drafter, no_draft_body, eagle3, modelopt_eagle_parallel_heads.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from cli_runner import invoke  # noqa: E402
from fixtures_dflash import cli_convert  # noqa: E402
from fixtures_dspark import (  # noqa: E402
    REFUSAL_CASES,
    make_deepspec_dspark,
    make_modelopt_dspark,
    make_refusal,
    make_specforge_dspark,
    make_zlab_dflash,
)
from specconv.converters import REGISTRY, SourceInfo, detect  # noqa: E402


@pytest.fixture(scope="module")
def refusal_dirs(tmp_path_factory, tiny_verifier_dir):
    base = tmp_path_factory.mktemp("refusals")
    return {kind: make_refusal(kind, base / kind.replace(":", "_"), tiny_verifier_dir) for kind, _ in REFUSAL_CASES}


@pytest.fixture
def no_tensor_data(monkeypatch):
    """Make any read of tensor *data* fail (headers stay readable)."""
    import torch

    from specconv.tensors import TensorStore

    def boom(*a, **k):
        raise AssertionError("tensor data was read during detection")

    for m in ("read_bytes", "read_tensor", "read_numpy"):
        monkeypatch.setattr(TensorStore, m, boom)
    monkeypatch.setattr(torch, "load", boom)
    import safetensors.torch as st

    monkeypatch.setattr(st, "load_file", boom)


@pytest.mark.parametrize("kind,fid", REFUSAL_CASES, ids=[k for k, _ in REFUSAL_CASES])
def test_inspect_reports_refusal_without_reading_tensors(refusal_dirs, kind, fid, no_tensor_data):
    code, rep, _ = invoke("inspect", refusal_dirs[kind]).code_json_stderr
    assert code == 3
    assert rep["format"] == fid
    assert rep["supported"] is False
    assert rep["reason"] == REGISTRY[fid].refusal and rep["reason"]


@pytest.mark.parametrize("kind,fid", REFUSAL_CASES, ids=[k for k, _ in REFUSAL_CASES])
def test_convert_refuses_before_writing(refusal_dirs, kind, fid, tiny_verifier_dir, tmp_path, no_tensor_data):
    out = tmp_path / "out"
    code, rep, err = cli_convert(refusal_dirs[kind], tiny_verifier_dir, out)
    assert code == 3
    assert rep["error"] == "unsupported_format"
    assert f"({fid}) is not supported" in rep["message"]
    assert not out.exists()


#: refusals that would otherwise be converted by a supported (generic) converter
SHADOWED = {
    "laguna_dflash": "zlab_dflash", "laguna_dflash:tensors": "zlab_dflash", "mimo_dflash": "zlab_dflash",
    "mimo_dflash:file": "zlab_dflash", "mimo_dflash:tensor": "zlab_dflash", "dflash2_variant:config": "zlab_dflash",
    "dflash2_variant:tensors": "zlab_dflash", "causal_dflash": "nemo_dflash", "quantized_drafter": "zlab_dflash",
    "quantized_drafter:scale": "zlab_dflash", "quantized_drafter:hf_quant": "zlab_dflash",
    "mla_dspark": "specforge_dspark", "mla_dspark:kv_lora": "deepspec_dspark", "no_draft_body": "zlab_dflash",
}


@pytest.mark.parametrize("kind,shadowed", sorted(SHADOWED.items()))
def test_refusal_wins_over_generic_match(refusal_dirs, kind, shadowed):
    src = SourceInfo.open(refusal_dirs[kind])
    assert REGISTRY[shadowed].detect(src), f"{shadowed} no longer matches {kind}: the order test is vacuous"
    fid = dict(REFUSAL_CASES)[kind]
    from specconv.converters.dispatch import candidates

    order = candidates(src)
    assert fid in order and shadowed in order and order.index(fid) < order.index(shadowed)
    assert detect(src).format_id == fid


# ------------------------------------------------------------------- no false positives
@pytest.fixture(scope="module")
def supported_dirs(tmp_path_factory, tiny_verifier_dir):
    b = tmp_path_factory.mktemp("supported")
    return {
        "deepspec_dspark": make_deepspec_dspark(b / "ds", tiny_verifier_dir),
        "specforge_dspark": make_specforge_dspark(b / "sf", tiny_verifier_dir, logit_head=True),
        "modelopt_dspark": make_modelopt_dspark(b / "mo", tiny_verifier_dir, markov_head_type="gated"),
        "zlab_dflash": make_zlab_dflash(b / "zl", tiny_verifier_dir),
    }


@pytest.mark.parametrize("fid", ["deepspec_dspark", "specforge_dspark", "modelopt_dspark", "zlab_dflash"])
def test_no_refusal_fires_on_supported_sources(supported_dirs, fid):
    src = SourceInfo.open(supported_dirs[fid])
    fired = [c.format_id for c in REGISTRY.values() if not c.supported and c.detect(src)]
    assert fired == []
    assert detect(src).format_id == fid


def test_eagle3_refusal_leaves_peagle_markers_alone(tmp_path, tiny_verifier_dir):
    import torch
    from safetensors.torch import load_file, save_file

    from specconv.converters.refusals import Eagle3

    d = make_refusal("eagle3", tmp_path / "e", tiny_verifier_dir)
    assert Eagle3.detect(SourceInfo.open(d))
    sd = load_file(str(d / "model.safetensors"))
    sd["mask_hidden"] = torch.zeros(1, 1, 192)
    save_file(sd, str(d / "model.safetensors"))
    assert not Eagle3.detect(SourceInfo.open(d))  # AWS P-EAGLE layout: a mask_hidden tensor
    d2 = make_refusal("eagle3", tmp_path / "e2", tiny_verifier_dir)
    cfg = json.loads((d2 / "config.json").read_text())
    cfg["ptd_token_id"] = 7
    (d2 / "config.json").write_text(json.dumps(cfg))
    assert not Eagle3.detect(SourceInfo.open(d2))  # early P-EAGLE mask key


def test_eagle3_refusal_points_to_speculators_convert():
    assert "speculators convert --algorithm eagle3" in REGISTRY["eagle3"].refusal


def test_parallel_heads_refusal_points_to_modelopt():
    r = REGISTRY["modelopt_eagle_parallel_heads"].refusal
    assert "ModelOpt" in r and "TensorRT-LLM" in r


def test_corrupt_weights_are_not_reported_as_missing_body(tmp_path, tiny_verifier_dir):
    d = make_refusal("no_draft_body", tmp_path / "c", tiny_verifier_dir)
    (d / "model.safetensors").write_bytes(b"\x00" * 16)  # unreadable header
    assert not REGISTRY["no_draft_body"].detect(SourceInfo.open(d))


def test_jetspec_causal_false_is_not_refused(tmp_path, tiny_verifier_dir):
    d = make_refusal("causal_dflash", tmp_path / "c", tiny_verifier_dir)
    cfg = json.loads((d / "config.json").read_text())
    cfg["dflash_config"]["causal"] = False
    (d / "config.json").write_text(json.dumps(cfg))
    assert detect(SourceInfo.open(d)).format_id == "nemo_dflash"


def test_every_refusal_class_is_covered_here():
    refused = {c.format_id for c in REGISTRY.values() if not c.supported and c.__module__.endswith("refusals")}
    assert refused <= {fid for _, fid in REFUSAL_CASES}


def test_an_unknown_format_names_every_algorithm_of_the_table(tmp_path, tiny_verifier_dir):
    """The unknown-format error lists the algorithms from ``format/algorithms.py`` (a new entry needs no edit)."""
    from specconv.format.algorithms import ALGORITHMS

    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"architectures": ["SomethingElse"], "model_type": "other"}))
    import numpy as np
    from safetensors.numpy import save_file

    save_file({"blocks.0.mixer.weight": np.zeros((4, 4), np.float32)}, str(src / "model.safetensors"))
    code, rep, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == 3 and rep["error"] == "unsupported_format", rep
    assert " / ".join(a.display_name for a in ALGORITHMS.values()) in rep["message"], rep["message"]
    assert "DFlash2" in rep["message"]
