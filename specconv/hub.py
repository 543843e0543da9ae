"""The one module that talks to the Hugging Face Hub (a test scans ``specconv/`` for any other
import of ``huggingface_hub``; importing this module does not import it).

Every function here that calls the Hub raises the specconv error that :data:`HUB_ERROR_RULES`
maps huggingface_hub's exception to, naming what its caller wanted (:class:`Wanted`), so no
caller catches huggingface_hub's exceptions (a test scans for that). The endpoint and token are
read at call time (:func:`api`); the token is never logged or put into an error message.
The download functions take ``repo_id`` (``namespace/name``), ``revision`` (branch, tag or
commit; None: ``main``), ``endpoint_url`` (``--endpoint``, :func:`endpoint`) and ``wanted``
(how a failure names what was wanted; default: the file, or the snapshot, code ``hub_error``).
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

from .errors import (HubAuthError, HubConflictError, InvalidInputError, RemoteNotFoundError, SpecconvError,
                     TransientRemoteError)

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
    """Whether ``name`` is a Hub repo id (``namespace/name`` or a bare ``name``) and no local path.

    Decision: a bare ``name`` (``gpt2``) counts, because the Hub, huggingface_hub's
    ``validate_repo_id`` (``src/huggingface_hub/utils/_validators.py``) and vLLM all accept
    one; a string that exists as a local path never counts (vLLM 0.33 decides local vs
    remote the same way). The character rules mirror ``validate_repo_id`` (1–96 chars of
    ``[A-Za-z0-9-_.]``, at most one ``/``, no ``--`` or ``..``, no part ending in ``-`` or
    ``.``, not ending in ``.git``) without importing huggingface_hub;
    ``tests/hub/test_hub_module.py`` cross-checks the two.

    Args:
        name: a ``SRC`` / ``--verifier`` value or a recorded ``name_or_path``.

    Returns:
        True for a syntactically valid repo id that is not an existing path.
    """
    if not name or len(name) > 96 or name.count("/") > 1 or not _REPO_ID_RE.fullmatch(name):
        return False
    if "--" in name or ".." in name or name.endswith(".git"):
        return False
    if any(part.endswith(("-", ".")) for part in name.split("/")):
        return False
    return not os.path.exists(name)


# ----------------------------------------------------------------------- settings
def endpoint(explicit: str | None = None) -> str | None:
    """The Hub endpoint: ``explicit`` (``--endpoint``), else ``HF_ENDPOINT`` now, else None.

    None lets huggingface_hub use its default (``https://huggingface.co``).
    """
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
    """The one ``HfApi`` factory: explicit endpoint and token, resolved at call time.

    Args:
        endpoint_url: ``--endpoint``; None → ``HF_ENDPOINT`` → library default.
        token_value: explicit token; None → ``HF_TOKEN`` → stored login.

    Returns:
        ``huggingface_hub.HfApi`` tagged ``library_name="specconv"``.
    """
    from huggingface_hub import HfApi

    from . import __version__

    _install_byte_counter()
    return HfApi(endpoint=endpoint(endpoint_url), token=token(token_value),
                 library_name="specconv", library_version=__version__)


# ---------------------------------------------------------------------- downloads
def download_file(repo_id: str, filename: str, *, revision: str | None = None, endpoint_url: str | None = None,
                  wanted: Wanted | None = None, missing_ok: bool = False) -> Path | None:
    """Download (or find in the cache) one file of a model repo.

    Args:
        filename: path inside the repo.
        missing_ok: return None when the file is absent (from the repo, or from the cache
            when offline or unreachable: huggingface_hub's ``EntryNotFoundError``).

    Returns:
        The file's path inside the Hub cache snapshot (None: absent and ``missing_ok``).

    Raises:
        SpecconvError: the :func:`hub_error` of what huggingface_hub raised (e.g.
            ``LocalEntryNotFoundError`` when offline and not cached: exit 3).
    """
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
    """Download (or find in the cache) the files of a model repo matching ``allow_patterns``.

    Args:
        allow_patterns: fnmatch globs (huggingface_hub ``filter_repo_objects``); None = all.

    Returns:
        The snapshot directory inside the Hub cache.

    Raises:
        SpecconvError: the :func:`hub_error` of what huggingface_hub raised, e.g.
            ``IncompleteSnapshotError`` when offline and the cached tree lists missing files.
    """
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
    """A safetensors file with the remote header and a sparse (all-zero, unallocated) data area.

    Only headers may be read from it: the tensor bytes were never downloaded.
    """
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
    """The header of one remote safetensors file, read with HTTP range requests (no tensor data).

    Args:
        filename: the ``.safetensors`` path in the repo.

    Returns:
        ``huggingface_hub.utils.SafetensorsFileMetadata``: ``tensors`` maps each name to
        ``(dtype, shape, data_offsets)``; ``metadata`` is the ``__metadata__`` dict.

    Raises:
        SpecconvError: the :func:`hub_error` of what huggingface_hub raised, e.g.
            ``SafetensorsParsingError`` for a corrupt header (exit 3).
    """
    with _mapped(repo_id, wanted or Wanted(filename)):
        return api(endpoint_url).parse_safetensors_file_metadata(repo_id, filename, revision=revision)


def header_snapshot(repo_id: str, *, revision: str | None = None, allow_patterns: list[str] | None = None,
                    endpoint_url: str | None = None, wanted: Wanted | None = None) -> Path:
    """A local view of a Hub repo for headers-only inspection; downloads no tensor data.

    Files matching ``allow_patterns`` are fetched as :func:`download_snapshot` would, except
    ``*.safetensors``: of those only the header is read (HTTP range requests through
    huggingface_hub) and written as a sparse stub of the right shape. The view lives under
    ``$SPECCONV_CACHE/hub-headers/models--ORG--NAME/<commit>/`` and carries
    :data:`HEADERS_ONLY_MARKER`; reading tensor data from it gives zeros, so it is for
    detection and header checks only (``specconv inspect``), never for a conversion.

    Args:
        allow_patterns: fnmatch globs over repo paths; None = all files.

    Returns:
        The view's root directory (repo paths below it).

    Raises:
        SpecconvError: the :func:`hub_error` of what huggingface_hub raised.
    """
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
    """One row of :data:`HUB_ERROR_RULES`.

    Attributes:
        exc: class name in ``huggingface_hub.errors`` (or a builtin exception name).
        error: the specconv error class raised (its ``exit_code`` is the process exit).
        code: the error's stable slug; None keeps the caller's code (e.g. ``source_not_found``).
        hint: what the user can do, or None.
        when: extra condition on the exception (status code, offline mode), or None.
        message: the message as a ``str.format`` template over ``what``, ``repo``, ``error``
            and ``status``; None: the download wording of :func:`_describe`.
        writes: the row applies to upload-side calls only (push / release), which see the
            table's ``writes`` rows first.
    """

    exc: str
    error: type[SpecconvError]
    code: str | None
    hint: str | None = None
    when: Callable[[BaseException], bool] | None = None
    message: str | None = None
    writes: bool = False

    def matches(self, e: BaseException) -> bool:
        """Whether ``e`` is an instance of :attr:`exc` and satisfies :attr:`when`."""
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

#: Ordered: the first matching row decides. Subclasses come before their bases, as in
#: the ``hf`` CLI's ``CLI_ERROR_MAPPINGS`` (GatedRepoError before RepositoryNotFoundError,
#: IncompleteSnapshotError before LocalEntryNotFoundError, OfflineModeIsEnabled before
#: ConnectionError). Upload-side calls see the ``writes`` rows first: a ``ValueError``
#: (invalid README metadata, a bad parent commit: raised before any upload, and a 400's
#: ``BadRequestError``), then 412 / 409 / 401 / 403 (huggingface_hub reports a 401 on a repo
#: URL as ``RepositoryNotFoundError``), then offline mode (its hint: no cache makes a push
#: work; a download's offline rows below point at the cache). Exit codes: 5 auth, 6 conflict, 7 transient,
#: 9 repo/revision not found, 3 otherwise.
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
    HubErrorRule("HfHubHTTPError", TransientRemoteError, "hub_unreachable", "the Hub is overloaded or down; retry later",
                 when=lambda e: (_status(e) or 0) == 429 or (_status(e) or 0) >= 500),
    HubErrorRule("HfHubHTTPError", InvalidInputError, None),
    HubErrorRule("TransportError", TransientRemoteError, "hub_unreachable", _NETWORK),
    HubErrorRule("ConnectionError", TransientRemoteError, "hub_unreachable", _NETWORK),
    HubErrorRule("TimeoutError", TransientRemoteError, "hub_unreachable", _NETWORK),
)


def _describe(what: str, repo: str, e: BaseException) -> str:
    """Message for a Hub file that could not be had.

    In offline mode a file missing from the cache raises ``LocalEntryNotFoundError`` whose
    own text blames the network; say instead that it is not cached and where the cache is.
    ``IncompleteSnapshotError``'s own message lists the missing files, so it is kept.
    """
    from huggingface_hub import errors as hf_errors

    if (is_offline() and isinstance(e, hf_errors.LocalEntryNotFoundError)
            and not isinstance(e, hf_errors.IncompleteSnapshotError)):
        return (f"{what} of {repo!r} is not in the local Hugging Face cache ({cache_dir()}) "
                "and offline mode (HF_HUB_OFFLINE=1) forbids downloading it")
    return f"cannot fetch {what} of {repo!r} from the Hub: {type(e).__name__}: {e}"


def hub_error(what: str, repo: str, e: BaseException, *, code: str, hint: str | None = None,
              writes: bool = False) -> SpecconvError:
    """The project error for a failed Hub call, chosen by :data:`HUB_ERROR_RULES`.

    Args:
        what: the thing that was wanted (``"config.json"``, ``"shard X (holding Y)"``,
            ``"committing"``).
        repo: the repo id.
        e: the exception huggingface_hub (or its HTTP client) raised.
        code: slug for rows that keep the caller's code (``verifier_not_found`` ...).
        hint: the caller's hint; used when the matching row has none, and for exit-3 rows.
        writes: an upload-side call: the table's ``writes`` rows apply (first).

    Returns:
        A :class:`~specconv.errors.SpecconvError` subclass instance (not raised).
    """
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
    """What a caller wants from the Hub, named in the error a failed call raises.

    Attributes:
        what: the thing wanted (``"config.json"``, ``"shard X (holding Y)"``).
        code: the slug of table rows that keep the caller's code (``verifier_not_found`` ...).
        hint: the caller's hint (see :func:`hub_error`).
        role: ``"verifier"`` / ``"source"``: the message starts with ``"<role>: "``.
    """

    what: str
    code: str = "hub_error"
    hint: str | None = None
    role: str | None = None


@contextmanager
def _mapped(repo: str, wanted: Wanted, *, writes: bool = False) -> Iterator[None]:
    """Raise what huggingface_hub raises inside the block as the :func:`hub_error` of ``wanted``.

    The one place a Hub call's exception becomes a specconv error; specconv's own errors
    pass through unchanged.
    """
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
# Upload-side calls for ``specconv push`` / ``release`` (specconv/publish/). Each takes the
# ``HfApi`` made by :func:`api`; huggingface_hub types stay in this module.

@dataclass(frozen=True)
class RemoteFile:
    """One file of a remote tree (huggingface_hub ``RepoFile``).

    Attributes:
        path: path in the repo.
        size: bytes.
        blob_id: git blob sha1 (of the LFS pointer for LFS files).
        sha256: the content sha256 for LFS files, None for regular git files.
    """

    path: str
    size: int
    blob_id: str
    sha256: str | None


def _upload_side(what: str):
    """Decorator of the upload-side calls: what huggingface_hub raises in one becomes the
    :func:`hub_error` (``writes`` rows first) naming ``what`` (a call may pass its own
    ``what=``, e.g. ``"verifying"``)."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(hf: Any, repo_id: str, *args: Any, what: str = what, **kwargs: Any) -> Any:
            with _mapped(repo_id, Wanted(what), writes=True):
                return fn(hf, repo_id, *args, **kwargs)
        return call
    return wrap


@_upload_side("the repo state")
def repo_state(hf: HfApi, repo_id: str, revision: str) -> tuple[str, bool] | None:
    """``(head commit, private)`` of ``repo_id`` at ``revision``; None when the repo does not exist.

    Raises:
        SpecconvError: any other failure (``RevisionNotFoundError`` is exit 9; a 401 / 403
            on the repo, which huggingface_hub reports as not found, is exit 5).
    """
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
    """``create_repo(exist_ok=True)`` then the repo's actual visibility (``private`` is
    ignored by the Hub for an existing repo, so callers compare the returned value).

    Returns:
        Whether the repo is private.
    """
    hf.create_repo(repo_id, private=private, exist_ok=True)
    return bool(hf.model_info(repo_id).private)


@_upload_side("listing files")
def remote_files(hf: HfApi, repo_id: str, revision: str) -> dict[str, RemoteFile]:
    """Every file of ``repo_id`` at ``revision`` (``list_repo_tree(recursive=True)``)."""
    out: dict[str, RemoteFile] = {}
    for f in hf.list_repo_tree(repo_id, revision=revision, recursive=True):
        if hasattr(f, "size"):
            lfs = getattr(f, "lfs", None)
            out[f.path] = RemoteFile(f.path, int(f.size), str(f.blob_id), lfs.sha256 if lfs else None)
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
    """One atomic ``create_commit`` guarded by ``parent_commit`` (HTTP 412 when the head moved).

    Args:
        adds: path in repo → bytes or a local file.
        deletes: paths in repo to delete.
        revision: branch or ``refs/pr/N``.
        parent_commit: the head the plan was made against.

    Returns:
        ``(commit oid, commit url)``; when every addition is already there byte for byte,
        huggingface_hub creates no commit and returns the current head.

    Raises:
        HubConflictError: the head moved (``parent_commit_moved``, exit 6); other failures
            as :data:`HUB_ERROR_RULES` maps them.
    """
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
    """The open pull request titled ``title`` (one specconv opened: the title carries its
    marker), reused; else a new one (``create_pull_request``; none when ``dry_run``).

    Returns:
        The PR number; None on a dry run that would open one.
    """
    for d in hf.get_repo_discussions(repo_id, discussion_type="pull_request", discussion_status="open"):
        if d.title == title:
            return int(d.num)
    if dry_run:
        return None
    return int(hf.create_pull_request(repo_id, title=title, description="Opened by specconv push.").num)


def check_card(content: str) -> dict[str, Any]:
    """Parse a model card with huggingface_hub's card tools (``ModelCard`` +
    ``ModelCardData``, ``src/huggingface_hub/repocard.py`` / ``repocard_data.py``), locally.

    Returns:
        The metadata as a dict.

    Raises:
        InvalidInputError: the YAML front matter is missing or invalid.
    """
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
