"""The cold copy: read every source byte once, hash, scan and write it from one buffer
(docs/benchmarks.md, docs/tensors.md)."""

from __future__ import annotations

import bisect
import concurrent.futures as cf
import hashlib
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import InvalidInputError
from .header import TensorInfo
from .scan import NonFinite, itemsize, scan_bytes, scannable
from .write import OutTensor, _copy_range, _produced_bytes

#: Bytes per read in the cold copy (two such buffers are live at a time).
CHUNK = 4 * 1024 * 1024


@dataclass
class SourceFile:
    """What is known about one source (or verifier) weight file before the copy: whether its sha256 is
    wanted (provenance), the digest when known, cached ``{tensor name: [count, first flat index]}`` scans."""

    path: Path
    want_sha256: bool = False
    sha256: str | None = None
    scans: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def needs_read(self) -> bool:
        """True when the whole file must be streamed to learn its sha256."""
        return self.want_sha256 and self.sha256 is None


@dataclass
class _Piece:
    """One output tensor whose bytes come from a source byte range."""

    t: OutTensor
    start: int
    end: int
    pos: int | None  # output offset in the file being written; None: another shard


class _Src(NamedTuple):
    """Where an output tensor's bytes are copied from: ``info`` and its byte range ``[start, end)`` in
    ``info.file``."""

    info: TensorInfo
    start: int
    end: int


def _src(t: OutTensor) -> _Src | None:
    """``t``'s safetensors source range; None when ``t`` is produced or comes from a ``.bin`` loader."""
    src = t.src
    if src is None or src.start is None or src.end is None:
        return None
    return _Src(src, src.start, src.end)


