"""Lazy checkpoint readers and a streaming, sharded safetensors writer.

A conversion is mostly a byte copy plus a config rewrite, so this module keeps the
copy path free of torch: safetensors headers are parsed here (no ``safetensors`` or
``torch`` import), every :class:`TensorInfo` carries the tensor's absolute byte range
in its file, and :func:`write_safetensors` copies those ranges in bounded chunks
(``os.copy_file_range`` / ``os.sendfile`` when the kernel offers them, a 16 MiB
read/write loop otherwise). torch is imported lazily, only for dtype casts,
``read_tensor`` and the weights-only ``pytorch_model.bin`` reader.

Format facts (safetensors, ``huggingface/safetensors`` ``docs/source/index.mdx`` and
``safetensors/src/tensor.rs``):

* file = 8-byte little-endian header length ``N`` + ``N`` bytes of UTF-8 JSON + data;
* the JSON maps tensor name -> ``{"dtype", "shape", "data_offsets": [begin, end]}``
  with offsets relative to the start of the data section, plus an optional
  ``"__metadata__"`` str->str map (transformers writes ``{"format": "pt"}``);
* the library pads the header with spaces to a multiple of 8 bytes and lays tensors
  out by descending dtype (its ``Dtype`` enum order, roughly element size) then name,
  so every tensor is aligned to its element size; header keys follow that data order.
  The writer here reproduces that layout byte for byte (``safetensors.torch.save``
  with ``metadata={"format": "pt"}`` gives the same bytes for the same tensors).

Sharded checkpoints follow transformers (``transformers/utils/hub.py``,
``modeling_utils.py``): ``model-00001-of-00003.safetensors`` plus
``model.safetensors.index.json`` = ``{"metadata": {"total_size": N}, "weight_map":
{name: file}}``; the same for ``pytorch_model.bin.index.json``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InvalidInputError, UsageError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import torch

__all__ = [
    "DTYPE_SIZES",
    "SAFE_WEIGHTS_NAME",
    "SAFE_WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "WEIGHTS_INDEX_NAME",
    "COPY_CHUNK_SIZE",
    "TensorInfo",
    "TensorStore",
    "open_store",
    "OutTensor",
    "write_safetensors",
    "cast_bytes",
    "tensor_to_bytes",
    "torch_dtype",
    "safetensors_dtype",
    "parse_size",
    "sha256_file",
]

#: Bytes per element of each safetensors dtype string (safetensors ``Dtype::size``).
DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}

# Order of safetensors' Rust ``Dtype`` enum (derive(Ord)); the library writes tensors
# by descending rank then name. Checked against safetensors 0.8.0's ``save``.
_DTYPE_RANK: dict[str, int] = {
    d: i
    for i, d in enumerate(
        ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16",
         "I32", "U32", "F32", "F64", "I64", "U64"]
    )
}

SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
WEIGHTS_NAME = "pytorch_model.bin"
WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"

#: Bytes moved per read/write in the user-space copy fallback (bounds its memory).
COPY_CHUNK_SIZE = 16 * 1024 * 1024
#: Bytes per copy_file_range/sendfile call (kernel-side, no user buffer; sendfile
#: caps one call at 0x7ffff000 bytes anyway).
KERNEL_COPY_CHUNK = 1 << 30

# safetensors refuses headers above 100 MB (``MAX_HEADER_SIZE``); so do we.
_MAX_HEADER_SIZE = 100_000_000
_METADATA_KEY = "__metadata__"
_HEADER_ALIGN = 8


# --------------------------------------------------------------------------- dtypes

def _torch_dtype_map() -> dict[str, "torch.dtype"]:
    import torch

    m = {
        "BOOL": torch.bool,
        "U8": torch.uint8,
        "I8": torch.int8,
        "I16": torch.int16,
        "F16": torch.float16,
        "BF16": torch.bfloat16,
        "I32": torch.int32,
        "F32": torch.float32,
        "I64": torch.int64,
        "F64": torch.float64,
        "F8_E4M3": torch.float8_e4m3fn,
        "F8_E5M2": torch.float8_e5m2,
    }
    for name, attr in (("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64")):
        if hasattr(torch, attr):
            m[name] = getattr(torch, attr)
    return m


def torch_dtype(dtype: str) -> "torch.dtype":
    """Map a safetensors dtype string (``"BF16"``) to the torch dtype (imports torch).

    Raises:
        InvalidInputError: unknown dtype, or one this torch build lacks.
    """
    m = _torch_dtype_map()
    if dtype not in m:
        raise InvalidInputError(f"dtype {dtype!r} has no torch equivalent here")
    return m[dtype]


def safetensors_dtype(dt: "torch.dtype") -> str:
    """Map a torch dtype to its safetensors dtype string (``torch.bfloat16`` -> ``"BF16"``).

    Raises:
        InvalidInputError: a torch dtype safetensors cannot store (complex, ...).
    """
    for k, v in _torch_dtype_map().items():
        if v == dt:
            return k
    raise InvalidInputError(f"torch dtype {dt} cannot be stored in safetensors")


_NUMPY_NAMES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "<i2", "U16": "<u2",
    "F16": "<f2", "I32": "<i4", "U32": "<u4", "F32": "<f4", "I64": "<i8",
    "U64": "<u8", "F64": "<f8",
}


def _numel(shape: Iterable[int]) -> int:
    return math.prod(shape)


def _nbytes(dtype: str, shape: Iterable[int]) -> int:
    return _numel(shape) * DTYPE_SIZES[dtype]


# ----------------------------------------------------------------------- TensorInfo

@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor of a checkpoint lives.

    Attributes:
        name: tensor name as stored (e.g. ``"layers.0.self_attn.q_proj.weight"``).
        dtype: safetensors dtype string (``"BF16"``, ``"F32"``, ``"I64"``, ``"BOOL"``...).
        shape: tensor shape (``()`` for a scalar).
        file: the file holding it.
        start, end: absolute byte range ``[start, end)`` inside ``file`` for
            safetensors (header length already added); ``None`` for ``.bin`` files.
        loader: for ``.bin`` tensors, a callable returning the raw little-endian bytes
            (used by :func:`write_safetensors`); ``None`` for safetensors.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    start: int | None
    end: int | None
    loader: Callable[[], bytes] | None = field(default=None, compare=False, repr=False)

    @property
    def nbytes(self) -> int:
        """Size of the tensor data in bytes (``numel * DTYPE_SIZES[dtype]``)."""
        return _nbytes(self.dtype, self.shape)

    @property
    def numel(self) -> int:
        """Number of elements."""
        return _numel(self.shape)


# ----------------------------------------------------------- safetensors header parse

def _read_safetensors_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Parse and check one safetensors file's header without reading its data.

    Returns:
        (infos by name, ``__metadata__`` dict or ``{}``).

    Raises:
        InvalidInputError: unreadable file, bad header length, non-JSON header, unknown
            dtype, offsets that disagree with dtype x shape, fall outside the file or
            overlap. The message names the file (and tensor).
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise InvalidInputError(
                    f"{path}: not a safetensors file ({size} bytes, shorter than the "
                    "8-byte header length)"
                )
            n = int.from_bytes(head, "little")
            if n == 0 or n > size - 8:
                raise InvalidInputError(
                    f"{path}: corrupt safetensors header: declared header length {n} "
                    f"does not fit the {size}-byte file (truncated download?)"
                )
            if n > _MAX_HEADER_SIZE:
                raise InvalidInputError(
                    f"{path}: safetensors header length {n} exceeds {_MAX_HEADER_SIZE} bytes"
                )
            raw = f.read(n)
    except OSError as e:
        raise InvalidInputError(f"{path}: cannot read: {e.strerror or e}") from e
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise InvalidInputError(f"{path}: corrupt safetensors header (not JSON: {e})") from e
    if not isinstance(header, dict):
        raise InvalidInputError(f"{path}: corrupt safetensors header (not a JSON object)")

    data_start = 8 + n
    data_len = size - data_start
    meta = header.pop(_METADATA_KEY, None) or {}
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        raise InvalidInputError(f"{path}: __metadata__ must map strings to strings")

    infos: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        where = f"{path}: tensor {name!r}"
        if not isinstance(entry, dict):
            raise InvalidInputError(f"{where}: header entry is not an object")
        dtype = entry.get("dtype")
        shape = entry.get("shape")
        offs = entry.get("data_offsets")
        if dtype not in DTYPE_SIZES:
            raise InvalidInputError(f"{where}: unsupported dtype {dtype!r}")
        if not isinstance(shape, list) or not all(
            type(d) is int and d >= 0 for d in shape
        ):
            raise InvalidInputError(f"{where}: bad shape {shape!r}")
        if (
            not isinstance(offs, list)
            or len(offs) != 2
            or not all(type(o) is int for o in offs)
            or not 0 <= offs[0] <= offs[1]
        ):
            raise InvalidInputError(f"{where}: bad data_offsets {offs!r}")
        b, e = offs
        if e - b != _nbytes(dtype, shape):
            raise InvalidInputError(
                f"{where}: data_offsets span {e - b} bytes but {dtype} {shape} needs "
                f"{_nbytes(dtype, shape)}"
            )
        if e > data_len:
            raise InvalidInputError(
                f"{where}: data_offsets [{b}, {e}] run past the end of the data section "
                f"({data_len} bytes; truncated file?)"
            )
        infos[name] = TensorInfo(
            name, dtype, tuple(shape), path, data_start + b, data_start + e
        )

    spans = sorted((i.start, i.end, i.name) for i in infos.values() if i.end > i.start)
    for (_, e0, n0), (b1, _, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise InvalidInputError(
                f"{path}: corrupt safetensors header: tensors {n0!r} and {n1!r} overlap"
            )
    return infos, dict(meta)


def _load_index(index_path: Path) -> dict[str, str]:
    """Read a transformers ``*.index.json`` and return its ``weight_map``.

    Raises:
        InvalidInputError: unreadable/non-JSON file, missing or malformed
            ``weight_map``, or a shard name that is not a plain file name.
    """
    try:
        data = json.loads(index_path.read_text(encoding="utf-8"))
    except OSError as e:
        raise InvalidInputError(f"{index_path}: cannot read: {e.strerror or e}") from e
    except (ValueError, RecursionError) as e:
        raise InvalidInputError(f"{index_path}: not valid JSON ({e})") from e
    wm = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wm, dict) or not wm:
        raise InvalidInputError(f"{index_path}: missing or empty 'weight_map'")
    for name, shard in wm.items():
        if not isinstance(shard, str) or not shard:
            raise InvalidInputError(f"{index_path}: weight_map[{name!r}] is not a file name")
        if os.path.isabs(shard) or ".." in Path(shard).parts:
            raise InvalidInputError(
                f"{index_path}: weight_map[{name!r}] = {shard!r} points outside the directory"
            )
    return wm


# --------------------------------------------------------------------- .bin loading

#: torch's own wrapper text around a weights-only refusal (it advises weights_only=False,
#: which specconv never does, so it is not echoed).
_TORCH_LOAD_BOILERPLATE = ("Weights only load failed", "Please file an issue", "Check the documentation",
                           "In PyTorch 2.6", "Re-running `torch.load`")


def torch_load_error_detail(e: BaseException) -> str:
    """One line saying why ``torch.load(weights_only=True)`` failed (e.g. ``UnpicklingError:
    Trying to load unsupported GLOBAL posix.system ...``), without torch's boilerplate."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.startswith(_TORCH_LOAD_BOILERPLATE)]
    line = useful[0] if useful else (lines[0] if lines else "")
    line = re.sub(r"^.*WeightsUnpickler error:\s*", "", line)
    return f"{type(e).__name__}: {line[:300]}"


