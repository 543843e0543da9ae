"""Write a :class:`~specconv.plan.ConversionPlan` as a Speculators-format directory, atomically
(docs/cli.md) and byte-identical for identical input (sorted tensors, deterministic JSON, no timestamps).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import math
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .errors import InvalidInputError
from .fileio import atomic_write
from .plan import ConversionPlan

if TYPE_CHECKING:
    from .outdir import Kinds
    from .record import SpecconvRecord
    from .tensors import OutTensor
    from .verifier import Verifier

SPECCONV_JSON = "specconv.json"
#: the model card a conversion writes next to the record (rendered by the ``card`` hook)
CARD = "README.md"


def _sha256(path: Path) -> str:
    """sha256 of a source file; cached in ``$SPECCONV_CACHE/sha256.json`` by real path, validated by
    (size, mtime_ns, inode) as git's stat cache (``SPECCONV_HASH_CACHE=0``: off)."""
    from .tensors import sha256_file

    blob = hub_blob_sha256(path)
    if blob is not None:
        return blob
    stamp, hit = _cache_hit(path)
    if isinstance(hit.get("sha256"), str):
        return hit["sha256"]
    digest = sha256_file(path)
    if _hash_cache_on():
        _hash_cache()[os.path.realpath(path)] = {"stat": stamp, "sha256": digest}
    return digest


_HASH_CACHE: dict[str, Any] | None = None
#: Above this many entries, saving the cache drops those whose file no longer exists.
_CACHE_PRUNE_ABOVE = 256
_SHA256_HEX = frozenset("0123456789abcdef")


def hub_blob_sha256(path: Path) -> str | None:
    """The sha256 of a Hub-cache LFS file, read from its ``blobs/`` name (huggingface_hub checks it on
    download, ``huggingface_hub/file_download.py``), or ``None``."""
    if not os.path.islink(path):
        return None
    real = Path(os.path.realpath(path))
    name = real.name
    if real.parent.name == "blobs" and len(name) == 64 and set(name) <= _SHA256_HEX:
        return name
    return None


def _hash_cache_on() -> bool:
    return os.environ.get("SPECCONV_HASH_CACHE", "1") != "0"


def _cache_hit(path: Path) -> tuple[list[int], dict[str, Any]]:
    """``(stat stamp, cached entry or {})`` of one file; the entry only when the stamp matches."""
    st = os.stat(path)
    stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
    if not _hash_cache_on():
        return stamp, {}
    hit = _hash_cache().get(os.path.realpath(path))
    return stamp, (hit if isinstance(hit, dict) and hit.get("stat") == stamp else {})


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
    if _HASH_CACHE is None or not _hash_cache_on():
        return
    if len(_HASH_CACHE) > _CACHE_PRUNE_ABOVE:  # forget files that are gone (temp checkpoints)
        for k in [k for k in _HASH_CACHE if not os.path.exists(k)]:
            del _HASH_CACHE[k]
    try:
        atomic_write(_hash_cache_path(), json.dumps(_HASH_CACHE, sort_keys=True))
    except OSError:  # a read-only cache is not an error
        pass


def library_versions() -> dict[str, str]:
    """Versions of the installed libraries that shape the output (recorded in specconv.json)."""
    from .versions import library_versions as versions

    return {k: v for k, v in versions(("safetensors", "pydantic", "huggingface_hub", "torch")).items() if v}


def _out_tensors(plan: ConversionPlan, source_store: Any, verifier: Verifier | None) -> list[OutTensor]:
    from .tensors import OutTensor, cast_bytes

    outs = []
    for t in plan.tensors:
        if t.produce is not None:
            outs.append(OutTensor(name=t.out, dtype=t.dtype, shape=t.shape, produce=t.produce))
            continue
        if t.origin == "verifier":
            assert verifier is not None, f"tensor {t.out!r} comes from the verifier but there is none"
            info, store = verifier.tensor_info(t.source_name), verifier
        else:
            info, store = source_store.info(t.source_name), source_store
        if t.cast:
            def produce(info=info, t=t, store=store):
                name = f"{t.out!r} ({t.origin} tensor {info.name!r} in {Path(info.file).name})"
                return cast_bytes(store.read_bytes(info.name), t.src_dtype, t.dtype, t.shape, name=name)

            outs.append(OutTensor(name=t.out, dtype=t.dtype, shape=t.shape, produce=produce))
        else:
            outs.append(OutTensor(name=t.out, dtype=t.dtype, shape=t.shape, src=info))
    return outs


