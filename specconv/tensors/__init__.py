"""Lazy checkpoint readers and a streaming, sharded safetensors writer.

A conversion is mostly a byte copy plus a config rewrite, so this package keeps the
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
