"""``specconv export sglang DIR``: a Speculators dir → SGLang's layout (``DIR/sglang`` by default)
through the one export lifecycle (docs/sglang.md, "The layout", "The check").
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import InvalidInputError
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
    """The drafter tensors SGLang replaces by the target's, each proven equal to it (:func:`_equal`).

    Raises:
        InvalidInputError: ``sglang_target_tensor_differs``: SGLang would serve the
            verifier's tensor instead of a different trained one.
    """
    from .layout import TARGET_SUPPLIED

    roles = dict(zip(TARGET_SUPPLIED, ("embed", "lm_head"), strict=True))
    out = []
    for name in (n for n in TARGET_SUPPLIED if n in store):
        vname = verifier.find_tensor(roles[name])
        mine, theirs = store.info(name), (verifier.tensor_info(vname) if vname else None)
        if (not vname or theirs is None or tuple(mine.shape) != tuple(theirs.shape)
                or not _equal(store, name, verifier, vname)):
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
    """``(layout, meta, verifier spec)`` of ``drafter_dir``: the :class:`.layout.SglangLayout`, the
    ``sglang_export.json`` content without ``files``; nothing written.

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

    sc = raw.get("speculators_config")
    sc = sc if isinstance(sc, dict) else {}
    v = sc.get("verifier")
    name = v.get("name_or_path") if isinstance(v, dict) else None
    return next((v for v in (name, spec) if isinstance(v, str) and hub.is_hub_id(v)), None)


def export_sglang_dir(drafter_dir: str | Path, out: str | Path | None = None, *, verifier: str | None = None,
                      overwrite: bool = False, check: Callable[[Path, str], dict[str, Any]] | None = None,
                      record: bool = True) -> ExportSglangResult:
    """Write SGLang's layout of a Speculators dir (``out`` default ``DIR/sglang``). ``check(files_dir,
    verifier)`` runs on the written files before they are moved into place and returns the ``check``
    payload or raises; ``record``: set ``export.sglang`` in ``DIR/specconv.json``.

    Raises:
        InvalidInputError: a refusal (exit 3, nothing written), an existing output
            without ``overwrite``, no SGLang interpreter for ``check``.
        GateFailedError: SGLang's loader refused the files (exit 4, nothing written).
    """
    from ..exportdir import export
    from . import ENGINE

    return export(ENGINE.export, drafter_dir, out, overwrite=overwrite, verifier=verifier, record=record, gate=check)


def prepare(job: Any) -> None:
    """:func:`plan_sglang` (every refusal), kept for :func:`write`."""
    layout, meta, spec = plan_sglang(job.drafter_dir, job.verifier_spec)
    job.state.update(layout=layout, meta=meta, spec=spec)


def write(job: Any, tmp: Path) -> dict[str, Any]:
    """Copy the weights and write ``config.json`` into ``tmp``; returns the meta's keys
    (:func:`plan_sglang`'s; the lifecycle adds ``files``)."""
    d, layout, meta = job.drafter_dir, job.state["layout"], job.state["meta"]
    for name in weight_files(d):
        shutil.copyfile(d / name, tmp / name)  # a regular file, never a link
    (tmp / "config.json").write_text(json.dumps(layout.config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    files = layout_files(tmp)
    for name in weight_files(d):
        if files[name] != meta["drafter_files"].get(name):
            raise InvalidInputError(f"{d / name} changed while it was copied", code="sglang_copy_changed")
    return meta


def gate(job: Any, tmp: Path) -> None:
    """The caller's check of the written files (``export sglang --check``: SGLang's own loader),
    kept for :func:`result` (the meta does not hold it)."""
    if job.options.get("gate") is not None:
        job.state["check"] = job.options["gate"](tmp, job.state["spec"])


def result(job: Any, meta: dict[str, Any]) -> dict[str, Any]:
    from .layout import launch_argv

    keep = ("format", "format_version", "algorithm", "speculative_algorithm", "architecture", "env", "expected",
            "target_supplied", "notes", "drafter_files")
    res = {"output": str(job.out_dir), **{k: meta[k] for k in keep}, "files": meta["files"]}
    res["launch"] = launch_argv(meta.get("verifier") or "VERIFIER", str(job.out_dir), meta["algorithm"])
    return {**res, **({"check": job.state["check"]} if "check" in job.state else {})}


def record_value(result: dict[str, Any], prev: dict[str, Any] | None) -> dict[str, Any]:
    """``export.sglang``: the result, ``launch`` None (the recorded argv would name a local path:
    rebuilt where it is printed); an earlier check of the same bytes is kept with it."""
    new = {**result, "launch": None}
    prev = prev or {}
    if "check" not in new and (prev.get("check") or {}).get("files") == new["files"]:
        return {**new, "check": prev["check"]}
    return new


def record_sglang_check(drafter_dir: str | Path, result: ExportSglangResult, check: dict[str, Any]) -> None:
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
