"""A built TensorRT engine as a drafter runtime (``validate --engine``: :func:`load`,
:func:`preflight_engine`); its refusals, made before a TensorRT object exists: docs/engines.md,
"Engine validation".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...errors import InvalidInputError
from ..onnx.graph_drafter import GraphDrafter

if TYPE_CHECKING:
    from ...verifier import Verifier

__all__ = ["EngineDrafter", "load", "preflight_engine", "resolve_engine", "check_versions", "run_engine",
           "cuda_available"]


def cuda_available() -> bool:
    """``torch.cuda.is_available()`` (a module function so tests can monkeypatch it)."""
    return bool(torch.cuda.is_available())


def _gpu_cc() -> str:
    major, minor = torch.cuda.get_device_capability(0)
    return f"{major}.{minor}"


def resolve_engine(path: str | Path) -> tuple[Path, dict]:
    """``--engine PATH`` (a ``trt/<key>/`` dir or its ``drafter.plan``) → (plan, build.json).

    Raises:
        InvalidInputError: no plan, no / unreadable ``build.json`` (exit 3).
    """
    p = Path(path)
    plan = p / "drafter.plan" if p.is_dir() else p
    if not plan.is_file():
        raise InvalidInputError(f"--engine {path}: no engine plan at {plan}", code="engine_not_found")
    bj = plan.parent / "build.json"
    try:
        build = json.loads(bj.read_text())
    except (OSError, ValueError) as e:
        raise InvalidInputError(f"--engine {path}: cannot read {bj} ({e}); build the engine with "
                                "specconv build-engine", code="engine_build_json") from e
    from . import BUILD_FORMAT

    if not isinstance(build, dict) or build.get("format") != BUILD_FORMAT:
        raise InvalidInputError(f"{bj}: not a specconv build.json", code="engine_build_json")
    return plan, build


def import_runtime(builder: str):
    """Import the runtime module for a build (``tensorrt`` or ``tensorrt_rtx``; missing: exit 2)."""
    from .build import import_builder

    builder = builder if builder == "rtx" else "tensorrt"
    return import_builder(builder, feature=f"--engine (an engine built with {builder!r})")


def _ver(v: str) -> tuple[int, ...]:
    out = []
    for part in str(v).split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def version_ok(built: str, installed: str, version_compatible: bool) -> bool:
    """Can a runtime ``installed`` load a plan built by ``built`` (docs/engines.md, "Engine validation")?"""
    b, i = _ver(built), _ver(installed)
    if b and b == i[:len(b)] or str(built) == str(installed):
        return True
    if not version_compatible or not b or not i:
        return False
    return i >= b and (i[0] == b[0] or (b[0] == 10 and i[0] == 11))


def cc_ok(build: dict, gpu_cc: str) -> bool:
    """Does the build target this GPU's compute capability (``X.Y``; docs/engines.md)?"""
    if build.get("builder") == "rtx" and build.get("target_compute_capabilities"):
        return gpu_cc in build["target_compute_capabilities"]
    if build.get("hardware_compat") == "ampere+" and _ver(gpu_cc)[:1] >= (8,):
        return True
    return build.get("compute_capability") == gpu_cc


def check_versions(build: dict, installed: str, gpu_cc: str) -> None:
    """Refuse a plan the installed runtime / this GPU cannot load (exit 3: ``engine_version_mismatch``,
    ``engine_cc_mismatch``)."""
    built = str(build.get("trt_version"))
    if not version_ok(built, installed, bool(build.get("version_compatible"))):
        raise InvalidInputError(
            f"--engine: built with TensorRT {built}, installed runtime is {installed}, and the build is "
            "not version-compatible", code="engine_version_mismatch",
            hint="rebuild with this TensorRT (specconv build-engine), or build with --version-compatible")
    if not cc_ok(build, gpu_cc):
        want = build.get("target_compute_capabilities") or build.get("compute_capability")
        raise InvalidInputError(
            f"--engine: built for compute capability {want}, this GPU is {gpu_cc}, and the build is not "
            "hardware-compatible", code="engine_cc_mismatch",
            hint="rebuild on this GPU, or build with --hardware-compat ampere+")


