"""The one lifecycle of an export directory, whatever the engine (docs/architecture.md, "Adding an
engine"): refusals, a locked temp dir, the engine's files and check, the meta file, the swap into
place and ``export.<key>`` in ``DIR/specconv.json``. A failed check writes nothing.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InvalidInputError

if TYPE_CHECKING:
    from ..outdir import OutputKind
    from ..verifier import Verifier
    from .base import Exporter

log = logging.getLogger("specconv.engines")

__all__ = ["ExportJob", "check_meta", "check_speculators_dir", "default_verifier", "export", "files_of",
           "finish_export", "output_kinds", "read_meta", "record_export", "write_output"]


@dataclass
class ExportJob:
    """One export in progress (``options``: the engine's, by ``dest``; ``state``: what
    :meth:`~specconv.engines.base.Exporter.prepare` keeps; ``created``: ISO-8601 UTC)."""

    drafter_dir: Path
    out_dir: Path
    options: Mapping[str, Any]
    overwrite: bool = False
    verifier_spec: str | None = None
    state: dict[str, Any] = field(default_factory=dict)
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    _verifier: Verifier | None = None

    def verifier(self, why: str = "") -> Verifier:
        """The verifier, resolved once: ``--verifier``, else the one ``DIR/specconv.json`` records.

        Raises:
            InvalidInputError: ``verifier_not_found`` (exit 3): none given or recorded.
        """
        if self._verifier is None:
            from ..verifier import resolve_verifier

            spec = self.verifier_spec or default_verifier(self.drafter_dir)
            if not spec:
                raise InvalidInputError(f"{self.drafter_dir}/specconv.json names no verifier{why}: pass --verifier",
                                        code="verifier_not_found", hint="pass --verifier DIR_OR_HUB_ID")
            self._verifier = resolve_verifier(spec)
        return self._verifier


def output_kinds() -> dict[str, OutputKind]:
    """Every kind of directory specconv writes: the conversion and each engine's, the conversion's
    listing extended with every export's default sub-directory (judged as its own kind)."""
    from .. import outdir
    from . import engines

    kinds = dict(outdir.KINDS)
    subdirs: dict[str, str] = {}
    for e in engines():
        kinds.update(e.output_kinds)
        if e.export is not None:
            subdirs[e.export.dir_name] = e.export.dir_kind or e.export.kind
    kinds["conversion"] = outdir.conversion_kind(subdirs)
    return kinds


def check_speculators_dir(d: Path) -> None:
    """Refuse ``d`` unless its ``config.json`` has a ``speculators_model_type`` (what an export reads).

    Raises:
        InvalidInputError: ``not_speculators_dir`` (exit 3), the hint to convert it first.
    """
    from ..format import speculators_model_type_of

    if speculators_model_type_of(d) is None:
        raise InvalidInputError(
            f"{d} is not a Speculators-format directory (no config.json with speculators_model_type)",
            code="not_speculators_dir", hint=f"convert it first: specconv convert {d} --verifier V -o OUT")


def default_verifier(d: Path) -> str | None:
    """The verifier recorded in ``DIR/specconv.json`` (its ``spec``, else ``name_or_path``;
    a local one is recorded relative to DIR and returned absolute)."""
    from ..record import read_record, resolve_record_path

    conv = read_record(d, missing_ok=True).conversion
    v = conv.verifier if conv is not None else None
    if v is None:
        return None
    return resolve_record_path(v.spec or v.name_or_path, d)


def files_of(d: Path, but: str) -> dict[str, str]:
    """sha256 of every file under ``d`` but ``but`` (relative POSIX paths, sorted)."""
    from ..tensors import sha256_file

    return {p.relative_to(d).as_posix(): sha256_file(p) for p in sorted(d.rglob("*"))
            if p.is_file() and p.relative_to(d).as_posix() != but}


def write_output(out_dir: Path, kind: str, overwrite: bool, fill: Callable[[Path], Any]) -> Any:
    """Write an output dir of ``kind`` through a locked temp dir beside it (``fill(tmp)`` writes the
    files; raising writes nothing) and swap it into place; returns ``fill``'s value."""
    from ..outdir import move_into_place, public_modes, temp_output

    with temp_output(out_dir) as tmp:
        value = fill(tmp.path)
        public_modes(tmp.path)
        tmp.step = "moving it into place"
        move_into_place(tmp, out_dir, overwrite, kind, kinds=output_kinds)
    return value


