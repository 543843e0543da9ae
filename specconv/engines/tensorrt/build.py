"""``specconv build-engine DIR``: TensorRT / TensorRT-RTX engines from an exported graph (docs/engines.md:
the code path, the in-memory TensorRT attributes, the layout). The builder module (``tensorrt`` or
``tensorrt_rtx``) is passed in, so unit tests can inject a fake.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import InvalidInputError, UsageError
from ...fileio import atomic_write, read_json_object
from ...results import BuildEngineResult
from . import BUILD_FORMAT, BUILD_NAME, MANIFEST_FORMAT

__all__ = ["BuildOptions", "parse_profile", "profile_shapes", "build_engine_dir", "gpu_info",
           "variant_key", "import_builder", "tensorrt_model", "TENSORRT_ATTRIBUTES"]

AXES = ("batch", "context")
_DTYPE_TAG = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
#: TensorRT-only node attributes ``(op type, attribute, value)``, set in memory on the parsed proto,
#: never in the shipped graph (docs/engines.md, "Prepare for TensorRT").
TENSORRT_ATTRIBUTES = (("Attention", "TRT_decomposable", 1),)


@dataclass
class BuildOptions:
    """``build-engine`` flags (docs/cli.md); ``profile`` as given on the command line."""

    builder: str = "tensorrt"
    profile: str = ""
    hardware_compat: str = "none"
    version_compatible: bool = False
    timing_cache: str | None = None
    builder_opt_level: int | None = None
    compute_capabilities: list[str] = field(default_factory=list)
    workspace_mb: int = 4096
    overwrite: bool = False


def parse_profile(spec: str | None, dynamic: dict) -> dict[str, tuple[int, int, int]]:
    """Parse ``batch=1:4:8,context=16:1024:4096`` against the graph's dynamic ranges (a missing
    axis: ``1 : min(max, 4 | 1024) : max``).

    Raises:
        UsageError: unknown or repeated axis, malformed triple, ``min <= opt <= max`` violated, or
            a bound outside the graph's range.
    """
    out: dict[str, tuple[int, int, int]] = {}
    for part in (spec.split(",") if spec and spec.strip() else []):
        name, _, val = part.partition("=")
        name = name.strip()
        if name not in AXES:
            raise UsageError(f"--profile: unknown axis {name!r} (batch, context)")
        if name in out:
            raise UsageError(f"--profile: axis {name!r} given twice")
        try:
            lo, opt, hi = (int(x) for x in val.split(":"))
        except ValueError as e:
            raise UsageError(f"--profile {part!r}: expected {name}=MIN:OPT:MAX") from e
        out[name] = (lo, opt, hi)
    for name in AXES:
        rng = dynamic[name]
        if name not in out:
            hi = int(rng["max"])
            out[name] = (int(rng["min"]), min(hi, 4 if name == "batch" else 1024), hi)
        lo, opt, hi = out[name]
        if not 1 <= lo <= opt <= hi:
            raise UsageError(f"--profile {name}: need 1 <= min <= opt <= max, got {lo}:{opt}:{hi}")
        if lo < rng["min"] or hi > rng["max"]:
            raise UsageError(f"--profile {name}: {lo}:{hi} outside the graph's range "
                             f"{rng['min']}..{rng['max']} (export with a larger --max-{name})")
    return out


def profile_shapes(inputs: list[dict], profile: dict) -> dict[str, tuple[tuple, tuple, tuple]]:
    """``{input: (min_shape, opt_shape, max_shape)}`` for every input with a dynamic axis."""
    out: dict[str, tuple[tuple, tuple, tuple]] = {}
    for inp in inputs:
        dims = inp["shape"]
        if any(isinstance(d, str) for d in dims):
            lo, opt, hi = (tuple(profile[d][k] if isinstance(d, str) else int(d) for d in dims) for k in range(3))
            out[inp["name"]] = (lo, opt, hi)
    return out


def gpu_info() -> dict | None:
    """The first CUDA GPU (name, compute capability, CUDA, driver) or None; uses torch
    (no TensorRT object is created)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency of export
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(0)
    driver = None
    try:
        import subprocess

        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        pass
    return {"name": torch.cuda.get_device_name(0), "compute_capability": f"{major}.{minor}",
            "cuda": torch.version.cuda, "driver": driver}


def import_builder(builder: str, *, feature: str | None = None):
    """Import ``tensorrt`` (``--builder tensorrt``) or ``tensorrt_rtx`` (``rtx``).

    Raises:
        MissingExtraError: not installed (exit 2, slug ``tensorrt_missing``).
    """
    from ...extras import MissingExtraError, require

    feature = feature or f"--builder {builder}"
    try:
        if builder == "tensorrt":
            return require("tensorrt", "tensorrt", feature=feature)
        return require("tensorrt_rtx", "trt-rtx", feature=feature)
    except MissingExtraError as e:
        e.code = "tensorrt_missing"
        raise


