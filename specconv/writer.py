"""Write a :class:`~specconv.plan.ConversionPlan` as a Speculators-format directory.

Everything is written into a temporary sibling directory and renamed into place at the
end, so bad input never leaves a half-written output and never destroys an existing one
(``--overwrite`` swaps atomically). Output is byte-identical for identical input:
sorted tensor order, deterministic JSON, no timestamps. The writer knows nothing about
source formats.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import hashlib
import json
import os
import platform
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .errors import InvalidInputError
from .plan import ConversionPlan

if TYPE_CHECKING:
    from .record import SpecconvRecord
    from .verifier import Verifier

SPECCONV_JSON = "specconv.json"


def _sha256(path: Path) -> str:
    """sha256 of a source file, reusing a cached digest when the file is unchanged.

    The cache (``$SPECCONV_CACHE/sha256.json``) is keyed by real path and validated by
    (size, mtime_ns, inode) — git's stat-cache rule — so re-converting the same checkpoint
    (a common loop: convert, lint, change a flag, convert again) does not re-read it.
    ``SPECCONV_HASH_CACHE=0`` disables it.
    """
    from .tensors import sha256_file

    if os.environ.get("SPECCONV_HASH_CACHE", "1") == "0":
        return sha256_file(path)
    st = os.stat(path)
    key = os.path.realpath(path)
    stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
    cache = _hash_cache()
    hit = cache.get(key)
    if isinstance(hit, dict) and hit.get("stat") == stamp and isinstance(hit.get("sha256"), str):
        return hit["sha256"]
    digest = sha256_file(path)
    cache[key] = {"stat": stamp, "sha256": digest}
    return digest


_HASH_CACHE: dict[str, Any] | None = None


def _hash_cache_path() -> Path:
    from .offline import cache_dir

    return cache_dir() / "sha256.json"


def _hash_cache() -> dict[str, Any]:
    global _HASH_CACHE
    if _HASH_CACHE is None:
        try:
            _HASH_CACHE = json.loads(_hash_cache_path().read_text())
            if not isinstance(_HASH_CACHE, dict):
                _HASH_CACHE = {}
        except (OSError, ValueError):
            _HASH_CACHE = {}
    return _HASH_CACHE


def _save_hash_cache() -> None:
    if _HASH_CACHE is None or os.environ.get("SPECCONV_HASH_CACHE", "1") == "0":
        return
    try:
        p = _hash_cache_path()
        tmp = p.with_name(f".{p.name}.{os.getpid()}")
        tmp.write_text(json.dumps(_HASH_CACHE, sort_keys=True))
        os.replace(tmp, p)
    except OSError:  # a read-only cache is not an error
        pass


def library_versions() -> dict[str, str]:
    """Versions of the libraries that shape the output (recorded in specconv.json)."""
    import importlib.metadata as md

    out = {"specconv": __version__, "python": platform.python_version()}
    for dist in ("safetensors", "pydantic", "huggingface_hub", "torch"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out


def _out_tensors(plan: ConversionPlan, source_store: Any, verifier: Any) -> list:
    from .tensors import OutTensor, cast_bytes

    outs = []
    for t in plan.tensors:
        if t.produce is not None:
            outs.append(OutTensor(name=t.out, dtype=t.dtype, shape=t.shape, produce=t.produce))
            continue
        info = (verifier.tensor_info(t.source) if t.origin == "verifier" else source_store.info(t.source))
        if t.cast:
            def produce(info=info, t=t, store=(None if t.origin == "verifier" else source_store)):
                raw = (store.read_bytes(info.name) if store is not None else _read_range(info))
                return cast_bytes(raw, t.src_dtype, t.dtype, t.shape)

            outs.append(OutTensor(name=t.out, dtype=t.dtype, shape=t.shape, produce=produce))
        else:
            outs.append(OutTensor(name=t.out, dtype=t.dtype, shape=t.shape, src=info))
    return outs


def _read_range(info: Any) -> bytes:
    with open(info.file, "rb") as f:
        f.seek(info.start)
        return f.read(info.end - info.start)


#: ConvertOptions fields that hold a local path (recorded relative to the drafter dir)
_PATH_OPTIONS = ("vocab_mapping", "draft_config")


def build_record(plan: ConversionPlan, verifier: "Verifier | None", source_hashes: dict[str, str], files: list[str], *,
                 out_dir: Path, source_ref: dict[str, Any] | None = None) -> "SpecconvRecord":
    """The ``specconv.json`` record of a conversion (no timestamps: byte-identical re-runs).

    Every local path is written relative to ``out_dir`` (the final drafter dir); a Hub
    source is named by ``source_ref`` (``hub_id``, resolved ``revision``, ``subfolder``,
    ``path`` inside the snapshot) as :func:`specconv.convert.convert` builds it. The
    models are assembled with ``model_construct`` (values derived here; no schema build
    on the convert path); :func:`specconv.record.read_record` validates them on reading.

    Returns:
        :class:`~specconv.record.SpecconvRecord` with ``schema_version``,
        ``specconv_version`` and the ``conversion`` section.
    """
    from .record import (SCHEMA_VERSION, ConversionSection, SourceRef, SpecconvRecord, VerifierRef, as_record_path,
                         relative_to_dir)

    cfg = plan.config
    source = dict(source_ref) if source_ref else {"path": relative_to_dir(plan.source_dir, out_dir)}
    options = dict(plan.options)
    for k in _PATH_OPTIONS:
        if isinstance(options.get(k), str):
            options[k] = as_record_path(options[k], out_dir)
    ver = None if verifier is None else VerifierRef.model_construct(
        spec=as_record_path(verifier.spec, out_dir),
        name_or_path=as_record_path(verifier.name_or_path, out_dir),
        architectures=verifier.architectures,
        num_hidden_layers=verifier.num_hidden_layers,
        hidden_size=verifier.hidden_size,
        vocab_size=verifier.vocab_size,
    )
    conversion = ConversionSection.model_construct(
        format=plan.format_id,
        algorithm=plan.algorithm,
        source=SourceRef.model_construct(**source, files=source_hashes),
        verifier=ver,
        layer_ids=plan.layer_ids.to_dict() if plan.layer_ids else None,
        dtype=getattr(cfg, "dtype", None) if not isinstance(cfg, dict) else cfg.get("dtype"),
        options=options,
        tensors=plan.tensor_fates(),
        findings=[f.to_dict() for f in plan.findings],
        notes=plan.notes,
        output_files=files,
        versions=library_versions(),
    )
    return SpecconvRecord.model_construct(schema_version=SCHEMA_VERSION, specconv_version=__version__,
                                          conversion=conversion)


def hash_sources(plan: ConversionPlan) -> "concurrent.futures.Future[dict[str, str]]":
    """Start hashing every source file in a background thread (hashlib releases the GIL),
    so it overlaps the tensor copy instead of adding to it. The thread is a daemon: an
    interrupted conversion exits at once instead of waiting for a large source to be hashed."""
    fut: concurrent.futures.Future[dict[str, str]] = concurrent.futures.Future()

    def run() -> dict[str, str]:
        # Name files as the user sees them: Hub snapshots are symlinks into blobs/, so
        # try the unresolved path first, then the resolved one, then an absolute path.
        root = Path(plan.source_dir).resolve()
        aroot = Path(os.path.abspath(plan.source_dir))
        out = {}
        for p in sorted(plan.source_files):
            if not p.is_file():
                continue
            rp, ap = Path(p).resolve(), Path(os.path.abspath(p))
            if aroot in ap.parents:
                key = str(ap.relative_to(aroot))
            elif root in rp.parents:
                key = str(rp.relative_to(root))
            else:
                key = str(rp)
            out[key] = _sha256(p)
        _save_hash_cache()
        return out

    def target() -> None:
        try:
            fut.set_result(run())
        except BaseException as e:  # delivered to the caller by fut.result()
            fut.set_exception(e)

    fut.set_running_or_notify_cancel()
    threading.Thread(target=target, name="specconv-hash", daemon=True).start()
    return fut


def _fix_mode(path: Path) -> None:
    """mkdtemp creates 0700; give the output the modes a plain ``mkdir`` would have."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o777 & ~umask)
    for p in path.iterdir():
        os.chmod(p, 0o666 & ~umask)


