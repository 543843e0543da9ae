"""ONNX Runtime as a drafter runtime (``specconv validate --onnx``: :func:`load`, :func:`preflight`):
an exported ``drafter.onnx`` at batch 1, checked against its ``onnx_meta.json`` (sha256 of the graph
and of the drafter files it came from) before it loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ...errors import InvalidInputError
from .graph_drafter import GraphDrafter

if TYPE_CHECKING:
    from ...verifier import Verifier

__all__ = ["OrtDrafter", "check_graph", "load", "preflight", "resolve_graph"]

_NP_DTYPES = {"float32": np.float32, "float16": np.float16}


def resolve_graph(path: str | Path, dtype: str | None = None) -> tuple[Path, Path, dict]:
    """``(graph path, meta dir, meta dict)`` for ``--onnx PATH`` (also ``build-engine``): a graph file,
    or an export dir's graph for ``dtype`` (:func:`~.export.graph_for_dtype`).

    Raises:
        InvalidInputError: no graph / no ``onnx_meta.json`` / unreadable meta / a meta of
            another format version (:func:`~.export.check_meta_format`).
    """
    from .export import META_NAME, check_meta_format, graph_for_dtype

    p = Path(path)
    meta_dir = next((m for m in ((p,) if p.is_dir() else (p.parent, p.parent.parent))
                     if (m / META_NAME).is_file()), None)
    if meta_dir is None:
        raise InvalidInputError(f"--onnx {path}: no onnx_meta.json next to the graph (export it with "
                                "specconv export onnx)", code="onnx_meta")
    try:
        meta = json.loads((meta_dir / META_NAME).read_text())
    except ValueError as e:
        raise InvalidInputError(f"{meta_dir / META_NAME}: invalid JSON ({e})", code="onnx_meta") from e
    check_meta_format(meta, meta_dir / META_NAME)
    graph = p / graph_for_dtype(meta, dtype) if p.is_dir() else p
    if not graph.is_file():
        raise InvalidInputError(f"--onnx {path}: no ONNX graph at {graph}", code="onnx_not_found")
    return graph, meta_dir, meta


def check_graph(graph: Path, meta_dir: Path, meta: dict, drafter_dir: Path | None) -> str:
    """The graph and its data file have the sha256 of ``onnx_meta.json`` and come from
    ``drafter_dir`` (None: not checked). Returns the graph's path in the meta dir.

    Raises:
        InvalidInputError: unlisted, truncated / modified, or from another drafter (exit 3).
    """
    from ...tensors import sha256_file
    from ..exportdir import check_drafter_files

    rel = graph.relative_to(meta_dir).as_posix()
    files = meta.get("files") or {}
    for name in (rel, rel + ".data"):
        want = files.get(name)
        if want is None:
            raise InvalidInputError(f"{meta_dir / name}: not listed in onnx_meta.json", code="onnx_meta")
        f = meta_dir / name
        if not f.is_file() or sha256_file(f) != want:
            raise InvalidInputError(f"{f}: sha256 differs from onnx_meta.json (truncated or modified "
                                    "file); export again", code="onnx_corrupt")
    if drafter_dir is not None:
        check_drafter_files(meta.get("drafter_files"), drafter_dir, graph, built="exported", code="onnx_other_drafter")
    return rel


def preflight(path: str | Path, drafter_dir: str | Path, dtype: str | None = None) -> None:
    """Every ``--onnx`` refusal before a model is loaded (:func:`resolve_graph`, :func:`check_graph`).

    Raises:
        MissingExtraError: the ``onnx`` extra is not installed (exit 2).
        InvalidInputError: missing / old-format / corrupt / foreign graph (exit 3).
    """
    from ...extras import require_extra

    require_extra("onnx", feature="specconv validate --onnx")
    graph, meta_dir, meta = resolve_graph(path, dtype)
    check_graph(graph, meta_dir, meta, Path(drafter_dir))


def load(drafter_dir: Path, verifier: Verifier, *, path: str | Path, dtype: str, device: str,
         config: object = None) -> OrtDrafter:
    """The registry's loader: the graph at ``path`` (checked against ``drafter_dir``), run on
    the CPU whatever ``device``; the verifier is not needed (its tensors are in the graph)."""
    return OrtDrafter(path, drafter_dir, dtype=dtype)


class OrtDrafter(GraphDrafter):
    """An exported drafter graph (``--onnx`` PATH, :func:`resolve_graph`) run by ONNX Runtime (CPU),
    batch 1; ``drafter_dir``: the dir it must come from (None: not checked).

    Raises:
        InvalidInputError: missing / corrupt / foreign graph.
    """

    CONTEXT_HINT = " (export with a larger --max-context)"

    def __init__(self, path: str | Path, drafter_dir: str | Path | None = None, *,
                 dtype: str | None = None):
        graph, meta_dir, meta = resolve_graph(path, dtype)
        rel = check_graph(graph, meta_dir, meta, Path(drafter_dir) if drafter_dir else None)
        g = (meta.get("graphs") or {}).get(rel) or {}
        self.path = graph
        self.meta = meta
        graph_dtype = g.get("dtype", meta.get("dtype"))
        if graph_dtype not in _NP_DTYPES:
            raise InvalidInputError(f"{graph}: ONNX Runtime (CPU) cannot run a {graph_dtype} graph; "
                                    "use the fp32 twin (fp32/drafter.onnx)", code="onnx_dtype")
        self.graph_dtype: str = graph_dtype
        self._read_facts(meta, g)
        self.device = torch.device("cpu")
        self.dtype = getattr(torch, self.graph_dtype)
        from .parity import ort_session

        try:
            self.session = ort_session(graph)
        except Exception as e:  # onnxruntime raises its own exception types
            raise InvalidInputError(f"{graph}: ONNX Runtime cannot load it ({str(e)[:300]})",
                                    code="onnx_corrupt") from e

    def describe(self) -> dict:
        """What ran (``report["onnx"]``): the graph file and its dtype."""
        return {"graph": str(self.path), "graph_dtype": self.graph_dtype}

    def _run(self, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        arrays = {n: t.numpy() for n, t in feeds.items()}
        arrays["aux_hidden"] = arrays["aux_hidden"].astype(_NP_DTYPES[self.graph_dtype])
        return {n: torch.from_numpy(v) for n, v in zip(self.output_names, self.session.run(None, arrays), strict=True)}