def _count_verifier_copies(plan: ConversionPlan, verifier: Verifier | None, engine: Any) -> None:
    """Add the copy engine's reads of the verifier's weight files to ``verifier.bytes_read``."""
    if verifier is None or not hasattr(verifier, "add_bytes_read"):
        return
    vfiles = {os.path.realpath(verifier.tensor_info(t.source_name).file) for t in plan.tensors
              if t.origin == "verifier" and t.produce is None and not t.cast}
    verifier.add_bytes_read(sum(n for f, n in engine.bytes_read.items() if os.path.realpath(f) in vfiles))


def verifier_bytes_needed(plan: ConversionPlan) -> int:
    """Bytes of verifier tensor data the output holds, in the verifier's dtype."""
    from .tensors import DTYPE_SIZES

    return sum(math.prod(t.shape) * DTYPE_SIZES.get(t.src_dtype, 1) for t in plan.tensors if t.origin == "verifier")


#: ConvertOptions fields that hold a local path (recorded relative to the drafter dir)
_PATH_OPTIONS = ("vocab_mapping", "draft_config")


def build_record(plan: ConversionPlan, verifier: Verifier | None, source_hashes: dict[str, str], files: list[str], *,
                 out_dir: Path, source_ref: dict[str, Any] | None = None) -> SpecconvRecord:
    """The ``specconv.json`` record of a conversion; local paths relative to ``out_dir``, a Hub source
    named by ``source_ref`` (:func:`specconv.convert.source_ref`). Built with ``model_construct``: no
    schema build on the convert path (:func:`specconv.record.read_record` validates)."""
    from .record import (
        SCHEMA_VERSION,
        ConversionSection,
        SourceRef,
        SpecconvRecord,
        VerifierRef,
        as_record_path,
        relative_to_dir,
    )

    cfg = plan.config
    source = dict(source_ref) if source_ref else {"path": relative_to_dir(plan.source_dir, out_dir)}
    options = dict(plan.options)
    for k in _PATH_OPTIONS:
        if isinstance(options.get(k), str):
            options[k] = as_record_path(options[k], out_dir)
    ver = None if verifier is None else VerifierRef.model_construct(
        spec=as_record_path(verifier.spec, out_dir), name_or_path=as_record_path(verifier.name_or_path, out_dir),
        architectures=verifier.architectures, num_hidden_layers=verifier.num_hidden_layers,
        hidden_size=verifier.hidden_size, vocab_size=verifier.vocab_size)
    conversion = ConversionSection.model_construct(
        format=plan.format_id, algorithm=plan.algorithm,
        source=SourceRef.model_construct(**source, files=source_hashes),
        verifier=ver, layer_ids=plan.layer_ids.to_dict() if plan.layer_ids else None,
        dtype=getattr(cfg, "dtype", None) if not isinstance(cfg, dict) else cfg.get("dtype"), options=options,
        tensors=plan.tensor_fates(), findings=[f.to_dict() for f in plan.findings], notes=plan.notes,
        output_files=files, versions=library_versions())
    return SpecconvRecord.model_construct(schema_version=SCHEMA_VERSION, specconv_version=__version__,
                                          conversion=conversion)


def _source_key(plan: ConversionPlan, p: Path) -> str:
    """A source file's name in the record: relative to the source dir unresolved (Hub snapshots link
    into blobs/), else resolved, else absolute."""
    root = Path(plan.source_dir).resolve()
    aroot = Path(os.path.abspath(plan.source_dir))
    rp, ap = Path(p).resolve(), Path(os.path.abspath(p))
    if aroot in ap.parents:
        return str(ap.relative_to(aroot))
    if root in rp.parents:
        return str(rp.relative_to(root))
    return str(rp)


def hash_sources(plan: ConversionPlan, skip: frozenset[str] = frozenset()
                 ) -> concurrent.futures.Future[dict[str, str]]:
    """Hash every source file but ``skip`` (real paths the copy pass hashes) in a daemon thread,
    overlapping the copy (hashlib releases the GIL); an interrupt does not wait for it."""
    fut: concurrent.futures.Future[dict[str, str]] = concurrent.futures.Future()

    def run() -> dict[str, str]:
        out = {}
        for p in sorted(plan.source_files):
            if p.is_file() and os.path.realpath(p) not in skip:
                out[_source_key(plan, p)] = _sha256(p)
        return out

    def target() -> None:
        try:
            fut.set_result(run())
        except BaseException as e:  # delivered to the caller by fut.result()
            fut.set_exception(e)

    fut.set_running_or_notify_cancel()
    threading.Thread(target=target, name="specconv-hash", daemon=True).start()
    return fut