def write_plan(
    plan: ConversionPlan,
    out_dir: Path,
    *,
    source_store: Any,
    verifier: Any,
    max_shard_size: int | None = None,
    overwrite: bool = False,
    source_ref: dict[str, Any] | None = None,
) -> "SpecconvRecord":
    """Write ``plan`` to ``out_dir`` atomically; return the ``specconv.json`` record
    (``source_ref``: how the record names the source, see :func:`build_record`).

    The output is written to a hidden temp dir next to ``out_dir`` and renamed into place;
    an error, Ctrl-C, SIGTERM or SIGHUP removes the temp dir and leaves any previous output
    untouched (signals arriving during the final rename are deferred until it is done).

    Raises:
        InvalidInputError: ``out_dir`` exists and ``overwrite`` is false (or it is not a
            directory), ``out_dir`` is inside the source directory or would replace an
            input (source, verifier, side file), or its parent is a file.
        OSError: writing failed (disk full, read-only, ...); nothing is left behind.
    """
    from .speculators import dump_config
    from .tensors import write_safetensors

    out_dir = Path(out_dir)
    _check_output(out_dir, plan, verifier, overwrite)
    with _Interrupts() as interrupts:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
        try:
            hashes_future = hash_sources(plan)
            files = write_safetensors(tmp, _out_tensors(plan, source_store, verifier), max_shard_size=max_shard_size)
            (tmp / "config.json").write_bytes(dump_config(plan.config))
            record = build_record(plan, verifier, hashes_future.result(), sorted(["config.json", *files, SPECCONV_JSON]),
                                  out_dir=out_dir, source_ref=source_ref)
            (tmp / SPECCONV_JSON).write_text(record.to_json())
            _fix_mode(tmp)
            _move_into_place(tmp, out_dir, overwrite, interrupts)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return record