def _torch_load_weights_only(path: Path) -> dict[str, Any]:
    """``torch.load`` with ``weights_only=True`` (never a full unpickle).

    ``mmap=True`` is used for the zip format; legacy (pre-1.6) files cannot be
    memory-mapped, so they are read weights-only without mmap.

    Raises:
        InvalidInputError: the file needs arbitrary unpickling (refused) or is not a
            torch checkpoint at all.
    """
    import pickle
    import zipfile

    import torch

    _detail = torch_load_error_detail

    try:
        if zipfile.is_zipfile(path):
            obj = torch.load(path, weights_only=True, mmap=True, map_location="cpu")
        else:
            obj = torch.load(path, weights_only=True, map_location="cpu")
    except OSError as e:
        raise InvalidInputError(f"{path}: cannot read: {e.strerror or e}") from e
    except Exception as e:  # UnpicklingError, RuntimeError, EOFError... for junk files
        msg = str(e)
        low = msg.lower()
        if isinstance(e, pickle.UnpicklingError) and (
            "unsupported global" in low or "unsupported class" in low or "is blocked" in low
        ):
            raise InvalidInputError(
                f"{path}: needs arbitrary unpickling (it references code outside the "
                "tensor allow-list), which specconv refuses to execute; only "
                "torch.load(weights_only=True) is used. Convert it to safetensors in a "
                f"trusted environment. ({_detail(e)})",
                code="unsafe_pickle",
            ) from e
        raise InvalidInputError(
            f"{path}: torch.load(weights_only=True) failed: the file is corrupt or needs "
            f"arbitrary unpickling, which specconv refuses ({_detail(e)})"
        ) from e
    if not isinstance(obj, dict):
        raise InvalidInputError(
            f"{path}: expected a state dict (name -> tensor), found {type(obj).__name__}"
        )
    for k, v in obj.items():
        if not isinstance(k, str):
            raise InvalidInputError(
                f"{path}: key {k!r} is a {type(k).__name__}, not a tensor name; expected a flat "
                "state dict (name -> tensor)"
            )
        if not isinstance(v, torch.Tensor):
            raise InvalidInputError(
                f"{path}: entry {k!r} is a {type(v).__name__}, not a tensor; expected a "
                "flat state dict (a training checkpoint? extract its model state dict)"
            )
    return obj


