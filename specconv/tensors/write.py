"""Streaming, deterministic, optionally sharded safetensors writer (no torch; layout: docs/tensors.md)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError
from ..fileio import atomic_write
from .dtypes import _DTYPE_RANK, DTYPE_SIZES, _nbytes, parse_size
from .header import _HEADER_ALIGN, _METADATA_KEY, SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, TensorInfo

#: Bytes moved per read/write in the user-space copy fallback (bounds its memory).
COPY_CHUNK_SIZE = 16 * 1024 * 1024
#: Bytes per copy_file_range/sendfile call (kernel-side; sendfile caps one call at 0x7ffff000 bytes anyway).
KERNEL_COPY_CHUNK = 1 << 30


# ------------------------------------------------------------------------- writing

@dataclass
class OutTensor:
    """One tensor to write, from exactly one of ``src`` (that byte range as it is: same dtype and nbytes, a
    shape change is a free reshape) or ``produce`` (called once, returns ``nbytes`` raw little-endian bytes)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    src: TensorInfo | None = None
    produce: Callable[[], bytes] | None = None

    @property
    def nbytes(self) -> int:
        return _nbytes(self.dtype, self.shape)


def _check_out_tensors(tensors: list[OutTensor]) -> None:
    seen: set[str] = set()
    for t in tensors:
        if not isinstance(t.name, str) or not t.name or t.name == _METADATA_KEY:
            raise InvalidInputError(f"invalid output tensor name {t.name!r}")
        if t.name in seen:
            raise InvalidInputError(f"output tensor {t.name!r} is listed twice")
        seen.add(t.name)
        if t.dtype not in DTYPE_SIZES:
            raise InvalidInputError(f"output tensor {t.name!r}: unknown dtype {t.dtype!r}")
        if not all(type(d) is int and d >= 0 for d in t.shape):
            raise InvalidInputError(f"output tensor {t.name!r}: bad shape {t.shape!r}")
        if (t.src is None) == (t.produce is None):
            raise InvalidInputError(f"output tensor {t.name!r}: give exactly one of src= and produce=")
        if t.src is not None:
            if t.src.dtype != t.dtype:
                raise InvalidInputError(
                    f"output tensor {t.name!r}: source {t.src.name!r} is {t.src.dtype}, "
                    f"not {t.dtype}; a cast needs produce= (cast_bytes)"
                )
            if t.src.nbytes != t.nbytes:
                raise InvalidInputError(
                    f"output tensor {t.name!r}: shape {list(t.shape)} does not hold the "
                    f"{t.src.nbytes} bytes of source {t.src.name!r} {list(t.src.shape)}"
                )


def _layout(tensors: list[OutTensor]) -> list[OutTensor]:
    """Data order inside one file: descending safetensors dtype rank, then name."""
    return sorted(tensors, key=lambda t: (-_DTYPE_RANK[t.dtype], t.name))


def _header_bytes(ordered: list[OutTensor]) -> bytes:
    """safetensors header (8-byte length + space-padded JSON) for tensors in data order."""
    header: dict[str, Any] = {_METADATA_KEY: {"format": "pt"}}
    off = 0
    for t in ordered:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [off, off + t.nbytes]}
        off += t.nbytes
    js = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    js += b" " * (-len(js) % _HEADER_ALIGN)
    return len(js).to_bytes(8, "little") + js


def _plan_shards(tensors: list[OutTensor], max_shard_size: int | None) -> list[list[OutTensor]]:
    """Greedy fill in sorted-name order; a tensor above the limit gets its own shard."""
    ordered = sorted(tensors, key=lambda t: t.name)
    total = sum(t.nbytes for t in ordered)
    if max_shard_size is None or total <= max_shard_size:
        return [ordered]
    shards: list[list[OutTensor]] = []
    cur: list[OutTensor] = []
    cur_size = 0
    for t in ordered:
        if cur and cur_size + t.nbytes > max_shard_size:
            shards.append(cur)
            cur, cur_size = [], 0
        cur.append(t)
        cur_size += t.nbytes
    if cur:
        shards.append(cur)
    return shards


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    mv = memoryview(data)
    while mv:
        n = os.write(fd, mv)
        mv = mv[n:]


def _copy_range(src: Path, start: int, length: int, dst_fd: int, *, method: str | None = None) -> str:
    """Append ``length`` bytes of ``src`` at ``start`` to ``dst_fd`` by ``copy_file_range``, else ``sendfile``,
    else a read/write loop (``method`` forces one); returns the method that completed the copy.

    Raises:
        InvalidInputError: the source ends before ``start + length`` (truncated).
    """
    methods = [method] if method else ["copy_file_range", "sendfile", "readwrite"]
    try:
        src_fd = os.open(src, os.O_RDONLY)
    except OSError as e:
        raise InvalidInputError(f"{src}: cannot read: {e.strerror or e}") from e
    try:
        done = 0
        for m in methods:
            try:
                while done < length:
                    n = _copy_step(m, src_fd, dst_fd, start + done, length - done)
                    if n == 0:
                        raise InvalidInputError(f"{src}: ended after {start + done} bytes while copying "
                                                f"{length} bytes from offset {start} (file truncated?)")
                    done += n
                return m
            except InvalidInputError:
                raise
            except OSError:  # refused (EXDEV, ENOSYS, EINVAL...); partial progress stays valid
                if m == methods[-1]:
                    raise
                continue
        return methods[-1]
    finally:
        os.close(src_fd)


