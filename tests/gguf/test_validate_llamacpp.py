"""``specconv validate --backend llamacpp`` (issue 18 item 4; docs/llamacpp.md).

The usage refusals need no llama.cpp build. The gate test serves a GGUF whose
``dflash.target_layers`` are shifted by one with the ``make llama-cpp`` build's
``llama-server`` (127.0.0.1) next to the SmolLM2 Q4_1 GGUF: G3 must fail (exit 4).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import fixtures_dflash as fd
from cli_runner import validate

pytest.importorskip("gguf")

REPO = Path(__file__).resolve().parents[2]
SMOL_HUB = "HuggingFaceTB/SmolLM2-135M-Instruct"
#: validate with the llama.cpp backend on the CPU
LLAMACPP = ("--backend", "llamacpp", "--device", "cpu")


@pytest.fixture(scope="module")
def bundled(tmp_path_factory, smollm2_dir) -> Path:
    out = tmp_path_factory.mktemp("vl") / "bundled"
    fd.api_convert(REPO / "examples" / "smollm2-dflash-b8", smollm2_dir, out, name=SMOL_HUB)
    return out


def test_temperature_above_zero_is_exit_2(bundled, smollm2_dir):
    r = validate(bundled, smollm2_dir, *LLAMACPP, "--temperature", "0.7", catch=True)
    assert r.code == 2 and "greedy only" in r.output, r.output


def test_llamacpp_and_onnx_are_exclusive(bundled, smollm2_dir, tmp_path):
    r = validate(bundled, smollm2_dir, *LLAMACPP, "--onnx", str(tmp_path / "x.onnx"), catch=True)
    assert r.code == 2 and "mutually exclusive" in r.output, r.output


def test_no_gguf_export_is_exit_3(bundled, smollm2_dir):
    r = validate(bundled, smollm2_dir, *LLAMACPP, catch=True)
    assert r.code == 3 and "gguf_missing" in r.output, r.output


@pytest.mark.server
@pytest.mark.usefixtures("llamacpp_build")
def test_a_gguf_with_target_layers_shifted_by_one_fails_the_gate(bundled, smollm2_dir, tmp_path):
    from specconv.engines.llamacpp.export import export_gguf_dir
    from specconv.record import file_hashes

    shifted = tmp_path / "shifted"
    shutil.copytree(bundled, shifted)
    cfg = json.loads((shifted / "config.json").read_text())
    cfg["aux_hidden_state_layer_ids"] = [i + 1 for i in cfg["aux_hidden_state_layer_ids"]]
    (shifted / "config.json").write_text(json.dumps(cfg, indent=2))
    export_gguf_dir(shifted, check=False)
    d = tmp_path / "served"
    shutil.copytree(bundled, d)
    shutil.copytree(shifted / "gguf", d / "gguf")  # the shifted GGUF, recorded as d's export
    meta = json.loads((d / "gguf" / "gguf_meta.json").read_text())
    meta["drafter_files"] = file_hashes(d)
    (d / "gguf" / "gguf_meta.json").write_text(json.dumps(meta))
    r = validate(d, smollm2_dir, *LLAMACPP, "--num-prompts", "2", "--max-new-tokens", "24",
                 "--report-dir", str(tmp_path / "report"), catch=True)
    assert r.code == 4, r.output
    rep = json.loads((tmp_path / "report" / "validation.json").read_text())
    s = rep["llamacpp_serve"]
    assert s["commit"] == "0c1e570" and s["verifier_gguf"]["quantisation"] == "Q4_1"
    assert abs(s["tau"] - s["tau_torch"]) > s["band"], s
    assert rep["gates"]["acceptance"] is False and rep["gates"]["lossless"] is True, rep["gates"]  # G3 fails, lossless
    # llama-server was sent the torch loop's rendered ids: it evaluated exactly that many per prompt
    assert s["prompt_tokens"] == "count" and len(rep["prompts"]["token_counts"]) == 2
    g3 = next(g for g in rep["gate_results"] if g["name"] == "acceptance")
    assert not [e for e in g3["errors"] if "prompt tokens" in e], g3["errors"]


@pytest.mark.slow
def test_the_target_gguf_is_found_by_the_recorded_verifier_name(bundled, smollm2_dir, tmp_path):
    """A local copy of the verifier (not the materialised cache dir) converted with --verifier-name:
    validate --backend llamacpp finds the target GGUF by the recorded name, as export gguf does
    (it refused with verifier_gguf_missing while export gguf found it)."""
    from specconv.engines.llamacpp.backend import find_target
    from specconv.verifier import resolve_verifier

    copy = tmp_path / "smollm2-copy"
    copy.mkdir()
    for f in smollm2_dir.iterdir():
        (copy / f.name).symlink_to(f)
    path, repo, target = find_target(bundled, resolve_verifier(str(copy)), None)
    assert path.name.endswith(".gguf") and repo and target["name"] == path.name
