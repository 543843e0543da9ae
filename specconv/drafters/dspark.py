"""Reference DSpark drafter (``speculators_model_type: "dspark"``).

Speculators 0.9.0 ``src/speculators/models/dspark/{core,model_definitions}.py`` (vLLM
``vllm/model_executor/models/qwen3_dspark.py``): the DFlash backbone
(:mod:`specconv.drafters.dflash`) gives ``out_k = norm(h)`` and base logits ``z_k`` for the ``B``
slots; then a **sequential** stage over the ``N`` draft slots ``s`` (slot ``k = s`` when
``sample_from_anchor``, else ``k = s + 1``; ``N = B`` or ``B - 1``):

* ``prev_0`` = the anchor (bonus) token; ``prev_{s+1}`` = the token picked at ``s``
  (a **target** id, ``d2t`` applied);
* ``e_s = markov_w1[prev_s]`` (rows indexed by target ids);
* vanilla: ``logits_s = z_k + markov_w2(e_s)``; gated:
  ``z_k + markov_w2(sigmoid(gate_proj(cat(out_k, e_s))) * e_s)``; rnn is refused
  (training-only recurrent state; no vLLM counterpart);
* pick ``y_s`` by argmax or by sampling ``softmax(logits_s / T)`` inside the loop;
* confidence (when the head is present and enabled): ``sigmoid(proj(cat(out_k, e_s)))``
  (``confidence_head_with_markov``) or ``sigmoid(proj(out_k))``; it never changes the
  tokens. Computed in fp32 (vLLM keeps this head in fp32).

``markov_rank: 0`` disables the Markov head (pure DFlash drafting).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch

from ..errors import InvalidInputError, UnsupportedFormatError
from .dflash import DFlashDrafter
from .layers import Linear, WeightTaker
from .step import StepBatch, StepOutput

if TYPE_CHECKING:  # pragma: no cover
    from ..format import DSparkConfig
    from ..verifier import Verifier
    from .step import Pick

__all__ = ["DSparkDrafter"]


class DSparkDrafter(DFlashDrafter):
    """DSpark reference drafter. Build with :func:`specconv.drafters.load_drafter`."""

    algorithm = "dspark"

    def __init__(self, config: DSparkConfig, w: WeightTaker, verifier: Verifier | None, source: str):
        super().__init__(config, w, verifier, source)
        H, Vt, Vd = self.hidden_size, self.vocab_size, self.draft_vocab_size
        rank = config.markov_rank
        if rank < 0:
            raise InvalidInputError(f"{source}: markov_rank must be an integer >= 0, got {rank!r}",
                                    code="config_key")
        self.markov_rank = rank
        self.markov_head_type = str(config.markov_head_type)
        if self.markov_head_type == "rnn":
            raise UnsupportedFormatError(
                f"{source}: markov_head_type 'rnn' is not supported (training-only recurrent "
                "head; vLLM implements vanilla only)", format_id="dspark_rnn")
        self.markov_w1: torch.nn.Parameter | None = None
        self.markov_w2: Linear | None = None
        self.gate_proj: Linear | None = None
        if rank > 0:
            self.markov_w1 = torch.nn.Parameter(
                w.take("markov_head.markov_w1.weight", (Vt, rank)), requires_grad=False)
            self.markov_w2 = Linear(w.take("markov_head.markov_w2.weight", (Vd, rank)))
            if self.markov_head_type == "gated":
                self.gate_proj = Linear(w.take("markov_head.gate_proj.weight", (rank, H + rank)),
                                        w.take("markov_head.gate_proj.bias", (rank,)))
        enabled = bool(config.enable_confidence_head)
        self.confidence_with_markov = bool(config.confidence_head_with_markov)
        self.confidence_proj: Linear | None = None
        if enabled:
            if self.confidence_with_markov and rank == 0:
                raise InvalidInputError(f"{source}: confidence_head_with_markov requires markov_rank > 0",
                                        code="config_key")
            width = H + (rank if self.confidence_with_markov else 0)
            if w.has("confidence_head.proj.weight"):
                self.confidence_proj = Linear(w.take("confidence_head.proj.weight", (1, width)),
                                              w.take("confidence_head.proj.bias", (1,)))
            else:
                warnings.warn(f"{source}: enable_confidence_head is true but confidence_head.* "
                              "tensors are absent; no confidence is reported", stacklevel=2)
        else:
            w.ignore("confidence_head.proj.weight")
            w.ignore("confidence_head.proj.bias")

    def _markov_bias(self, out_k: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        assert self.markov_w2 is not None
        if self.gate_proj is not None:
            e = torch.sigmoid(self.gate_proj(torch.cat([out_k, e], dim=-1))) * e
        return self.markov_w2(e)

    def _confidence_logit(self, out_k: torch.Tensor, e: torch.Tensor | None) -> torch.Tensor:
        """``proj(cat(out_k, e))`` or ``proj(out_k)`` in fp32 (vLLM keeps this head in fp32) → ``[B]``."""
        assert self.confidence_proj is not None and self.confidence_proj.bias is not None
        feat = out_k
        if self.confidence_with_markov:
            assert e is not None, "confidence_head_with_markov requires markov_rank > 0 (checked at load)"
            feat = torch.cat([out_k, e], dim=-1)
        w_ = self.confidence_proj.weight.to(torch.float32)
        b_ = self.confidence_proj.bias.to(torch.float32)
        return (feat.to(torch.float32) @ w_[0]) + b_[0]

    def _draft(self, out: StepOutput, batch: StepBatch, pick: Pick, confidence: bool,
               prev_tokens: torch.Tensor | None) -> StepOutput:
        """The sequential Markov / confidence stage (module doc); ``prev_tokens [B, N]`` forces ``prev_s``
        (InvalidInputError without ``N`` per row)."""
        N, first = int(self.num_draft_tokens), out.first_row
        if prev_tokens is not None and prev_tokens.shape[-1] != N:
            raise InvalidInputError(f"prev_tokens must have {N} entries")
        prev = batch.block_ids[:, 0].to(torch.int64)
        rows, picks, confs = [], [], []
        for s in range(N):
            if prev_tokens is not None:
                prev = prev_tokens[:, s]
            out_k, row, e = out.hidden[:, first + s], out.slot_logits[:, first + s], None
            if self.markov_w1 is not None:
                e = self.markov_w1[prev]
                row = row + self._markov_bias(out_k, e)
            y = pick(row, s)
            if confidence and self.confidence_proj is not None:
                confs.append(self._confidence_logit(out_k, e))
            rows.append(row)
            picks.append(y)
            prev = self.vocab.to_target_ids(y)
        out.draft_logits, out.draft_ids = torch.stack(rows, dim=1), torch.stack(picks, dim=1)
        out.confidence_logits = torch.stack(confs, dim=1) if confs else None
        return out
