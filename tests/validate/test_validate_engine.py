"""``specconv validate DIR --engine PATH``: every refusal before a TensorRT object exists
(fake ``tensorrt`` module, monkeypatched CUDA check), the version / compute-capability
rules, the name-based I/O binding order, the KL helper, and the real run (``gpu``)."""

from __future__ import annotations

import json
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from test_build_engine import GPU, fake_trt, onnx_dir  # noqa: E402,F401
from test_export_onnx import exported  # noqa: E402,F401

from cli_runner import invoke  # noqa: E402
from specconv.engines.tensorrt import build as engine  # noqa: E402
from specconv.engines.tensorrt import engine_drafter as ed  # noqa: E402
from specconv.engines.tensorrt.build import BuildOptions, build_engine_dir  # noqa: E402
from specconv.errors import InvalidInputError  # noqa: E402
from specconv.validate.metrics import kl_rows  # noqa: E402
from specconv.validate.runtimes import judge, runtimes  # noqa: E402

KEY = "trt11.4.0-cu13-sm90-fp32"


@pytest.fixture
def built(onnx_dir, monkeypatch):  # noqa: F811
    """``DIR/trt/<key>/`` built by the real build path with the fake TensorRT (sm 9.0)."""
    monkeypatch.setattr(engine, "gpu_info", lambda: GPU)
    build_engine_dir(onnx_dir, None, BuildOptions(), trt_module=fake_trt([]))
    return onnx_dir, onnx_dir / "trt" / KEY


_ENGINE_OBJ = object()  # the deserialized engine of runtime_module's fake runtime


def runtime_module(calls: list, version="11.4.0", engine_obj=_ENGINE_OBJ):
    """A fake runtime module: records Logger / Runtime / deserialize calls."""
    class Runtime:
        def __init__(self, logger):
            calls.append(("Runtime", ()))

        def __setattr__(self, k, v):
            calls.append((f"runtime.{k}", (v,)))

        def deserialize_cuda_engine(self, b):
            calls.append(("deserialize_cuda_engine", (len(b),)))
            return engine_obj

    class Logger:
        WARNING = 2

        def __init__(self, sev):
            calls.append(("Logger", (sev,)))

    return types.SimpleNamespace(__version__=version, Runtime=Runtime, Logger=Logger)


def _cuda(monkeypatch, on=True, cc="9.0", trt=None):
    monkeypatch.setattr(ed, "cuda_available", lambda: on)
    monkeypatch.setattr(ed, "_gpu_cc", lambda: cc)
    if trt is not None:
        monkeypatch.setattr(ed, "import_runtime", lambda builder: trt)


def _code(fn):
    with pytest.raises(InvalidInputError) as e:
        fn()
    assert e.value.exit_code == 3
    return e.value.code


def test_version_rules():
    assert ed.version_ok("11.4.0", "11.4.0", False)
    assert ed.version_ok("11.4.0", "11.4.0.106", False)  # build recorded fewer components
    assert not ed.version_ok("11.4.0", "11.5.0", False)
    assert not ed.version_ok("11.5.0", "11.4.0", True)  # never onto an older runtime
    assert ed.version_ok("11.4.0", "11.5.1", True)
    assert ed.version_ok("10.15.1", "11.4.0", True)  # 10.x version-compatible engines run on 11
    assert not ed.version_ok("10.15.1", "11.4.0", False)
    assert not ed.version_ok("11.4.0", "12.0.0", True)  # nothing else crosses majors


def test_compute_capability_rules():
    b = {"builder": "tensorrt", "compute_capability": "9.0", "hardware_compat": "none"}
    assert ed.cc_ok(b, "9.0") and not ed.cc_ok(b, "8.9")
    amp = {**b, "hardware_compat": "ampere+"}
    assert ed.cc_ok(amp, "8.0") and ed.cc_ok(amp, "12.0") and not ed.cc_ok(amp, "7.5")
    rtx = {"builder": "rtx", "compute_capability": None, "target_compute_capabilities": ["8.9", "12.0"]}
    assert ed.cc_ok(rtx, "12.0") and not ed.cc_ok(rtx, "9.0")


