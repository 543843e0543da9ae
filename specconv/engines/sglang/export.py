"""``specconv export sglang DIR``: a Speculators dir → SGLang's layout (``DIR/sglang`` by default),
written through a locked temp dir renamed at the end (:mod:`specconv.outdir`). The files and
``--check``: ``docs/sglang.md`` ("The layout", "The check"). The result is recorded under
``export.sglang`` in ``DIR/specconv.json``; a check made earlier on the same bytes
(``validate --sglang-load-check`` exports to a temp dir) is kept.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ...errors import InvalidInputError
from ...outdir import check_output, move_into_place, temp_output
from ...results import ExportSglangResult
from . import FORMAT, FORMAT_VERSION, META_NAME

if TYPE_CHECKING:
    from ...verifier import Verifier

log = logging.getLogger("specconv.export")

__all__ = ["FORMAT", "FORMAT_VERSION", "META_NAME", "export_sglang_dir", "plan_sglang", "record_sglang_check",
           "layout_files", "weight_files"]



def weight_files(d: Path) -> list[str]:
    """The drafter's weight files: every ``*.safetensors`` and the index, sorted."""
    return sorted(p.name for p in d.iterdir() if p.is_file() and (
        p.name.endswith(".safetensors") or p.name == "model.safetensors.index.json"))


def layout_files(out: Path) -> dict[str, str]:
    """sha256 of every file of an SGLang export dir but its record (what SGLang loads)."""
    from ...tensors import sha256_file

    return {p.name: sha256_file(p) for p in sorted(out.iterdir()) if p.is_file() and p.name != META_NAME}


def _verifier(d: Path, spec: str | None):
    """The verifier (``--verifier``, else the one ``DIR/specconv.json`` records)."""
    from ...verifier import resolve_verifier
    from ..exportdir import default_verifier

    spec = spec or default_verifier(d)
    if not spec:
        raise InvalidInputError(f"{d}: no verifier recorded in specconv.json; SGLang's layout needs its layer count",
                                code="sglang_no_verifier", hint="pass --verifier DIR_OR_HUB_ID")
    v = resolve_verifier(spec)
    return v.spec, v  # a local path made absolute: the check's runner works in a temp dir


def _target_supplied(d: Path, store: Any, verifier: Verifier) -> list[str]:
    """The drafter tensors SGLang replaces by the target's, each proven equal to it: the same
    bytes, or (another dtype) the verifier's tensor cast to the drafter's dtype, element for
    element — what SGLang serves in that dtype.

    Raises:
        InvalidInputError: ``sglang_target_tensor_differs``: SGLang would serve the
            verifier's tensor instead of a different trained one.
    """
    from .layout import TARGET_SUPPLIED

    roles = dict(zip(TARGET_SUPPLIED, ("embed", "lm_head")))
    out = []
    for name in (n for n in TARGET_SUPPLIED if n in store):
        vname = verifier.find_tensor(roles[name])
        mine, theirs = store.info(name), (verifier.tensor_info(vname) if vname else None)
        if theirs is None or tuple(mine.shape) != tuple(theirs.shape) or not _equal(store, name, verifier, vname):
            shown = f"{theirs.dtype} {list(theirs.shape)}" if theirs else "none"
            raise InvalidInputError(
                f"{d}: {name} ({mine.dtype} {list(mine.shape)}) differs from the verifier's {vname or roles[name]} "
                f"({shown}): SGLang takes it from the target and would serve the verifier's instead "
                "(srt/models/dflash.py, dspark.py skip it)", code="sglang_target_tensor_differs")
        out.append(name)
    return out


def _equal(store: Any, name: str, verifier: Verifier, vname: str) -> bool:
    """Bytes when the dtypes agree, else the verifier's tensor cast to the drafter's dtype (torch)."""
    if store.info(name).dtype == verifier.tensor_info(vname).dtype:
        return store.read_bytes(name) == verifier.read_bytes(vname)
    from ...extras import require

    torch = require("torch", "validate", feature="comparing a drafter's embedding / LM head with the verifier's")
    mine = store.read_tensor(name)
    return bool(torch.equal(verifier.read_tensor(vname).to(mine.dtype), mine))


