"""``specconv push``: publish a validated drafter directory as one atomic Hub commit (the
flags, gates, retries and exit codes: docs/cli.md, "push"). Every Hub call goes through
:mod:`specconv.hub`; the files and their gates are :mod:`.payload`'s.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import HubConflictError, PostPublishError, SpecconvError, TransientRemoteError
from ..results import PushResult
from .payload import MANIFEST, Payload, collect, derived_files

log = logging.getLogger("specconv")

PR_TITLE = "[specconv] publish {repo}"


@dataclass
class PushOptions:
    """The ``specconv push`` flags (see ``docs/cli.md``)."""

    repo_id: str
    endpoint: str | None = None
    private: bool | None = None
    branch: str | None = None
    create_pr: bool = False
    tag: str | None = None
    force_tag: bool = False
    commit_message: str | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    delete_stale: bool = False
    max_retries: int = 3
    dry_run: bool = False
    detailed_exitcode: bool = False
    verify: bool = True
    allow_unvalidated: bool = False
    allow_verifier_weights: bool = False
    #: engines ``validate --compare`` found departing that may be published anyway (``--allow-departing``)
    allow_departing: tuple[str, ...] = ()
    #: engine key → the Hub repo its export is also published as (an exporter's ``repo_option``: .separate_repo)
    separate_repos: dict[str, str] = field(default_factory=dict)


def build_payload(d: Path, opts: PushOptions) -> Payload:
    """Gate and collect ``d``'s files, then add the regenerated card, record, plot, manifest."""
    from ..engines.card import render_card

    p, rec = collect(d, include=opts.include, exclude=opts.exclude, allow_unvalidated=opts.allow_unvalidated,
                     allow_verifier_weights=opts.allow_verifier_weights, allow_departing=opts.allow_departing)
    plot = _plot(rec)
    card = render_card(d, rec, p, opts.repo_id, plot=plot is not None, separate_repos=opts.separate_repos)
    derived_files(p, rec, card, plot)
    return p


def _plot(rec: Any) -> bytes | None:
    """The acceptance plot regenerated from the record's per-position acceptance (PNG bytes)."""
    v = rec.validation
    pos = v.acceptance_at_pos if v is not None else None
    if not pos:
        return None
    import tempfile

    from ..validate.report import plot_acceptance

    with tempfile.TemporaryDirectory(prefix="specconv-plot-") as tmp:
        out = plot_acceptance({"acceptance_at_pos": pos, "acceptance_length": v.acceptance_length},
                              Path(tmp) / "acceptance.png")
        return out.read_bytes() if out else None