# ---------------------------------------------------------------------- TensorStore

def _check_weight_map(expected: dict[str, str], infos: dict, root: Path, index_path: Path) -> None:
    """Every name in an index's ``weight_map`` must be in the shard the index names.

    Raises:
        InvalidInputError: naming the index, the tensor and the shard.
    """
    for name, shard in expected.items():
        info = infos.get(name)
        if info is None or info.file != root / shard:
            raise InvalidInputError(
                f"{index_path}: weight_map says {name!r} is in {shard}, but that "
                "shard has no such tensor"
            )


class TensorStore:
    """Lazy, read-only view of one checkpoint's tensors.

    Opening reads only headers (safetensors) or memory-maps the pickle archive
    weights-only (``.bin``); tensor data is read on demand by byte range.

    Attributes:
        path: the path the store was opened from.
        files: the weight files (shards) in use, in name order.
        format: ``"safetensors"`` or ``"bin"``.
        metadata: the first safetensors file's ``__metadata__`` (``{}`` for ``.bin``).
    """

    def __init__(
        self,
        path: Path,
        infos: dict[str, TensorInfo],
        files: list[Path],
        fmt: str,
        metadata: dict[str, str] | None = None,
        tensors: dict[str, Any] | None = None,
    ):
        self.path = path
        self._infos = infos
        self.files = files
        self.format = fmt
        self.metadata = metadata or {}
        self._tensors = tensors  # .bin only: name -> mmap-backed torch.Tensor

    # ---- opening
    @classmethod
    def open(cls, path: str | os.PathLike) -> "TensorStore":
        """Open a checkpoint directory or weight file.

        Accepted, in this order of preference for a directory: ``model.safetensors``;
        ``model.safetensors.index.json`` + shards; exactly one other ``*.safetensors``;
        ``pytorch_model.bin``; ``pytorch_model.bin.index.json`` + shards. A file path
        may be a ``.safetensors`` file, a ``*.index.json`` or a ``.bin``/``.pt``/``.pth``.
        ``.bin`` files are loaded only with ``torch.load(weights_only=True, mmap=True)``.

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
            if name.endswith(".bin.index.json"):
                return cls._open_bin_index(p)
            return cls._open_safetensors_index(p)
        if name.endswith(".safetensors"):
            return cls._open_safetensors_files(p, [p])
        if name.endswith((".bin", ".pt", ".pth")):
            return cls._open_bin_files(p, [p])
        raise InvalidInputError(
            f"{p}: not a weight file (.safetensors, .bin, .pt, .pth or *.index.json)"
        )

    @classmethod
    def _open_dir(cls, d: Path) -> "TensorStore":
        if (d / SAFE_WEIGHTS_NAME).is_file():
            return cls._open_safetensors_files(d, [d / SAFE_WEIGHTS_NAME])
        if (d / SAFE_WEIGHTS_INDEX_NAME).is_file():
            return cls._open_safetensors_index(d / SAFE_WEIGHTS_INDEX_NAME, root=d)
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
            return cls._open_bin_index(d / WEIGHTS_INDEX_NAME, root=d)
        raise InvalidInputError(
            f"{d}: no weights found (expected {SAFE_WEIGHTS_NAME}, {SAFE_WEIGHTS_INDEX_NAME}, "
            f"a single *.safetensors, {WEIGHTS_NAME} or {WEIGHTS_INDEX_NAME})"
        )

    @classmethod
    def _open_safetensors_files(
        cls, root: Path, files: list[Path], expected: dict[str, str] | None = None,
        index_path: Path | None = None,
    ) -> "TensorStore":
        infos: dict[str, TensorInfo] = {}
        first_meta: dict[str, str] | None = None
        for f in files:
            got, meta = _read_safetensors_header(f)
            if first_meta is None:
                first_meta = meta
            for name, info in got.items():
                if name in infos:
                    raise InvalidInputError(
                        f"tensor {name!r} appears in two shards: {infos[name].file.name} "
                        f"and {f.name} (in {root})"
                    )
                infos[name] = info
        if expected is not None:
            _check_weight_map(expected, infos, root, index_path)
            infos = {n: infos[n] for n in expected}
        return cls(root, infos, list(files), "safetensors", first_meta)

    @classmethod
    def _shards_from_index(cls, index: Path, root: Path) -> tuple[dict[str, str], list[Path]]:
        wm = _load_index(index)
        shards = sorted(set(wm.values()))
        paths = []
        for s in shards:
            sp = root / s
            if not sp.is_file():
                raise InvalidInputError(
                    f"{index}: shard {s} listed in weight_map is missing from {root}"
                )
            paths.append(sp)
        return wm, paths

    @classmethod
    def _open_safetensors_index(cls, index: Path, root: Path | None = None) -> "TensorStore":
        root = root or index.parent
        wm, paths = cls._shards_from_index(index, root)
        return cls._open_safetensors_files(root, paths, expected=wm, index_path=index)

    @classmethod
    def _open_bin_files(
        cls, root: Path, files: list[Path], expected: dict[str, str] | None = None,
        index_path: Path | None = None,
    ) -> "TensorStore":
        tensors: dict[str, Any] = {}
        infos: dict[str, TensorInfo] = {}
        for f in files:
            sd = _torch_load_weights_only(f)
            for name, t in sd.items():
                if name in tensors:
                    raise InvalidInputError(
                        f"tensor {name!r} appears in two shards: {infos[name].file.name} "
                        f"and {f.name} (in {root})"
                    )
                tensors[name] = t
                infos[name] = TensorInfo(
                    name, safetensors_dtype(t.dtype), tuple(t.shape), f, None, None,
                    loader=_BinLoader(tensors, name),
                )
        if expected is not None:
            _check_weight_map(expected, infos, root, index_path)
            infos = {n: infos[n] for n in expected}
            tensors = {n: tensors[n] for n in expected}
            for n, i in infos.items():  # rebind loaders to the filtered dict
                infos[n] = TensorInfo(i.name, i.dtype, i.shape, i.file, None, None,
                                      loader=_BinLoader(tensors, n))
        return cls(root, infos, list(files), "bin", {}, tensors)

    @classmethod
    def _open_bin_index(cls, index: Path, root: Path | None = None) -> "TensorStore":
        root = root or index.parent
        wm, paths = cls._shards_from_index(index, root)
        return cls._open_bin_files(root, paths, expected=wm, index_path=index)

    # ---- queries
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
        """Return the :class:`TensorInfo` of ``name``.

        Raises:
            InvalidInputError: no tensor of that name (the message names the checkpoint).
        """
        try:
            return self._infos[name]
        except KeyError:
            raise InvalidInputError(f"{self.path}: no tensor named {name!r}") from None

    def infos(self) -> list[TensorInfo]:
        """All :class:`TensorInfo` objects, sorted by name."""
        return [self._infos[n] for n in self.names()]

    def total_bytes(self) -> int:
        """Sum of all tensors' ``nbytes``."""
        return sum(i.nbytes for i in self._infos.values())

    # ---- data
    def read_bytes(self, name: str) -> bytes:
        """Raw little-endian bytes of tensor ``name`` (row-major, ``nbytes`` long).

        For safetensors only the tensor's byte range is read (no torch import).

        Raises:
            InvalidInputError: unknown name, or the file was truncated since opening.
        """
        info = self.info(name)
        if info.start is None:
            assert info.loader is not None
            return info.loader()
        return _read_range(info.file, info.start, info.nbytes)

    def read_tensor(self, name: str) -> "torch.Tensor":
        """Tensor ``name`` as a CPU ``torch.Tensor`` of its stored dtype and shape."""
        import torch

        info = self.info(name)
        if self._tensors is not None:
            return self._tensors[name]
        raw = self.read_bytes(name)
        if info.nbytes == 0:
            return torch.empty(info.shape, dtype=torch_dtype(info.dtype))
        return torch.frombuffer(bytearray(raw), dtype=torch_dtype(info.dtype)).reshape(
            info.shape
        )

    def read_numpy(self, name: str) -> "np.ndarray":
        """Tensor ``name`` as a numpy array (not for BF16/F8, which numpy lacks).

        Raises:
            InvalidInputError: unknown name.
            ValueError: BF16 or F8 dtypes (use :meth:`read_tensor`).
        """
        import numpy as np

        info = self.info(name)
        if info.dtype not in _NUMPY_NAMES:
            raise ValueError(
                f"tensor {name!r} is {info.dtype}, which numpy cannot represent; "
                "use read_tensor()"
            )
        return np.frombuffer(self.read_bytes(name), dtype=np.dtype(_NUMPY_NAMES[info.dtype])
                             ).reshape(info.shape).copy()

    def __repr__(self) -> str:
        return (f"TensorStore({str(self.path)!r}, format={self.format!r}, "
                f"tensors={len(self)}, files={len(self.files)})")


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
        raise InvalidInputError(
            f"{path}: wanted {length} bytes at offset {start}, got {len(data)} (file truncated?)"
        )
    return data


