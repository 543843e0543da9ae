"""``specconv build-engine``: builder logic against a fake ``tensorrt`` module (exact
calls, the in-memory TensorRT attributes), the missing-GPU / missing-TensorRT / version-1
exits, and a real TensorRT-RTX ahead-of-time build on the CPU (when the ``trt-rtx`` extra
is installed)."""

from __future__ import annotations

import json
import shutil
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from test_export_onnx import exported  # noqa: E402,F401

from cli_runner import invoke  # noqa: E402
from specconv.engines.tensorrt import build as engine  # noqa: E402
from specconv.engines.tensorrt.build import BuildOptions, build_engine_dir, parse_profile, profile_shapes  # noqa: E402
from specconv.errors import InvalidInputError, UsageError  # noqa: E402
from specconv.tensors import sha256_file  # noqa: E402

GPU = {"name": "Fake H100", "compute_capability": "9.0", "cuda": "13.0", "driver": "580.1"}
DYN = {"batch": {"min": 1, "max": 8}, "context": {"min": 1, "max": 4096}}


def fake_trt(calls: list, *, parse_ok=True, plan=b"PLAN-BYTES", version="11.4.0"):
    """A stand-in for the ``tensorrt`` module that records every call."""
    def rec(name):
        return lambda *a, **k: calls.append((name, a)) or None

    class Enum:
        def __init__(self, *names):
            for i, n in enumerate(names):
                setattr(self, n, i)

    class Parser:
        def __init__(self, network, logger):
            calls.append(("OnnxParser", ()))
            self.num_errors = 0 if parse_ok else 1

        def parse(self, model, path=None):  # OnnxParser.parse(model: buffer, path: str = None)
            calls.append(("parse", (bytes(model), path)))
            return parse_ok

        def get_error(self, i):
            return "In node 3 (Attention): unsupported"

    class Profile:
        set_shape = staticmethod(rec("set_shape"))

    class Cache:
        def serialize(self):
            return b"CACHE"

    class Config:
        def __setattr__(self, k, v):
            calls.append((f"config.{k}", (v,)))

        set_memory_pool_limit = staticmethod(rec("set_memory_pool_limit"))
        add_optimization_profile = staticmethod(rec("add_optimization_profile"))
        set_flag = staticmethod(rec("set_flag"))
        clear_flag = staticmethod(rec("clear_flag"))
        set_timing_cache = staticmethod(rec("set_timing_cache"))

        def create_timing_cache(self, b):
            calls.append(("create_timing_cache", (b,)))
            return Cache()

    class Builder:
        def __init__(self, logger):
            calls.append(("Builder", ()))
            self.logger = logger

        def create_network(self, flags):
            calls.append(("create_network", (flags,)))
            return object()

        def create_builder_config(self):
            return Config()

        def create_optimization_profile(self):
            return Profile()

        def build_serialized_network(self, network, config):
            calls.append(("build_serialized_network", ()))
            if plan is None:
                self.logger.log(1, "Error: could not find any implementation for node /layers.1/Attention")
            return plan

    class ILogger:
        def __init__(self):
            pass

    return types.SimpleNamespace(
        __version__=version, ILogger=ILogger, Builder=Builder, OnnxParser=Parser,
        NetworkDefinitionCreationFlag=Enum("STRONGLY_TYPED"), MemoryPoolType=Enum("WORKSPACE"),
        BuilderFlag=Enum("TF32", "VERSION_COMPATIBLE"),
        HardwareCompatibilityLevel=Enum("NONE", "AMPERE_PLUS"))


@pytest.fixture
def onnx_dir(exported, tmp_path):  # noqa: F811
    """A copy of the tiny P-EAGLE export (fp32, max context 16)."""
    src, _ = exported["peagle"]
    d = tmp_path / "drafter"
    shutil.copytree(src, d)
    return d


