"""An exported drafting step (ONNX graph, TensorRT engine) as a drafter of the acceptance loop.

:func:`step_feeds` builds the stateless step's inputs at batch 1 (I/O contract:
``docs/engines.md``; the algorithm's :class:`~specconv.format.algorithms.ExportFacts` say
whether it reads ``context_ids`` and what the ``block_ids`` rows hold) from the
:class:`StepFacts` of ``onnx_meta.json``; :class:`GraphDrafter` is the drafter surface over a
runtime's ``_run(feeds)`` (:class:`.ort_drafter.OrtDrafter`, :class:`.engine_drafter.EngineDrafter`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InvalidInputError, UsageError
from ..format.algorithms import ExportFacts, algorithm

__all__ = ["GraphDrafter", "StepFacts", "step_feeds"]


@dataclass(frozen=True)
class StepFacts:
    """The exported step's facts: ``onnx_meta.json`` keys (``block_size`` B, ``num_draft_tokens``
    K, the ``aux_hidden`` concat order, the block filler, the ``sampling_noise`` width), the
    algorithm's export facts, the longest context and the graph's I/O names."""

    algorithm: str
    export: ExportFacts
    block_size: int
    num_draft_tokens: int
    aux_layer_ids: tuple[int, ...]
    mask_token_id: int
    draft_vocab_size: int
    max_context: int
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]

    @classmethod
    def of(cls, meta: dict, io: dict, max_context: int | None = None) -> "StepFacts":
        """From an ``onnx_meta.json`` and its graph entry (``io``: ``inputs`` / ``outputs``, lists of
        ``{"name"}``); ``max_context`` overrides the graph's. Raises KeyError on a missing key."""
        return cls(algorithm=meta["algorithm"], export=algorithm(meta["algorithm"]).export,
                   block_size=int(meta["block_size"]), num_draft_tokens=int(meta["num_draft_tokens"]),
                   aux_layer_ids=tuple(meta["aux_layer_ids"]), mask_token_id=int(meta["mask_token_id"]),
                   draft_vocab_size=int(meta["draft_vocab_size"]),
                   max_context=int(max_context or meta["dynamic"]["context"]["max"]),
                   input_names=tuple(i["name"] for i in io.get("inputs", [])),
                   output_names=tuple(o["name"] for o in io.get("outputs", [])))


def step_feeds(facts: StepFacts, tokens: torch.Tensor, aux: torch.Tensor, temperature: float,
               generator: torch.Generator | None) -> dict[str, torch.Tensor]:
    """The inputs of one drafting step at batch 1 (CPU tensors).

    Args:
        tokens: LongTensor ``[T+1]``, index ``T`` the anchor. aux: ``[T, A*H]`` aux hidden states.
        temperature, generator: ``sampling_noise`` (Gumbel noise × T) when the graph takes it.

    Returns:
        ``aux_hidden`` float32 ``[1, T, A*H]``; ``ctx_position_ids`` / ``block_position_ids``
        int32; ``ctx_valid`` bool; ``block_ids`` int32 (``B`` slots, anchor first, or P-EAGLE's
        ``K − 1`` mask entries); ``context_ids`` int32 ``[1, T]`` when the step reads it;
        ``sampling_noise`` float32 ``[1, K, Vd]`` when the graph takes it.
    """
    T = int(aux.shape[0])
    feeds = {"aux_hidden": aux.detach().to("cpu", torch.float32)[None],
             "ctx_position_ids": torch.arange(T, dtype=torch.int32)[None],
             "ctx_valid": torch.ones((1, T), dtype=torch.bool)}
    if facts.export.context_ids:
        feeds["context_ids"] = tokens[1:T + 1].to(torch.int32)[None]
    S = facts.num_draft_tokens - 1 if facts.export.block_rows == "mask-depths" else facts.block_size
    feeds["block_ids"] = torch.full((1, S), facts.mask_token_id, dtype=torch.int32)
    if facts.export.block_rows == "block":
        feeds["block_ids"][0, 0] = int(tokens[T])
    feeds["block_position_ids"] = (T + torch.arange(S, dtype=torch.int32))[None]
    if "sampling_noise" in facts.input_names:
        shape = (1, facts.num_draft_tokens, facts.draft_vocab_size)
        if temperature > 0:
            u = torch.rand(shape, generator=generator).clamp_(1e-20, 1.0)
            feeds["sampling_noise"] = -torch.log(-torch.log(u)) * float(temperature)
        else:
            feeds["sampling_noise"] = torch.zeros(shape, dtype=torch.float32)
    return feeds


class GraphDrafter:
    """The drafter surface over an exported step (``algorithm``, ``num_draft_tokens``,
    ``aux_layer_ids``, ``block_size``, ``device``, ``dtype``, :meth:`propose`); a subclass sets
    :attr:`facts`, :attr:`device`, :attr:`dtype`, implements :meth:`_run`, and names itself in
    errors (``KIND``, ``CONTEXT_HINT``, ``SAMPLING_NEEDS``)."""

    KIND = "graph"
    CONTEXT_HINT = ""
    SAMPLING_NEEDS = "a graph exported with --sampling-noise and --outputs including logits"
    facts: StepFacts
    device: torch.device
    dtype: torch.dtype

    algorithm = property(lambda self: self.facts.algorithm)
    block_size = property(lambda self: self.facts.block_size)
    num_draft_tokens = property(lambda self: self.facts.num_draft_tokens)
    aux_layer_ids = property(lambda self: list(self.facts.aux_layer_ids))
    max_context = property(lambda self: self.facts.max_context)

    def _run(self, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run the step; output name → tensor with a leading batch axis."""
        raise NotImplementedError  # pragma: no cover

    @torch.no_grad()
    def propose(self, context_tokens: torch.Tensor, aux_hidden: torch.Tensor, *,
                temperature: float = 0.0, generator: torch.Generator | None = None):
        """One drafting step (contract of :meth:`specconv.validate.backend.DrafterBackend.propose`).

        Raises:
            InvalidInputError: the context is longer than :attr:`max_context` (exit 3).
            UsageError: ``temperature > 0`` without ``sampling_noise`` / ``logits``.
        """
        from ..drafters import DraftProposal

        tokens = context_tokens.reshape(-1).to("cpu", torch.long)
        aux = aux_hidden.reshape(-1, aux_hidden.shape[-1])
        if aux.shape[0] > self.max_context:
            raise InvalidInputError(f"context of {aux.shape[0]} positions exceeds the {self.KIND}'s max context "
                                    f"{self.max_context}{self.CONTEXT_HINT}", code="context_too_long")
        if temperature > 0 and ("sampling_noise" not in self.facts.input_names
                                or "logits" not in self.facts.output_names):
            raise UsageError(f"temperature > 0 needs {self.SAMPLING_NEEDS}")
        outs = self._run(step_feeds(self.facts, tokens, aux, temperature, generator))
        logits = outs["logits"][0].float() if "logits" in outs else None
        conf = outs["confidence"][0].float() if "confidence" in outs else None
        return DraftProposal(tokens=outs["draft_ids"][0].long(), logits=logits, confidence=conf)
