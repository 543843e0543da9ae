"""``release --build-engine``: one ``--builder rtx`` engine built from the exported graph after the
ONNX export step (docs/cli.md, "release").
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import InvalidInputError, UsageError

#: the builder a release uses (TensorRT-RTX: one engine per GPU generation, ``docs/engines.md``)
RELEASE_BUILDER = "rtx"
_MODULES = {"tensorrt": "tensorrt", "rtx": "tensorrt_rtx"}


def engine_unavailable(builder: str = RELEASE_BUILDER) -> str | None:
    """Why an engine cannot be built here (one line), or None: the builder's module is not
    importable, or no CUDA GPU (``release`` takes no ``--compute-capability``)."""
    mod = _MODULES[builder]
    if importlib.util.find_spec(mod) is None:
        return f"--builder {builder}: the Python module {mod!r} is not installed"
    from .build import gpu_info

    if gpu_info() is None:
        return f"--builder {builder}: no CUDA GPU found (torch.cuda)"
    return None


def preflight(options: Mapping[str, Any], mode: Any) -> None:
    """``--build-engine`` needs ``--export-onnx`` (exit 2); ``always``: the builder installed (exit 2)
    and a GPU here (exit 3)."""
    if mode and not (options.get("exports") or {}).get("onnx"):
        raise UsageError("--build-engine needs --export-onnx (the engine is built from onnx/)")
    if mode != "always":
        return
    from .build import import_builder

    import_builder(RELEASE_BUILDER, feature="specconv release --build-engine")  # not installed: exit 2
    reason = engine_unavailable()
    if reason is not None:
        raise InvalidInputError(f"--build-engine: {reason}", code="engine_unavailable",
                                hint="--build-engine=if-available records the skip and releases without it")


def engine_step(drafter: Path, work: Path, options: Mapping[str, Any], mode: str) -> dict[str, Any]:
    """``--build-engine`` (``always``) or ``--build-engine=if-available``: build one
    ``--builder rtx`` engine under ``drafter/trt/<key>/``; ``if-available`` returns
    ``{"skipped": reason}`` when :func:`engine_unavailable` says no."""
    reason = engine_unavailable()
    if reason is not None:
        if mode == "if-available":
            return {"skipped": reason}
        raise InvalidInputError(f"--build-engine: {reason}", code="engine_unavailable")
    from .build import BuildOptions, build_engine_dir

    built = build_engine_dir(drafter, None, BuildOptions(builder=RELEASE_BUILDER, overwrite=True))
    return {"path": str(Path(built.path).relative_to(drafter)) if built.path else None}