def _copy_engine(plan: ConversionPlan, outs: list, hash_output: bool) -> tuple[Any, dict[str, list[int]]]:
    """``(copy engine told what the cache knows of each weight file, {real path: stat stamp before it})``."""
    from .tensors.onepass import CopyPass, SourceFile

    provenance = {os.path.realpath(p) for p in plan.source_files}
    files, stamps = {}, {}
    for f in {t.src.file for t in outs if t.src is not None and t.src.start is not None}:
        key = os.path.realpath(f)
        stamps[key], hit = _cache_hit(f)
        sha = hub_blob_sha256(f) or (hit.get("sha256") if isinstance(hit.get("sha256"), str) else None)
        scans = hit.get("scan")
        files[f] = SourceFile(f, want_sha256=key in provenance, sha256=sha,
                              scans=dict(scans) if isinstance(scans, dict) else {})
    return CopyPass(files, outs, hash_output=hash_output), stamps


def _remember(engine: Any, stamps: dict[str, list[int]]) -> dict[str, str]:
    """Store the pass's digests and scans in the hash cache; return its digests by real path."""
    cache = _hash_cache() if _hash_cache_on() else {}
    digests = {}
    for f, sf in engine.files.items():
        key = os.path.realpath(f)
        if sf.want_sha256 and sf.sha256:
            digests[key] = sf.sha256
        if key not in stamps:
            continue
        entry = {"stat": stamps[key], "scan": sf.scans}
        if sf.sha256 and hub_blob_sha256(f) is None:
            entry["sha256"] = sf.sha256
        elif isinstance(cache.get(key), dict) and isinstance(cache[key].get("sha256"), str):
            entry["sha256"] = cache[key]["sha256"]
        cache[key] = entry
    return digests


def _nonfinite_check(plan: ConversionPlan, outs: list, engine: Any, allow: bool) -> None:
    """Refuse (``nonfinite_weights``, exit 3) or, with ``allow``, record a finding for every tensor
    holding NaN/Inf, naming its count and first index (in the source tensor's shape)."""
    from .tensors.scan import unravel

    if not engine.nonfinite:
        return
    by_name = {t.name: t for t in outs}
    parts = []
    for name in sorted(engine.nonfinite):
        nf, t = engine.nonfinite[name], by_name[name]
        shape = t.src.shape if t.src is not None else t.shape
        where = f" (source {t.src.name!r} in {Path(t.src.file).name})" if t.src is not None else ""
        parts.append(f"{name!r}{where}: {nf.count} NaN/Inf value(s) of {math.prod(shape)}, "
                     f"first at index {unravel(nf.first or 0, tuple(shape))}")
    if not allow:
        raise InvalidInputError("non-finite weights: " + "; ".join(parts) +
                                ". Pass --allow-nonfinite to convert anyway (recorded as a finding).",
                                code="nonfinite_weights")
    from .format.findings import Finding

    for name, part in zip(sorted(engine.nonfinite), parts, strict=True):
        plan.findings.append(Finding("warning", "nonfinite-weights",
                                     f"converted with --allow-nonfinite: {part}", key=name))


def write_plan(
    plan: ConversionPlan, out_dir: Path, *, source_store: Any, verifier: Verifier | None,
    max_shard_size: int | None = None, overwrite: bool = False, kinds: Kinds | None = None,
    source_ref: dict[str, Any] | None = None, allow_nonfinite: bool = False,
    hash_output: bool = False, output_sha256: dict[str, str] | None = None,
    card: Callable[[Path, SpecconvRecord], str | None] | None = None,
) -> SpecconvRecord:
    """Write ``plan`` to ``out_dir`` atomically; return the ``specconv.json`` record, written once.
    ``card(temp dir, record)`` renders ``README.md`` (None: no card). NaN/Inf in an output tensor fails
    unless ``allow_nonfinite``. With ``hash_output``, ``output_sha256`` gets file name → sha256 of each
    written safetensors file. Signals during the final rename wait until it is done.

    Raises:
        InvalidInputError: ``out_dir`` exists and ``overwrite`` is false (or it is not a
            directory), ``out_dir`` is inside the source directory or would replace an
            input (source, verifier, side file), or its parent is a file.
        OutputWriteError: (``os_error``, exit 3) an OS error while writing (disk full,
            read-only, ...): the message names ``out_dir`` and the step; nothing is left behind.
    """
    from .outdir import move_into_place, public_modes, temp_output

    out_dir = Path(out_dir)
    _check_output(out_dir, plan, verifier, overwrite, kinds)
    with _Interrupts() as interrupts, temp_output(out_dir) as tmp:
        record = _write_tmp(tmp.path, plan, source_store, verifier, max_shard_size=max_shard_size,
                            allow_nonfinite=allow_nonfinite, hash_output=hash_output,
                            output_sha256=output_sha256, out_dir=out_dir, source_ref=source_ref)
        _write_record(tmp.path, record, card)
        public_modes(tmp.path)
        with interrupts.deferred():
            move_into_place(tmp, out_dir, overwrite, "conversion", kinds)
    return record