def check_provenance(plan: Path, build: dict, drafter_dir: Path) -> None:
    """The plan's sha256 matches ``build.json`` and the engine comes from ``drafter_dir`` (its
    ``drafter_files``, else those of the ONNX export with ``build["onnx_sha256"]``).

    Raises:
        InvalidInputError: corrupt plan, unknown provenance, another drafter (exit 3).
    """
    from ...tensors import sha256_file
    from ..exportdir import check_drafter_files

    if sha256_file(plan) != build.get("plan_sha256"):
        raise InvalidInputError(f"{plan}: sha256 differs from build.json (truncated or modified plan); "
                                "build it again", code="engine_corrupt")
    want = build.get("drafter_files")
    if want is None:
        meta_p = drafter_dir / "onnx" / "onnx_meta.json"
        meta = json.loads(meta_p.read_text()) if meta_p.is_file() else {}
        if (meta.get("files") or {}).get(build.get("onnx")) != build.get("onnx_sha256"):
            raise InvalidInputError(f"{plan}: cannot tell which drafter it was built from (no matching "
                                    f"{meta_p})", code="engine_other_drafter")
        want = meta.get("drafter_files")
    check_drafter_files(want, drafter_dir, plan, built="built", code="engine_other_drafter")


def preflight_engine(path: str | Path, drafter_dir: str | Path, dtype: str | None = None) -> tuple[Path, dict, object]:
    """Every ``--engine`` refusal (exit 3), before any TensorRT object is created (``dtype`` unused: the
    plan has its own): ``(plan path, build.json dict, runtime module)``."""
    plan, build = resolve_engine(path)
    if not cuda_available():
        raise InvalidInputError("--engine needs a CUDA GPU and none was found (torch.cuda.is_available() "
                                "is false)", code="gpu_missing", hint="run validate --engine on a GPU machine")
    trt = import_runtime(str(build.get("builder") or "tensorrt"))
    check_versions(build, str(getattr(trt, "__version__", "unknown")), _gpu_cc())
    check_provenance(plan, build, Path(drafter_dir))
    return plan, build, trt


_DTYPES = (("FLOAT", "float32", torch.float32), ("HALF", "float16", torch.float16),
           ("BF16", "bfloat16", torch.bfloat16), ("INT32", "int32", torch.int32),
           ("INT64", "int64", torch.int64), ("BOOL", "bool", torch.bool), ("INT8", "int8", torch.int8))


def torch_dtype(trt, trt_dtype) -> torch.dtype:
    """TensorRT tensor dtype (``trt.DataType.FLOAT`` … or its ``trt.float32`` alias) → torch.

    Raises:
        InvalidInputError: a dtype without a torch equivalent.
    """
    dt = getattr(trt, "DataType", None)
    for enum_name, alias, td in _DTYPES:
        for cand in (getattr(dt, enum_name, None), getattr(trt, alias, None)):
            if cand is not None and trt_dtype == cand:
                return td
    raise InvalidInputError(f"engine tensor dtype {trt_dtype} has no torch equivalent", code="engine_dtype")