# ------------------------------------------------------------------------- writing

@dataclass
class OutTensor:
    """One tensor to write.

    Exactly one of ``src`` (copy that byte range as it is; its dtype must equal
    ``dtype`` and its ``nbytes`` must match, a shape change is a free reshape) or
    ``produce`` (a callable returning exactly ``numel * DTYPE_SIZES[dtype]`` raw
    little-endian bytes, called once when the tensor is written).
    """

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
            raise InvalidInputError(
                f"output tensor {t.name!r}: give exactly one of src= and produce="
            )
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
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape),
                          "data_offsets": [off, off + t.nbytes]}
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


def _write_all(fd: int, data: bytes | memoryview) -> None:
    mv = memoryview(data)
    while mv:
        n = os.write(fd, mv)
        mv = mv[n:]


def _copy_range(src: Path, start: int, length: int, dst_fd: int, *, method: str | None = None
                ) -> str:
    """Append ``length`` bytes of ``src`` starting at ``start`` to ``dst_fd``.

    Tries ``os.copy_file_range`` then ``os.sendfile`` (both kernel-side, no user-space
    buffer; up to :data:`KERNEL_COPY_CHUNK` bytes per call, as ``cp`` does), falling
    back to a read/write loop of :data:`COPY_CHUNK_SIZE` bytes. Peak user-space memory
    is at most one chunk. ``method`` forces ``"copy_file_range"``,
    ``"sendfile"`` or ``"readwrite"`` (tests).

    Returns:
        The method that completed the copy.

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
                    chunk = COPY_CHUNK_SIZE if m == "readwrite" else KERNEL_COPY_CHUNK
                    want = min(chunk, length - done)
                    if m == "copy_file_range":
                        if not hasattr(os, "copy_file_range"):
                            raise OSError("copy_file_range unavailable")
                        n = os.copy_file_range(src_fd, dst_fd, want, start + done)
                    elif m == "sendfile":
                        if not hasattr(os, "sendfile"):
                            raise OSError("sendfile unavailable")
                        n = os.sendfile(dst_fd, src_fd, start + done, want)
                    else:
                        buf = os.pread(src_fd, want, start + done)
                        n = len(buf)
                        if n:
                            _write_all(dst_fd, buf)
                    if n == 0:
                        raise InvalidInputError(
                            f"{src}: ended after {start + done} bytes while copying "
                            f"{length} bytes from offset {start} (file truncated?)"
                        )
                    done += n
                return m
            except InvalidInputError:
                raise
            except OSError:
                # Kernel/filesystem refused this method (EXDEV, ENOSYS, EINVAL...).
                # Partial progress stays valid: dst's position and `done` agree.
                if m == methods[-1]:
                    raise
                continue
        return methods[-1]
    finally:
        os.close(src_fd)


def _shard_name(i: int, n: int) -> str:
    return f"model-{i:05d}-of-{n:05d}.safetensors"


def write_safetensors(
    out_dir: str | os.PathLike,
    tensors: list[OutTensor],
    *,
    max_shard_size: int | str | None = None,
) -> list[str]:
    """Write tensors as safetensors, streaming, deterministic and optionally sharded.

    Layout: tensors are assigned to shards greedily in sorted-name order; inside each
    file the header (``__metadata__ = {"format": "pt"}``, compact JSON, padded with
    spaces to a multiple of 8 bytes) and the data follow the safetensors library's
    order (descending dtype, then name), so identical input gives identical bytes and
    a shard equals what ``safetensors.torch.save(..., metadata={"format": "pt"})``
    writes. ``src`` tensors are copied by byte range in bounded chunks, ``produce()``
    tensors are materialised one at a time, so peak memory is about the largest
    produced tensor. Each file is written to a ``.tmp`` name and renamed when complete.

    Args:
        out_dir: target directory (created if missing).
        tensors: what to write; names must be unique.
        max_shard_size: bytes (or a string for :func:`parse_size`); when the total
            data exceeds it, write ``model-0000i-of-0000n.safetensors`` (5-digit, as
            transformers) plus ``model.safetensors.index.json``. A tensor larger than
            the limit gets a shard of its own.

    Returns:
        File names written, relative to ``out_dir``: ``["model.safetensors"]`` or the
        shard names followed by ``"model.safetensors.index.json"``.

    Raises:
        InvalidInputError: duplicate/invalid names, unknown dtype, a src whose dtype or
            size disagrees with the declared tensor, a produce() returning the wrong
            number of bytes, or a truncated source file.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _check_out_tensors(tensors)
    limit = parse_size(max_shard_size) if max_shard_size is not None else None
    shards = _plan_shards(tensors, limit)
    n = len(shards)
    names = [SAFE_WEIGHTS_NAME] if n == 1 else [_shard_name(i + 1, n) for i in range(n)]

    for fname, shard in zip(names, shards):
        _write_one(out / fname, _layout(shard))

    if n == 1:
        return names
    index = {
        "metadata": {"total_size": sum(t.nbytes for t in tensors)},
        "weight_map": {t.name: fname for fname, shard in zip(names, shards) for t in shard},
    }
    text = json.dumps(index, indent=2, sort_keys=True) + "\n"
    tmp = out / (SAFE_WEIGHTS_INDEX_NAME + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out / SAFE_WEIGHTS_INDEX_NAME)
    return names + [SAFE_WEIGHTS_INDEX_NAME]


