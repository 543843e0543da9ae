"""SGLang's layout as its own Hub repo (``push --sglang-repo-id``) and the cards' SGLang lines.

SGLang's ``--speculative-draft-model-path`` takes a folder or a repo id, never a subfolder, so
the layout is published as a second repo after the Speculators one; the gate is
:func:`sglang_problem` (docs/sglang.md).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import GateFailedError, SpecconvError, UsageError
from .payload import Payload, add_manifest

if TYPE_CHECKING:
    from ..results import SglangExport

__all__ = ["card_section", "is_sglang_file", "local_export_path", "push_with_sglang", "sglang_payload",
           "sglang_problem"]

#: where ``specconv export sglang`` writes by default (inside the drafter dir)
DEFAULT_DIR = "sglang"


def _export(rec: Any) -> SglangExport:
    """The record's ``export.sglang`` (an empty one when unset)."""
    from ..results import SglangExport

    exp = rec.export.sglang if rec.export is not None else None
    return exp if exp is not None else SglangExport()


def _export_dir(d: Path, rec: Any) -> Path | None:
    out = _export(rec).output
    return (d / out) if isinstance(out, str) and not Path(out).is_absolute() else None


def is_sglang_file(d: Path, rec: Any, rel: str) -> bool:
    """``rel`` (a path in drafter dir ``d``) belongs to an SGLang export: never pushed with the
    Speculators repo."""
    out = _export(rec).output
    prefixes = {DEFAULT_DIR + "/"} | ({out.rstrip("/") + "/"} if isinstance(out, str) and not out.startswith("..") else set())
    return any(rel.startswith(p) for p in prefixes)


def sglang_problem(d: Path, rec: Any) -> str | None:
    """Why ``d``'s SGLang layout cannot be published or printed as checked (None: it can)."""
    from ..export.sglang_dir import layout_files
    from ..record import file_hashes

    exp = _export(rec)
    out = _export_dir(d, rec)
    check = exp.check or {}
    if out is None or not out.is_dir():
        return "no SGLang export in the record (run `specconv export sglang DIR --check`)"
    if not check:
        return f"{out}: SGLang's loader has not checked it (`specconv export sglang DIR --check`)"
    if not check.get("ok"):
        return f"{out}: SGLang's loader check failed: {'; '.join(check.get('errors', []) + check.get('mismatches', []))}"
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
    from .. import hub
    from ..export.sglang import launch_command

    if sglang_problem(d, rec) is not None:
        return None
    exp = _export(rec)
    check = exp.check
    return {"version": check.get("version"), "distribution": check.get("distribution"), "class": check.get("class"),
            "draft": draft, "repo_url": f"https://huggingface.co/{draft}" if hub.is_hub_id(draft) else None,
            "command": launch_command(verifier, draft, exp.algorithm, exp.env or {}), "env": exp.env or {}}


def _rows(exp: SglangExport) -> list[tuple[str, str]]:
    """The SGLang card's table of what SGLang resolved (each equal to the Speculators drafter's)."""
    r = exp.check.get("resolved") or {}
    rows = [("draft class", f"`{exp.check.get('class')}`"),
            ("verifier layers captured (SGLang ids)", ", ".join(map(str, r.get("captured_layer_ids") or []))),
            ("= Speculators aux_hidden_state_layer_ids", ", ".join(map(str, r.get("capture_layer_inputs") or []))),
            ("block slots / drafts per pass", f"{r.get('block_slots')} / {r.get('drafts_per_block')}"),
            ("mask_token_id", str(r.get("mask_token_id"))),
            ("sample_from_anchor", json.dumps(r.get("sample_from_anchor"))),
            ("causal draft layers", json.dumps(r.get("layer_causal")))]
    rows += [(k, json.dumps(r[k])) for k in ("markov_rank", "markov_head_type", "confidence_head") if k in r]
    return rows