@pytest.mark.slow  # the real ONNX exports of test_export_onnx (~100 s on a busy 2-core machine)
def test_no_gpu_and_no_module_refused_before_any_tensorrt_object(built, monkeypatch):
    d, eng_dir = built
    calls: list = []
    _cuda(monkeypatch, on=False, trt=runtime_module(calls))
    assert _code(lambda: ed.EngineDrafter(eng_dir, d)) == "gpu_missing"
    r = invoke("validate", d, "--verifier", "x", "--engine", eng_dir, catch=True)
    assert r.code == 3 and json.loads(r.stdout)["error"] == "gpu_missing"
    assert calls == []
    monkeypatch.undo()  # the real import_runtime, with the tensorrt import failing
    monkeypatch.setattr(ed, "cuda_available", lambda: True)
    monkeypatch.setattr(ed, "_gpu_cc", lambda: "9.0")
    monkeypatch.setitem(__import__("sys").modules, "tensorrt", None)
    r = invoke("validate", d, "--verifier", "x", "--engine", eng_dir / "drafter.plan", catch=True)
    res = json.loads(r.stdout)
    assert r.code == 2 and res["error"] == "tensorrt_missing"  # a missing optional package (docs/cli.md)
    assert res["hint"] == "pip install 'specconv[tensorrt]' --extra-index-url https://pypi.nvidia.com"


@pytest.mark.slow  # the real ONNX exports of test_export_onnx (~100 s on a busy 2-core machine)
def test_version_and_cc_mismatch_refused(built, monkeypatch):
    d, eng_dir = built
    calls: list = []
    _cuda(monkeypatch, trt=runtime_module(calls, version="11.5.0"))
    assert _code(lambda: ed.EngineDrafter(eng_dir, d)) == "engine_version_mismatch"
    _cuda(monkeypatch, cc="8.9", trt=runtime_module(calls))
    assert _code(lambda: ed.EngineDrafter(eng_dir, d)) == "engine_cc_mismatch"
    assert calls == []
    # a version-compatible, hardware-compatible build loads on a later runtime and another GPU
    bj = eng_dir / "build.json"
    b = json.loads(bj.read_text())
    bj.write_text(json.dumps({**b, "version_compatible": True, "hardware_compat": "ampere+"}))
    _cuda(monkeypatch, cc="8.9", trt=runtime_module(calls, version="11.5.0", engine_obj=None))
    assert _code(lambda: ed.EngineDrafter(eng_dir, d)) == "engine_load_failed"  # the fake returns None
    names = [c[0] for c in calls]
    assert names == ["Logger", "Runtime", "runtime.engine_host_code_allowed", "deserialize_cuda_engine"]
    assert ("runtime.engine_host_code_allowed", (True,)) in calls


@pytest.mark.slow  # the real ONNX exports of test_export_onnx (~100 s on a busy 2-core machine)
def test_corrupt_plan_foreign_drafter_and_bad_paths(built, exported, monkeypatch, tmp_path):  # noqa: F811
    d, eng_dir = built
    calls: list = []
    _cuda(monkeypatch, trt=runtime_module(calls))
    other, _ = exported["dspark"]
    assert _code(lambda: ed.preflight_engine(eng_dir, other)) == "engine_other_drafter"
    # without the recorded drafter hashes, provenance comes from DIR/onnx/onnx_meta.json
    bj = eng_dir / "build.json"
    b = json.loads(bj.read_text())
    bj.write_text(json.dumps({k: v for k, v in b.items() if k not in ("drafter_files", "drafter_meta")}))
    plan, build, _ = ed.preflight_engine(eng_dir, d)
    assert plan == eng_dir / "drafter.plan" and "drafter_files" not in build
    assert _code(lambda: ed.preflight_engine(eng_dir, other)) == "engine_other_drafter"
    (eng_dir / "drafter.plan").write_bytes(b"PLAN-BYTE")  # truncated
    assert _code(lambda: ed.preflight_engine(eng_dir, d)) == "engine_corrupt"
    assert _code(lambda: ed.preflight_engine(tmp_path / "nope", d)) == "engine_not_found"
    (tmp_path / "drafter.plan").write_bytes(b"x")
    assert _code(lambda: ed.preflight_engine(tmp_path, d)) == "engine_build_json"
    assert calls == []


@pytest.mark.slow  # the real ONNX exports of test_export_onnx (~100 s on a busy 2-core machine)
def test_exclusive_with_onnx_and_vllm(built):
    d, eng_dir = built
    for extra in (["--onnx", "a.onnx"], ["--backend", "vllm"]):
        r = invoke("validate", d, "--verifier", "x", "--engine", eng_dir, *extra, catch=True)
        assert r.code == 2 and "mutually exclusive" in json.loads(r.stdout)["message"]


