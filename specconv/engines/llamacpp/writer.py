"""Write a :class:`~specconv.engines.llamacpp.layout.GgufPlan` as one GGUF file (PyPI ``gguf``'s
``GGUFWriter``), byte for byte as llama.cpp's converter (docs/llamacpp.md, "The tokenizer and the tensor bytes").
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ...tensors import TensorStore
    from ...verifier import Verifier
    from .layout import GgufPlan, PlannedTensor

__all__ = ["write_gguf"]

#: GGML type of the 2-D weights → ``general.file_type`` (``gguf.LlamaFileType``).
_FILE_TYPES = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16"}


def _add_key(writer: Any, key: str, value: Any, kind: str) -> None:
    add = {"u32": writer.add_uint32, "f32": writer.add_float32, "bool": writer.add_bool,
           "str": writer.add_string, "array": writer.add_array}[kind]
    add(key, value)


def _tensor_data(t: PlannedTensor, plan: GgufPlan, store: TensorStore, verifier: Verifier):
    """The tensor as the converter writes it: a float32 array through ``gguf.quants.quantize``."""
    import torch

    import gguf

    from ...errors import InvalidInputError

    if t.ggml_type == "I64":
        return plan.d2t
    if t.source.startswith("verifier:"):
        role = t.source.split(":", 1)[1]
        name = verifier.find_tensor(role)
        if name is None:
            raise InvalidInputError(f"the verifier has no {role} tensor for {t.gguf_name}", code="gguf_missing_tensor")
        tensor = verifier.read_tensor(name)
    else:
        tensor = store.read_tensor(t.source)
    if tuple(tensor.shape) != tuple(t.shape):
        raise InvalidInputError(f"{t.source}: shape {list(tensor.shape)}, expected {list(t.shape)} for {t.gguf_name}",
                                code="gguf_tensor_shape")
    data = tensor.to(torch.float32).contiguous().numpy()
    return gguf.quants.quantize(data, gguf.GGMLQuantizationType[t.ggml_type])


def write_gguf(plan: GgufPlan, path: Path, *, store: TensorStore, verifier: Verifier, name: str,
               vocab_size: int) -> None:
    """Write ``plan`` to ``path`` (``name``: ``general.name``; ``vocab_size``: the draft config's).

    Raises:
        UnsupportedFormatError: ``gguf_tokenizer`` (:mod:`specconv.engines.llamacpp.vocab`).
        InvalidInputError: a tensor's shape differs from the plan's.
        OSError: the file cannot be written.
    """
    import gguf

    from .vocab import add_tokenizer

    writer = gguf.GGUFWriter(str(path), plan.arch)
    try:
        writer.add_type(gguf.GGUFType.MODEL)
        writer.add_name(name)
        for key, value, kind in plan.keys:
            _add_key(writer, key, value, kind)
        writer.add_file_type(int(gguf.LlamaFileType[_FILE_TYPES[plan.file_type]]))
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        arch = verifier.architectures[0] if verifier.architectures else None
        add_tokenizer(writer, Path(verifier.local_dir), arch, vocab_size)
        for t in plan.tensors:
            writer.add_tensor(t.gguf_name, _tensor_data(t, plan, store, verifier),
                              raw_dtype=gguf.GGMLQuantizationType[t.ggml_type])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
