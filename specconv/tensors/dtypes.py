"""safetensors dtype facts (``huggingface/safetensors`` ``safetensors/src/tensor.rs``), torch/numpy dtype maps,
raw-byte casts and size parsing; torch is imported lazily."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..errors import InvalidInputError, UsageError

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: Bytes per element of each safetensors dtype string (safetensors ``Dtype::size``).
DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1,
}

# Order of safetensors' Rust ``Dtype`` enum (derive(Ord)); tensors are written by descending rank then name.
_DTYPE_RANK: dict[str, int] = {d: i for i, d in enumerate(
    ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64"])}


def import_torch():
    """torch, for the tensor paths that need it; MissingExtraError (exit 2) without the ``validate`` extra."""
    from ..extras import require

    return require("torch", "validate",
                   feature="reading or casting tensors with torch (.bin / .pt checkpoints, convert --dtype)")


def _torch_dtype_map() -> dict[str, torch.dtype]:
    torch = import_torch()

    m = {
        "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "F16": torch.float16,
        "BF16": torch.bfloat16, "I32": torch.int32, "F32": torch.float32, "I64": torch.int64, "F64": torch.float64,
        "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    }
    for name, attr in (("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64")):
        if hasattr(torch, attr):
            m[name] = getattr(torch, attr)
    return m


def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a safetensors dtype string (``"BF16"``); InvalidInputError when unknown here."""
    m = _torch_dtype_map()
    if dtype not in m:
        raise InvalidInputError(f"dtype {dtype!r} has no torch equivalent here")
    return m[dtype]


def safetensors_dtype(dt: torch.dtype) -> str:
    """The safetensors dtype string of a torch dtype; InvalidInputError for one it cannot store (complex, ...)."""
    for k, v in _torch_dtype_map().items():
        if v == dt:
            return k
    raise InvalidInputError(f"torch dtype {dt} cannot be stored in safetensors")


_NUMPY_NAMES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "<i2", "U16": "<u2",
    "F16": "<f2", "I32": "<i4", "U32": "<u4", "F32": "<f4", "I64": "<i8",
    "U64": "<u8", "F64": "<f8",
}


def _nbytes(dtype: str, shape: Iterable[int]) -> int:
    return math.prod(shape) * DTYPE_SIZES[dtype]


# --------------------------------------------------------------------------- casts

def tensor_to_bytes(t: torch.Tensor) -> tuple[str, tuple[int, ...], bytes]:
    """``(safetensors dtype, shape, raw little-endian bytes)`` of a torch tensor (viewed as ``uint8``, so BF16
    and F8 work); InvalidInputError for a dtype safetensors cannot store."""
    torch = import_torch()

    dtype = safetensors_dtype(t.dtype)
    shape = tuple(int(d) for d in t.shape)
    t = t.detach().cpu().contiguous()
    if t.numel() == 0:
        return dtype, shape, b""
    flat = t.reshape(-1)
    if flat.dtype != torch.uint8:
        flat = flat.view(torch.uint8)
    return dtype, shape, flat.numpy().tobytes()


def cast_bytes(raw: bytes, src_dtype: str, dst_dtype: str, shape: Iterable[int], *, name: str = "tensor") -> bytes:
    """Cast raw little-endian tensor bytes between safetensors dtypes (e.g. ``"BF16"`` -> ``"F32"``) with
    :func:`cast_tensor`; ``name`` names the tensor in errors.

    Raises:
        InvalidInputError: unknown dtype or ``raw`` of the wrong length.
        CastOverflowError: the cast would make finite source values non-finite.
    """
    shape = tuple(shape)
    for d in (src_dtype, dst_dtype):
        if d not in DTYPE_SIZES:
            raise InvalidInputError(f"cast: unknown dtype {d!r}")
    need = _nbytes(src_dtype, shape)
    if len(raw) != need:
        raise InvalidInputError(f"cast: {len(raw)} bytes given, {src_dtype} {list(shape)} needs {need}")
    if src_dtype == dst_dtype:
        return bytes(raw)
    if need == 0:
        return b""
    torch = import_torch()

    t = torch.frombuffer(bytearray(raw), dtype=torch_dtype(src_dtype)).reshape(shape)
    return tensor_to_bytes(cast_tensor(t, dst_dtype, name=name))[2]


def _nonfinite(t: torch.Tensor) -> int:
    """NaN/±Inf count of ``t``, on its raw bits (:func:`specconv.tensors.scan.scan_bytes`)."""
    from .scan import scan_bytes

    if t.numel() == 0:
        return 0
    flat = t.detach().cpu().contiguous().reshape(-1)
    return scan_bytes(flat.view(import_torch().uint8).numpy(), safetensors_dtype(t.dtype))[0]


def cast_tensor(t: torch.Tensor, dst_dtype: str, *, name: str = "tensor") -> torch.Tensor:
    """``t.to(dst_dtype)`` (a safetensors dtype string), refusing NaN/±Inf the cast creates (docs/tensors.md).

    Raises:
        CastOverflowError: naming ``name``, the source's max finite |value|, the target
            dtype's largest finite value and the dtypes that hold the tensor.
    """
    out = t.to(torch_dtype(dst_dtype))
    if out.dtype == t.dtype:
        return out
    created = _nonfinite(out) - _nonfinite(t)
    if created > 0:
        raise _overflow_error(t, dst_dtype, name, created)
    return out


def _overflow_error(t: torch.Tensor, dst_dtype: str, name: str, created: int) -> Exception:
    from ..errors import CastOverflowError

    torch = import_torch()

    def label(d: str) -> str:  # the --dtype spelling: torch's dtype name
        return str(torch_dtype(d)).removeprefix("torch.")

    src_dtype = safetensors_dtype(t.dtype)
    x = t.double()
    peak = float(x[torch.isfinite(x)].abs().max())
    limit = float(torch.finfo(torch_dtype(dst_dtype)).max)
    others = [d for d in ("BF16", "F16", "F32") if d not in (src_dtype, dst_dtype)
              and _nonfinite(t.to(torch_dtype(d))) <= _nonfinite(t)]
    also = "".join(f", or --dtype {label(d)}, which holds it" for d in others)
    return CastOverflowError(
        f"{name}: casting {src_dtype} to {dst_dtype} overflows: max |value| {peak:.7g} is above "
        f"{label(dst_dtype)}'s largest finite value {limit:.7g} ({created} value(s) would become ±inf, "
        f"which the source does not hold; --allow-nonfinite never covers them): keep {label(src_dtype)} "
        f"(--dtype keep){also}"
    )


# ------------------------------------------------------------------------- helpers

_SIZE_UNITS = {
    "": 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(size: int | str) -> int:
    """Bytes (> 0) of a size such as ``"5GB"``, ``"2GiB"``, ``"1.5G"`` or an int (units: docs/tensors.md).

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
            raise UsageError(f"invalid size {size!r}: use bytes or a number with KB/MB/GB/TB or "
                             "KiB/MiB/GiB/TiB, e.g. 5GB")
        value = int(float(m.group(1)) * _SIZE_UNITS[unit])
    if value <= 0:
        raise UsageError(f"invalid size {size!r}: must be positive")
    return value