def _cuda_major(trt, gpu: dict | None) -> str:
    if gpu and gpu.get("cuda"):
        return str(gpu["cuda"]).split(".")[0]
    from importlib.metadata import distributions

    for dist in distributions():
        m = re.match(r"tensorrt(?:[-_]rtx)?[-_]cu(\d+)$", (dist.metadata["Name"] or "").lower())
        if m:
            return m.group(1)
    return "unknown"


def variant_key(builder: str, version: str, cuda_major: str, dtype: str, *, sm: str | None = None,
                targets: list[str] | None = None, ampere_plus: bool = False, vc: bool = False) -> str:
    """``trt<version>-cu<major>-sm<XY>-<dtype>[-ampere_plus][-vc]`` or
    ``rtx<version>-cu<major>-<sm targets>-<dtype>``."""
    tag = _DTYPE_TAG[dtype]
    if builder == "rtx":
        cc = "_".join("sm" + t.replace(".", "") for t in (targets or [])) or "smnative"
        return f"rtx{version}-cu{cuda_major}-{cc}-{tag}"
    key = f"trt{version}-cu{cuda_major}-sm{(sm or '').replace('.', '')}-{tag}"
    return key + ("-ampere_plus" if ampere_plus else "") + ("-vc" if vc else "")


class _Log:
    """A ``trt.ILogger`` that keeps the messages (to name a failing layer)."""

    @staticmethod
    def make(trt):
        base = getattr(trt, "ILogger", object)

        class Logger(base):  # type: ignore[misc, valid-type]
            def __init__(self):
                base.__init__(self)
                self.lines: list[str] = []

            def log(self, severity, msg):  # noqa: D401 - TensorRT callback
                self.lines.append(f"{severity}: {msg}")

        return Logger()


def _configure(trt, builder, config, opts: BuildOptions, shapes: dict, dtype: str) -> None:
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(opts.workspace_mb) << 20)
    if opts.builder_opt_level is not None:
        config.builder_optimization_level = int(opts.builder_opt_level)
    profile = builder.create_optimization_profile()
    for name, (lo, opt, hi) in shapes.items():
        profile.set_shape(name, lo, opt, hi)
    config.add_optimization_profile(profile)
    if dtype == "float32" and hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)  # fp32 validation engines: no TF32 drift
    if opts.hardware_compat == "ampere+":
        config.hardware_compatibility_level = trt.HardwareCompatibilityLevel.AMPERE_PLUS
    if opts.version_compatible:
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    if opts.builder == "rtx" and opts.compute_capabilities:
        config.num_compute_capabilities = len(opts.compute_capabilities)
        for i, cc in enumerate(opts.compute_capabilities):
            config.set_compute_capability(getattr(trt.ComputeCapability, "SM" + cc.replace(".", "")), i)


def _failing_layer(lines: list[str]) -> str | None:
    for line in reversed(lines):
        m = re.search(r"(?:[Ll]ayer|[Nn]ode)[: ]+([\w./:\-]+)", line)
        if m:
            return m.group(1)
    return None


def tensorrt_model(onnx_path: Path) -> tuple[bytes, list[dict]]:
    """``(model bytes, [{"op_type", "name", "value", "count"}])``: the proto of ``onnx_path`` (external
    data not loaded) with :data:`TENSORRT_ATTRIBUTES` set; the file itself is not changed.

    Raises:
        MissingExtraError: the ``onnx`` package is not installed (exit 2).
    """
    from ...extras import require

    onnx = require("onnx", "onnx", feature="specconv build-engine")
    model = onnx.load(str(onnx_path), load_external_data=False)
    applied = []
    for op_type, name, value in TENSORRT_ATTRIBUTES:
        count = 0
        for node in model.graph.node:
            if node.op_type != op_type or node.domain not in ("", "ai.onnx"):
                continue
            keep = [a for a in node.attribute if a.name != name]
            del node.attribute[:]
            node.attribute.extend([*keep, onnx.helper.make_attribute(name, value)])
            count += 1
        applied.append({"op_type": op_type, "name": name, "value": value, "count": count})
    return model.SerializeToString(), applied


