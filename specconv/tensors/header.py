"""safetensors header parsing and transformers index reading (no tensor data, no torch; docs/tensors.md)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InvalidInputError
from .dtypes import DTYPE_SIZES, _nbytes

SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
WEIGHTS_NAME = "pytorch_model.bin"
WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"

# safetensors refuses headers above 100 MB (``MAX_HEADER_SIZE``); so do we.
_MAX_HEADER_SIZE = 100_000_000
_METADATA_KEY = "__metadata__"
_HEADER_ALIGN = 8


# ----------------------------------------------------------------------- TensorInfo

@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor of a checkpoint lives: safetensors ``dtype`` string, ``shape`` (``()`` for a scalar),
    ``file`` and absolute byte range ``[start, end)`` in it (``None`` for ``.bin``, whose ``loader`` returns
    the raw little-endian bytes)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    start: int | None
    end: int | None
    loader: Callable[[], bytes] | None = field(default=None, compare=False, repr=False)

    @property
    def nbytes(self) -> int:
        return _nbytes(self.dtype, self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


# ----------------------------------------------------------- safetensors header parse

def _read_header_json(path: Path) -> tuple[dict, int, int]:
    """``(header object, absolute start of the data section, its length)`` of one safetensors file.

    Raises:
        InvalidInputError: unreadable file, bad header length, non-JSON or non-object header.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise InvalidInputError(f"{path}: not a safetensors file ({size} bytes, shorter than the "
                                        "8-byte header length)")
            n = int.from_bytes(head, "little")
            if n == 0 or n > size - 8:
                raise InvalidInputError(f"{path}: corrupt safetensors header: declared header length {n} "
                                        f"does not fit the {size}-byte file (truncated download?)")
            if n > _MAX_HEADER_SIZE:
                raise InvalidInputError(f"{path}: safetensors header length {n} exceeds {_MAX_HEADER_SIZE} bytes")
            raw = f.read(n)
    except OSError as e:
        raise InvalidInputError(f"{path}: cannot read: {e.strerror or e}") from e
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise InvalidInputError(f"{path}: corrupt safetensors header (not JSON: {e})") from e
    if not isinstance(header, dict):
        raise InvalidInputError(f"{path}: corrupt safetensors header (not a JSON object)")
    return header, 8 + n, size - 8 - n


def _parse_entry(path: Path, name: str, entry: object, data_start: int, data_len: int) -> TensorInfo:
    """Check one header entry (dtype, shape, offsets inside the data section); errors name file and tensor."""
    where = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict):
        raise InvalidInputError(f"{where}: header entry is not an object")
    dtype = entry.get("dtype")
    shape = entry.get("shape")
    offs = entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise InvalidInputError(f"{where}: unsupported dtype {dtype!r}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise InvalidInputError(f"{where}: bad shape {shape!r}")
    if (not isinstance(offs, list) or len(offs) != 2 or not all(type(o) is int for o in offs)
            or not 0 <= offs[0] <= offs[1]):
        raise InvalidInputError(f"{where}: bad data_offsets {offs!r}")
    b, e = offs
    if e - b != _nbytes(dtype, shape):
        raise InvalidInputError(f"{where}: data_offsets span {e - b} bytes but {dtype} {shape} needs "
                                f"{_nbytes(dtype, shape)}")
    if e > data_len:
        raise InvalidInputError(f"{where}: data_offsets [{b}, {e}] run past the end of the data section "
                                f"({data_len} bytes; truncated file?)")
    return TensorInfo(name, dtype, tuple(shape), path, data_start + b, data_start + e)


def _read_safetensors_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """``(infos by name, __metadata__ or {})`` of one safetensors file, its header checked, no data read.

    Raises:
        InvalidInputError: unreadable file, bad header length, non-JSON header, unknown dtype, offsets that
            disagree with dtype x shape, fall outside the file or overlap. The message names the file (and tensor).
    """
    header, data_start, data_len = _read_header_json(path)
    meta = header.pop(_METADATA_KEY, None) or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise InvalidInputError(f"{path}: __metadata__ must map strings to strings")
    infos = {name: _parse_entry(path, name, entry, data_start, data_len) for name, entry in header.items()}
    spans = sorted((i.start, i.end, i.name) for i in infos.values()
                   if i.start is not None and i.end is not None and i.end > i.start)
    for (_, e0, n0), (b1, _, n1) in zip(spans, spans[1:], strict=False):
        if b1 < e0:
            raise InvalidInputError(f"{path}: corrupt safetensors header: tensors {n0!r} and {n1!r} overlap")
    return infos, dict(meta)


def _load_index(index_path: Path) -> dict[str, str]:
    """The ``weight_map`` of a transformers ``*.index.json``.

    Raises:
        InvalidInputError: unreadable/non-JSON file, missing or malformed ``weight_map``, or a shard name that
            is not a plain file name.
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
            raise InvalidInputError(f"{index_path}: weight_map[{name!r}] = {shard!r} points outside the directory")
    return wm

