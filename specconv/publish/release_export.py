"""The export / engine steps of ``specconv release`` (``--export-onnx``, ``--build-engine``;
docs/cli.md, "release"): an earlier export of the same drafter bytes is kept across the
re-conversion and re-used (:func:`export_step`).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger("specconv.release")

#: the builder a release uses (TensorRT-RTX: one engine per GPU generation, ``docs/engines.md``)
RELEASE_BUILDER = "rtx"
_MODULES = {"tensorrt": "tensorrt", "rtx": "tensorrt_rtx"}


def engine_unavailable(builder: str = RELEASE_BUILDER) -> str | None:
    """Why an engine cannot be built on this machine, or None when it can.

    Checks that the builder's Python module is importable (without importing it) and that a
    CUDA GPU is present: ``--builder tensorrt`` always needs one, and ``rtx`` without a GPU
    needs explicit ``--compute-capability`` targets, which ``release`` does not take.

    Args:
        builder: ``tensorrt`` | ``rtx``.

    Returns:
        A one-line reason (str) or None.
    """
    mod = _MODULES[builder]
    if importlib.util.find_spec(mod) is None:
        return f"--builder {builder}: the Python module {mod!r} is not installed"
    from ..export.engine import gpu_info

    if gpu_info() is None:
        return f"--builder {builder}: no CUDA GPU found (torch.cuda)"
    return None


def _prev_dir(work: Path) -> Path:
    return work / ".previous-export"


def keep_previous_export(drafter: Path, work: Path) -> None:
    """Move ``drafter/onnx`` and its ``export`` record section aside before the drafter is
    re-converted (the conversion replaces the dir). Call it only after
    :func:`specconv.outdir.check_replaceable` has accepted ``drafter`` as a conversion."""
    from ..record import read_record

    prev = _prev_dir(work)
    if prev.exists():
        shutil.rmtree(prev)
    if not (drafter / "onnx" / "onnx_meta.json").is_file():
        return
    export = read_record(drafter, missing_ok=True).export
    prev.mkdir(parents=True)
    (prev / "export.json").write_text(json.dumps(export.model_dump(mode="json", exclude_unset=True)
                                                 if export is not None else {}))
    shutil.move(str(drafter / "onnx"), str(prev / "onnx"))


def _reuse(drafter: Path, work: Path) -> dict[str, Any] | None:
    """Put the earlier export back when it was made from these exact drafter files.

    Returns:
        The earlier ``export.onnx`` section, or None (no earlier export, other drafter bytes).

    Raises:
        InvalidInputError: the earlier export is of another format version
            (:func:`specconv.export.onnx_dir.check_meta_format`); it is left aside.
    """
    from ..export.onnx_dir import check_meta_format
    from ..record import file_hashes, update_record

    prev = _prev_dir(work)
    meta_path = prev / "onnx" / "onnx_meta.json"
    if not meta_path.is_file():
        return None
    meta = json.loads(meta_path.read_text())
    check_meta_format(meta, meta_path)
    section = json.loads((prev / "export.json").read_text())
    if meta.get("drafter_files") != file_hashes(drafter) or not (section.get("onnx") or {}):
        return None
    shutil.move(str(prev / "onnx"), str(drafter / "onnx"))
    update_record(drafter, "export", {"onnx": section["onnx"]})
    return section["onnx"]


def export_step(drafter: Path, work: Path, verifier: str) -> dict[str, Any]:
    """``--export-onnx``: re-use the earlier export of the same drafter bytes, else export.

    An earlier export of another format version is refused for re-use (a warning and
    ``reuse_refused`` in the result say so) and the drafter is exported again.

    Returns:
        ``{"reused": bool, "contains_verifier_weights": bool, "parity_passed": ...}``
        (+ ``reuse_refused``: the reason, when an earlier export was refused).

    Raises:
        InvalidInputError / GateFailedError: from :func:`~specconv.export.onnx_dir.export_onnx_dir`.
    """
    from ..errors import InvalidInputError

    refused = None
    try:
        try:
            section = _reuse(drafter, work)
        except InvalidInputError as e:
            refused, section = e.message, None
            log.warning("not re-using the earlier ONNX export: %s; exporting again", e.message)
        reused = section is not None
        if section is None:
            from ..export.onnx_dir import export_onnx_dir

            section = export_onnx_dir(drafter, verifier=verifier, overwrite=True).to_dict()
    finally:
        shutil.rmtree(_prev_dir(work), ignore_errors=True)
    out = {"reused": reused, "contains_verifier_weights": bool(section.get("contains_verifier_weights")),
           "parity_passed": section.get("parity_passed")}
    return {**out, "reuse_refused": refused} if refused else out


def engine_step(drafter: Path, mode: str) -> dict[str, Any]:
    """``--build-engine`` (``always``) or ``--build-engine=if-available``: build one
    ``--builder rtx`` engine under ``drafter/trt/<key>/``; ``if-available`` returns
    ``{"skipped": reason}`` when :func:`engine_unavailable` says no."""
    reason = engine_unavailable()
    if reason is not None:
        if mode == "if-available":
            return {"skipped": reason}
        from ..errors import InvalidInputError

        raise InvalidInputError(f"--build-engine: {reason}", code="engine_unavailable")
    from ..export.engine import BuildOptions, build_engine_dir

    built = build_engine_dir(drafter, None, BuildOptions(builder=RELEASE_BUILDER, overwrite=True))
    return {"path": str(Path(built.path).relative_to(drafter)) if built.path else None}