def run_engine(trt, engine, ctx, feeds: dict[str, torch.Tensor], stream: int,
               device: str | torch.device = "cuda") -> dict[str, torch.Tensor]:
    """Bind named inputs (cast to the engine's dtypes), allocate outputs after all input shapes are
    set, execute on CUDA stream handle ``stream``; the outputs are valid after it is synchronized.

    Raises:
        InvalidInputError: a missing input, or ``execute_async_v3`` reports failure.
    """
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    is_in = {n: engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
    keep = {}
    for n in [n for n in names if is_in[n]]:
        if n not in feeds:
            raise InvalidInputError(f"engine input {n!r} has no feed", code="engine_io")
        t = feeds[n].to(device, torch_dtype(trt, engine.get_tensor_dtype(n))).contiguous()
        keep[n] = t
        ctx.set_input_shape(n, tuple(t.shape))
        ctx.set_tensor_address(n, t.data_ptr())
    outs = {}
    for n in [n for n in names if not is_in[n]]:
        outs[n] = torch.empty(tuple(ctx.get_tensor_shape(n)), dtype=torch_dtype(trt, engine.get_tensor_dtype(n)),
                              device=device)
        ctx.set_tensor_address(n, outs[n].data_ptr())
    if not ctx.execute_async_v3(stream):
        raise InvalidInputError("TensorRT execute_async_v3 failed", code="engine_run_failed")
    return outs


def deserialize(trt, plan: Path, build: dict):
    """``Runtime.deserialize_cuda_engine`` (host code allowed for version-compatible plans; None: exit 3)."""
    logger = trt.Logger(trt.Logger.WARNING)
    runtime = trt.Runtime(logger)
    if build.get("version_compatible"):
        runtime.engine_host_code_allowed = True
    engine = runtime.deserialize_cuda_engine(plan.read_bytes())
    if engine is None:
        raise InvalidInputError(
            f"TensorRT {getattr(trt, '__version__', '?')} could not deserialize {plan} (built with TensorRT "
            f"{build.get('trt_version')} for compute capability {build.get('compute_capability')})",
            code="engine_load_failed")
    return runtime, engine


def _read_graph_facts(drafter: GraphDrafter, build: dict, drafter_dir: Path) -> None:
    """The graph's facts (``build.json`` ``drafter_meta``, else ``onnx_meta.json``), bounded by the profile."""
    meta_p = drafter_dir / "onnx" / "onnx_meta.json"
    try:
        meta = build.get("drafter_meta") or json.loads(meta_p.read_text())
        io = meta if build.get("drafter_meta") else meta["graphs"][build["onnx"]]
        drafter._read_facts(meta, io, _profile_max_context(build, int(meta["dynamic"]["context"]["max"])))
    except (OSError, ValueError, KeyError) as e:
        raise InvalidInputError(f"--engine: the graph facts are neither in build.json nor in {meta_p} ({e})",
                                code="engine_build_json") from e


def _profile_max_context(build: dict, graph_max: int) -> int:
    """The context bound of the engine's optimization profile (``aux_hidden`` axis 1)."""
    for prof in build.get("profiles") or []:
        aux = prof.get("aux_hidden")
        if aux and len(aux.get("max", [])) > 1:
            return min(graph_max, int(aux["max"][1]))
    return graph_max


def load(drafter_dir: Path, verifier: Verifier, *, path: str | Path, dtype: str, device: str,
         config: object = None) -> EngineDrafter:
    """The registry's loader: the engine at ``path`` (checked against ``drafter_dir``), on CUDA
    at the plan's dtype whatever ``dtype`` / ``device``; the verifier is not needed."""
    return EngineDrafter(path, drafter_dir)


class EngineDrafter(GraphDrafter):
    """A TensorRT engine (``--engine`` PATH) built from ``drafter_dir`` as the drafter, batch 1, on CUDA.

    Raises:
        InvalidInputError: every :func:`preflight_engine` refusal; the plan does not
            deserialize (exit 3).
    """

    KIND = "engine"
    SAMPLING_NEEDS = "an engine built from a graph exported with --sampling-noise and --outputs including logits"

    def __init__(self, path: str | Path, drafter_dir: str | Path):
        plan, build, trt = preflight_engine(path, drafter_dir)
        _read_graph_facts(self, build, Path(drafter_dir))
        self.path, self.build, self.trt = plan, build, trt
        self.graph_dtype = str(build["dtype"])
        self.device = torch.device("cuda")
        self.dtype = getattr(torch, self.graph_dtype)
        self.runtime, self.engine = deserialize(trt, plan, build)
        self.context = self.engine.create_execution_context()

    def describe(self) -> dict:
        """What ran (``report["engine"]``): the plan and its build facts."""
        return {"engine": str(self.path), "build": {x: self.build.get(x) for x in (
            "key", "builder", "trt_version", "compute_capability", "dtype", "hardware_compat", "version_compatible")}}

    def _run(self, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        outs = run_engine(self.trt, self.engine, self.context, feeds, torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        return outs