def test_parse_profile_defaults_and_errors():
    assert parse_profile("", DYN) == {"batch": (1, 4, 8), "context": (1, 1024, 4096)}
    assert parse_profile("batch=1:2:3,context=8:64:512", DYN) == {"batch": (1, 2, 3), "context": (8, 64, 512)}
    for bad, msg in [("beam=1:1:1", "unknown axis"), ("batch=4:2:8", "min <= opt"),
                     ("context=1:2:9999", "outside the graph's range"), ("batch=1:2", "MIN:OPT:MAX")]:
        with pytest.raises(UsageError, match=msg):
            parse_profile(bad, DYN)
    shapes = profile_shapes([{"name": "aux_hidden", "shape": ["batch", "context", 96]},
                             {"name": "block_ids", "shape": ["batch", 4]}, {"name": "w", "shape": [3]}],
                            {"batch": (1, 2, 8), "context": (1, 64, 512)})
    assert shapes == {"aux_hidden": ((1, 1, 96), (2, 64, 96), (8, 512, 96)),
                      "block_ids": ((1, 4), (2, 4), (8, 4))}


@pytest.mark.slow
def test_fake_tensorrt_build_calls_layout_and_manifest(onnx_dir, monkeypatch, tmp_path):
    monkeypatch.setattr(engine, "gpu_info", lambda: GPU)
    calls: list = []
    cache = tmp_path / "timing.cache"
    opts = BuildOptions(profile="batch=1:2:4,context=1:8:16", version_compatible=True, hardware_compat="ampere+",
                        builder_opt_level=3, timing_cache=str(cache))
    res = build_engine_dir(onnx_dir, None, opts, trt_module=fake_trt(calls))
    key = "trt11.4.0-cu13-sm90-fp32-ampere_plus-vc"
    assert res.extra("key") == key
    names = [c[0] for c in calls]
    assert names.index("Builder") < names.index("create_network") < names.index("parse")
    # the parsed bytes are the shipped graph plus TRT_decomposable=1 on every Attention node,
    # read with the graph's own path (external data beside it); the file itself is unchanged
    import onnx

    graph = onnx_dir / "onnx" / "drafter.onnx"
    (model, path), = [c[1] for c in calls if c[0] == "parse"]
    assert path == str(graph.resolve())
    parsed, shipped = onnx.load_from_string(model), onnx.load(str(graph), load_external_data=False)
    attn = [n for n in parsed.graph.node if n.op_type == "Attention"]
    assert len(attn) == 2 and all({a.name: a.i for a in n.attribute}["TRT_decomposable"] == 1 for n in attn)
    for n in shipped.graph.node:
        assert "TRT_decomposable" not in [a.name for a in n.attribute]
    for n in parsed.graph.node:  # nothing else differs
        n.ClearField("attribute")
    for n in shipped.graph.node:
        n.ClearField("attribute")
    assert parsed == shipped
    assert sha256_file(graph) == json.loads((onnx_dir / "onnx" / "onnx_meta.json").read_text())["files"]["drafter.onnx"]
    assert ("create_network", (1 << 0,)) in calls  # STRONGLY_TYPED
    assert ("clear_flag", (0,)) in calls  # TF32 off for an fp32 engine
    assert ("set_flag", (1,)) in calls  # VERSION_COMPATIBLE
    assert ("config.hardware_compatibility_level", (1,)) in calls
    assert ("config.builder_optimization_level", (3,)) in calls
    shapes = {c[1][0]: c[1][1:] for c in calls if c[0] == "set_shape"}
    assert shapes["aux_hidden"] == ((1, 1, 96), (2, 8, 96), (4, 16, 96))
    assert shapes["block_ids"] == ((1, 2), (2, 2), (4, 2))
    assert set(shapes) == {"aux_hidden", "context_ids", "block_ids", "ctx_position_ids",
                           "block_position_ids", "ctx_valid"}
    assert not any("FP16" in str(c) or "BF16" in str(c) for c in calls)
    out = onnx_dir / "trt" / key
    assert (out / "drafter.plan").read_bytes() == b"PLAN-BYTES"
    build = json.loads((out / "build.json").read_text())
    assert build["onnx_in_memory"]["attributes"] == [
        {"op_type": "Attention", "name": "TRT_decomposable", "value": 1, "count": 2}]
    assert build["gpu"] == "Fake H100" and build["compute_capability"] == "9.0" and build["driver"] == "580.1"
    assert build["profiles"][0]["ctx_valid"] == {"min": [1, 1], "opt": [2, 8], "max": [4, 16]}
    assert build["plan_sha256"] == __import__("hashlib").sha256(b"PLAN-BYTES").hexdigest()
    meta = json.loads((onnx_dir / "onnx" / "onnx_meta.json").read_text())
    assert build["contains_verifier_weights"] is meta["contains_verifier_weights"]  # push's trt/ gate reads it
    assert (out / "timing.cache").read_bytes() == b"CACHE" == cache.read_bytes()
    man = json.loads((onnx_dir / "trt" / "manifest.json").read_text())
    assert [v["key"] for v in man["variants"]] == [key]
    # a second variant is added, the first kept; the same key needs --overwrite
    build_engine_dir(onnx_dir, None, BuildOptions(), trt_module=fake_trt([]))
    man = json.loads((onnx_dir / "trt" / "manifest.json").read_text())
    assert [v["key"] for v in man["variants"]] == ["trt11.4.0-cu13-sm90-fp32", key]
    with pytest.raises(InvalidInputError, match="--overwrite"):
        build_engine_dir(onnx_dir, None, BuildOptions(), trt_module=fake_trt([]))