def _check_output(out_dir: Path, plan: ConversionPlan, verifier: Any, overwrite: bool) -> None:
    """Refuse outputs that would clobber a non-directory or delete an input on replace."""
    if out_dir.name in ("", ".", ".."):
        raise InvalidInputError(f"output {str(out_dir)!r} must name a directory to create (not '.', '..' or '/')",
                                code="output_exists")
    if out_dir.exists() or out_dir.is_symlink():
        if not out_dir.is_dir():
            raise InvalidInputError(f"output {out_dir} exists and is not a directory; refusing to replace it",
                                    code="output_exists")
        if not overwrite:
            raise InvalidInputError(f"output {out_dir} exists; pass --overwrite to replace it", code="output_exists")
    out_res = out_dir.resolve()
    src_res = Path(plan.source_dir).resolve()
    if out_res == src_res or src_res in out_res.parents:
        raise InvalidInputError(f"output {out_dir} must not be the source directory or inside it")
    inputs: list[tuple[str, Path]] = [("source", Path(plan.source_dir))]
    if getattr(verifier, "local_dir", None) is not None:
        inputs.append(("verifier", Path(verifier.local_dir)))
    inputs += [("source file", Path(p)) for p in plan.source_files]
    inputs += [(f"--{k.replace('_', '-')}", Path(v)) for k, v in (plan.options or {}).items()
               if k in ("vocab_mapping", "draft_config") and v]
    for what, p in inputs:
        for q in {Path(os.path.abspath(p)), p.resolve()}:
            if q == out_res or out_res in q.parents:
                raise InvalidInputError(
                    f"output {out_dir} is or contains the {what} {p}: writing there would replace an input",
                    code="output_is_input",
                )
    for parent in out_dir.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise InvalidInputError(f"cannot create output {out_dir}: {parent} is not a directory",
                                        code="output_unwritable")
            break


def _move_into_place(tmp: Path, out_dir: Path, overwrite: bool, interrupts: "_Interrupts") -> None:
    """Rename the finished temp dir to ``out_dir``; an existing output (``overwrite``) is
    swapped out and removed only once the new one is in place, else restored."""
    old: Path | None = None
    swapped = False
    try:
        with interrupts.deferred():
            if out_dir.exists() and not overwrite:  # created meanwhile (another conversion)
                raise InvalidInputError(f"output {out_dir} appeared while converting; pass --overwrite to replace it",
                                        code="output_exists")
            if overwrite and out_dir.exists():
                old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
                try:
                    os.replace(out_dir, old)
                except FileNotFoundError:  # removed meanwhile
                    old = None
            try:
                os.rename(tmp, out_dir)
            except OSError as e:
                if old is not None:
                    os.replace(old, out_dir)  # put the previous output back
                    old = None
                if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    raise InvalidInputError(f"output {out_dir} appeared while converting (another conversion?); "
                                            "nothing was replaced", code="output_exists") from e
                raise
            swapped = True
    finally:
        if swapped and old is not None:
            shutil.rmtree(old, ignore_errors=True)


class _Interrupts(contextlib.AbstractContextManager):
    """While writing (main thread only): SIGTERM / SIGHUP raise ``SystemExit(128 + n)``
    like Ctrl-C raises ``KeyboardInterrupt``, so ``finally`` blocks remove the temp dir;
    inside :meth:`deferred` every such signal waits until the block is done. Handlers
    the application installed itself (or ``SIG_IGN``) are left alone."""

    def __init__(self) -> None:
        self._saved: dict[int, Any] = {}
        self._defer = False
        self._pending: int | None = None

    def __enter__(self) -> "_Interrupts":
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is None:
                continue
            cur = signal.getsignal(sig)
            if cur in (signal.SIG_DFL, signal.default_int_handler):
                self._saved[sig] = cur
                signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, h in self._saved.items():
            signal.signal(sig, h)
        self._saved.clear()

    def _handler(self, signum: int, frame: Any) -> None:
        if self._defer:
            self._pending = signum
            return
        self._raise(signum)

    @staticmethod
    def _raise(signum: int) -> None:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    @contextlib.contextmanager
    def deferred(self):
        self._defer = True
        try:
            yield
        finally:
            self._defer = False
            if self._pending is not None:
                sig, self._pending = self._pending, None
                self._raise(sig)
