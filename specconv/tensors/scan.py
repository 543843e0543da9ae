"""Non-finite (NaN / ±Inf) scan of raw tensor bytes, on the bits (numpy, no torch; docs/tensors.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: dtype -> (unsigned view of the same width, threshold): non-finite iff the bits without the sign bit
#: are >= the threshold (exponent all ones; for ``F8_E4M3`` its single NaN pattern ``.1111.111``).
NONFINITE_BITS: dict[str, tuple[str, int]] = {
    "F16": ("<u2", 0x7C00), "BF16": ("<u2", 0x7F80), "F32": ("<u4", 0x7F800000),
    "F64": ("<u8", 0x7FF0000000000000), "F8_E5M2": ("u1", 0x7C), "F8_E4M3": ("u1", 0x7F),
}

#: Elements per numpy step of the scan (bounds its temporaries to ~3 bytes x this).
_BLOCK = 1 << 18

def scannable(dtype: str) -> bool:
    """Whether ``dtype`` (a safetensors dtype string) can hold NaN/Inf at all."""
    return dtype in NONFINITE_BITS


@dataclass
class NonFinite:
    """Non-finite values found in one tensor: their ``count`` and the flat (row-major) index of the ``first``."""

    count: int = 0
    first: int | None = None

    def add(self, count: int, first: int | None) -> None:
        """Merge the result of a later chunk of the same tensor (``first`` already absolute)."""
        if count:
            self.count += count
            if self.first is None or (first is not None and first < self.first):
                self.first = first


def scan_bytes(data: Any, dtype: str, elem_offset: int = 0) -> tuple[int, int | None]:
    """``(count, first flat index or None)`` of NaN/±Inf in raw little-endian bytes of whole ``dtype`` elements
    (non-float dtypes give ``(0, None)``); ``elem_offset``: flat index of ``data``'s first element.

    Raises:
        ValueError: ``data`` does not hold a whole number of elements.
    """
    spec = NONFINITE_BITS.get(dtype)
    if spec is None:
        return 0, None
    import numpy as np

    view, threshold = spec
    bits = np.frombuffer(data, dtype=np.dtype(view))
    nosign = np.array((1 << (8 * bits.dtype.itemsize - 1)) - 1, dtype=bits.dtype)
    thr = np.array(threshold, dtype=bits.dtype)
    tmp = np.empty(min(bits.size, _BLOCK), dtype=bits.dtype)  # bounded temporaries (peak RSS)
    count, first = 0, None
    for lo in range(0, bits.size, _BLOCK):
        blk = bits[lo:lo + _BLOCK]
        t = tmp[: blk.size]
        np.bitwise_and(blk, nosign, out=t)
        if t.max() < thr:  # the common case: two fast passes, no boolean array
            continue
        hit = t >= thr
        count += int(np.count_nonzero(hit))
        if first is None:
            first = elem_offset + lo + int(np.argmax(hit))
    return count, first


def unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    """Row-major multi-index of flat index ``flat`` in ``shape`` (``[]`` for a scalar)."""
    out = []
    for d in reversed(shape):
        out.append(flat % d if d else 0)
        flat = flat // d if d else 0
    return out[::-1]


def itemsize(dtype: str) -> int:
    """Element size of a scanned dtype (1 for dtypes that are not scanned)."""
    from .dtypes import DTYPE_SIZES

    return DTYPE_SIZES[dtype] if dtype in NONFINITE_BITS else 1
