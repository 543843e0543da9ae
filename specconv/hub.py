"""The one module that talks to the Hugging Face Hub (docs/architecture.md, "The Hub"); importing
it does not import huggingface_hub. The token is never logged or put into an error message.
The download functions take ``repo_id``, ``revision`` (None: ``main``), ``endpoint_url``
(``--endpoint``) and ``wanted`` (default: the file, or the snapshot, code ``hub_error``).
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import re
import shutil
import struct
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import (
    HubAuthError,
    HubConflictError,
    InvalidInputError,
    RemoteNotFoundError,
    SpecconvError,
    TransientRemoteError,
)

if TYPE_CHECKING:  # pragma: no cover
    from huggingface_hub import HfApi

__all__ = ["HEADERS_ONLY_MARKER", "HUB_ERROR_RULES", "HubErrorRule", "RemoteFile", "Wanted", "api",
           "bytes_downloaded", "cache_dir", "check_card", "commit", "create_branch", "create_tag", "ensure_repo",
           "open_pull_request", "read_remote_file", "refs", "remote_files", "repo_state",
           "download_file", "download_snapshot", "endpoint", "header_snapshot", "hub_error", "is_hub_id",
           "is_offline", "safetensors_header", "token"]

_REPO_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9][A-Za-z0-9_.\-]*)?")


# ------------------------------------------------------------------------ identity
def is_hub_id(name: str | None) -> bool:
    """Whether ``name`` is a Hub repo id (``namespace/name`` or a bare ``name``, as vLLM accepts)
    that is not an existing local path. The rules mirror huggingface_hub's ``validate_repo_id``
    (``src/huggingface_hub/utils/_validators.py``) without importing it (tests/hub cross-checks)."""
    if not name or len(name) > 96 or name.count("/") > 1 or not _REPO_ID_RE.fullmatch(name):
        return False
    if "--" in name or ".." in name or name.endswith(".git"):
        return False
    if any(part.endswith(("-", ".")) for part in name.split("/")):
        return False
    return not os.path.exists(name)


# ----------------------------------------------------------------------- settings
def endpoint(explicit: str | None = None) -> str | None:
    """The Hub endpoint: ``explicit`` (``--endpoint``), else ``HF_ENDPOINT`` now, else None (the default)."""
    value = explicit or os.environ.get("HF_ENDPOINT") or None
    return value.rstrip("/") if value else None


def token(explicit: str | None = None) -> str | None:
    """The Hub token: ``explicit``, else ``HF_TOKEN`` now, else None (huggingface_hub's stored login)."""
    return explicit or os.environ.get("HF_TOKEN") or None


def is_offline() -> bool:
    """Whether huggingface_hub is in offline mode (``HF_HUB_OFFLINE``, read at its import)."""
    from huggingface_hub import constants

    return bool(constants.is_offline_mode())


def cache_dir() -> str:
    """huggingface_hub's cache directory (``HF_HUB_CACHE``, default ``~/.cache/huggingface/hub``)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def api(endpoint_url: str | None = None, token_value: str | None = None) -> HfApi:
    """The one ``HfApi`` factory (:func:`endpoint`, :func:`token`), tagged ``library_name="specconv"``."""
    from huggingface_hub import HfApi

    from . import __version__

    _install_byte_counter()
    return HfApi(endpoint=endpoint(endpoint_url), token=token(token_value),
                 library_name="specconv", library_version=__version__)


# ---------------------------------------------------------------------- downloads
def download_file(repo_id: str, filename: str, *, revision: str | None = None, endpoint_url: str | None = None,
                  wanted: Wanted | None = None, missing_ok: bool = False) -> Path | None:
    """One file of a model repo, downloaded or from the cache: its path in the cache snapshot; None
    when absent (``EntryNotFoundError``) and ``missing_ok``. Raises the :func:`hub_error`."""
    from huggingface_hub import errors as hf_errors

    with _mapped(repo_id, wanted or Wanted(filename)):
        try:
            return Path(api(endpoint_url).hf_hub_download(repo_id, filename, revision=revision))
        except hf_errors.EntryNotFoundError:
            if missing_ok:
                return None
            raise


def download_snapshot(repo_id: str, *, revision: str | None = None, allow_patterns: list[str] | None = None,
                      endpoint_url: str | None = None, wanted: Wanted | None = None) -> Path:
    """The cache snapshot dir of the repo's files matching ``allow_patterns`` (fnmatch; None: all).
    Raises the :func:`hub_error`."""
    with _mapped(repo_id, wanted or Wanted("the snapshot")):
        return Path(api(endpoint_url).snapshot_download(repo_id, revision=revision, allow_patterns=allow_patterns))


# ------------------------------------------------------------- bytes downloaded
_COUNT_LOCK = threading.Lock()
_COUNT = {"bytes": 0, "installed": False}


def _counting_stream(inner: Any) -> Any:
    """Wrap a response body stream (an ``httpx2.SyncByteStream``) so every chunk is counted."""
    import httpx2

    class CountingStream(httpx2.SyncByteStream):
        def __iter__(self):
            for chunk in inner:
                with _COUNT_LOCK:
                    _COUNT["bytes"] += len(chunk)
                yield chunk

        def close(self) -> None:
            inner.close()

    return CountingStream()


def _count_response(response: Any) -> None:
    response.stream = _counting_stream(response.stream)


def _install_byte_counter() -> None:
    """Add the counting response hook to huggingface_hub's shared client (once per process)."""
    with _COUNT_LOCK:
        if _COUNT["installed"]:
            return
        _COUNT["installed"] = True
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils import _http  # default_client_factory is not re-exported

    def factory():
        client = _http.default_client_factory()
        hooks = dict(client.event_hooks)
        hooks["response"] = [*hooks.get("response", []), _count_response]
        client.event_hooks = hooks
        return client

    set_client_factory(factory)


def bytes_downloaded() -> int:
    """Body bytes huggingface_hub's client has received in this process (as sent, before decoding)."""
    with _COUNT_LOCK:
        return int(_COUNT["bytes"])


# ------------------------------------------------------------ headers-only reads
#: Written inside a :func:`header_snapshot` dir (under ``.cache/``, which source listings skip).
HEADERS_ONLY_MARKER = ".cache/specconv-headers-only.json"


def _write_header_stub(path: Path, meta: Any) -> None:
    """A safetensors file with the remote header and a sparse (all-zero, unallocated) data area."""
    header: dict[str, Any] = {"__metadata__": dict(meta.metadata)} if meta.metadata else {}
    for name, t in meta.tensors.items():
        header[name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": list(t.data_offsets)}
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    data_len = max((t.data_offsets[1] for t in meta.tensors.values()), default=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.truncate(8 + len(raw) + data_len)


def safetensors_header(repo_id: str, filename: str, *, revision: str | None = None,
                       endpoint_url: str | None = None, wanted: Wanted | None = None) -> Any:
    """The ``SafetensorsFileMetadata`` of one remote safetensors file, by HTTP range requests
    (``tensors``: name → dtype, shape, data_offsets). Raises the :func:`hub_error`."""
    with _mapped(repo_id, wanted or Wanted(filename)):
        return api(endpoint_url).parse_safetensors_file_metadata(repo_id, filename, revision=revision)


def header_snapshot(repo_id: str, *, revision: str | None = None, allow_patterns: list[str] | None = None,
                    endpoint_url: str | None = None, wanted: Wanted | None = None) -> Path:
    """A headers-only local view of a Hub repo (``$SPECCONV_CACHE/hub-headers/models--ORG--NAME/<commit>/``,
    :data:`HEADERS_ONLY_MARKER`): files as :func:`download_snapshot`, safetensors as sparse stubs whose
    data reads as zeros, so for detection only, never a conversion. Raises the :func:`hub_error`."""
    with _mapped(repo_id, wanted or Wanted("the snapshot")):
        return _header_view(api(endpoint_url), repo_id, revision, allow_patterns)


def _header_view(hf: Any, repo_id: str, revision: str | None, allow_patterns: list[str] | None) -> Path:
    """:func:`header_snapshot`'s work, its huggingface_hub errors unmapped."""
    from .offline import cache_dir as specconv_cache

    sha = hf.model_info(repo_id, revision=revision).sha
    root = specconv_cache() / "hub-headers" / ("models--" + repo_id.replace("/", "--")) / sha
    if (root / HEADERS_ONLY_MARKER).is_file():
        return root
    paths = [f.path for f in hf.list_repo_tree(repo_id, recursive=True, revision=sha) if hasattr(f, "size")]
    if allow_patterns is not None:
        paths = [p for p in paths if any(fnmatch.fnmatch(p, pat) for pat in allow_patterns)]
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{sha}.", dir=root.parent))
    try:
        _fill_header_view(tmp, hf, repo_id, sha, paths)
        try:
            os.replace(tmp, root)
        except OSError:  # a concurrent run finished first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return root


def _fill_header_view(tmp: Path, hf: Any, repo_id: str, sha: str, paths: list[str]) -> None:
    """Write ``paths`` of ``repo_id@sha`` into ``tmp``: small files whole, safetensors as header stubs."""
    small = [p for p in paths if not p.endswith(".safetensors")]
    if small:
        snap = Path(hf.snapshot_download(repo_id, revision=sha, allow_patterns=small))
        for p in small:
            (tmp / p).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(snap / p, tmp / p)
    for p in paths:
        if p.endswith(".safetensors"):
            _write_header_stub(tmp / p, hf.parse_safetensors_file_metadata(repo_id, p, revision=sha))
    (tmp / HEADERS_ONLY_MARKER).parent.mkdir(parents=True, exist_ok=True)
    (tmp / HEADERS_ONLY_MARKER).write_text(json.dumps(
        {"repo_id": repo_id, "commit": sha, "tensor_data": "not downloaded (sparse zeros)"}, indent=1) + "\n")


# -------------------------------------------------------------------- error table
def _status(e: BaseException) -> int | None:
    return getattr(getattr(e, "response", None), "status_code", None)


@dataclass(frozen=True)
class HubErrorRule:
    """One row of :data:`HUB_ERROR_RULES`: ``exc`` (a ``huggingface_hub.errors`` or builtin class
    name), ``when`` (extra condition), the ``error`` class, ``code`` (None: the caller's), ``hint``,
    ``message`` (``str.format`` over what, repo, error, status; None: :func:`_describe`), ``writes``
    (upload-side calls only)."""

    exc: str
    error: type[SpecconvError]
    code: str | None
    hint: str | None = None
    when: Callable[[BaseException], bool] | None = None
    message: str | None = None
    writes: bool = False

    def matches(self, e: BaseException) -> bool:
        from huggingface_hub import errors as hf_errors

        cls = getattr(hf_errors, self.exc, None) or _BUILTIN.get(self.exc)
        return cls is not None and isinstance(e, cls) and (self.when is None or self.when(e))


_BUILTIN: dict[str, Any] = {"ConnectionError": ConnectionError, "TimeoutError": TimeoutError, "ValueError": ValueError}
_LOGIN = "log in with `hf auth login` or set HF_TOKEN"
_OFFLINE = "unset HF_HUB_OFFLINE to download it, or fill the cache first (`hf download REPO`)"
#: offline, an upload-side call (a push reads the remote state, --dry-run too): no cache helps
_OFFLINE_PUSH = "unset HF_HUB_OFFLINE: publishing reads the repo's state on the Hub (--dry-run too) and uploads to it"
_PRIVATE = "check the repo id; if the repo is private, set HF_TOKEN to a token that can read it"
_NETWORK = "check the network / HF_ENDPOINT and retry"

#: Ordered: the first matching row decides; subclasses before their bases, as in the ``hf`` CLI's
#: ``CLI_ERROR_MAPPINGS``. Upload-side calls see the ``writes`` rows first (a ``ValueError`` is
#: raised before any upload, or is a 400's ``BadRequestError``; a 401 on a repo URL comes as
#: ``RepositoryNotFoundError``).
HUB_ERROR_RULES: tuple[HubErrorRule, ...] = (
    HubErrorRule("ValueError", InvalidInputError, "hub_rejected", message="{what} on {repo!r}: {error}", writes=True),
    HubErrorRule("HfHubHTTPError", HubConflictError, "parent_commit_moved",
                 "re-run: the push re-plans against the new head", when=lambda e: _status(e) == 412,
                 message="{what} on {repo!r}: the branch head moved since the plan (HTTP 412)", writes=True),
    HubErrorRule("HfHubHTTPError", HubConflictError, "hub_conflict", when=lambda e: _status(e) == 409,
                 message="{what} on {repo!r}: the Hub answered 409 (it exists already)", writes=True),
    HubErrorRule("HfHubHTTPError", HubAuthError, "hub_auth", "set HF_TOKEN to a token with write access to the repo",
                 when=lambda e: _status(e) in (401, 403),
                 message="{what} on {repo!r}: the Hub refused the credentials (HTTP {status})", writes=True),
    HubErrorRule("OfflineModeIsEnabled", InvalidInputError, None, _OFFLINE_PUSH, writes=True),
    HubErrorRule("LocalEntryNotFoundError", InvalidInputError, None, _OFFLINE_PUSH, when=lambda e: is_offline(),
                 writes=True),
    HubErrorRule("OfflineModeIsEnabled", InvalidInputError, None, _OFFLINE),
    HubErrorRule("GatedRepoError", HubAuthError, "hub_gated",
                 "request access on the repo's Hub page, then " + _LOGIN),
    HubErrorRule("RepositoryNotFoundError", RemoteNotFoundError, "hub_repo_not_found", _PRIVATE),
    HubErrorRule("RevisionNotFoundError", RemoteNotFoundError, "hub_revision_not_found",
                 "check --revision (a branch, tag or commit of the repo)"),
    HubErrorRule("LocalTokenNotFoundError", HubAuthError, "hub_auth", _LOGIN),
    HubErrorRule("RemoteEntryNotFoundError", InvalidInputError, None),
    HubErrorRule("IncompleteSnapshotError", InvalidInputError, None, _OFFLINE),
    HubErrorRule("LocalEntryNotFoundError", InvalidInputError, None, _OFFLINE, when=lambda e: is_offline()),
    # online: huggingface_hub reports a connection failure (after its own retries) this way
    HubErrorRule("LocalEntryNotFoundError", TransientRemoteError, "hub_unreachable", _NETWORK),
    HubErrorRule("EntryNotFoundError", InvalidInputError, None),
    HubErrorRule("HfHubHTTPError", HubAuthError, "hub_auth", _LOGIN, when=lambda e: _status(e) in (401, 403)),
    HubErrorRule("HfHubHTTPError", TransientRemoteError, "hub_unreachable",
                 "the Hub is overloaded or down; retry later",
                 when=lambda e: (_status(e) or 0) == 429 or (_status(e) or 0) >= 500),
    HubErrorRule("HfHubHTTPError", InvalidInputError, None),
    HubErrorRule("TransportError", TransientRemoteError, "hub_unreachable", _NETWORK),
    HubErrorRule("ConnectionError", TransientRemoteError, "hub_unreachable", _NETWORK),
    HubErrorRule("TimeoutError", TransientRemoteError, "hub_unreachable", _NETWORK),
)


def _describe(what: str, repo: str, e: BaseException) -> str:
    """Message for a Hub file that could not be had (offline: not cached, and where the cache is;
    ``LocalEntryNotFoundError``'s own text would blame the network)."""
    from huggingface_hub import errors as hf_errors

    if (is_offline() and isinstance(e, hf_errors.LocalEntryNotFoundError)
            and not isinstance(e, hf_errors.IncompleteSnapshotError)):
        return (f"{what} of {repo!r} is not in the local Hugging Face cache ({cache_dir()}) "
                "and offline mode (HF_HUB_OFFLINE=1) forbids downloading it")
    return f"cannot fetch {what} of {repo!r} from the Hub: {type(e).__name__}: {e}"


def hub_error(what: str, repo: str, e: BaseException, *, code: str, hint: str | None = None,
              writes: bool = False) -> SpecconvError:
    """The (unraised) project error for ``e`` from a Hub call, by :data:`HUB_ERROR_RULES`: ``code``
    for rows that keep the caller's; ``hint`` where the row has none, and for exit-3 rows."""
    import httpx2  # huggingface_hub 2.x sends its requests with it

    _BUILTIN["TransportError"] = httpx2.TransportError
    for rule in HUB_ERROR_RULES:
        if (writes or not rule.writes) and rule.matches(e):
            msg = (rule.message.format(what=what, repo=repo, error=e, status=_status(e)) if rule.message
                   else _describe(what, repo, e))
            row_hint = hint if rule.error is InvalidInputError and hint else (rule.hint or hint)
            return rule.error(msg, code=rule.code or code, hint=row_hint)
    return InvalidInputError(_describe(what, repo, e), code=code, hint=hint)


@dataclass(frozen=True)
class Wanted:
    """What a caller wants from the Hub (:func:`hub_error`'s what, code, hint); ``role``
    (``verifier`` / ``source``) prefixes the message."""

    what: str
    code: str = "hub_error"
    hint: str | None = None
    role: str | None = None


@contextmanager
def _mapped(repo: str, wanted: Wanted, *, writes: bool = False) -> Iterator[None]:
    """Raise what huggingface_hub raises inside the block as the :func:`hub_error` of ``wanted``."""
    try:
        yield
    except SpecconvError:
        raise
    except Exception as e:  # noqa: BLE001 - every other exception goes through the one table
        err = hub_error(wanted.what, repo, e, code=wanted.code, hint=wanted.hint, writes=writes)
        if wanted.role:
            err.message = f"{wanted.role}: {err.message}"
        raise err from e


# --------------------------------------------------------------------- publishing
@dataclass(frozen=True)
class RemoteFile:
    """One file of a remote tree: ``blob_id`` the git sha1 (of the LFS pointer for LFS files),
    ``sha256`` the content's for LFS files (None for regular git files)."""

    path: str
    size: int
    blob_id: str
    sha256: str | None


def _upload_side(what: str):
    """Map an upload-side call's errors (``writes`` rows first) naming ``what`` (or the call's ``what=``)."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(hf: Any, repo_id: str, *args: Any, what: str = what, **kwargs: Any) -> Any:
            with _mapped(repo_id, Wanted(what), writes=True):
                return fn(hf, repo_id, *args, **kwargs)
        return call
    return wrap


@_upload_side("the repo state")
def repo_state(hf: HfApi, repo_id: str, revision: str) -> tuple[str, bool] | None:
    """``(head commit, private)`` at ``revision``; None when the repo does not exist (a 401 / 403,
    which huggingface_hub reports as not found, raises: exit 5)."""
    from huggingface_hub import errors as hf_errors

    try:
        info = hf.model_info(repo_id, revision=revision)
    except hf_errors.RepositoryNotFoundError as e:  # not RevisionNotFoundError's base: that one propagates
        if _status(e) in (401, 403):
            raise
        return None
    return str(info.sha), bool(info.private)


@_upload_side("creating the repo")
def ensure_repo(hf: HfApi, repo_id: str, private: bool | None) -> bool:
    """``create_repo(exist_ok=True)``; whether the repo is private (the Hub ignores ``private`` for an
    existing repo)."""
    hf.create_repo(repo_id, private=private, exist_ok=True)
    return bool(hf.model_info(repo_id).private)


@_upload_side("listing files")
def remote_files(hf: HfApi, repo_id: str, revision: str) -> dict[str, RemoteFile]:
    """Every file of ``repo_id`` at ``revision`` (``list_repo_tree(recursive=True)``)."""
    from huggingface_hub.hf_api import RepoFile

    out: dict[str, RemoteFile] = {}
    for f in hf.list_repo_tree(repo_id, revision=revision, recursive=True):
        if isinstance(f, RepoFile):  # folders have no size
            out[f.path] = RemoteFile(f.path, int(f.size), str(f.blob_id), f.lfs.sha256 if f.lfs else None)
    return out


@_upload_side("listing refs")
def refs(hf: HfApi, repo_id: str) -> dict[str, dict[str, str]]:
    """``{"branches": {name: commit}, "tags": {name: commit}}`` (``list_repo_refs``)."""
    r = hf.list_repo_refs(repo_id)
    return {"branches": {b.name: b.target_commit for b in r.branches},
            "tags": {t.name: t.target_commit for t in r.tags}}


@_upload_side("creating the branch")
def create_branch(hf: HfApi, repo_id: str, branch: str) -> None:
    """Create ``branch`` from ``main`` (``create_branch``; exists → 409)."""
    hf.create_branch(repo_id, branch=branch)


@_upload_side("committing")
def commit(hf: HfApi, repo_id: str, adds: dict[str, bytes | Path], deletes: list[str], *, message: str,
           description: str, revision: str, parent_commit: str) -> tuple[str, str]:
    """One atomic ``create_commit`` on ``revision`` (a branch or ``refs/pr/N``) guarded by
    ``parent_commit`` (moved: ``parent_commit_moved``, exit 6). ``adds``: repo path → bytes or a file.
    Returns ``(commit oid, commit url)`` (no change: the current head)."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    ops: list[Any] = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=src if isinstance(src, bytes) else str(src))
                      for p, src in sorted(adds.items())]
    ops += [CommitOperationDelete(path_in_repo=p) for p in sorted(deletes)]
    info = hf.create_commit(repo_id, ops, commit_message=message, commit_description=description,
                            revision=revision, parent_commit=parent_commit)
    return str(info.oid), str(info.commit_url)


@_upload_side("tagging")
def create_tag(hf: HfApi, repo_id: str, tag: str, revision: str, *, replace: bool) -> None:
    """Tag ``revision``; with ``replace`` delete an existing tag of that name first."""
    if replace:
        hf.delete_tag(repo_id, tag=tag)
    hf.create_tag(repo_id, tag=tag, revision=revision, tag_message=f"specconv release {tag}")


@_upload_side("finding the pull request")
def open_pull_request(hf: HfApi, repo_id: str, *, title: str, dry_run: bool = False) -> int | None:
    """The number of the open pull request titled ``title`` (reused), else of a new one (None on a
    ``dry_run`` that would open one)."""
    for d in hf.get_repo_discussions(repo_id, discussion_type="pull_request", discussion_status="open"):
        if d.title == title:
            return int(d.num)
    if dry_run:
        return None
    return int(hf.create_pull_request(repo_id, title=title, description="Opened by specconv push.").num)


def check_card(content: str) -> dict[str, Any]:
    """A model card's metadata dict, parsed locally by huggingface_hub's ``ModelCard``
    (``src/huggingface_hub/repocard.py``). Raises InvalidInputError (``bad_card``): missing or invalid."""
    from huggingface_hub import ModelCard

    try:
        card = ModelCard(content, ignore_metadata_errors=False)
    except Exception as e:  # ValueError from the YAML/metadata parser
        raise InvalidInputError(f"model card metadata invalid: {e}", code="bad_card") from e
    meta = card.data.to_dict()
    if not meta:
        raise InvalidInputError("model card has no YAML metadata", code="bad_card")
    return meta


@_upload_side("reading a remote file")
def read_remote_file(hf: HfApi, repo_id: str, path: str, revision: str) -> bytes | None:
    """The bytes of one remote file (through the Hub cache); None when the repo has no such file."""
    from huggingface_hub import errors as hf_errors

    try:
        return Path(hf.hf_hub_download(repo_id, path, revision=revision)).read_bytes()
    except hf_errors.EntryNotFoundError:
        return None
