"""An exported drafting step (ONNX graph, TensorRT engine) as a drafter of the acceptance loop: the
step's facts, its stateless inputs at batch 1 (docs/engines.md) and the drafter surface over a
runtime's ``_run(feeds)``.
"""

from __future__ import annotations

import torch

from ...errors import InvalidInputError, UsageError
from ...format.algorithms import algorithm

__all__ = ["GraphDrafter"]


class GraphDrafter:
    """The drafter surface over an exported step; a subclass calls :meth:`_read_facts`, sets ``device``
    / ``dtype``, implements :meth:`_run` and names itself in errors (``KIND``, ``CONTEXT_HINT``, ``SAMPLING_NEEDS``)."""

    KIND = "graph"
    CONTEXT_HINT = ""
    SAMPLING_NEEDS = "a graph exported with --sampling-noise and --outputs including logits"
    device: torch.device
    dtype: torch.dtype

    def _read_facts(self, meta: dict, io: dict, max_context: int | None = None) -> None:
        """The step's facts from an ``onnx_meta.json`` and its graph entry (``io``: ``inputs`` /
        ``outputs``, lists of ``{"name"}``); ``max_context`` overrides the graph's bound.

        Raises:
            KeyError: a key is missing. UnsupportedFormatError: an unknown algorithm.
        """
        self.algorithm, self.export = meta["algorithm"], algorithm(meta["algorithm"]).export
        self.block_size, self.num_draft_tokens = int(meta["block_size"]), int(meta["num_draft_tokens"])
        self.aux_layer_ids = list(meta["aux_layer_ids"])
        self.mask_token_id, self.draft_vocab_size = int(meta["mask_token_id"]), int(meta["draft_vocab_size"])
        self.max_context = int(max_context or meta["dynamic"]["context"]["max"])
        self.input_names = [i["name"] for i in io.get("inputs", [])]
        self.output_names = [o["name"] for o in io.get("outputs", [])]

    def _run(self, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run the step; output name → tensor with a leading batch axis."""
        raise NotImplementedError  # pragma: no cover

    def feeds(self, tokens: torch.Tensor, aux: torch.Tensor, temperature: float,
              generator: torch.Generator | None) -> dict[str, torch.Tensor]:
        """The inputs of one drafting step at batch 1 (CPU tensors).

        Args:
            tokens: LongTensor ``[T+1]``, index ``T`` the anchor. aux: ``[T, A*H]`` aux hidden states.
            temperature, generator: ``sampling_noise`` (Gumbel noise × T) when the graph takes it.

        Returns:
            ``aux_hidden`` float32 ``[1, T, A*H]``; ``ctx_position_ids`` / ``block_position_ids``
            int32; ``ctx_valid`` bool; ``block_ids`` int32 (``B`` slots, anchor first, or
            P-EAGLE's ``K − 1`` mask entries); ``context_ids`` int32 ``[1, T]`` when the step
            reads it; ``sampling_noise`` float32 ``[1, K, Vd]`` when the graph takes it.
        """
        T = int(aux.shape[0])
        feeds = {"aux_hidden": aux.detach().to("cpu", torch.float32)[None],
                 "ctx_position_ids": torch.arange(T, dtype=torch.int32)[None],
                 "ctx_valid": torch.ones((1, T), dtype=torch.bool)}
        if self.export.context_ids:
            feeds["context_ids"] = tokens[1:T + 1].to(torch.int32)[None]
        S = self.num_draft_tokens - 1 if self.export.block_rows == "mask-depths" else self.block_size
        feeds["block_ids"] = torch.full((1, S), self.mask_token_id, dtype=torch.int32)
        if self.export.block_rows == "block":
            feeds["block_ids"][0, 0] = int(tokens[T])
        feeds["block_position_ids"] = (T + torch.arange(S, dtype=torch.int32))[None]
        if "sampling_noise" in self.input_names:
            shape = (1, self.num_draft_tokens, self.draft_vocab_size)
            u = torch.rand(shape, generator=generator).clamp_(1e-20, 1.0) if temperature > 0 else None
            feeds["sampling_noise"] = (-torch.log(-torch.log(u)) * float(temperature) if u is not None
                                       else torch.zeros(shape, dtype=torch.float32))
        return feeds

    @torch.no_grad()
    def propose(self, context_tokens: torch.Tensor, aux_hidden: torch.Tensor, *,
                temperature: float = 0.0, generator: torch.Generator | None = None):
        """One drafting step (contract of :meth:`specconv.validate.backend.DrafterBackend.propose`).

        Raises:
            InvalidInputError: the context is longer than ``max_context`` (exit 3).
            UsageError: ``temperature > 0`` without ``sampling_noise`` / ``logits``.
        """
        from ...drafters import DraftProposal

        tokens = context_tokens.reshape(-1).to("cpu", torch.long)
        aux = aux_hidden.reshape(-1, aux_hidden.shape[-1])
        if aux.shape[0] > self.max_context:
            raise InvalidInputError(f"context of {aux.shape[0]} positions exceeds the {self.KIND}'s max context "
                                    f"{self.max_context}{self.CONTEXT_HINT}", code="context_too_long")
        if temperature > 0 and ("sampling_noise" not in self.input_names or "logits" not in self.output_names):
            raise UsageError(f"temperature > 0 needs {self.SAMPLING_NEEDS}")
        outs = self._run(self.feeds(tokens, aux, temperature, generator))
        logits = outs["logits"][0].float() if "logits" in outs else None
        conf = outs["confidence"][0].float() if "confidence" in outs else None
        return DraftProposal(tokens=outs["draft_ids"][0].long(), logits=logits, confidence=conf)
