"""The one place where the export code touches the reference drafters' API.

:func:`load_reference` loads a Speculators dir with :func:`specconv.drafters.load_drafter`;
:func:`parts_of` reads the weights and settings one drafting step needs from a loaded
drafter into a :class:`DrafterParts`. The export wrappers (:mod:`.wrappers`) only see
``DrafterParts``, so a change of the drafters' attributes or config type is absorbed
here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import UnsupportedFormatError

__all__ = ["DrafterParts", "load_reference", "parts_of"]


@dataclass
class DrafterParts:
    """Everything one drafting step reads (modules are the drafter's own, shared).

    Attributes:
        algorithm: ``peagle`` | ``dflash`` | ``dspark``.
        block_size: DFlash/DSpark ``B`` (block slots); P-EAGLE ``K`` (depths).
        num_draft_tokens: drafts per step ``N``.
        draft_slots: block rows the drafts come from (DFlash/DSpark), in order.
        mask_token_id, vocab_size (``Vt``), draft_vocab_size (``Vd``), hidden_size,
        aux_width (``A·Ht``), aux_layer_ids.
        embed, fc, hidden_norm, norm, lm_head, layers, rotary: the drafter's modules.
        draft_to_target: int64 ``[Vd]`` target id of each draft id, or None (identity).
        swa: per layer, the sliding window (None = full attention).
        non_causal_swa: DFlash ``sliding_window_non_causal``.
        tied_head: the LM head weight *is* the embedding (tied verifier): the graph
            stores it once.
        extra: algorithm-specific pieces (P-EAGLE: ``mask_hidden``, ``prep_fc``,
            ``norm_before_residual``; DSpark: ``markov_w1``, ``markov_bias``,
            ``confidence_proj``, ``confidence_with_markov``).
    """

    algorithm: str
    block_size: int
    num_draft_tokens: int
    draft_slots: list[int]
    mask_token_id: int
    vocab_size: int
    draft_vocab_size: int
    hidden_size: int
    aux_width: int
    aux_layer_ids: list[int]
    embed: torch.Tensor
    fc: Any
    hidden_norm: Any
    norm: Any
    lm_head: Any
    layers: Any
    rotary: Any
    draft_to_target: torch.Tensor | None
    swa: list[int | None]
    non_causal_swa: bool = False
    tied_head: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def load_reference(speculators_dir: str | Path, verifier_dir: str | Path | None,
                   dtype: torch.dtype = torch.float32):
    """Load the reference drafter (CPU, eval mode).

    Raises:
        InvalidInputError / UnsupportedFormatError: as :func:`specconv.drafters.load_drafter`.
    """
    from ..drafters import load_drafter

    return load_drafter(speculators_dir, verifier_dir, dtype=dtype, device="cpu")


def parts_of(drafter) -> DrafterParts:
    """Collect the modules and settings of a loaded reference drafter.

    Raises:
        UnsupportedFormatError: a P-EAGLE drafter with one depth (no mask entries; the
            static block input would be empty).
    """
    spec = drafter.spec
    n_layers = len(drafter.layers)
    swa = [spec.sliding_window if spec.is_swa(i) else None for i in range(n_layers)]
    vocab = drafter.vocab
    lm_head = drafter.lm_head
    # a tied verifier's embedding doubles as the LM head: one weight in the graph
    emb, w = drafter.embed_tokens, lm_head.weight
    tied = lm_head.bias is None and w.shape == emb.shape and (
        w.data_ptr() == emb.data_ptr() or bool(torch.equal(w, emb)))  # a dtype cast un-shares them
    common = dict(tied_head=tied,
        algorithm=drafter.algorithm, block_size=int(drafter.block_size),
        num_draft_tokens=int(drafter.num_draft_tokens), mask_token_id=int(drafter.mask_token_id),
        vocab_size=int(drafter.vocab_size), draft_vocab_size=int(drafter.draft_vocab_size),
        hidden_size=int(drafter.hidden_size),
        aux_width=len(drafter.aux_layer_ids) * int(drafter.aux_hidden_size),
        aux_layer_ids=list(drafter.aux_layer_ids), embed=drafter.embed_tokens, fc=drafter.fc,
        hidden_norm=drafter.hidden_norm, norm=drafter.norm, lm_head=lm_head,
        layers=drafter.layers, rotary=drafter.rotary,
        draft_to_target=None if vocab.identity else vocab.draft_to_target, swa=swa)
    if drafter.algorithm == "peagle":
        if drafter.num_draft_tokens < 2:
            raise UnsupportedFormatError(
                f"{drafter.source}: P-EAGLE with speculative_tokens 1 has no mask entries; "
                "the export needs at least 2 depths", format_id="peagle-k1")
        return DrafterParts(draft_slots=[], extra={
            "mask_hidden": drafter.mask_hidden, "prep_fc": drafter.prep_fc,
            "norm_before_residual": bool(drafter.norm_before_residual)}, **common)
    slots = [int(s) for s in drafter.draft_slot_indices(torch.device("cpu"))]
    extra: dict[str, Any] = {}
    if drafter.algorithm == "dspark":
        extra = {"markov_w1": drafter.markov_w1,
                 "markov_bias": drafter._markov_bias if drafter.markov_w1 is not None else None,
                 "confidence_proj": drafter.confidence_proj,
                 "confidence_with_markov": bool(drafter.confidence_with_markov)}
    return DrafterParts(draft_slots=slots, non_causal_swa=bool(drafter.sliding_window_non_causal),
                        extra=extra, **common)
