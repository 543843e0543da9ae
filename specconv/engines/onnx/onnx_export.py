"""ONNX export of a drafting step: ``torch.onnx.export(dynamo=True)`` + "prepare for TensorRT"
(docs/engines.md, "Prepare for TensorRT"); external data, opset 23.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections import Counter
from pathlib import Path

import torch

from ...errors import InvalidInputError

log = logging.getLogger("specconv.export")

__all__ = ["export_graph", "prepare_for_tensorrt", "check_graph", "op_census", "ExportSettings"]

_FORBIDDEN_OPS = ("CumProd",)
_CONTROL_FLOW = ("If", "Loop", "Scan")


class ExportSettings:
    """Static settings of one export (the CLI flags; ``max_*``: the dynamic axes' upper bounds)."""

    def __init__(self, *, opset: int = 23, max_batch: int = 8, max_context: int = 4096,
                 outputs=("ids", "logprobs"), top_k: int = 4, sampling_noise: bool = False):
        self.opset = int(opset)
        self.max_batch = int(max_batch)
        self.max_context = int(max_context)
        self.outputs = tuple(outputs)
        self.top_k = int(top_k)
        self.sampling_noise = bool(sampling_noise)


def _dynamic_shapes(names: list[str], max_batch: int, max_context: int):
    from torch.export import Dim

    from ...drafters.step import CONTEXT_INPUTS

    batch = Dim("batch", min=1, max=max_batch)
    ctx = Dim("context", min=1, max=max_context)
    return (tuple({0: batch, 1: ctx} if n in CONTEXT_INPUTS else {0: batch} for n in names),)


def export_graph(wrapper, example: tuple[torch.Tensor, ...], out_path: Path,
                 settings: ExportSettings, workdir: Path) -> dict:
    """Export ``wrapper`` (``onnx_attention=True``) to ``out_path`` (+ ``.data``) and prepare it for
    TensorRT; ``example``: batch ≥ 2 and context ≥ 2 so no axis specialises. Returns
    :func:`prepare_for_tensorrt`'s dict plus ``census`` (``{op: count}``).

    Raises:
        InvalidInputError: the exporter failed, or the graph breaks a TensorRT rule.
    """
    raw = workdir / f"raw-{out_path.parent.name}-{out_path.name}"
    try:
        torch.onnx.export(
            wrapper, example, str(raw), dynamo=True, opset_version=settings.opset,
            dynamic_shapes=_dynamic_shapes(wrapper.input_names, settings.max_batch,
                                           settings.max_context),
            input_names=list(wrapper.input_names), output_names=list(wrapper.output_names),
            external_data=True, optimize=True, verbose=False, report=False)
    except Exception as e:  # the exporter raises many types; name the step
        raise InvalidInputError(f"torch.onnx.export failed: {type(e).__name__}: {str(e)[:500]}",
                                code="onnx_export_failed") from e
    info = prepare_for_tensorrt(raw, out_path)
    info["census"] = op_census(out_path)
    return info


def prepare_for_tensorrt(src: Path, dst: Path) -> dict:
    """Constant-fold, deduplicate identical weights, check the TensorRT rules, write ``dst`` (weights
    in ``dst.name + ".data"``, standard ONNX) and :func:`check_graph` the written file.

    Returns:
        ``{"attention_nodes": n, "folded": True, "checked": "..."}``.

    Raises:
        InvalidInputError: ``If``/``Loop``/``Scan`` holding an ``Attention``, a
            ``CumProd`` node, a node outside the default ONNX domain, or a graph the
            checker / strict shape inference rejects.
    """
    import onnx_ir as ir
    import onnxscript.optimizer

    model = ir.load(str(src))
    onnxscript.optimizer.fold_constants(model)
    # a tied verifier's embedding reaches the graph twice (Gather + LM head): keep one
    _dedupe_initializers(model)
    onnxscript.optimizer.remove_unused_nodes(model)
    _check_rules(model)
    n_attn = sum(1 for node in model.graph.all_nodes()
                 if node.op_type == "Attention" and node.domain in ("", "ai.onnx"))
    ir.save(model, str(dst), external_data=dst.name + ".data")
    del model
    check_graph(dst)
    return {"attention_nodes": n_attn, "folded": True,
            "checked": "onnx.checker full check and strict shape inference on the written file"}


def _dedupe_initializers(model, min_size: int = 1024) -> int:
    """Point every use of a weight to one initializer per identical (dtype, shape, bytes)."""
    import numpy as np

    seen: dict[tuple, object] = {}
    dropped = 0
    for name, value in list(model.graph.initializers.items()):
        cv = value.const_value
        if cv is None or cv.size < min_size or value.is_graph_input():
            continue
        digest = hashlib.sha256(np.ascontiguousarray(cv.numpy()).tobytes()).hexdigest()
        key = (str(cv.dtype), tuple(cv.shape), digest)
        keep = seen.setdefault(key, value)
        if keep is not value:
            value.replace_all_uses_with(keep)
            model.graph.initializers.pop(name)
            dropped += 1
    return dropped


def _subgraph_ops(node) -> set[str]:
    ops: set[str] = set()
    for attr in node.attributes.values():
        graphs = [attr.value] if attr.type.name == "GRAPH" else list(attr.value) if attr.type.name == "GRAPHS" else []
        for g in graphs:
            for n in g.all_nodes() if hasattr(g, "all_nodes") else g:
                ops.add(n.op_type)
    return ops


def _check_rules(model) -> None:
    for node in model.graph.all_nodes():
        if node.domain not in ("", "ai.onnx"):
            raise InvalidInputError(f"exported graph has a {node.domain}::{node.op_type} node; only "
                                    "default-domain ONNX ops are allowed", code="onnx_rule")
        if node.op_type in _FORBIDDEN_OPS:
            raise InvalidInputError(f"exported graph has a {node.op_type} node (TensorRT's ONNX "
                                    "parser stops at opset 25)", code="onnx_rule")
        if node.op_type in _CONTROL_FLOW and "Attention" in _subgraph_ops(node):
            raise InvalidInputError(f"exported graph has Attention inside {node.op_type} "
                                    "(TensorRT cannot build it)", code="onnx_rule")


def check_graph(path: Path) -> None:
    """``onnx.checker`` (full check) and strict shape inference, both on the file path.

    Raises:
        InvalidInputError: the checker or shape inference rejects the file.
    """
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
        fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=path.parent)
        os.close(fd)
        try:
            onnx.shape_inference.infer_shapes_path(str(path), tmp, strict_mode=True)
        finally:
            os.unlink(tmp)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise InvalidInputError(f"{path}: ONNX check failed: {e}", code="onnx_check") from e


def op_census(path: Path) -> dict[str, int]:
    """``{op_type: count}`` of the main graph (weights not loaded)."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    return dict(sorted(Counter(n.op_type for n in m.graph.node).items()))


def io_spec(path: Path) -> dict:
    """Inputs/outputs of a graph: name, dtype, shape (dim names for dynamic axes)."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)

    def one(v):
        tt = v.type.tensor_type
        return {"name": v.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name
                if tt.elem_type != onnx.TensorProto.BFLOAT16 else "bfloat16",
                "shape": [d.dim_param or d.dim_value for d in tt.shape.dim]}

    return {"opset": max(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")),
            "ir_version": m.ir_version, "inputs": [one(v) for v in m.graph.input],
            "outputs": [one(v) for v in m.graph.output]}
