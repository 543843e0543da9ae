"""What publishing SGLang's layout as its own Hub repo rests on (``push --sglang-repo-id``; the
gate: :func:`sglang_problem`, docs/sglang.md) and the cards' SGLang lines.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...results import SglangExport

__all__ = ["card_section", "is_sglang_file", "local_export_path", "sglang_problem"]

#: where ``specconv export sglang`` writes by default (inside the drafter dir)
DEFAULT_DIR = "sglang"


def _export(rec: Any) -> SglangExport:
    """The record's ``export.sglang`` (an empty one when unset)."""
    from ...results import SglangExport

    exp = rec.export.sglang if rec.export is not None else None
    return exp if exp is not None else SglangExport()


def _export_dir(d: Path, rec: Any) -> Path | None:
    out = _export(rec).output
    return (d / out) if isinstance(out, str) and not Path(out).is_absolute() else None


def is_sglang_file(d: Path, rec: Any, rel: str) -> bool:
    """``rel`` (a path in drafter dir ``d``) belongs to an SGLang export: never pushed with the
    Speculators repo."""
    out = _export(rec).output
    prefixes = {DEFAULT_DIR + "/"} | ({out.rstrip("/") + "/"}
                                      if isinstance(out, str) and not out.startswith("..") else set())
    return any(rel.startswith(p) for p in prefixes)


def sglang_problem(d: Path, rec: Any) -> str | None:
    """Why ``d``'s SGLang layout cannot be published or printed as checked (None: it can)."""
    from ...record import file_hashes
    from .export import layout_files

    exp = _export(rec)
    out = _export_dir(d, rec)
    check = exp.check or {}
    if out is None or not out.is_dir():
        return "no SGLang export in the record (run `specconv export sglang DIR --check`)"
    if not check:
        return f"{out}: SGLang's loader has not checked it (`specconv export sglang DIR --check`)"
    if not check.get("ok"):
        return (f"{out}: SGLang's loader check failed: "
                f"{'; '.join(check.get('errors', []) + check.get('mismatches', []))}")
    if check.get("files") != exp.files:
        return f"{out}: the check was made on other bytes than the export records"
    if layout_files(out) != exp.files:
        return f"{out}: its files changed after the export (sha256 differs from export.sglang.files)"
    if exp.drafter_files != file_hashes(d):
        return f"{out}: made from other drafter files than {d} holds now; export again"
    return None


def local_export_path(d: Path, rec: Any) -> str | None:
    """The local card's ``--speculative-draft-model-path``: the recorded export, relative to ``d``."""
    out = _export(rec).output
    if not isinstance(out, str) or not (d / out).is_dir():
        return None
    return out if out.startswith(("./", "../")) else "./" + out


def card_section(d: Path, rec: Any, verifier: str, draft: str) -> dict[str, Any] | None:
    """The Speculators card's SGLang section, or None unless the export's check passed on these bytes."""
    from ... import hub
    from .layout import launch_command

    exp = _export(rec)
    check, algo = exp.check, exp.algorithm
    if sglang_problem(d, rec) is not None or check is None or algo is None:  # a passed check records both
        return None
    return {"version": check.get("version"), "distribution": check.get("distribution"), "class": check.get("class"),
            "draft": draft, "repo_url": f"https://huggingface.co/{draft}" if hub.is_hub_id(draft) else None,
            "command": launch_command(verifier, draft, algo, exp.env or {}), "env": exp.env or {}}


def _rows(exp: SglangExport) -> list[tuple[str, str]]:
    """The SGLang card's table of what SGLang resolved (each equal to the Speculators drafter's)."""
    check = exp.check or {}
    r = check.get("resolved") or {}
    rows = [("draft class", f"`{check.get('class')}`"),
            ("verifier layers captured (SGLang ids)", ", ".join(map(str, r.get("captured_layer_ids") or []))),
            ("= Speculators aux_hidden_state_layer_ids", ", ".join(map(str, r.get("capture_layer_inputs") or []))),
            ("block slots / drafts per pass", f"{r.get('block_slots')} / {r.get('drafts_per_block')}"),
            ("mask_token_id", str(r.get("mask_token_id"))),
            ("sample_from_anchor", json.dumps(r.get("sample_from_anchor"))),
            ("causal draft layers", json.dumps(r.get("layer_causal")))]
    rows += [(k, json.dumps(r[k])) for k in ("markov_rank", "markov_head_type", "confidence_head") if k in r]
    return rows