def _write_tmp(tmp: Path, plan: ConversionPlan, source_store: Any, verifier: Verifier | None, *,
               max_shard_size: int | None,
               allow_nonfinite: bool, hash_output: bool, output_sha256: dict[str, str] | None, out_dir: Path,
               source_ref: dict[str, Any] | None) -> SpecconvRecord:
    """Write weights and config into ``tmp``; return the record (not written yet)."""
    from .format import dump_config
    from .tensors import write_safetensors

    outs = _out_tensors(plan, source_store, verifier)
    engine, stamps = _copy_engine(plan, outs, hash_output)
    streamed = frozenset(os.path.realpath(f) for f, sf in engine.files.items() if sf.needs_read)
    hashes_future = hash_sources(plan, skip=streamed)
    files = write_safetensors(tmp, outs, max_shard_size=max_shard_size, engine=engine)
    _count_verifier_copies(plan, verifier, engine)
    digests = _remember(engine, stamps)
    hashes = hashes_future.result()
    hashes.update({_source_key(plan, p): digests[os.path.realpath(p)] for p in plan.source_files
                   if os.path.realpath(p) in streamed and os.path.realpath(p) in digests})
    _save_hash_cache()
    _nonfinite_check(plan, outs, engine, allow_nonfinite)
    if output_sha256 is not None:
        output_sha256.update(engine.output_sha256)
    (tmp / "config.json").write_bytes(dump_config(plan.config))
    return build_record(plan, verifier, dict(sorted(hashes.items())), sorted(["config.json", *files, SPECCONV_JSON]),
                        out_dir=out_dir, source_ref=source_ref)


def _write_record(tmp: Path, record: SpecconvRecord, card: Callable[[Path, SpecconvRecord], str | None] | None
                  ) -> None:
    """The card (when ``card`` renders one, listed in ``output_files``), then ``specconv.json``."""
    text = card(tmp, record) if card is not None else None
    if text is not None:
        assert record.conversion is not None  # build_record writes the conversion section
        record.conversion.output_files = sorted([*record.conversion.output_files, CARD])
        (tmp / CARD).write_text(text, encoding="utf-8")
    (tmp / SPECCONV_JSON).write_text(record.to_json())


def _check_output(out_dir: Path, plan: ConversionPlan, verifier: Verifier | None, overwrite: bool,
                  kinds: Kinds | None) -> None:
    """Refuse outputs that would clobber a non-directory, delete an input or replace a
    directory specconv did not write (:func:`specconv.outdir.check_replaceable`)."""
    from .outdir import check_output, check_replaceable

    if not overwrite or out_dir.name in ("", ".", "..") or not out_dir.is_dir():
        check_output(out_dir, "conversion", overwrite, kinds=kinds)  # '.', '..', '/', a non-directory, not specconv's
    out_res = out_dir.resolve()
    src_res = Path(plan.source_dir).resolve()
    if out_res == src_res or src_res in out_res.parents:
        raise InvalidInputError(f"output {out_dir} must not be the source directory or inside it")
    inputs: list[tuple[str, Path]] = [("source", Path(plan.source_dir))]
    verifier_dir = getattr(verifier, "local_dir", None)
    if verifier_dir is not None:
        inputs.append(("verifier", Path(verifier_dir)))
    inputs += [("source file", Path(p)) for p in plan.source_files]
    inputs += [(f"--{k.replace('_', '-')}", Path(v)) for k, v in (plan.options or {}).items()
               if k in _PATH_OPTIONS and v]
    for what, p in inputs:
        for q in {Path(os.path.abspath(p)), p.resolve()}:
            if q == out_res or out_res in q.parents:
                raise InvalidInputError(
                    f"output {out_dir} is or contains the {what} {p}: writing there would replace an input",
                    code="output_is_input",
                )
    if overwrite:
        check_replaceable(out_dir, "conversion", kinds)
    for parent in out_dir.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise InvalidInputError(f"cannot create output {out_dir}: {parent} is not a directory",
                                        code="output_unwritable")
            break


class _Interrupts(contextlib.AbstractContextManager):
    """While writing (main thread only): SIGTERM / SIGHUP raise ``SystemExit(128 + n)`` as Ctrl-C raises
    ``KeyboardInterrupt`` (:meth:`deferred`: after the block); the application's own handlers stay."""

    def __init__(self) -> None:
        self._saved: dict[int, Any] = {}
        self._defer = False
        self._pending: int | None = None

    def __enter__(self) -> _Interrupts:
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