def export(cap: Exporter, drafter_dir: str | Path, out: str | Path | None = None, *, overwrite: bool = False,
           verifier: str | None = None, record: bool = True, **options: Any) -> Any:
    """Export ``drafter_dir`` with the engine's export capability ``cap`` (``out`` default
    ``DIR/<cap.dir_name>``; ``options``: the engine's own); returns ``cap.result_type``.

    Raises:
        InvalidInputError: not a Speculators dir, an existing output without ``overwrite`` or not
            specconv's, the engine's refusals (exit 3, nothing written).
        GateFailedError: the engine's check refused the files (exit 4, nothing written).
    """
    from ..outdir import check_output

    d = Path(drafter_dir)
    out_dir = Path(out) if out is not None else d / cap.dir_name
    check_speculators_dir(d)
    cap.check_options(options)
    check_output(out_dir, cap.kind, overwrite, drafter_dir=d, kinds=output_kinds)
    job = ExportJob(d, out_dir, options, overwrite=overwrite, verifier_spec=verifier)
    cap.prepare(job)
    meta = write_output(out_dir, cap.kind, overwrite, lambda tmp: _fill(cap, job, tmp))
    result = cap.result(job, meta)
    if record and cap.record_key:
        # the card lists what DIR holds, and names where a separate-repo layout was written
        finish_export(d, cap.record_key, lambda prev: cap.record_value(job, result, prev),
                      card=out is None or cap.separate_repo, output=str(out_dir))
    return cap.result_type.of(result)


def _fill(cap: Exporter, job: ExportJob, tmp: Path) -> dict[str, Any]:
    """The engine's files, the meta, the engine's check (its keys added to the meta after it)."""
    from ..record import file_hashes

    kind = cap.engine.output_kinds[cap.kind]
    engine_meta = cap.write(job, tmp)
    meta = {"format": kind.format, "format_version": cap.meta_version, **engine_meta,
            "files": files_of(tmp, kind.record), "drafter_files": file_hashes(job.drafter_dir)}
    _write_meta(tmp / kind.record, meta)
    more = cap.check(job, tmp, meta)
    if more:
        meta.update(more)
        _write_meta(tmp / kind.record, meta)
    return meta


def _write_meta(path: Path, meta: dict[str, Any]) -> None:
    path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def finish_export(d: Path, key: str, value: Any, *, card: bool, output: str | None = None) -> None:
    """:func:`record_export`, then with ``card`` (the export inside the drafter dir) refresh the
    drafter's card, which lists it."""
    record_export(d, key, value, output=output)
    if card:
        from .card import refresh_local_card

        refresh_local_card(d)


def record_export(d: Path, key: str, value: Any, *, output: str | None = None) -> None:
    """Set ``export.<key>`` in ``DIR/specconv.json`` (the other keys kept; ``value``: the dict, or
    ``value(previous)``); its ``output`` is recorded relative to DIR. A read-only drafter dir only
    warns: the export itself is complete."""
    from ..record import as_record_path, update_section_key

    def new(prev: dict[str, Any] | None) -> dict[str, Any]:
        v = value(prev) if callable(value) else value
        return {**v, "output": as_record_path(v.get("output", output), d)} if "output" in v or output else v

    try:
        update_section_key(d, "export", key, new)
    except OSError as e:
        log.warning("could not record the export in %s/specconv.json: %s", d, e)


def read_meta(d: Path, cap: Exporter) -> Any:
    """The parsed meta file of ``d``'s export of ``cap`` (not checked), None when absent or unreadable."""
    kind = cap.engine.output_kinds[cap.kind]
    try:
        return json.loads((d / cap.dir_name / kind.record).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def check_meta(meta: Any, where: str | Path, cap: Exporter, *, shown: str | None = None, note: str = "") -> None:
    """Refuse a meta file of another format or version (exit 3, ``<command>_format_version``; the
    message says to export again with the engine's command)."""
    kind = cap.engine.output_kinds[cap.kind]
    fmt, got = (meta.get("format"), meta.get("format_version")) if isinstance(meta, dict) else (None, None)
    if fmt == kind.format and got == cap.meta_version:
        return
    command = " ".join(cap.surface.command)
    raise InvalidInputError(f"{where}: {shown or kind.name} {fmt!r} version {got!r}; this specconv reads "
                            f"{kind.format!r} version {cap.meta_version}{note}; re-export with `specconv {command}`",
                            code=f"{cap.surface.command[-1]}_format_version",
                            hint=f"specconv {command} DIR --overwrite")


def check_drafter_files(recorded: Any, drafter_dir: Path, artifact: str | Path, *, built: str, code: str) -> None:
    """Refuse an artifact of ``drafter_dir`` whose recorded ``drafter_files`` (what every export's
    meta records) are not :func:`specconv.record.file_hashes` of it now.

    Raises:
        InvalidInputError: ``code`` (exit 3): "``artifact`` was ``built`` from a different drafter".
    """
    from ..record import file_hashes

    if recorded != file_hashes(drafter_dir):
        raise InvalidInputError(f"{artifact} was {built} from a different drafter than {drafter_dir} (the sha256 "
                                "of config.json / weights differ)", code=code)
