"""The bundled trained drafter (examples/smollm2-dflash-b8, z-lab DFlash) converted against
the real SmolLM2 verifier, exported to ONNX and run as the drafter of the acceptance loop
with ONNX Runtime: fp32 greedy tokens identical to the torch run, τ equal; then its graph
is compiled ahead of time by TensorRT-RTX on the CPU (``build-engine --builder rtx``)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from cli_runner import invoke  # noqa: E402


@pytest.mark.slow
def test_bundled_drafter_export_and_validate_onnx(bundled_drafter_copy, tmp_path, smollm2_dir):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = bundled_drafter_copy  # conftest: the conversion; export and validate write into it
        # verifier taken from the record; fp32: one graph, written once (no fp32/ twin)
        code, exp = invoke("export", "onnx", str(out), "--dtype", "float32", "--outputs", "ids,logprobs,logits",
                           catch=True).code_json
        assert code == 0, exp
        assert exp["contains_verifier_weights"] is True  # full-vocab DFlash: SmolLM2's tied embedding baked in
        assert exp["census"]["Attention"] == 2 and exp["census"]["RMSNormalization"] >= 5
        p32 = exp["parity"]["drafter.onnx"]
        assert list(exp["parity"]) == ["drafter.onnx"] and not (out / "onnx" / "fp32").exists()
        assert p32["passed"] and p32["top1"] == 1.0 and p32["max_abs"] <= 1e-3
        data = out / "onnx" / "drafter.onnx.data"
        assert data.stat().st_size < 1.2 * 49152 * 576 * 4 + 20e6  # the tied weight is stored once
        code, rep = invoke("validate", str(out), "--verifier", str(smollm2_dir), "--onnx", str(out / "onnx"),
                           "--prompts", "humaneval", "--num-prompts", "2", "--max-new-tokens", "24",
                           "--dtype", "float32", "--report-dir", str(tmp_path / "rep"), catch=True).code_json
        assert code == 0, rep
        ox = rep["onnx"]
        assert ox["graph_dtype"] == "float32"
        assert ox["tokens_identical"] is True
        assert ox["drafts"]["drafts"] > 0
        assert ox["drafts"]["mismatches"] == ox["drafts"]["near_tie_mismatches"]
        if ox["drafts"]["near_tie_mismatches"] == 0:
            assert ox["tau_equal"] and ox["onnx"]["acceptance_length"] == ox["torch"]["acceptance_length"]
        assert ox["torch"]["acceptance_length"] > 1.0
        assert rep["gates"]["onnx"] is True and rep["passed"] is True
        try:
            import tensorrt_rtx  # noqa: F401
        except ImportError:
            return  # the trt-rtx extra is optional; tests/export/test_build_engine.py says so too
        if torch.cuda.is_available():
            return
        code, eng = invoke("build-engine", str(out), "--builder", "rtx", "--compute-capability", "8.9",
                           "--profile", "batch=1:1:2,context=1:64:256", catch=True).code_json
        assert code == 0, eng
        plan = out / "trt" / eng["key"] / "drafter.plan"
        assert plan.stat().st_size > 1_000_000 and eng["variants"] == [eng["key"]]
        assert (json.loads((out / "trt" / "manifest.json").read_text())["variants"][0]["plan_sha256"]
                == eng["plan_sha256"])
        assert eng["onnx_in_memory"]["attributes"] == [
            {"op_type": "Attention", "name": "TRT_decomposable", "value": 1, "count": 2}]
        assert eng["contains_verifier_weights"] is True  # the graph's, so push gates trt/ for it too
    finally:
        torch.set_num_threads(n)
