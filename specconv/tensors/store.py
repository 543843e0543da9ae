"""Lazy, read-only checkpoint store: safetensors by byte range, ``.bin`` weights-only."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import InvalidInputError
from .dtypes import _NUMPY_NAMES, import_torch, safetensors_dtype, tensor_to_bytes, torch_dtype
from .header import (
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    TensorInfo,
    _load_index,
    _read_safetensors_header,
)

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import torch

#: torch's own wrapper text around a weights-only refusal (it advises weights_only=False: not echoed).
_TORCH_LOAD_BOILERPLATE = ("Weights only load failed", "Please file an issue", "Check the documentation",
                           "In PyTorch 2.6", "Re-running `torch.load`")


def torch_load_error_detail(e: BaseException) -> str:
    """One line saying why ``torch.load(weights_only=True)`` failed, without torch's boilerplate."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.startswith(_TORCH_LOAD_BOILERPLATE)]
    line = useful[0] if useful else (lines[0] if lines else "")
    line = re.sub(r"^.*WeightsUnpickler error:\s*", "", line)
    return f"{type(e).__name__}: {line[:300]}"


def _torch_load_weights_only(path: Path) -> dict[str, Any]:
    """``torch.load`` with ``weights_only=True`` (``mmap`` for the zip format; legacy files cannot be mapped).

    Raises:
        InvalidInputError: the file needs arbitrary unpickling (refused) or is not a torch checkpoint at all.
    """
    import zipfile

    torch = import_torch()
    try:
        if zipfile.is_zipfile(path):
            obj = torch.load(path, weights_only=True, mmap=True, map_location="cpu")
        else:
            obj = torch.load(path, weights_only=True, map_location="cpu")
    except OSError as e:
        raise InvalidInputError(f"{path}: cannot read: {e.strerror or e}") from e
    except Exception as e:  # UnpicklingError, RuntimeError, EOFError... for junk files
        raise _torch_load_refusal(path, e) from e
    if not isinstance(obj, dict):
        raise InvalidInputError(f"{path}: expected a state dict (name -> tensor), found {type(obj).__name__}")
    for k, v in obj.items():
        if not isinstance(k, str):
            raise InvalidInputError(f"{path}: key {k!r} is a {type(k).__name__}, not a tensor name; expected a flat "
                                    "state dict (name -> tensor)")
        if not isinstance(v, torch.Tensor):
            raise InvalidInputError(f"{path}: entry {k!r} is a {type(v).__name__}, not a tensor; expected a "
                                    "flat state dict (a training checkpoint? extract its model state dict)")
    return obj


def _torch_load_refusal(path: Path, e: Exception) -> InvalidInputError:
    """``unsafe_pickle`` when torch's allow-list blocked a global, a generic corrupt-file error otherwise."""
    import pickle

    low = str(e).lower()
    if isinstance(e, pickle.UnpicklingError) and ("unsupported global" in low or "unsupported class" in low
                                                  or "is blocked" in low):
        return InvalidInputError(
            f"{path}: needs arbitrary unpickling (it references code outside the "
            "tensor allow-list), which specconv refuses to execute; only "
            "torch.load(weights_only=True) is used. Convert it to safetensors in a "
            f"trusted environment. ({torch_load_error_detail(e)})",
            code="unsafe_pickle",
        )
    return InvalidInputError(
        f"{path}: torch.load(weights_only=True) failed: the file is corrupt or needs "
        f"arbitrary unpickling, which specconv refuses ({torch_load_error_detail(e)})"
    )


class _WeightMap(NamedTuple):
    """An index file and its ``weight_map`` (tensor name → shard file name)."""

    path: Path
    shards: dict[str, str]


def _check_weight_map(index: _WeightMap, infos: dict[str, TensorInfo], root: Path) -> None:
    """Every name in an index's ``weight_map`` must be in the shard the index names."""
    for name, shard in index.shards.items():
        info = infos.get(name)
        if info is None or info.file != root / shard:
            raise InvalidInputError(f"{index.path}: weight_map says {name!r} is in {shard}, but that "
                                    "shard has no such tensor")