def _write_one(path: Path, ordered: list[OutTensor]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, _header_bytes(ordered))
        run: list[Any] = []  # pending [file, start, length] of adjacent source ranges
        for t in ordered:
            if t.src is not None and t.src.start is not None:
                if run and run[0] == t.src.file and run[1] + run[2] == t.src.start:
                    run[2] += t.nbytes  # contiguous with the previous one: one copy
                else:
                    if run:
                        _copy_range(*run, fd)
                    run = [t.src.file, t.src.start, t.nbytes]
                continue
            if run:
                _copy_range(*run, fd)
                run = []
            data = t.produce() if t.produce is not None else t.src.loader()  # type: ignore[union-attr]
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise InvalidInputError(
                    f"output tensor {t.name!r}: producer returned {type(data).__name__}, "
                    "not bytes"
                )
            got = memoryview(data).nbytes
            if got != t.nbytes:
                raise InvalidInputError(
                    f"output tensor {t.name!r}: producer gave {got} bytes, but "
                    f"{t.dtype} {list(t.shape)} needs {t.nbytes}"
                )
            _write_all(fd, data)
            del data
        if run:
            _copy_range(*run, fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- casts

def tensor_to_bytes(t: "torch.Tensor") -> tuple[str, tuple[int, ...], bytes]:
    """Serialise a torch tensor to ``(safetensors dtype, shape, raw little-endian bytes)``.

    Works for every dtype in :data:`DTYPE_SIZES`, BF16 and F8 included (the data is
    viewed as ``uint8``; numpy never sees the float type). Non-contiguous or non-CPU
    tensors are copied first.

    Raises:
        InvalidInputError: a dtype safetensors cannot store.
    """
    import torch

    dtype = safetensors_dtype(t.dtype)
    shape = tuple(int(d) for d in t.shape)
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.numel() == 0:
        return dtype, shape, b""
    flat = t.reshape(-1)
    if flat.dtype != torch.uint8:
        flat = flat.view(torch.uint8)
    return dtype, shape, flat.numpy().tobytes()


def cast_bytes(raw: bytes, src_dtype: str, dst_dtype: str, shape: Iterable[int]) -> bytes:
    """Cast raw tensor bytes between safetensors dtypes with torch's ``Tensor.to`` rules.

    Args:
        raw: ``numel(shape) * DTYPE_SIZES[src_dtype]`` little-endian bytes.
        src_dtype, dst_dtype: safetensors dtype strings, e.g. ``"BF16"`` -> ``"F32"``.
        shape: the tensor shape.

    Returns:
        ``numel(shape) * DTYPE_SIZES[dst_dtype]`` bytes (``raw`` itself when the dtypes
        are equal).

    Raises:
        InvalidInputError: unknown dtype or ``raw`` of the wrong length.
    """
    shape = tuple(shape)
    for d in (src_dtype, dst_dtype):
        if d not in DTYPE_SIZES:
            raise InvalidInputError(f"cast: unknown dtype {d!r}")
    need = _nbytes(src_dtype, shape)
    if len(raw) != need:
        raise InvalidInputError(
            f"cast: {len(raw)} bytes given, {src_dtype} {list(shape)} needs {need}"
        )
    if src_dtype == dst_dtype:
        return bytes(raw)
    if need == 0:
        return b""
    import torch

    t = torch.frombuffer(bytearray(raw), dtype=torch_dtype(src_dtype)).reshape(shape)
    return tensor_to_bytes(t.to(torch_dtype(dst_dtype)))[2]


# ------------------------------------------------------------------------- helpers

_SIZE_UNITS = {
    "": 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(size: int | str) -> int:
    """Parse a size such as ``"5GB"``, ``"500MB"``, ``"2GiB"``, ``"1.5G"`` or an int.

    Decimal units are powers of 10 and ``*iB`` powers of 2, as transformers'
    ``convert_file_size_to_int``.

    Returns:
        Bytes, > 0.

    Raises:
        UsageError: unparsable, unknown unit, or not positive.
    """
    if isinstance(size, bool):
        raise UsageError(f"invalid size {size!r}")
    if isinstance(size, int):
        value = size
    else:
        m = _SIZE_RE.match(str(size))
        unit = m.group(2).upper() if m else None
        if not m or unit not in _SIZE_UNITS:
            raise UsageError(
                f"invalid size {size!r}: use bytes or a number with KB/MB/GB/TB or "
                "KiB/MiB/GiB/TiB, e.g. 5GB"
            )
        value = int(float(m.group(1)) * _SIZE_UNITS[unit])
    if value <= 0:
        raise UsageError(f"invalid size {size!r}: must be positive")
    return value


def sha256_file(path: str | os.PathLike, *, chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in ``chunk_size`` pieces (constant memory).

    Raises:
        InvalidInputError: unreadable file.
    """
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while True:
                b = f.read(chunk_size)
                if not b:
                    break
                h.update(b)
    except OSError as e:
        raise InvalidInputError(f"{path}: cannot read: {e.strerror or e}") from e
    return h.hexdigest()
