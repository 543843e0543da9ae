"""TensorRT: engines built from the ONNX export (``specconv build-engine``, ``release --build-engine``)
and run as the drafter in the validation loop (``validate --engine``); docs/engines.md. The engine's
declaration (standard library only).
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from typing import Any

from ...outdir import OutputKind, files_listed
from ..base import CompareRule, Engine, Exporter, OptionSpec, Runtime, Surface

#: a variant dir's record (``trt/<key>/build.json``) and its ``format``
BUILD_NAME, BUILD_FORMAT = "build.json", "specconv-trt-build"
#: ``trt/manifest.json``'s ``format``
MANIFEST_FORMAT = "specconv-trt-manifest"
#: a variant's files before its build.json recorded them (``files``)
_VARIANT_FILES_UNRECORDED = ("drafter.plan", "timing.cache")


def _variant(d: Path, rec: dict) -> dict[str, str | None] | None:
    return files_listed(d, rec) if "files" in rec else dict.fromkeys(_VARIANT_FILES_UNRECORDED)


def _variants(d: Path, rec: dict) -> dict[str, str | None] | None:
    """``trt/``: every variant the manifest lists (each judged as an engine variant)."""
    variants = rec.get("variants")
    if not isinstance(variants, list) or not all(isinstance(v, dict) and isinstance(v.get("key"), str)
                                                 for v in variants):
        return None
    return {v["key"]: "engine" for v in variants}


_OPTIONS = (
    OptionSpec(("--onnx",), "onnx_path", "Exported graph or export dir [default: DIR/onnx/drafter.onnx].",
               kind="any_path"),
    OptionSpec(("--builder",), "builder", "tensorrt: full TensorRT on a GPU; rtx: TensorRT-RTX (builds ahead of time; "
               "on a CPU with --compute-capability).", kind="choice", choices=("tensorrt", "rtx"), default="tensorrt",
               show_default=True),
    OptionSpec(("--profile",), "profile", "Optimization profile, e.g. batch=1:4:8,context=16:1024:4096 [default: the "
               "graph's range]."),
    OptionSpec(("--hardware-compat",), "hardware_compat", "", kind="choice", choices=("none", "ampere+"),
               default="none", show_default=True),
    OptionSpec(("--version-compatible",), "version_compatible", "Engine loadable by later TensorRT runtimes.",
               kind="flag", default=False),
    OptionSpec(("--timing-cache",), "timing_cache", "Read/write this timing cache.", kind="path"),
    OptionSpec(("--builder-opt-level",), "builder_opt_level", "0-5 (TensorRT's default when unset).", kind="int",
               minimum=0, maximum=5),
    OptionSpec(("--compute-capability",), "ccs", "TensorRT-RTX targets, comma list (e.g. 8.9,12.0)."),
    OptionSpec(("--workspace-mb",), "workspace_mb", "", kind="int", minimum=64, default=4096, show_default=True),
    OptionSpec(("--overwrite",), "overwrite", "Replace an existing variant dir that is empty or an earlier specconv "
               "build; anything else is refused (exit 3).", kind="flag", default=False),
)


def _lazy(module: str, name: str) -> Any:
    """A method calling ``.<module>.<name>`` with its arguments (the module imported on the first call)."""
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(import_module(f"{__name__}.{module}"), name)(*args, **kwargs)
    return method


class EngineBuilder(Exporter):
    """``specconv build-engine``: ``DIR/trt/<key>/`` from ``DIR/onnx`` (:func:`.build.build_engine_dir`)."""

    kind = "engine"
    dir_name = "trt"
    dir_kind = "engines"
    release_key = "engine"
    common = ()
    surface = Surface(
        command=("build-engine",), options=_OPTIONS,
        flag=OptionSpec(("--build-engine",), "build_engine", "With --export-onnx: build a --builder rtx engine, on a "
                        "GPU machine only (exit 3 up front without a CUDA GPU); --build-engine=if-available records "
                        "the skip instead.", kind="choice", choices=("always", "if-available"), flag_value="always"),
        help="""Build DIR/trt/<key>/drafter.plan + build.json and update DIR/trt/manifest.json.

    The GPU is checked before TensorRT is imported: exit 3 when --builder tensorrt
    finds no CUDA GPU, 2 when --builder rtx has no GPU and no --compute-capability;
    then exit 2 when the builder's TensorRT is not installed.
    """)

    def run(self, drafter_dir: Path, out: Path | None, **o: Any) -> Any:
        from .build import BuildOptions, build_engine_dir

        opts = BuildOptions(builder=o.get("builder", "tensorrt"), profile=o.get("profile") or "",
                            hardware_compat=o.get("hardware_compat", "none"),
                            version_compatible=bool(o.get("version_compatible")),
                            timing_cache=str(o["timing_cache"]) if o.get("timing_cache") else None,
                            builder_opt_level=o.get("builder_opt_level"),
                            compute_capabilities=[c.strip() for c in (o.get("ccs") or "").split(",") if c.strip()],
                            workspace_mb=o.get("workspace_mb", 4096), overwrite=bool(o.get("overwrite")))
        return build_engine_dir(drafter_dir, o.get("onnx_path"), opts)

    push_verdict = _lazy("push", "verdict")
    holds_verifier_weights = _lazy("push", "holds_verifier_weights")
    release_preflight = _lazy("release", "preflight")
    release_step = _lazy("release", "engine_step")

    def card_rows(self, files: Any) -> list[tuple[str, str]]:
        return [(p, "TensorRT engine")
                for p in files if p.startswith("trt/") and p.endswith((".onnx", ".plan", ".engine"))]

    def local_files(self, d: Path) -> list[str]:
        """Every file of ``trt/`` (the local card lists the variants' engines)."""
        root = d / self.dir_name
        return sorted(f.relative_to(d).as_posix() for f in root.rglob("*") if f.is_file()) if root.is_dir() else []


ENGINE = Engine(
    key="tensorrt", display="TensorRT", extra="onnx", order=50,
    output_kinds={"engine": OutputKind("engine variant", BUILD_NAME, BUILD_FORMAT, _variant),
                  "engines": OutputKind("engine dir (trt/)", "manifest.json", MANIFEST_FORMAT, _variants)},
    export=EngineBuilder(),
    runtime=Runtime("TensorRT engine", "specconv.engines.tensorrt.engine_drafter:load", key="engine", side="engine_run",
                    preflight="specconv.engines.tensorrt.engine_drafter:preflight_engine",
                    rule=CompareRule(tau_rel_tol=0.03, kl=True),
                    help="Also run the loop with this TensorRT engine (a trt/<key>/ dir or its drafter.plan) as the "
                         "drafter; needs a CUDA GPU and TensorRT (excludes --backend vllm, --onnx)."),
)