def build_plan(trt, model: bytes, onnx_path: Path, opts: BuildOptions, shapes: dict, dtype: str,
               cache_bytes: bytes | None) -> tuple[bytes, bytes | None, list[str]]:
    """Parse ``model`` (external data beside ``onnx_path``) and build: ``(plan, timing cache or None, log lines)``.

    Raises:
        InvalidInputError: the parser rejects the graph, or ``build_serialized_network`` returns None.
    """
    logger = _Log.make(trt)
    builder = trt.Builder(logger)
    flags = 0
    strongly = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    if strongly is not None:  # 10.x: enables strong typing; 11.x: deprecated no-op
        flags = 1 << int(strongly)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(model, str(Path(onnx_path).resolve())):
        errs = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise InvalidInputError(f"the TensorRT ONNX parser rejected {onnx_path}: " + "; ".join(errs[:5]),
                                code="trt_parse_failed")
    config = builder.create_builder_config()
    _configure(trt, builder, config, opts, shapes, dtype)
    cache = None
    if hasattr(config, "create_timing_cache"):
        cache = config.create_timing_cache(cache_bytes or b"")
        config.set_timing_cache(cache, False)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        layer = _failing_layer(logger.lines)
        tail = " | ".join(logger.lines[-3:])
        raise InvalidInputError(
            "TensorRT could not build the engine" + (f" (failing layer: {layer})" if layer else "")
            + (f": {tail}" if tail else ""), code="trt_build_failed")
    out_cache = bytes(cache.serialize()) if cache is not None and opts.timing_cache else None
    return bytes(plan), out_cache, logger.lines


def build_engine_dir(drafter_dir: str | Path, onnx_path: str | Path | None, opts: BuildOptions, *,
                     trt_module=None) -> BuildEngineResult:
    """Build one engine variant under ``DIR/trt/<key>/`` from ``onnx_path`` (default
    ``DIR/onnx/drafter.onnx``, checked first) and update ``trt/manifest.json``; ``trt_module``: a
    fake for tests (default: imported after the GPU check).

    Raises:
        InvalidInputError: no GPU (``--builder tensorrt``), TensorRT missing, a bad or
            foreign graph, parse/build failures, an existing variant without overwrite.
        UsageError: bad profile / flags.
    """
    from ...tensors import sha256_file

    d = Path(drafter_dir)
    graph, rel, meta, g = _graph_of(d, onnx_path)
    dtype, provenance = g["dtype"], _provenance(meta, g)  # validate --engine checks DIR against it
    model, attributes = tensorrt_model(graph)
    gpu = gpu_info()
    _check_builder(opts, gpu)  # before any TensorRT object exists
    trt = trt_module if trt_module is not None else import_builder(opts.builder)
    prof = parse_profile(opts.profile, meta["dynamic"])
    shapes = profile_shapes(g["inputs"], prof)
    version = str(getattr(trt, "__version__", "unknown"))
    key = variant_key(opts.builder, version, _cuda_major(trt, gpu), dtype,
                      sm=gpu["compute_capability"] if gpu else None,
                      targets=opts.compute_capabilities or ([gpu["compute_capability"]] if gpu else None),
                      ampere_plus=opts.hardware_compat == "ampere+", vc=opts.version_compatible)
    out = d / "trt" / key
    _check_target(out, opts.overwrite)
    cache_in = Path(opts.timing_cache).read_bytes() if opts.timing_cache and Path(opts.timing_cache).is_file() else None
    plan, cache_out, _lines = build_plan(trt, model, graph, opts, shapes, dtype, cache_in)
    build = {**_build_record(key, opts, version, trt, gpu, dtype, shapes, rel, sha256_file(graph), plan),
             **provenance, "onnx_in_memory": _in_memory_record(attributes)}
    _write_variant(d / "trt", key, plan, build, cache_out, opts)
    if cache_out is not None and opts.timing_cache:  # build_plan serializes a cache only for --timing-cache
        Path(opts.timing_cache).write_bytes(cache_out)
    manifest = _update_manifest(d / "trt", build)
    return BuildEngineResult.of({**build, "path": str(out), "manifest": str(d / "trt" / "manifest.json"),
                                 "variants": [v["key"] for v in manifest["variants"]]})


def _graph_of(d: Path, onnx_path: str | Path | None) -> tuple[Path, str, dict, dict]:
    """``(graph path, its path in the meta dir, meta, the meta's graph entry)``, after the
    format-version and sha256 checks (:func:`~.ort_drafter.resolve_graph`, :func:`~.ort_drafter.check_graph`)."""
    from ..onnx.ort_drafter import check_graph, resolve_graph

    graph, meta_dir, meta = resolve_graph(onnx_path or d / "onnx" / "drafter.onnx")
    rel = check_graph(graph, meta_dir, meta, d)
    return graph, rel, meta, meta["graphs"][rel]


def _check_builder(opts: BuildOptions, gpu: dict | None) -> None:
    """Refuse a build this machine cannot do, before any TensorRT object exists."""
    if opts.builder == "tensorrt" and gpu is None:
        raise InvalidInputError("--builder tensorrt needs a CUDA GPU and none was found (torch.cuda)",
                                code="gpu_missing", hint="build on a GPU machine, or --builder rtx for a CPU build")
    if opts.builder == "rtx" and gpu is None and not opts.compute_capabilities:
        raise UsageError("--builder rtx without a GPU needs --compute-capability (e.g. 8.9,12.0)")