def test_run_engine_binds_inputs_before_sizing_outputs():
    calls: list = []
    DT = types.SimpleNamespace(FLOAT=0, INT32=1, BOOL=2, HALF=3)
    trt = types.SimpleNamespace(TensorIOMode=types.SimpleNamespace(INPUT=0, OUTPUT=1), DataType=DT)
    io = [("aux_hidden", 0, DT.HALF), ("block_ids", 0, DT.INT32), ("draft_ids", 1, DT.INT32)]

    class Eng:
        num_io_tensors = len(io)
        get_tensor_name = staticmethod(lambda i: io[i][0])
        get_tensor_mode = staticmethod(lambda n: dict((a, b) for a, b, _ in io)[n])
        get_tensor_dtype = staticmethod(lambda n: dict((a, c) for a, _, c in io)[n])

    class Ctx:
        def set_input_shape(self, n, s):
            calls.append(("shape", n, s))

        def set_tensor_address(self, n, p):
            calls.append(("addr", n))

        def get_tensor_shape(self, n):
            assert {c[1] for c in calls if c[0] == "shape"} == {"aux_hidden", "block_ids"}
            return (1, 2)

        def execute_async_v3(self, stream):
            calls.append(("exec", stream))
            return True

    feeds = {"aux_hidden": torch.zeros(1, 3, 4), "block_ids": torch.zeros(1, 2, dtype=torch.int64)}
    outs = ed.run_engine(trt, Eng(), Ctx(), feeds, 7, device="cpu")
    assert outs["draft_ids"].dtype == torch.int32 and outs["draft_ids"].shape == (1, 2)
    assert calls[-1] == ("exec", 7) and ("shape", "aux_hidden", (1, 3, 4)) in calls
    with pytest.raises(InvalidInputError, match="no feed"):
        ed.run_engine(trt, Eng(), Ctx(), {"aux_hidden": feeds["aux_hidden"]}, 0, device="cpu")


def test_kl_and_the_engine_rule():
    ref = torch.tensor([[2.0, 0.0, float("-inf")], [0.0, 0.0, 0.0]])
    assert torch.allclose(kl_rows(ref, ref), torch.zeros(2, dtype=torch.float64), atol=1e-7)
    assert (kl_rows(ref, torch.tensor([[0.0, 2.0, float("-inf")], [0.0, 0.0, 0.0]]))[0] > 0.5).item()
    rule, counts = runtimes()["tensorrt"].rule, {"mismatches": 3, "near_tie_mismatches": 0}
    verdict, passed, errors = judge(rule, 2.0, 2.05, counts, False, 0.0)  # tokens and drafts are not gated
    assert passed is True and errors == [] and verdict == {"tau_rel_diff": pytest.approx(0.025)}
    verdict, passed, errors = judge(rule, 2.0, 1.9, counts, True, 1.0)  # any temperature
    assert passed is False and "5.0% from torch tau 2 (> 3%)" in errors[0]


@pytest.mark.gpu
@pytest.mark.slow
def test_real_engine_validate_tau_within_3_percent(tmp_path, smollm2_dir):
    """The bundled drafter as a real TensorRT engine (GPU + full TensorRT only; never run
    here, docs/engines.md says so)."""
    if not torch.cuda.is_available():  # before any TensorRT object (CPU: segfault)
        pytest.skip("no CUDA GPU")
    pytest.importorskip("tensorrt")
    from test_export_bundled import TRAINED, _invoke

    out = tmp_path / "trained"
    code, res = _invoke("convert", str(TRAINED), "--verifier", str(smollm2_dir), "-o", str(out))
    assert code == 0, res
    code, exp = _invoke("export", "onnx", str(out), "--dtype", "float32", "--outputs", "ids,logprobs,logits")
    assert code == 0, exp
    code, eng = _invoke("build-engine", str(out), "--profile", "batch=1:1:1,context=1:256:1024")
    assert code == 0, eng
    code, rep = _invoke("validate", str(out), "--verifier", str(smollm2_dir), "--engine", eng["path"],
                        "--prompts", "humaneval", "--num-prompts", "2", "--max-new-tokens", "24",
                        "--device", "cuda", "--dtype", "float32", "--report-dir", str(tmp_path / "rep"))
    assert code == 0, rep
    e = rep["engine"]
    assert e["tau_rel_diff"] <= 0.03 and rep["gates"]["engine"] is True
    assert e["drafts"]["drafts"] > 0 and e["drafts"]["top1_agreement"] >= 0.95
    assert e["drafts"]["kl_mean"] is not None and e["drafts"]["kl_mean"] < 1e-2