def git_blob_sha1(data: bytes) -> str:
    """The git blob id the Hub reports for a regular file (``blob <len>\\0`` + bytes)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _same(p: Payload, path: str, remote: Any) -> bool:
    if remote is None:
        return False
    if remote.sha256 is not None:
        return remote.sha256 == p.sha256[path]
    src = p.files[path]
    return git_blob_sha1(src if isinstance(src, bytes) else src.read_bytes()) == remote.blob_id


def plan(p: Payload, remote: dict[str, Any], owned: list[str], delete_stale: bool) -> list[dict[str, Any]]:
    """One entry per file: ``add`` / ``update`` / ``unchanged`` / ``delete`` (stale specconv-owned
    remote files, only with ``--delete-stale``; ``.gitattributes`` never)."""
    rows = [{"path": path, "size": p.size(path), "sha256": p.sha256[path],
             "action": "unchanged" if _same(p, path, remote.get(path)) else ("update" if path in remote else "add")}
            for path in sorted(p.files)]
    if delete_stale:
        rows += [{"path": path, "size": remote[path].size, "sha256": remote[path].sha256, "action": "delete"}
                 for path in sorted(set(owned) - set(p.files)) if path in remote and path != ".gitattributes"]
    return rows


def _owned(hf: Any, repo_id: str, head: str, remote: dict[str, Any]) -> list[str]:
    """Paths the remote ``specconv-manifest.json`` says specconv wrote."""
    import json

    from .. import hub

    if MANIFEST not in remote:
        return []
    raw = hub.read_remote_file(hf, repo_id, MANIFEST, head)
    try:
        return sorted(json.loads(raw or b"{}").get("files") or {})
    except ValueError:
        return []


def _delay(attempt: int) -> float:
    base = float(os.environ.get("SPECCONV_HUB_RETRY_DELAY", "2"))
    return base * (2 ** attempt)


def push(d: Path, opts: PushOptions) -> PushResult:
    """Publish drafter dir ``d`` to ``opts.repo_id``.

    Returns:
        :class:`PushResult`: ``status`` (``published`` | ``unchanged`` | ``pr_opened`` |
        ``dry_run``), ``commit_oid``, ``commit_url``, ``pr_url``, ``files`` (the plan), ...

    Raises:
        GateFailedError: not validated / modified after validation (exit 4).
        HubAuthError (5), HubConflictError (6), TransientRemoteError (7),
        PostPublishError (8), RemoteNotFoundError (9).
    """
    from .. import hub

    for flag, repo in (("--repo-id", opts.repo_id), *_repo_flags(opts)):
        if repo is not None and ("/" not in repo or not hub.is_hub_id(repo)):
            from ..errors import UsageError

            raise UsageError(f"{flag} {repo!r} is not a Hub repo id ORG/NAME")
    if opts.separate_repos:  # the Speculators repo first, then each engine's own
        from .separate_repo import push_with_separate

        return push_with_separate(Path(d), opts)
    result = publish_payload(build_payload(Path(d), opts), opts)
    _record_publish(Path(d), result)
    return result


def _repo_flags(opts: PushOptions) -> list[tuple[str, str]]:
    """``(flag, repo id)`` of each engine repo option given."""
    from ..engines import exporters

    return [(cap.repo_option.flags[0], opts.separate_repos[cap.engine.key]) for cap in exporters()
            if cap.repo_option is not None and opts.separate_repos.get(cap.engine.key)]


def publish_payload(p: Payload, opts: PushOptions) -> PushResult:
    """Publish payload ``p`` to ``opts.repo_id``: the commit rounds, re-planned after a 412
    and retried after a transient error (see :func:`push`)."""
    from .. import hub
    from ..extras import quiet_library_bars

    hf = hub.api(opts.endpoint)
    quiet_library_bars()
    for attempt in range(opts.max_retries + 1):
        try:
            return _attempt(hf, p, opts)
        except (TransientRemoteError, HubConflictError) as e:
            retryable = isinstance(e, TransientRemoteError) or e.code == "parent_commit_moved"
            if not retryable or attempt >= opts.max_retries:
                if isinstance(e, TransientRemoteError):
                    e.message += f" (after {attempt + 1} attempt(s))"
                raise
            wait = _delay(attempt) if isinstance(e, TransientRemoteError) else 0.0
            log.warning("%s; re-planning and retrying in %.3fs (%d/%d)", e.message, wait, attempt + 1, opts.max_retries)
            time.sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover


def _record_publish(d: Path, r: PushResult, key: str | None = None, label: str = "") -> None:
    """The ``publish`` section of the local ``specconv.json`` (never part of what is pushed), or
    its ``key`` (an engine's key: its own repo's push, beside the Speculators repo's; ``label``:
    the engine's display name, for the log)."""
    if r.status == "dry_run":
        return
    from ..record import PublishedRepo, update_record, update_section_key

    body = {k: getattr(r, k) for k in PublishedRepo.model_fields}
    try:
        update_section_key(d, "publish", key, body) if key else update_record(d, "publish", body)
    except (OSError, SpecconvError) as e:  # a read-only dir: the push itself succeeded
        log.warning("could not record the %spush in %s/specconv.json: %s", f"{label} " if label else "", d, e)


def _result(p: Payload, opts: PushOptions, rows: list[dict], **kw: Any) -> PushResult:
    from .. import hub

    changes = [r for r in rows if r["action"] != "unchanged"]
    return PushResult.of(dict(schema="specconv.publish/v1", repo_id=opts.repo_id, repo_type="model",
                              endpoint=hub.endpoint(opts.endpoint) or "https://huggingface.co", files=rows,
                              bytes_to_upload=sum(r["size"] for r in changes if r["action"] != "delete"),
                              would_change=bool(changes), detailed_exitcode=opts.detailed_exitcode,
                              warnings=sorted(set(p.warnings)), tag=opts.tag, **kw))


def _target(hf: Any, opts: PushOptions) -> tuple[str, int | None]:
    """``(revision to commit to, PR number)``: ``main``, ``--branch`` (created from ``main`` when
    missing, not on a dry run) or the open specconv PR's ``refs/pr/N`` (reused or opened)."""
    from .. import hub

    repo = opts.repo_id
    if opts.create_pr:
        num = hub.open_pull_request(hf, repo, title=PR_TITLE.format(repo=repo), dry_run=opts.dry_run)
        return (f"refs/pr/{num}" if num else "main"), num
    if opts.branch and opts.branch != "main":
        if opts.branch not in hub.refs(hf, repo)["branches"]:
            if opts.dry_run:
                return "main", None
            hub.create_branch(hf, repo, opts.branch)
        return opts.branch, None
    return "main", None


def _remote_plan(hf: Any, p: Payload, opts: PushOptions, private: bool) -> tuple[str, int | None, str, list[dict]]:
    """Visibility checked, the target resolved and the plan made against its head:
    ``(revision, PR number, head commit, plan rows)``."""
    from .. import hub

    _check_visibility(private, opts)
    revision, num = _target(hf, opts)
    head = hub.repo_state(hf, opts.repo_id, revision)[0]
    remote = hub.remote_files(hf, opts.repo_id, head)
    return revision, num, head, plan(p, remote, _owned(hf, opts.repo_id, head, remote), opts.delete_stale)


def _check_visibility(private: bool, opts: PushOptions) -> None:
    if opts.private is not None and private != opts.private:
        have, want = ("private" if private else "public"), ("private" if opts.private else "public")
        raise HubConflictError(f"{opts.repo_id} exists and is {have}, but --{want} was asked",
                               code="visibility_mismatch",
                               hint="change the repo's visibility on the Hub, or drop the flag")


def _check_tag(hf: Any, opts: PushOptions, head: str, changes: bool) -> str | None:
    """The commit the tag points at now; a tag elsewhere is a conflict without ``--force-tag``."""
    from .. import hub

    if not opts.tag:
        return None
    cur = hub.refs(hf, opts.repo_id)["tags"].get(opts.tag)
    if cur is not None and (changes or cur != head) and not opts.force_tag:
        raise HubConflictError(f"tag {opts.tag} already points at {cur[:12]} of {opts.repo_id}",
                               code="tag_exists", hint="pass --force-tag to move it, or choose a new version")
    return cur


def _verify(hf: Any, p: Payload, opts: PushOptions, oid: str) -> bool:
    """Compare the remote tree at ``oid`` with the local bytes (sha256 for LFS files, git blob
    sha1 for regular ones, as huggingface_hub ``verify_repo_checksums`` does)."""
    from .. import hub

    remote = hub.remote_files(hf, opts.repo_id, oid, what="verifying")
    bad = [path for path in sorted(p.files) if not _same(p, path, remote.get(path))]
    if bad:
        raise PostPublishError(f"{opts.repo_id}@{oid[:12]}: remote checksum differs from the local file for "
                               + ", ".join(bad), code="checksum_mismatch",
                               hint="re-run the push; if it persists, inspect the files on the Hub")
    return True


def _dry_run(hf: Any, p: Payload, opts: PushOptions, state: tuple[str, bool] | None) -> PushResult:
    """The plan, from reads only (no write request)."""
    if state is None:
        rows = plan(p, {}, [], False)
        return _result(p, opts, rows, status="dry_run", private=opts.private, revision=opts.branch or "main",
                       parent_commit=None, commit_oid=None, commit_url=None, pr_url=None, pr_revision=None,
                       verified=None, repo_exists=False)
    revision, num, head, rows = _remote_plan(hf, p, opts, state[1])
    _check_tag(hf, opts, head, any(r["action"] != "unchanged" for r in rows))
    return _result(p, opts, rows, status="dry_run", private=state[1], revision=revision, parent_commit=head,
                   commit_oid=None, commit_url=None, pr_url=None, pr_revision=f"refs/pr/{num}" if num else None,
                   verified=None, repo_exists=True)


def _attempt(hf: Any, p: Payload, opts: PushOptions) -> PushResult:
    """One plan + commit + tag + verify round (re-run from the top after a 412 or a 5xx)."""
    from .. import hub

    repo = opts.repo_id
    state = hub.repo_state(hf, repo, "main")
    if opts.dry_run:
        return _dry_run(hf, p, opts, state)
    private = hub.ensure_repo(hf, repo, opts.private)
    revision, num, head, rows = _remote_plan(hf, p, opts, private)
    changed = [r for r in rows if r["action"] != "unchanged"]
    tag_at = _check_tag(hf, opts, head, bool(changed))
    base = (hub.endpoint(opts.endpoint) or "https://huggingface.co") + f"/{repo}"
    oid, url = head, f"{base}/commit/{head}"
    if changed:
        adds = {r["path"]: p.files[r["path"]] for r in changed if r["action"] != "delete"}
        deletes = [r["path"] for r in changed if r["action"] == "delete"]
        message = opts.commit_message or (f"specconv: release {opts.tag}" if opts.tag else "specconv: publish drafter")
        description = f"Published by specconv push ({len(adds)} file(s), {len(deletes)} deletion(s))."
        oid, url = hub.commit(hf, repo, adds, deletes, message=message, description=description, revision=revision,
                              parent_commit=head)
    if opts.tag and tag_at != oid:
        hub.create_tag(hf, repo, opts.tag, oid, replace=tag_at is not None)
    verified = _verify(hf, p, opts, oid) if opts.verify else None
    status = "unchanged" if oid == head else ("pr_opened" if num else "published")
    return _result(p, opts, rows, status=status, private=private, revision=revision, parent_commit=head,
                   commit_oid=oid, commit_url=url, pr_url=f"{base}/discussions/{num}" if num else None,
                   pr_revision=f"refs/pr/{num}" if num else None, verified=verified, repo_exists=True)
