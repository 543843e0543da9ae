"""One drafting step over the export I/O contract: its inputs, shape and result (the inputs:
``docs/engines.md``, "The graph: one drafting step, stateless").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from ..format.algorithms import algorithm
from .layers import sample_rows

__all__ = ["CONTEXT_INPUTS", "StepShape", "StepBatch", "StepOutput", "Pick", "request_inputs",
           "batch_inputs", "noise_pick", "sample_pick"]

#: inputs whose axis 1 is the (dynamic, left-padded) context
CONTEXT_INPUTS = ("aux_hidden", "context_ids", "ctx_position_ids", "ctx_valid")

#: ``(logits, slot)`` → draft-vocab ids: ``logits [B, N, Vd]`` with ``slot`` None (every
#: draft at once), or ``[B, Vd]`` with ``slot`` the draft index (a sequential stage)
Pick = Callable[[torch.Tensor, "int | None"], torch.Tensor]


@dataclass(frozen=True)
class StepShape:
    """The static shape of one drafting step: ``block_size`` ``B`` (P-EAGLE: ``K``), ``N`` drafts,
    ``aux_width`` ``A·Ht``, ``draft_slots`` (empty for P-EAGLE), ``dtype`` of ``aux_hidden``."""

    algorithm: str
    block_size: int
    num_draft_tokens: int
    mask_token_id: int
    vocab_size: int
    draft_vocab_size: int
    aux_width: int
    draft_slots: tuple[int, ...] = ()
    dtype: torch.dtype = torch.float32

    @property
    def anchor_in_block(self) -> bool:
        """``block_ids[:, 0]`` holds the anchor (bonus) token (block drafters)."""
        return algorithm(self.algorithm).export.block_rows == "block"

    @property
    def block_rows(self) -> int:
        """``S``: the block slots, or P-EAGLE's ``K - 1`` mask entries."""
        return self.block_size if self.anchor_in_block else self.num_draft_tokens - 1

    def input_names(self, sampling_noise: bool = False) -> list[str]:
        """Input names in positional order (``sampling_noise`` last when taken)."""
        return list(algorithm(self.algorithm).export.inputs) + (["sampling_noise"] if sampling_noise else [])

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any], dtype: torch.dtype = torch.float32) -> StepShape:
        """The shape an ``onnx_meta.json`` records (``dtype``: the graph's float dtype)."""
        return cls(algorithm=meta["algorithm"], block_size=int(meta["block_size"]),
                   num_draft_tokens=int(meta["num_draft_tokens"]), mask_token_id=int(meta["mask_token_id"]),
                   vocab_size=int(meta["vocab_size"]), draft_vocab_size=int(meta["draft_vocab_size"]),
                   aux_width=int(meta["aux_width"]), draft_slots=tuple(meta.get("draft_slots") or ()),
                   dtype=dtype)


@dataclass
class StepBatch:
    """The step's inputs by name (:data:`CONTEXT_INPUTS` on axis 1 are left-padded)."""

    aux_hidden: torch.Tensor
    block_ids: torch.Tensor
    ctx_position_ids: torch.Tensor
    block_position_ids: torch.Tensor
    ctx_valid: torch.Tensor
    context_ids: torch.Tensor | None = None

    @classmethod
    def of(cls, names: list[str], tensors: tuple[torch.Tensor, ...]) -> StepBatch:
        """From positional inputs in ``names`` order (extra names, e.g. ``sampling_noise``, ignored)."""
        known = {f.name for f in fields(cls)}
        return cls(**{n: t for n, t in zip(names, tensors, strict=True) if n in known})

    def context_from(self, start: int) -> StepBatch:
        """The context axis from column ``start`` on (views; the block inputs unchanged)."""
        if start == 0:
            return self
        cut = {n: getattr(self, n)[:, start:] for n in CONTEXT_INPUTS if getattr(self, n) is not None}
        return StepBatch(**{**self.__dict__, **cut})


