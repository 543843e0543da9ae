"""Lazy checkpoint readers and a streaming, sharded safetensors writer (format facts: docs/tensors.md)."""

from __future__ import annotations

from .dtypes import DTYPE_SIZES, cast_bytes, cast_tensor, parse_size, safetensors_dtype, tensor_to_bytes, torch_dtype
from .header import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME, TensorInfo
from .store import TensorStore, open_store, torch_load_error_detail
from .write import COPY_CHUNK_SIZE, KERNEL_COPY_CHUNK, OutTensor, sha256_file, write_safetensors

__all__ = [
    "DTYPE_SIZES", "SAFE_WEIGHTS_NAME", "SAFE_WEIGHTS_INDEX_NAME", "WEIGHTS_NAME", "WEIGHTS_INDEX_NAME",
    "COPY_CHUNK_SIZE", "KERNEL_COPY_CHUNK", "TensorInfo", "TensorStore", "open_store", "OutTensor",
    "write_safetensors", "cast_bytes", "cast_tensor", "tensor_to_bytes", "torch_dtype", "safetensors_dtype",
    "parse_size", "sha256_file", "torch_load_error_detail",
]
