"""``release --export-onnx``'s step (docs/cli.md, "release"): an earlier ``onnx/`` of the same drafter
bytes is kept aside across the re-conversion and re-used (:func:`export_step`).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger("specconv.release")


def _prev_dir(work: Path) -> Path:
    return work / ".previous-export"


def keep_previous_export(drafter: Path, work: Path) -> None:
    """Move ``drafter/onnx`` and its ``export`` record section aside before the drafter is
    re-converted (the conversion replaces the dir). Call it only after
    :func:`specconv.outdir.check_replaceable` has accepted ``drafter`` as a conversion."""
    from ...record import read_record

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
    """Put the earlier export back when it was made from these exact drafter files; returns its
    ``export.onnx`` section, or None.

    Raises:
        InvalidInputError: the earlier export is of another format version
            (:func:`.export.check_meta_format`); it is left aside.
    """
    from ...record import file_hashes, update_record
    from .export import check_meta_format

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


def export_step(drafter: Path, work: Path, verifier: str | None) -> dict[str, Any]:
    """``--export-onnx``: re-use the earlier export of the same drafter bytes, else export (an
    earlier one of another format version: ``reuse_refused`` and a warning).

    Returns:
        ``{"reused", "contains_verifier_weights", "parity_passed"}`` (+ ``reuse_refused``).

    Raises:
        InvalidInputError / GateFailedError: from the export.
    """
    from ...errors import InvalidInputError
    from . import ENGINE

    refused = None
    try:
        try:
            section = _reuse(drafter, work)
        except InvalidInputError as e:
            refused, section = e.message, None
            log.warning("not re-using the earlier ONNX export: %s; exporting again", e.message)
        reused = section is not None
        if section is None:
            section = ENGINE.export.run(drafter, None, verifier=verifier, overwrite=True).to_dict()
    finally:
        shutil.rmtree(_prev_dir(work), ignore_errors=True)
    out = {"reused": reused, "contains_verifier_weights": bool(section.get("contains_verifier_weights")),
           "parity_passed": section.get("parity_passed")}
    return {**out, "reuse_refused": refused} if refused else out
