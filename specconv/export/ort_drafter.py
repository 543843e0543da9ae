"""ONNX Runtime as the drafter of the acceptance loop (``specconv validate --onnx``).

:class:`OrtDrafter` has the drafter surface the loop (:mod:`specconv.validate.loop`)
uses — ``propose(context_tokens, aux_hidden, temperature=, generator=)`` returning a
:class:`~specconv.drafters.DraftProposal`, plus ``num_draft_tokens``, ``aux_layer_ids``,
``algorithm``, ``block_size``, ``device``, ``dtype`` — and runs an exported
``drafter.onnx`` (stateless contract, :mod:`.wrappers`) at batch 1.

Before loading it checks the graph against its ``onnx_meta.json``: the sha256 of the
graph and weights files (a truncated or edited file is refused) and of the drafter files
it was exported from (a graph from another drafter is refused).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ..errors import InvalidInputError, UsageError

__all__ = ["OrtDrafter", "ComparingDrafter", "resolve_graph"]

_NP_DTYPES = {"float32": np.float32, "float16": np.float16}


def resolve_graph(path: str | Path, dtype: str | None = None) -> tuple[Path, Path, dict]:
    """Find the graph, its meta dir and meta for ``--onnx PATH`` (also ``build-engine``).

    Args:
        path: a ``drafter.onnx`` file, or an export dir (``onnx/``): then the graph whose
            dtype is ``dtype`` (:func:`~.onnx_dir.graph_for_dtype`: ``drafter.onnx`` of a
            float32 export, else the fp32 twin ``fp32/drafter.onnx``) is used.
        dtype: the run dtype (directory form only).

    Returns:
        ``(graph path, meta dir, meta dict)``.

    Raises:
        InvalidInputError: no graph / no ``onnx_meta.json`` / unreadable meta / a meta of
            another format version (:func:`~.onnx_dir.check_meta_format`).
    """
    from .onnx_dir import META_NAME, check_meta_format, graph_for_dtype

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


def _check_files(graph: Path, meta_dir: Path, meta: dict, drafter_dir: Path | None) -> str:
    from .onnx_dir import drafter_file_hashes
    from ..tensors import sha256_file

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
        have = drafter_file_hashes(Path(drafter_dir))
        if have != meta.get("drafter_files"):
            raise InvalidInputError(
                f"{graph} was exported from a different drafter than {drafter_dir} (the sha256 of "
                "config.json / weights differ)", code="onnx_other_drafter")
    return rel


class OrtDrafter:
    """An exported drafter graph run by ONNX Runtime (CPU), batch 1.

    Args:
        path: ``--onnx`` PATH (file or export dir; see :func:`resolve_graph`).
        drafter_dir: the Speculators dir the graph must come from (checked by sha256);
            None skips that check.
        dtype: run dtype, used to pick the graph in an export dir.

    Raises:
        InvalidInputError: missing / corrupt / foreign graph.
    """

    def __init__(self, path: str | Path, drafter_dir: str | Path | None = None, *,
                 dtype: str | None = None):
        graph, meta_dir, meta = resolve_graph(path, dtype)
        rel = _check_files(graph, meta_dir, meta, Path(drafter_dir) if drafter_dir else None)
        g = (meta.get("graphs") or {}).get(rel) or {}
        self.path = graph
        self.meta = meta
        self.graph_dtype = g.get("dtype", meta.get("dtype"))
        if self.graph_dtype not in _NP_DTYPES:
            raise InvalidInputError(f"{graph}: ONNX Runtime (CPU) cannot run a {self.graph_dtype} graph; "
                                    "use the fp32 twin (fp32/drafter.onnx)", code="onnx_dtype")
        self.algorithm = meta["algorithm"]
        self.block_size = int(meta["block_size"])
        self.num_draft_tokens = int(meta["num_draft_tokens"])
        self.aux_layer_ids = list(meta["aux_layer_ids"])
        self.mask_token_id = int(meta["mask_token_id"])
        self.draft_vocab_size = int(meta["draft_vocab_size"])
        self.max_context = int(meta["dynamic"]["context"]["max"])
        self.input_names = [i["name"] for i in g.get("inputs", [])]
        self.output_names = [o["name"] for o in g.get("outputs", [])]
        self.device = torch.device("cpu")
        self.dtype = getattr(torch, self.graph_dtype)
        from .parity import ort_session

        try:
            self.session = ort_session(graph)
        except Exception as e:  # onnxruntime raises its own exception types
            raise InvalidInputError(f"{graph}: ONNX Runtime cannot load it ({str(e)[:300]})",
                                    code="onnx_corrupt") from e

    def _inputs(self, tokens: torch.Tensor, aux: torch.Tensor, temperature: float,
                generator) -> dict[str, np.ndarray]:
        T = int(aux.shape[0])
        pos = np.arange(T, dtype=np.int32)[None]
        feeds = {"aux_hidden": aux.detach().to("cpu", torch.float32).numpy()
                 .astype(_NP_DTYPES[self.graph_dtype])[None],
                 "ctx_position_ids": pos, "ctx_valid": np.ones((1, T), dtype=bool)}
        if self.algorithm == "peagle":
            S = self.num_draft_tokens - 1
            feeds["context_ids"] = tokens[1:T + 1].numpy().astype(np.int32)[None]
            feeds["block_ids"] = np.full((1, S), self.mask_token_id, dtype=np.int32)
        else:
            S = self.block_size
            blk = np.full((1, S), self.mask_token_id, dtype=np.int32)
            blk[0, 0] = int(tokens[T])
            feeds["block_ids"] = blk
        feeds["block_position_ids"] = (T + np.arange(S, dtype=np.int32))[None]
        if "sampling_noise" in self.input_names:
            shape = (1, self.num_draft_tokens, self.draft_vocab_size)
            if temperature > 0:
                u = torch.rand(shape, generator=generator).clamp_(1e-20, 1.0)
                feeds["sampling_noise"] = (-torch.log(-torch.log(u)) * float(temperature)).numpy()
            else:
                feeds["sampling_noise"] = np.zeros(shape, dtype=np.float32)
        return feeds

    @torch.no_grad()
    def propose(self, context_tokens: torch.Tensor, aux_hidden: torch.Tensor, *,
                temperature: float = 0.0, generator=None):
        """One drafting step (same contract as :meth:`specconv.drafters.Drafter.propose`).

        Raises:
            InvalidInputError: the context is longer than the graph's ``--max-context``.
            UsageError: ``temperature > 0`` with a graph exported without
                ``sampling_noise`` / ``logits``.
        """
        from ..drafters import DraftProposal

        tokens = context_tokens.reshape(-1).to("cpu", torch.long)
        aux = aux_hidden.reshape(-1, aux_hidden.shape[-1])
        if aux.shape[0] > self.max_context:
            raise InvalidInputError(f"context of {aux.shape[0]} positions exceeds the graph's max "
                                    f"context {self.max_context} (export with a larger --max-context)",
                                    code="context_too_long")
        if temperature > 0 and ("sampling_noise" not in self.input_names
                                or "logits" not in self.output_names):
            raise UsageError("temperature > 0 needs a graph exported with --sampling-noise and "
                             "--outputs including logits")
        outs = dict(zip(self.output_names, self.session.run(None, self._inputs(tokens, aux, temperature, generator))))
        logits = torch.from_numpy(outs["logits"][0]) if "logits" in outs else None
        conf = torch.from_numpy(outs["confidence"][0]) if "confidence" in outs else None
        return DraftProposal(tokens=torch.from_numpy(outs["draft_ids"][0]).long(), logits=logits,
                             confidence=conf)


class ComparingDrafter:
    """Proposes with ``primary`` (ONNX Runtime) and compares each step with ``reference``
    (the torch drafter) on the same inputs.

    Counts: ``steps``, ``drafts`` compared, ``mismatches``, ``near_ties`` (drafts whose
    torch top-1/top-2 logit margin is below ``margin``) and ``near_tie_mismatches``.
    """

    def __init__(self, primary: OrtDrafter, reference, *, margin: float = 1e-4):
        self.primary, self.reference, self.margin = primary, reference, float(margin)
        for a in ("algorithm", "block_size", "num_draft_tokens", "aux_layer_ids", "device", "dtype"):
            setattr(self, a, getattr(primary, a))
        self.steps = self.drafts = self.mismatches = self.near_ties = self.near_tie_mismatches = 0
        self.primary_ms: list[float] = []  # the loop's draft_ms also counts the comparison

    def propose(self, context_tokens, aux_hidden, *, temperature: float = 0.0, generator=None):
        import time

        t0 = time.perf_counter()
        prop = self.primary.propose(context_tokens, aux_hidden, temperature=temperature, generator=generator)
        self.primary_ms.append((time.perf_counter() - t0) * 1e3)
        if temperature <= 0:
            ref = self.reference.propose(context_tokens.to(self.reference.device),
                                         aux_hidden.to(self.reference.device, self.reference.dtype))
            self.last_reference = ref  # the engine comparison reuses it (engine_validate.py)
            top2 = torch.topk(ref.logits.float(), 2, dim=-1).values
            tie = ((top2[:, 0] - top2[:, 1]) < self.margin).cpu()
            diff = prop.tokens.cpu() != ref.tokens.cpu()
            self.steps += 1
            self.drafts += int(diff.numel())
            self.mismatches += int(diff.sum())
            self.near_ties += int(tie.sum())
            self.near_tie_mismatches += int((diff & tie).sum())
        return prop

    def counts(self) -> dict:
        return {"steps": self.steps, "drafts": self.drafts, "mismatches": self.mismatches,
                "near_ties": self.near_ties, "near_tie_mismatches": self.near_tie_mismatches,
                "near_tie_margin": self.margin,
                "primary_draft_ms_median": float(np.median(self.primary_ms)) if self.primary_ms else None}
