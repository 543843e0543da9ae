"""``push`` with an engine's repo option (``--sglang-repo-id``): an export published as a Hub repo
of its own after the Speculators repo, for an engine that loads a whole repo
(:attr:`specconv.engines.base.Exporter.repo_option`; SGLang's: docs/sglang.md)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SpecconvError, UsageError
from .payload import Payload, add_manifest, check_links, link_problems

if TYPE_CHECKING:
    from ..engines.base import Exporter
    from ..results import PushResult
    from .push import PushOptions


def separate_payload(cap: Exporter, d: Path, rec: Any, repo_id: str, speculators_repo: str) -> Payload:
    """The files of ``cap``'s export of drafter dir ``d`` as the repo ``repo_id`` (its dir's files,
    its card, the manifest).

    Raises:
        GateFailedError: the engine's gate (:meth:`~specconv.engines.base.Exporter.repo_files`);
            ``link_outside_dir`` (exit 4): a file of the export that is a link out of it.
    """
    out, recorded = cap.repo_files(d, rec, repo_id)
    names = sorted(x for x in out.iterdir() if not x.name.startswith("."))
    check_links(out, link_problems(out, names), f"the {cap.engine.display} export")  # its bytes, never a link's
    p = Payload()
    for f in (x for x in names if x.is_file()):
        p.add(f.name, f, recorded.get(f.name))
    p.add("README.md", cap.repo_card(d, rec, repo_id, speculators_repo).encode("utf-8"))
    add_manifest(p)
    return p


def _asked(opts: PushOptions) -> list[tuple[Exporter, str]]:
    """``(exporter, repo id)`` of each separate repo asked for, in registry order."""
    from ..engines import exporters

    caps = [cap for cap in exporters() if cap.repo_option is not None and opts.separate_repos.get(cap.engine.key)]
    for cap in caps:
        flag = cap.repo_option.flags[0] if cap.repo_option is not None else "--repo-id"
        if opts.separate_repos[cap.engine.key] == opts.repo_id:
            raise UsageError(f"{flag} must name another repo than --repo-id ({cap.engine.display} loads a whole repo)")
    return [(cap, opts.separate_repos[cap.engine.key]) for cap in caps]


def push_with_separate(d: Path, opts: PushOptions) -> PushResult:
    """``push DIR --repo-id A --sglang-repo-id B``: every gate first, then A, then each B.

    Returns:
        A's :class:`~specconv.results.PushResult` with each B's under its engine's key.

    Raises:
        UsageError: a repo id equal to ``--repo-id``.
        GateFailedError: any gate (nothing pushed).
        SpecconvError: a B's push failed after A's succeeded; its ``result`` is A's result with
            B's error under the engine's key, and the message names A's commit.
    """
    from ..record import read_record
    from .push import _record_publish, build_payload, publish_payload

    asked = _asked(opts)
    rec = read_record(d, missing_ok=True)
    payloads = [(cap, repo, separate_payload(cap, d, rec, repo, opts.repo_id)) for cap, repo in asked]
    first = publish_payload(build_payload(d, opts), opts)
    _record_publish(d, first)
    out = first.to_dict()
    for cap, repo, p in payloads:
        key = cap.engine.key
        try:
            second = publish_payload(p, replace(opts, repo_id=repo, include=(), exclude=(), separate_repos={}))
        except SpecconvError as e:
            done = f"{opts.repo_id}: {first.status}" + (f" (commit {first.commit_oid})" if first.commit_oid else "")
            e.message = f"{done}; then the {cap.engine.display} repo {repo} failed: {e.message}"
            e.result = type(first).of({**out, "error": e.code, "exit_code": e.exit_code, "message": e.message,
                                       key: {"repo_id": repo, "error": e.code, "message": e.message}})
            raise
        _record_publish(d, second, key=key, label=cap.engine.display)
        out = {**out, key: second.to_dict(), "would_change": bool(out.get("would_change") or second.would_change)}
    return type(first).of(out)