def plan_sglang(drafter_dir: str | Path, verifier: str | None = None) -> tuple[Any, dict[str, Any], str]:
    """SGLang's layout of ``drafter_dir`` and what its export records, nothing written.

    Returns:
        ``(layout, meta, verifier)``: :class:`specconv.engines.sglang.layout.SglangLayout`, the
        ``sglang_export.json`` content without ``files``, and the verifier spec used.

    Raises:
        InvalidInputError: not a Speculators dir, no verifier, or a refusal by name
            (:func:`specconv.engines.sglang.layout.sglang_layout`, exit 3).
    """
    from ... import __version__
    from ...format import read_config, speculators_model_type_of
    from ...record import file_hashes
    from ...tensors import open_store
    from .layout import sglang_layout

    d = Path(drafter_dir)
    if speculators_model_type_of(d) is None:
        raise InvalidInputError(f"{d} is not a Speculators-format directory (no config.json with "
                                "speculators_model_type)", code="not_speculators_dir")
    spec, v = _verifier(d, verifier)
    store = open_store(d)
    layout = sglang_layout(read_config(d), store.names(), v.num_hidden_layers, source=str(d / "config.json"))
    from ...format.algorithms import algorithm

    facts = algorithm(layout.algorithm).sglang
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "specconv_version": __version__,
            "algorithm": layout.algorithm, "speculative_algorithm": facts.speculative_algorithm,
            "architecture": facts.architecture, "verifier": _published_verifier(read_config(d), spec),
            "env": layout.env, "expected": layout.expected, "target_supplied": _target_supplied(d, store, v),
            "notes": layout.notes, "drafter_files": file_hashes(d)}
    return layout, meta, spec


def _published_verifier(raw: dict[str, Any], spec: str) -> str | None:
    """The verifier's Hub id: the one the Speculators config records, else ``spec`` when it
    is one (what a serve line can name; a local path is not recorded)."""
    from ... import hub

    sc = raw.get("speculators_config") if isinstance(raw.get("speculators_config"), dict) else {}
    name = (sc.get("verifier") or {}).get("name_or_path") if isinstance(sc.get("verifier"), dict) else None
    return next((v for v in (name, spec) if isinstance(v, str) and hub.is_hub_id(v)), None)