class _OrderedHash:
    """sha256 of an output file fed with (offset, bytes) pieces; breaks on a gap."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.next = 0
        self.broken = False

    def feed(self, offset: int, data: Any) -> None:
        if self.broken or offset != self.next:
            self.broken = True
            return
        self.h.update(data)
        self.next += memoryview(data).nbytes


class CopyPass:
    """Engine for :func:`specconv.tensors.write_safetensors` (``engine=``); ``outs``: every output tensor of
    all shards (a streamed source file scans later shards' tensors too). After the write: :attr:`nonfinite`
    (output name -> :class:`NonFinite`, non-zero only), :attr:`files` (filled in), :attr:`output_sha256`."""

    def __init__(self, files: dict[Path, SourceFile], outs: list[OutTensor], *,
                 hash_output: bool = False, threads: int = 4) -> None:
        self.files = dict(files)
        self.hash_output = hash_output
        self.threads = threads
        self.nonfinite: dict[str, NonFinite] = {}
        self.output_sha256: dict[str, str] = {}
        self.stats = {"streamed": 0, "ranges": 0, "kernel": 0}
        #: bytes read from each source file (user-space reads and kernel copies alike)
        self.bytes_read: dict[Path, int] = {}
        #: the source pieces of each file (no output offset yet)
        self._by_file: dict[Path, list[_Piece]] = {}
        for t in outs:
            if (src := _src(t)) is not None:
                self._by_file.setdefault(src.info.file, []).append(_Piece(t, src.start, src.end, None))
                self.files.setdefault(src.info.file, SourceFile(src.info.file))
        self._pool: cf.ThreadPoolExecutor | None = None
        self._src_fd = -1

    def begin(self, n_files: int) -> None:
        self._pool = cf.ThreadPoolExecutor(self.threads, thread_name_prefix="specconv-copy")

    def finish(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def write_file(self, fd: int, tmp: Path, name: str, header: bytes, ordered: list[OutTensor]) -> None:
        """Write one output file (``header`` then ``ordered`` data) to ``fd``."""
        out_hash = _OrderedHash() if self.hash_output else None
        _pwrite_all(fd, header, 0)
        if out_hash:
            out_hash.feed(0, header)
        pos, off = {}, len(header)
        for t in ordered:
            pos[t.name], off = off, off + t.nbytes
        done: set[str] = set()
        run: list[Any] | None = None  # pending warm [file, start, length, out pos]: one kernel copy
        for t in ordered:
            if t.name in done:
                continue
            if (src := self._warm(t)) is not None:
                f = src.info.file
                if run and run[0] == f and run[1] + run[2] == src.start and run[3] + run[2] == pos[t.name]:
                    run[2] += t.nbytes
                else:
                    self._kernel_copy(fd, run, out_hash)
                    run = [f, src.start, t.nbytes, pos[t.name]]
                continue
            self._kernel_copy(fd, run, out_hash)
            run = None
            done |= self._write_tensor(fd, t, pos, out_hash)
        self._kernel_copy(fd, run, out_hash)
        if out_hash is not None:
            self.output_sha256[name] = _file_sha256(tmp) if out_hash.broken else out_hash.h.hexdigest()

    def _warm(self, t: OutTensor) -> _Src | None:
        """``t``'s source range (and the cached scan recorded) when ``t`` needs no user-space read; else None."""
        src = _src(t)
        if src is None:
            return None
        sf = self.files[src.info.file]
        cached = sf.scans.get(src.info.name)
        if sf.needs_read or (cached is None and scannable(t.dtype)):
            return None
        if cached is not None:
            self._record(t, cached[0], cached[1])
        return src

    def _kernel_copy(self, fd: int, run: list[Any] | None, out_hash: Any) -> None:
        if not run:
            return
        os.lseek(fd, run[3], os.SEEK_SET)
        _copy_range(run[0], run[1], run[2], fd)
        self.bytes_read[run[0]] = self.bytes_read.get(run[0], 0) + run[2]
        if out_hash:
            out_hash.broken = True
        self.stats["kernel"] += 1

    def _write_tensor(self, fd: int, t: OutTensor, pos: dict[str, int], out_hash: Any) -> set[str]:
        src = _src(t)
        if src is None:
            data = _produced_bytes(t)
            self._record(t, *scan_bytes(data, t.dtype))
            _pwrite_all(fd, data, pos[t.name])
            if out_hash:
                out_hash.feed(pos[t.name], data)
            return {t.name}
        sf = self.files[src.info.file]
        if sf.needs_read:
            pieces = [replace(p, pos=pos.get(p.t.name)) for p in self._by_file[sf.path]]
            h = hashlib.sha256()
            self._stream(fd, sf.path, 0, os.stat(sf.path).st_size, pieces, h, out_hash)
            sf.sha256 = h.hexdigest()
            self.stats["streamed"] += 1
            return {p.t.name for p in pieces if p.pos is not None}
        self._stream(fd, sf.path, src.start, src.end, [_Piece(t, src.start, src.end, pos[t.name])],
                     None, out_hash)
        self.stats["ranges"] += 1
        return {t.name}

    def _record(self, t: OutTensor, count: int, first: int | None) -> None:
        if t.src is not None and t.src.start is not None and scannable(t.dtype):
            self.files[t.src.file].scans[t.src.name] = [count, first]
        if count:
            self.nonfinite[t.name] = NonFinite(count, first)

    def _stream(self, fd: int, path: Path, lo: int, hi: int, pieces: list[_Piece], h: Any, out_hash: Any) -> None:
        """Read ``path[lo:hi]`` once; hash it (``h``), scan and write the ``pieces``."""
        pieces = sorted(pieces, key=lambda p: p.start)
        acc = {p.t.name: NonFinite() for p in pieces}
        self.bytes_read[path] = self.bytes_read.get(path, 0) + max(hi - lo, 0)
        bufs = [bytearray(min(CHUNK, max(hi - lo, 1))) for _ in range(2)]
        try:
            src_fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            raise InvalidInputError(f"{path}: cannot read: {e.strerror or e}") from e
        pending: list[cf.Future] = []
        self._src_fd = src_fd
        try:
            off, i = lo, 0
            while off < hi:
                end = _chunk_end(off, hi, pieces, len(bufs[0]))
                mv = memoryview(bufs[i % 2])[: end - off]
                if os.preadv(src_fd, [mv], off) != end - off:
                    raise InvalidInputError(f"{path}: ended before byte {end} while copying (file truncated?)")
                _wait(pending)
                pending = self._submit(fd, mv, off, end, pieces, acc, h, out_hash)
                off, i = end, i + 1
            _wait(pending)
        finally:
            for f in pending:
                f.cancel()
            cf.wait(pending)
            os.close(src_fd)
        for p in pieces:
            self._record(p.t, acc[p.t.name].count, acc[p.t.name].first)

    def _submit(self, fd: int, mv: memoryview, off: int, end: int, pieces: list[_Piece],
                acc: dict[str, NonFinite], h: Any, out_hash: Any) -> list[cf.Future]:
        """Start the jobs for one chunk ``[off, end)`` held in ``mv``."""
        assert self._pool is not None
        here = _overlaps(pieces, off, end)
        jobs = [self._pool.submit(h.update, mv)] if h is not None else []
        scans = [(p, a, b) for p, a, b in here if scannable(p.t.dtype)]
        if scans:
            jobs.append(self._pool.submit(_scan_job, mv, off, scans, acc))
        writes = [(p, a, b) for p, a, b in here if p.pos is not None]
        if writes:
            jobs.append(self._pool.submit(_write_job, fd, mv, off, writes, out_hash, self._src_fd))
        return jobs


def _overlaps(pieces: list[_Piece], off: int, end: int) -> list[tuple[_Piece, int, int]]:
    """The ``(piece, a, b)`` with ``[a, b)`` = piece range ∩ ``[off, end)``, non-empty."""
    starts = [p.start for p in pieces]
    k = max(bisect.bisect_right(starts, off) - 1, 0)
    while k > 0 and pieces[k - 1].end > off:  # identical ranges (one source, two outputs)
        k -= 1
    out = []
    while k < len(pieces) and pieces[k].start < end:
        p = pieces[k]
        a, b = max(off, p.start), min(end, p.end)
        if a < b:
            out.append((p, a, b))
        k += 1
    return out


def _chunk_end(off: int, hi: int, pieces: list[_Piece], chunk: int) -> int:
    """End of the chunk starting at ``off``: at most ``chunk`` bytes, never splitting an element."""
    end = min(off + chunk, hi)
    if end == hi:
        return end
    for p, _a, _b in _overlaps(pieces, end - 1, end):
        es = itemsize(p.t.dtype)
        cut = p.start + ((end - p.start) // es) * es
        if cut > off:
            end = cut
    return end


def _scan_job(mv: memoryview, off: int, scans: list, acc: dict[str, NonFinite]) -> None:
    for p, a, b in scans:
        es = itemsize(p.t.dtype)
        count, first = scan_bytes(mv[a - off: b - off], p.t.dtype, (a - p.start) // es)
        acc[p.t.name].add(count, first)


def _write_job(fd: int, mv: memoryview, off: int, writes: list, out_hash: Any, src_fd: int) -> None:
    """Write the chunk's pieces at their output offsets: ``copy_file_range`` from the source (page cache),
    ``pwrite`` of the buffer where the kernel refuses (docs/benchmarks.md)."""
    for p, a, b in writes:
        dst = p.pos + (a - p.start)
        if not _kernel_piece(src_fd, fd, a, dst, b - a):
            _pwrite_all(fd, mv[a - off: b - off], dst)
        if out_hash is not None:
            out_hash.feed(dst, mv[a - off: b - off])


_CFR_OK = [hasattr(os, "copy_file_range")]


def _kernel_piece(src_fd: int, dst_fd: int, src_off: int, dst_off: int, n: int) -> bool:
    """``copy_file_range`` of ``n`` bytes at explicit offsets; False (redo by ``pwrite``) when refused."""
    if not _CFR_OK[0]:
        return False
    done = 0
    try:
        while done < n:
            k = os.copy_file_range(src_fd, dst_fd, n - done, src_off + done, dst_off + done)
            if k == 0:
                return False
            done += k
    except OSError:
        _CFR_OK[0] = False
        return False
    return True


def _wait(jobs: list[cf.Future]) -> None:
    for f in jobs:
        f.result()


def _pwrite_all(fd: int, data: Any, offset: int) -> None:
    mv = memoryview(data).cast("B")
    while mv:
        n = os.pwrite(fd, mv, offset)
        mv, offset = mv[n:], offset + n


def _file_sha256(path: Path) -> str:
    from .write import sha256_file

    return sha256_file(path, chunk_size=CHUNK)


def scan_store(store: Any) -> dict[str, NonFinite]:
    """``{tensor name: NonFinite}`` of the float tensors of a :class:`~specconv.tensors.TensorStore` that hold
    NaN/±Inf, each file read once (the cold copy's engine, nothing written).

    Raises:
        InvalidInputError: a weight file cannot be read or ended early.
    """
    outs = [OutTensor(i.name, i.dtype, i.shape, src=i) for i in store.infos() if scannable(i.dtype)]
    eng = CopyPass({}, outs, threads=2)
    found: dict[str, NonFinite] = {}
    eng.begin(0)
    try:
        for f, pieces in eng._by_file.items():
            lo, hi = min(p.start for p in pieces), max(p.end for p in pieces)
            if hi > lo:
                eng._stream(-1, f, lo, hi, pieces, None, None)
        for t in outs:
            if t.src is not None and t.src.start is None:  # .bin: bytes from the weights-only loader
                assert t.src.loader is not None
                eng._record(t, *scan_bytes(t.src.loader(), t.dtype))
    finally:
        eng.finish()
    found.update(eng.nonfinite)
    return found


def scan_report(store: Any) -> list[dict[str, Any]]:
    """:func:`scan_store` as JSON-ready rows ``{"tensor", "dtype", "count", "numel",
    "first_index"}``, sorted by tensor name (first_index in the tensor's shape)."""
    from .scan import unravel

    rows = []
    for name, nf in sorted(scan_store(store).items()):
        info = store.info(name)
        rows.append({"tensor": name, "dtype": info.dtype, "count": nf.count, "numel": info.numel,
                     "first_index": unravel(nf.first or 0, tuple(info.shape))})
    return rows