def _copy_step(method: str, src_fd: int, dst_fd: int, offset: int, left: int) -> int:
    """One ``method`` call appending up to one chunk at ``offset``; returns the bytes moved (0 at EOF)."""
    if method == "readwrite":
        buf = os.pread(src_fd, min(COPY_CHUNK_SIZE, left), offset)
        if buf:
            _write_all(dst_fd, buf)
        return len(buf)
    want = min(KERNEL_COPY_CHUNK, left)
    if method == "copy_file_range":
        if not hasattr(os, "copy_file_range"):
            raise OSError("copy_file_range unavailable")
        return os.copy_file_range(src_fd, dst_fd, want, offset)
    if not hasattr(os, "sendfile"):
        raise OSError("sendfile unavailable")
    return os.sendfile(dst_fd, src_fd, offset, want)


def _shard_name(i: int, n: int) -> str:
    return f"model-{i:05d}-of-{n:05d}.safetensors"


#: The cold-copy engine (:class:`specconv.tensors.onepass.CopyPass`) of the running write, if any.
_ENGINE: ContextVar[Any] = ContextVar("specconv_copy_engine", default=None)


def write_safetensors(out_dir: str | os.PathLike, tensors: list[OutTensor], *,
                      max_shard_size: int | str | None = None, engine: Any = None) -> list[str]:
    """Write tensors as safetensors, streaming, deterministic and sharded above ``max_shard_size`` (bytes or a
    :func:`parse_size` string; docs/tensors.md); ``engine``: a :class:`~specconv.tensors.onepass.CopyPass`
    that hashes and scans on the way. Returns the file names written, relative to ``out_dir``.

    Raises:
        InvalidInputError: duplicate/invalid names, unknown dtype, a src whose dtype or
            size disagrees, a produce() of the wrong length, a truncated source, or
            (``engine``) non-finite weights it refuses.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _check_out_tensors(tensors)
    limit = parse_size(max_shard_size) if max_shard_size is not None else None
    shards = _plan_shards(tensors, limit)
    n = len(shards)
    names = [SAFE_WEIGHTS_NAME] if n == 1 else [_shard_name(i + 1, n) for i in range(n)]
    token = _ENGINE.set(engine)
    try:
        if engine is not None:
            engine.begin(n)
        for fname, shard in zip(names, shards, strict=True):
            _write_one(out / fname, _layout(shard))
    finally:
        if engine is not None:
            engine.finish()
        _ENGINE.reset(token)
    if n == 1:
        return names
    _write_index(out, tensors, names, shards)
    return names + [SAFE_WEIGHTS_INDEX_NAME]


def _write_index(out: Path, tensors: list[OutTensor], names: list[str], shards: list[list[OutTensor]]) -> None:
    index = {
        "metadata": {"total_size": sum(t.nbytes for t in tensors)},
        "weight_map": {t.name: fname for fname, shard in zip(names, shards, strict=True) for t in shard},
    }
    atomic_write(out / SAFE_WEIGHTS_INDEX_NAME, json.dumps(index, indent=2, sort_keys=True) + "\n")


def _produced_bytes(t: OutTensor) -> bytes | bytearray | memoryview:
    """Call ``t.produce()`` (or a ``.bin`` loader) and check type and length."""
    produce = t.produce if t.produce is not None else t.src.loader if t.src is not None else None
    assert produce is not None, f"output tensor {t.name!r}: a src without a byte range needs a loader (.bin)"
    data = produce()
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidInputError(f"output tensor {t.name!r}: producer returned {type(data).__name__}, not bytes")
    got = memoryview(data).nbytes
    if got != t.nbytes:
        raise InvalidInputError(f"output tensor {t.name!r}: producer gave {got} bytes, but "
                                f"{t.dtype} {list(t.shape)} needs {t.nbytes}")
    return data


def _write_one(path: Path, ordered: list[OutTensor]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        engine = _ENGINE.get()
        if engine is not None:
            engine.write_file(fd, tmp, path.name, _header_bytes(ordered), ordered)
        else:
            _write_all(fd, _header_bytes(ordered))
            _write_tensors(fd, ordered)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)


@dataclass
class _Run:
    """``length`` bytes of ``file`` from ``start``: one kernel copy."""

    file: Path
    start: int
    length: int


def _write_tensors(fd: int, ordered: list[OutTensor]) -> None:
    """Append the data of ``ordered`` to ``fd``; adjacent source ranges are one copy."""
    run: _Run | None = None  # pending copy of adjacent source ranges
    for t in ordered:
        src = t.src
        if src is not None and src.start is not None:
            if run is not None and run.file == src.file and run.start + run.length == src.start:
                run.length += t.nbytes  # contiguous with the previous one: one copy
            else:
                if run is not None:
                    _copy_range(run.file, run.start, run.length, fd)
                run = _Run(src.file, src.start, t.nbytes)
            continue
        if run is not None:
            _copy_range(run.file, run.start, run.length, fd)
            run = None
        data = _produced_bytes(t)
        _write_all(fd, data)
        del data
    if run is not None:
        _copy_range(run.file, run.start, run.length, fd)


def sha256_file(path: str | os.PathLike, *, chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in ``chunk_size`` pieces; InvalidInputError when unreadable."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while b := f.read(chunk_size):
                h.update(b)
    except OSError as e:
        raise InvalidInputError(f"{path}: cannot read: {e.strerror or e}") from e
    return h.hexdigest()