class TensorStore:
    """Lazy, read-only view of one checkpoint's tensors (headers only, or a weights-only mapped ``.bin``):
    ``files`` in use in name order, ``format`` ``"safetensors"`` | ``"bin"``, the first file's ``metadata``."""

    def __init__(self, path: Path, infos: dict[str, TensorInfo], files: list[Path], fmt: str,
                 metadata: dict[str, str] | None = None, tensors: dict[str, Any] | None = None):
        self.path = path
        self._infos = infos
        self.files = files
        self.format = fmt
        self.metadata = metadata or {}
        self._tensors = tensors  # .bin only: name -> mmap-backed torch.Tensor
        #: tensor-data bytes read through this store (headers not counted)
        self.bytes_read = 0

    @classmethod
    def open(cls, path: str | os.PathLike) -> TensorStore:
        """Open a checkpoint directory or weight file (what is accepted: docs/tensors.md).

        Raises:
            InvalidInputError: no weights found, ambiguous ``*.safetensors`` files,
                corrupt headers, an index naming a missing shard or a tensor its shard
                lacks, duplicate names across shards, or a pickle needing code
                execution. The message names the file.
        """
        p = Path(path)
        if p.is_dir():
            return cls._open_dir(p)
        if not p.exists():
            raise InvalidInputError(f"{p}: no such file or directory")
        name = p.name
        if name.endswith(".index.json"):
            return cls._open_index(p)
        if name.endswith(".safetensors"):
            return cls._open_safetensors_files(p, [p])
        if name.endswith((".bin", ".pt", ".pth")):
            return cls._open_bin_files(p, [p])
        raise InvalidInputError(f"{p}: not a weight file (.safetensors, .bin, .pt, .pth or *.index.json)")

    @classmethod
    def _open_dir(cls, d: Path) -> TensorStore:
        if (d / SAFE_WEIGHTS_NAME).is_file():
            return cls._open_safetensors_files(d, [d / SAFE_WEIGHTS_NAME])
        if (d / SAFE_WEIGHTS_INDEX_NAME).is_file():
            return cls._open_index(d / SAFE_WEIGHTS_INDEX_NAME, root=d)
        others = sorted(d.glob("*.safetensors"))
        if len(others) == 1:
            return cls._open_safetensors_files(d, others)
        if len(others) > 1:
            raise InvalidInputError(
                f"{d}: {len(others)} *.safetensors files "
                f"({', '.join(o.name for o in others[:5])}{', ...' if len(others) > 5 else ''}) "
                f"but no {SAFE_WEIGHTS_INDEX_NAME}; cannot tell which to use"
            )
        if (d / WEIGHTS_NAME).is_file():
            return cls._open_bin_files(d, [d / WEIGHTS_NAME])
        if (d / WEIGHTS_INDEX_NAME).is_file():
            return cls._open_index(d / WEIGHTS_INDEX_NAME, root=d)
        raise InvalidInputError(
            f"{d}: no weights found (expected {SAFE_WEIGHTS_NAME}, {SAFE_WEIGHTS_INDEX_NAME}, "
            f"a single *.safetensors, {WEIGHTS_NAME} or {WEIGHTS_INDEX_NAME})"
        )

    @classmethod
    def _open_safetensors_files(cls, root: Path, files: list[Path], index: _WeightMap | None = None) -> TensorStore:
        infos: dict[str, TensorInfo] = {}
        first_meta: dict[str, str] | None = None
        for f in files:
            got, meta = _read_safetensors_header(f)
            if first_meta is None:
                first_meta = meta
            for name, info in got.items():
                if name in infos:
                    raise _in_two_shards(name, infos[name].file, f, root)
                infos[name] = info
        if index is not None:
            _check_weight_map(index, infos, root)
            infos = {n: infos[n] for n in index.shards}
        return cls(root, infos, list(files), "safetensors", first_meta)

    @classmethod
    def _open_index(cls, index: Path, root: Path | None = None) -> TensorStore:
        root = root or index.parent
        wm = _load_index(index)
        paths = []
        for s in sorted(set(wm.values())):
            if not (root / s).is_file():
                raise InvalidInputError(f"{index}: shard {s} listed in weight_map is missing from {root}")
            paths.append(root / s)
        bin_shards = index.name.endswith(".bin.index.json")
        open_files = cls._open_bin_files if bin_shards else cls._open_safetensors_files
        return open_files(root, paths, index=_WeightMap(index, wm))

    @classmethod
    def _open_bin_files(cls, root: Path, files: list[Path], index: _WeightMap | None = None) -> TensorStore:
        tensors: dict[str, Any] = {}
        infos: dict[str, TensorInfo] = {}
        for f in files:
            sd = _torch_load_weights_only(f)
            for name, t in sd.items():
                if name in tensors:
                    raise _in_two_shards(name, infos[name].file, f, root)
                tensors[name] = t
                infos[name] = TensorInfo(name, safetensors_dtype(t.dtype), tuple(t.shape), f, None, None,
                                         loader=_BinLoader(tensors, name))
        if index is not None:
            _check_weight_map(index, infos, root)
            infos = {n: infos[n] for n in index.shards}
            tensors = {n: tensors[n] for n in index.shards}
            for n, i in infos.items():  # rebind loaders to the filtered dict
                infos[n] = TensorInfo(i.name, i.dtype, i.shape, i.file, None, None, loader=_BinLoader(tensors, n))
        return cls(root, infos, list(files), "bin", {}, tensors)

    def names(self) -> list[str]:
        """All tensor names, sorted."""
        return sorted(self._infos)

    def __contains__(self, name: object) -> bool:
        return name in self._infos

    def __len__(self) -> int:
        return len(self._infos)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def info(self, name: str) -> TensorInfo:
        """The :class:`TensorInfo` of ``name``; InvalidInputError naming the checkpoint when there is none."""
        try:
            return self._infos[name]
        except KeyError:
            raise InvalidInputError(f"{self.path}: no tensor named {name!r}") from None

    def infos(self) -> list[TensorInfo]:
        """All :class:`TensorInfo` objects, sorted by name."""
        return [self._infos[n] for n in self.names()]

    def read_bytes(self, name: str) -> bytes:
        """Raw little-endian row-major bytes of tensor ``name`` (safetensors: only its byte range, no torch).

        Raises:
            InvalidInputError: unknown name, or the file was truncated since opening.
        """
        info = self.info(name)
        self.bytes_read += info.nbytes
        if info.start is None:
            assert info.loader is not None
            return info.loader()
        return _read_range(info.file, info.start, info.nbytes)

    def read_tensor(self, name: str) -> torch.Tensor:
        """Tensor ``name`` as a CPU ``torch.Tensor`` of its stored dtype and shape."""
        torch = import_torch()

        info = self.info(name)
        if self._tensors is not None:
            self.bytes_read += info.nbytes
            return self._tensors[name]
        raw = self.read_bytes(name)
        if info.nbytes == 0:
            return torch.empty(info.shape, dtype=torch_dtype(info.dtype))
        return torch.frombuffer(bytearray(raw), dtype=torch_dtype(info.dtype)).reshape(info.shape)

    def read_rows(self, name: str, rows: np.ndarray) -> torch.Tensor:
        """``[n, *shape[1:]]`` tensor (stored dtype) of rows ``rows`` (int ``[n]`` in ``[0, shape[0])``, repeats
        allowed) of tensor ``name``, reading only them (docs/tensors.md).

        Raises:
            InvalidInputError: unknown name, a row out of range, or a truncated file.
        """
        import numpy as np

        torch = import_torch()
        info = self.info(name)
        rows = np.asarray(rows, dtype=np.int64)
        if not info.shape or (rows.size and (rows.min() < 0 or rows.max() >= info.shape[0])):
            raise InvalidInputError(f"{self.path}: rows of {name!r} {list(info.shape)} out of range")
        if info.start is None:
            return self.read_tensor(name).index_select(0, torch.from_numpy(rows))
        uniq = np.unique(rows)
        row_bytes = info.nbytes // info.shape[0] if info.shape[0] else 0
        buf = bytearray(int(uniq.size) * row_bytes)
        _read_runs(info.file, info.start, row_bytes, uniq, memoryview(buf))
        self.bytes_read += len(buf)
        shape = (int(uniq.size), *info.shape[1:])
        if not buf:
            got = torch.empty(shape, dtype=torch_dtype(info.dtype))
        else:
            got = torch.frombuffer(buf, dtype=torch_dtype(info.dtype)).reshape(shape)
        return got.index_select(0, torch.from_numpy(np.searchsorted(uniq, rows)))

    def read_numpy(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a numpy array; InvalidInputError for an unknown name, ValueError for BF16/F8."""
        import numpy as np

        info = self.info(name)
        if info.dtype not in _NUMPY_NAMES:
            raise ValueError(f"tensor {name!r} is {info.dtype}, which numpy cannot represent; use read_tensor()")
        return np.frombuffer(self.read_bytes(name), dtype=np.dtype(_NUMPY_NAMES[info.dtype])).reshape(info.shape).copy()

    def __repr__(self) -> str:
        return f"TensorStore({str(self.path)!r}, format={self.format!r}, tensors={len(self)}, files={len(self.files)})"


class _BinLoader:
    """Callable giving a ``.bin`` tensor's raw bytes (kept lightweight, no closure)."""

    __slots__ = ("_tensors", "_name")

    def __init__(self, tensors: dict[str, Any], name: str):
        self._tensors = tensors
        self._name = name

    def __call__(self) -> bytes:
        return tensor_to_bytes(self._tensors[self._name])[2]


def open_store(path: str | os.PathLike) -> TensorStore:
    """Shorthand for :meth:`TensorStore.open`."""
    return TensorStore.open(path)


def _read_range(path: Path, start: int, length: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(length)
    except OSError as e:
        raise InvalidInputError(f"{path}: cannot read: {e.strerror or e}") from e
    if len(data) != length:
        raise InvalidInputError(f"{path}: wanted {length} bytes at offset {start}, got {len(data)} (file truncated?)")
    return data


def _read_runs(path: Path, start: int, row_bytes: int, uniq: np.ndarray, out: memoryview) -> None:
    """Read rows ``uniq`` (sorted, distinct) of a row-major tensor at ``start`` into ``out``, one pread per run."""
    import numpy as np

    if not uniq.size or not row_bytes:
        return
    breaks = np.flatnonzero(np.diff(uniq) != 1) + 1
    firsts = np.concatenate([[0], breaks])
    lasts = np.concatenate([breaks, [uniq.size]])
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise InvalidInputError(f"{path}: cannot read: {e.strerror or e}") from e
    try:
        for a, b in zip(firsts.tolist(), lasts.tolist(), strict=True):
            mv, off = out[a * row_bytes: b * row_bytes], start + int(uniq[a]) * row_bytes
            while mv:
                n = os.preadv(fd, [mv], off)
                if n <= 0:
                    raise InvalidInputError(f"{path}: ended before byte {off} (file truncated?)")
                mv, off = mv[n:], off + n
    finally:
        os.close(fd)


def _in_two_shards(name: str, first: Path, second: Path, root: Path) -> InvalidInputError:
    """The error for a tensor that two shards of one checkpoint both hold."""
    return InvalidInputError(f"tensor {name!r} appears in two shards: {first.name} and {second.name} (in {root})")