def _in_memory_record(attributes: list[dict]) -> dict:
    """``build.json``'s ``onnx_in_memory``: the TensorRT-only attributes set on the parsed
    proto (name, op type, count) and how the parser was called."""
    return {"attributes": attributes, "parse": "OnnxParser.parse(model bytes, path=the ONNX file)",
            "onnx_file_changed": False}


def _check_target(out: Path, overwrite: bool) -> None:
    """An existing ``trt/<key>/`` needs ``overwrite`` and must be specconv's own variant or
    empty (:func:`specconv.outdir.check_replaceable`); checked before anything is built."""
    from ...outdir import check_output
    from ..exportdir import output_kinds

    check_output(out, "engine", overwrite, kinds=output_kinds)


def _build_record(key: str, opts: BuildOptions, version: str, trt, gpu: dict | None, dtype: str,
                  shapes: dict, rel: str, onnx_sha: str, plan: bytes) -> dict:
    """The ``build.json`` content (GPU fields null for a CPU build)."""
    from ... import __version__

    return {
        "format": BUILD_FORMAT, "key": key, "builder": opts.builder,
        "trt_version": version, "cuda": gpu["cuda"] if gpu else None,
        "cuda_major": _cuda_major(trt, gpu), "driver": gpu["driver"] if gpu else None,
        "gpu": gpu["name"] if gpu else None,
        "compute_capability": gpu["compute_capability"] if gpu else None,
        "target_compute_capabilities": opts.compute_capabilities or None,
        "dtype": dtype, "hardware_compat": opts.hardware_compat,
        "version_compatible": opts.version_compatible,
        "builder_optimization_level": opts.builder_opt_level,
        "flags": {"strongly_typed": True, "tf32": dtype != "float32"},
        "profiles": [{n: {"min": list(s[0]), "opt": list(s[1]), "max": list(s[2])} for n, s in shapes.items()}],
        "onnx": rel, "onnx_sha256": onnx_sha, "plan_sha256": hashlib.sha256(plan).hexdigest(), "plan_bytes": len(plan),
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "specconv_version": __version__,
    }


def _provenance(meta: dict, g: dict) -> dict:
    """The graph's drafter files, ``contains_verifier_weights`` (a meta without the key counts as
    embedding them) and the graph facts the engine's runner needs."""
    keys = ("algorithm", "block_size", "num_draft_tokens", "aux_layer_ids", "mask_token_id",
            "draft_vocab_size", "dynamic")
    return {"drafter_files": meta.get("drafter_files"),
            "contains_verifier_weights": bool(meta.get("contains_verifier_weights", True)),
            "drafter_meta": {**{k: meta.get(k) for k in keys}, "inputs": g.get("inputs"),
                             "outputs": g.get("outputs")}}


def _write_variant(trt_dir: Path, key: str, plan: bytes, build: dict, cache: bytes | None,
                   opts: BuildOptions) -> None:
    """Write ``trt_dir/key/`` through a locked temp dir swapped into place
    (:mod:`specconv.outdir`); ``build.json`` lists the variant's files (``files``)."""
    from ...outdir import move_into_place, temp_output
    from ..exportdir import output_kinds

    dst = trt_dir / key
    with temp_output(dst) as tmp:
        files = {"drafter.plan": plan, **({"timing.cache": cache} if cache is not None else {})}
        build["files"] = sorted([*files, BUILD_NAME])
        for name, data in files.items():
            (tmp.path / name).write_bytes(data)
        (tmp.path / BUILD_NAME).write_text(json.dumps(build, indent=2, sort_keys=True) + "\n")
        os.chmod(tmp.path, 0o755)
        move_into_place(tmp, dst, opts.overwrite, "engine", kinds=output_kinds)


def _update_manifest(trt_dir: Path, build: dict) -> dict:
    p = trt_dir / "manifest.json"
    data: dict[str, Any] = {"format": MANIFEST_FORMAT, "format_version": 1, "variants": []}
    if p.is_file():
        data = read_json_object(p, unreadable="{path}: invalid JSON ({error}); not overwriting it",
                                not_object="{path}: not a JSON object; not overwriting it")
    keep = [v for v in data.get("variants", []) if v.get("key") != build["key"]]
    entry = {k: build[k] for k in ("key", "builder", "trt_version", "cuda_major", "compute_capability",
                                   "target_compute_capabilities", "dtype", "hardware_compat",
                                   "version_compatible", "onnx_sha256", "plan_sha256")}
    entry["path"] = f"{build['key']}/drafter.plan"
    data["variants"] = sorted([*keep, entry], key=lambda v: v["key"])
    atomic_write(p, json.dumps(data, indent=2, sort_keys=True) + "\n")
    return data