def render_sglang_card(d: Path, rec: Any, repo_id: str, speculators_repo: str) -> str:
    """The SGLang repo's README.md: a link back to the Speculators repo, the serve line, the check.

    Raises:
        InvalidInputError: the rendered metadata does not parse (``hub.check_card``).
    """
    import jinja2
    import yaml

    from .. import __version__, hub
    from ..format.algorithms import algorithm
    from ..format.schema import read_config
    from .card import _templates, choose_license
    from .payload import published_verifier

    exp = _export(rec)
    alg = algorithm(exp.algorithm)
    verifier = published_verifier(read_config(d)) or "unknown"
    license_id, license_note = choose_license(d, rec)
    meta: dict[str, Any] = {"license": license_id,
                            "tags": sorted({alg.name, "speculative-decoding", "sglang", "specconv"})}
    if hub.is_hub_id(verifier):
        meta["base_model"] = verifier
    env = " ".join(f"{k}={v}" for k, v in sorted((exp.env or {}).items()))
    ctx = dict(metadata_yaml=yaml.safe_dump(meta, sort_keys=True, allow_unicode=True), title=repo_id.split("/")[-1],
               algorithm_name=alg.display_name, speculators_repo=speculators_repo, verifier=verifier,
               verifier_url=f"https://huggingface.co/{verifier}" if hub.is_hub_id(verifier) else None,
               command=card_section(d, rec, verifier, repo_id)["command"], env=env, check=exp.check,
               rows=_rows(exp), target_supplied=", ".join(f"`{n}`" for n in exp.target_supplied or []),
               files=sorted(exp.files.items()), notes=exp.notes or [],
               specconv_version=rec.specconv_version or __version__, license=license_id, license_note=license_note)
    env_ = jinja2.Environment(loader=jinja2.FileSystemLoader(str(_templates())), keep_trailing_newline=True,
                              undefined=jinja2.StrictUndefined, autoescape=False)
    text = env_.get_template("model_card_sglang.md.j2").render(**ctx)
    hub.check_card(text)
    return text


def sglang_payload(d: Path, rec: Any, repo_id: str, speculators_repo: str) -> Payload:
    """The SGLang repo's files: the export dir's (weights, config, its record) plus its card.

    Raises:
        GateFailedError: ``sglang_not_checked`` (exit 4): :func:`sglang_problem`.
    """
    problem = sglang_problem(d, rec)
    if problem is not None:
        raise GateFailedError(f"--sglang-repo-id {repo_id}: {problem}", code="sglang_not_checked",
                              hint="specconv export sglang DIR --check --overwrite, then push again")
    out, files = _export_dir(d, rec), _export(rec).files
    p = Payload()
    for f in sorted(x for x in out.iterdir() if x.is_file() and not x.name.startswith(".")):
        p.add(f.name, f, files.get(f.name))
    p.add("README.md", render_sglang_card(d, rec, repo_id, speculators_repo).encode("utf-8"))
    add_manifest(p)
    return p


def push_with_sglang(d: Path, opts: Any) -> Any:
    """``push DIR --repo-id A --sglang-repo-id B``: both gates first, then A, then B.

    Returns:
        A's :class:`~specconv.publish.push.PushResult` with ``sglang``: B's.

    Raises:
        UsageError: the two repo ids are equal.
        GateFailedError: either gate (nothing pushed).
        SpecconvError: B's push failed after A's succeeded; its ``result`` is A's result
            with B's error under ``sglang``, and the message names A's commit.
    """
    from ..record import read_record
    from .push import _record_publish, build_payload, publish_payload

    if opts.sglang_repo_id == opts.repo_id:
        raise UsageError("--sglang-repo-id must name another repo than --repo-id (SGLang loads a whole repo)")
    rec = read_record(d, missing_ok=True)
    sg = sglang_payload(d, rec, opts.sglang_repo_id, opts.repo_id)
    first = publish_payload(build_payload(d, opts), opts)
    _record_publish(d, first)
    try:
        second = publish_payload(sg, replace(opts, repo_id=opts.sglang_repo_id, include=(), exclude=(),
                                             sglang_repo_id=None))
    except SpecconvError as e:
        done = f"{opts.repo_id}: {first.status}" + (f" (commit {first.commit_oid})" if first.commit_oid else "")
        e.message = f"{done}; then the SGLang repo {opts.sglang_repo_id} failed: {e.message}"
        e.result = type(first).of({**first.to_dict(), "error": e.code, "exit_code": e.exit_code, "message": e.message,
                                   "sglang": {"repo_id": opts.sglang_repo_id, "error": e.code, "message": e.message}})
        raise
    _record_publish(d, second, key="sglang")
    return type(first).of({**first.to_dict(), "sglang": second.to_dict(),
                           "would_change": bool(first.would_change or second.would_change)})