@dataclass
class StepOutput:
    """What one step computes (``R`` rows reached the LM head): ``positions`` int ``[B, R]``, ``hidden``
    ``[B, R, H]``, ``slot_logits`` ``[B, R, Vd]``; drafts from rows ``first_row..+N-1``: ``draft_logits``
    ``[B, N, Vd]``, ``draft_ids`` ``[B, N]``, ``confidence_logits`` fp32 ``[B, N]`` (DSpark) or None."""

    positions: torch.Tensor
    hidden: torch.Tensor
    slot_logits: torch.Tensor
    first_row: int
    draft_logits: torch.Tensor | None = None
    draft_ids: torch.Tensor | None = None
    confidence_logits: torch.Tensor | None = None


def request_inputs(shape: StepShape, context_tokens: torch.Tensor, aux_hidden: torch.Tensor) -> StepBatch:
    """The step's inputs for one request (batch 1, no padding, ``aux_hidden [T, A·Ht]`` not copied;
    ``context_tokens`` int ``[T+1]``, token ``T`` the anchor)."""
    T, dev = int(aux_hidden.shape[0]), aux_hidden.device
    S = shape.block_rows
    block = torch.full((1, S), shape.mask_token_id, dtype=torch.int32, device=dev)
    if shape.anchor_in_block:
        block[0, 0] = context_tokens[T]
    pos = torch.arange(T, dtype=torch.int32, device=dev)[None]
    ids = context_tokens[1:T + 1].to(torch.int32)[None] if algorithm(shape.algorithm).export.context_ids else None
    return StepBatch(aux_hidden=aux_hidden[None], block_ids=block, ctx_position_ids=pos,
                     block_position_ids=T + torch.arange(S, dtype=torch.int32, device=dev)[None],
                     ctx_valid=torch.ones(1, T, dtype=torch.bool, device=dev), context_ids=ids)


def batch_inputs(shape: StepShape, requests: list[tuple[torch.Tensor, torch.Tensor]], *,
                 sampling_noise: bool = False, pad_to: int | None = None) -> tuple[torch.Tensor, ...]:
    """Inputs (:meth:`StepShape.input_names` order) of ``[(context_tokens [T+1], aux_hidden [T, A·Ht])]``,
    left-padded with 0 / False to ``pad_to`` (default: the longest); ``sampling_noise``: append zeros."""
    rows = [request_inputs(shape, tok.reshape(-1), aux.to(shape.dtype)) for tok, aux in requests]
    C = pad_to or max(int(aux.shape[0]) for _, aux in requests)
    out = []
    for name in shape.input_names():
        parts = [getattr(r, name) for r in rows]
        if name in CONTEXT_INPUTS:
            parts = [torch.cat([p.new_zeros((1, C - p.shape[1], *p.shape[2:])), p], dim=1) for p in parts]
        out.append(torch.cat(parts))
    if sampling_noise:
        out.append(torch.zeros(len(rows), shape.num_draft_tokens, shape.draft_vocab_size))
    return tuple(out)


def noise_pick(noise: torch.Tensor | None) -> Pick:
    """The export's pick: ArgMax of the fp32 logits plus ``sampling_noise [B, N, Vd]``
    (Gumbel-max: ``T · Gumbel(0, 1)`` noise samples at temperature ``T``; None = greedy)."""

    def pick(logits: torch.Tensor, slot: int | None) -> torch.Tensor:
        scores = logits.to(torch.float32)
        if noise is not None:
            scores = scores + (noise if slot is None else noise[:, slot])
        return torch.argmax(scores, dim=-1)

    return pick


def sample_pick(temperature: float, generator: torch.Generator | None) -> Pick:
    """The reference pick (:func:`~specconv.drafters.layers.sample_rows`)."""

    def pick(logits: torch.Tensor, slot: int | None) -> torch.Tensor:
        flat = logits.reshape(-1, logits.shape[-1])
        return sample_rows(flat, temperature, generator).reshape(logits.shape[:-1])

    return pick