@pytest.mark.slow
def test_fake_tensorrt_failures_name_the_problem_and_write_nothing(onnx_dir, monkeypatch):
    monkeypatch.setattr(engine, "gpu_info", lambda: GPU)
    with pytest.raises(InvalidInputError, match="failing layer: /layers.1/Attention") as e:
        build_engine_dir(onnx_dir, None, BuildOptions(), trt_module=fake_trt([], plan=None))
    assert e.value.code == "trt_build_failed"
    with pytest.raises(InvalidInputError, match=r"rejected .*node 3 \(Attention\)"):
        build_engine_dir(onnx_dir, None, BuildOptions(), trt_module=fake_trt([], parse_ok=False))
    assert not (onnx_dir / "trt").exists() or not any((onnx_dir / "trt").iterdir())


@pytest.mark.slow
def test_no_gpu_exits_3_before_any_tensorrt_object(onnx_dir, monkeypatch):
    monkeypatch.setattr(engine, "gpu_info", lambda: None)
    calls: list = []
    with pytest.raises(InvalidInputError, match="needs a CUDA GPU") as e:
        build_engine_dir(onnx_dir, None, BuildOptions(), trt_module=fake_trt(calls))
    assert e.value.exit_code == 3 and calls == []
    r = invoke("build-engine", onnx_dir, catch=True)
    assert r.code == 3 and json.loads(r.stdout)["error"] == "gpu_missing"
    assert not (onnx_dir / "trt").exists()


@pytest.mark.slow
def test_missing_tensorrt_module_is_exit_2(onnx_dir, monkeypatch):
    monkeypatch.setattr(engine, "gpu_info", lambda: GPU)
    monkeypatch.setitem(__import__("sys").modules, "tensorrt", None)  # import fails
    r = invoke("build-engine", onnx_dir, catch=True)
    res = json.loads(r.stdout)
    assert r.code == 2 and res["error"] == "tensorrt_missing"  # a missing optional package (docs/cli.md)
    assert res["hint"] == "pip install 'specconv[tensorrt]' --extra-index-url https://pypi.nvidia.com"
    assert "--builder tensorrt needs the Python package 'tensorrt'" in res["message"]


@pytest.mark.slow
def test_truncated_or_foreign_onnx_is_refused(onnx_dir, exported, monkeypatch):  # noqa: F811
    monkeypatch.setattr(engine, "gpu_info", lambda: GPU)
    other, _ = exported["dspark"]
    with pytest.raises(InvalidInputError) as e:
        build_engine_dir(onnx_dir, other / "onnx" / "drafter.onnx", BuildOptions(), trt_module=fake_trt([]))
    assert e.value.code == "onnx_other_drafter"
    f = onnx_dir / "onnx" / "drafter.onnx"
    f.write_bytes(f.read_bytes()[:100])
    calls: list = []
    r = invoke("build-engine", onnx_dir, catch=True)
    assert r.code == 3 and json.loads(r.stdout)["error"] == "onnx_corrupt"
    assert calls == [] and not (onnx_dir / "trt").exists()


@pytest.mark.slow
def test_version_1_export_is_refused_before_any_tensorrt_object(onnx_dir, monkeypatch):
    monkeypatch.setattr(engine, "gpu_info", lambda: GPU)
    meta_p = onnx_dir / "onnx" / "onnx_meta.json"
    meta_p.write_text(json.dumps({**json.loads(meta_p.read_text()), "format_version": 1}))
    calls: list = []
    with pytest.raises(InvalidInputError, match="re-export with `specconv export onnx`") as e:
        build_engine_dir(onnx_dir, None, BuildOptions(), trt_module=fake_trt(calls))
    assert e.value.code == "onnx_format_version" and e.value.exit_code == 3 and calls == []
    r = invoke("build-engine", onnx_dir, "--builder", "rtx", "--compute-capability", "8.9", catch=True)
    assert r.code == 3 and json.loads(r.stdout)["error"] == "onnx_format_version"
    assert not (onnx_dir / "trt").exists()