def _write(tmp: Path, d: Path, layout: Any, meta: dict[str, Any]) -> dict[str, str]:
    """Copy the weights, write config.json and the record into ``tmp``; returns the files' sha256."""
    for name in weight_files(d):
        shutil.copyfile(d / name, tmp / name)  # a regular file, never a link
    (tmp / "config.json").write_text(json.dumps(layout.config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    files = layout_files(tmp)
    for name in weight_files(d):
        if files[name] != meta["drafter_files"].get(name):
            raise InvalidInputError(f"{d / name} changed while it was copied", code="sglang_copy_changed")
    (tmp / META_NAME).write_text(json.dumps({**meta, "files": files}, indent=2, sort_keys=True) + "\n",
                                 encoding="utf-8")
    for p in (tmp, *tmp.iterdir()):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return files


def export_sglang_dir(drafter_dir: str | Path, out: str | Path | None = None, *, verifier: str | None = None,
                      overwrite: bool = False, check: Callable[[Path, str], dict[str, Any]] | None = None,
                      record: bool = True) -> "ExportSglangResult":
    """Write SGLang's layout of a Speculators dir (see the module docstring).

    Args:
        drafter_dir: the Speculators-format DFlash or DSpark dir.
        out: output dir (default ``DIR/sglang``).
        verifier: verifier dir or Hub id (default: the one in ``DIR/specconv.json``).
        overwrite: replace an earlier SGLang export (:func:`specconv.outdir.check_replaceable`).
        check: ``check(files_dir, verifier)``, run on the written files before they are moved into
            place, returns the ``check`` payload or raises (:func:`specconv.engines.sglang.check.export_checked`
            passes SGLang's own loader; this room does not import the check).
        record: set ``export.sglang`` in ``DIR/specconv.json``.

    Returns:
        :class:`~specconv.results.ExportSglangResult` (what ``export.sglang`` records, ``output``
        absolute, ``launch`` the argv with the recorded verifier; ``check`` with ``check``).

    Raises:
        InvalidInputError: a refusal (exit 3, nothing written), an existing output
            without ``overwrite``, no SGLang interpreter for ``check``.
        GateFailedError: SGLang's loader refused the files (exit 4, nothing written).
    """
    d = Path(drafter_dir)
    out_dir = Path(out) if out is not None else d / "sglang"
    from ..exportdir import output_kinds

    check_output(out_dir, "sglang", overwrite, drafter_dir=d, kinds=output_kinds)
    layout, meta, spec = plan_sglang(d, verifier)
    with temp_output(out_dir) as tmp:
        files = _write(tmp.path, d, layout, meta)
        result = _result(meta, files, out_dir)
        if check is not None:
            tmp.step = "checking its files with SGLang's loader"
            result["check"] = check(tmp.path, spec)
        move_into_place(tmp, out_dir, overwrite, "sglang", kinds=output_kinds)
    if record:
        _record(d, result)
        from ..card import refresh_local_card

        refresh_local_card(d)  # the card's SGLang section, once a check of these bytes passed
    return ExportSglangResult.of(result)


def _result(meta: dict[str, Any], files: dict[str, str], out_dir: Path) -> dict[str, Any]:
    from .layout import launch_argv

    keep = ("format", "format_version", "algorithm", "speculative_algorithm", "architecture", "env", "expected",
            "target_supplied", "notes", "drafter_files")
    res = {"output": str(out_dir), **{k: meta[k] for k in keep}, "files": files}
    res["launch"] = launch_argv(meta.get("verifier") or "VERIFIER", str(out_dir), meta["algorithm"])
    return res


def _record(d: Path, result: dict[str, Any]) -> None:
    """``export.sglang`` of ``DIR/specconv.json`` (other export keys kept); an earlier check
    of the same bytes is kept with it."""
    from ...record import as_record_path, update_section_key

    new = {**result, "output": as_record_path(result.get("output"), d),
           "launch": None}  # the recorded argv names a local path: rebuilt where it is printed

    def merged(prev: dict[str, Any] | None) -> dict[str, Any]:
        prev = prev or {}
        if "check" not in new and (prev.get("check") or {}).get("files") == new["files"]:
            return {**new, "check": prev["check"]}
        return new

    try:
        update_section_key(d, "export", "sglang", merged)
    except OSError as e:  # a read-only drafter dir: the export itself is complete
        log.warning("could not record the SGLang export in %s/specconv.json: %s", d, e)


def record_sglang_check(drafter_dir: str | Path, result: "ExportSglangResult", check: dict[str, Any]) -> None:
    """Record a check of an export made elsewhere (``validate --sglang-load-check``'s temp
    dir, ``result`` its :func:`export_sglang_dir`) under ``export.sglang.check``: beside the
    recorded export when its files are these bytes, else as an export without ``output``
    (nothing in DIR holds those bytes yet)."""
    from ...record import update_section_key

    export = result.to_dict()

    def checked(prev: dict[str, Any] | None) -> dict[str, Any]:
        prev = prev or {}
        if prev.get("files") == export["files"] and prev.get("drafter_files") == export["drafter_files"]:
            return {**prev, "check": check}
        return {**export, "output": None, "launch": None, "check": check}

    update_section_key(Path(drafter_dir), "export", "sglang", checked)