@pytest.mark.slow
def test_rtx_ahead_of_time_build_on_cpu(onnx_dir):
    """Real TensorRT-RTX: parses and compiles the exported fp32 graph without a GPU. An fp32
    attention has no dedicated kernel: the build needs the in-memory TRT_decomposable."""
    pytest.importorskip("tensorrt_rtx")
    if torch.cuda.is_available():
        pytest.skip("checks the CPU path")
    r = invoke("build-engine", onnx_dir, "--builder", "rtx", "--compute-capability", "8.9",
               "--profile", "batch=1:1:2,context=1:8:16", catch=True)
    assert r.code == 0, r.output
    res = json.loads(r.stdout)
    assert res["key"].startswith("rtx") and res["key"].endswith("-sm89-fp32")
    plan = onnx_dir / "trt" / res["key"] / "drafter.plan"
    assert plan.stat().st_size > 10_000 and res["gpu"] is None and res["compute_capability"] is None
    man = json.loads((onnx_dir / "trt" / "manifest.json").read_text())
    assert man["variants"][0]["plan_sha256"] == res["plan_sha256"]
    assert man["variants"][0]["target_compute_capabilities"] == ["8.9"]
    build = json.loads((onnx_dir / "trt" / res["key"] / "build.json").read_text())
    assert build["onnx_in_memory"]["attributes"] == [
        {"op_type": "Attention", "name": "TRT_decomposable", "value": 1, "count": 2}]
    meta = json.loads((onnx_dir / "onnx" / "onnx_meta.json").read_text())
    assert build["onnx_sha256"] == meta["files"]["drafter.onnx"] == sha256_file(onnx_dir / "onnx" / "drafter.onnx")
    assert build["contains_verifier_weights"] is meta["contains_verifier_weights"]  # push's trt/ gate reads it


@pytest.mark.slow
@pytest.mark.gpu
def test_real_tensorrt_build_load_and_run_matches_ort(onnx_dir):
    """GPU + full TensorRT only (never run in CI; docs/engines.md says where it ran)."""
    if not torch.cuda.is_available():  # before any TensorRT object (CPU: segfault)
        pytest.skip("no CUDA GPU")
    trt = pytest.importorskip("tensorrt")
    r = invoke("build-engine", onnx_dir, "--profile", "batch=1:1:2,context=1:8:16", catch=True)
    assert r.code == 0, r.output
    res = json.loads(r.stdout)
    plan = (onnx_dir / "trt" / res["key"] / "drafter.plan").read_bytes()
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    eng = runtime.deserialize_cuda_engine(plan)
    assert eng is not None
    from specconv.drafters.step import StepShape
    from specconv.engines.onnx.parity import parity_inputs, run_ort

    meta = json.loads((onnx_dir / "onnx" / "onnx_meta.json").read_text())
    g = meta["graphs"]["drafter.onnx"]
    names = [i["name"] for i in g["inputs"]]
    inputs = parity_inputs(StepShape.from_meta(meta), sampling_noise=False, max_context=16)[0]
    want = run_ort(onnx_dir / "onnx" / "drafter.onnx", names, inputs)
    ctx = eng.create_execution_context()
    dev = [t.cuda().contiguous() for t in inputs]
    for n, t in zip(names, dev, strict=True):
        ctx.set_input_shape(n, tuple(t.shape))
        ctx.set_tensor_address(n, t.data_ptr())
    dmap = {trt.int32: torch.int32, trt.float32: torch.float32, trt.int64: torch.int64}
    outs = {}
    for o in g["outputs"]:
        n = o["name"]
        outs[n] = torch.empty(tuple(ctx.get_tensor_shape(n)), dtype=dmap[eng.get_tensor_dtype(n)], device="cuda")
        ctx.set_tensor_address(n, outs[n].data_ptr())
    assert ctx.execute_async_v3(torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert (outs["draft_ids"].cpu().numpy() == want[0]).all()
