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
from .base import BlockOutput
from .dflash import DFlashDrafter
from .layers import Linear, WeightTaker, sample_rows

if TYPE_CHECKING:  # pragma: no cover
    from ..format import DSparkConfig
    from ..verifier import Verifier

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
        if self.markov_head_type not in ("vanilla", "gated"):
            raise UnsupportedFormatError(
                f"{source}: unknown markov_head_type {self.markov_head_type!r}")
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
                raise InvalidInputError(
                    f"{source}: confidence_head_with_markov requires markov_rank > 0",
                    code="config_key")
            width = H + (rank if self.confidence_with_markov else 0)
            if w.has("confidence_head.proj.weight"):
                self.confidence_proj = Linear(
                    w.take("confidence_head.proj.weight", (1, width)),
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

    def _slot_step(self, out_k: torch.Tensor, row: torch.Tensor, prev: torch.Tensor, temperature: float,
                   generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One sequential slot: Markov-biased logits ``[Vd]``, the pick, the confidence logit (fp32) or None."""
        e = None
        if self.markov_w1 is not None:
            e = self.markov_w1[prev]
            row = row + self._markov_bias(out_k, e)
        y = sample_rows(row[None], temperature, generator)[0]
        conf = None
        if self.confidence_proj is not None:
            feat = torch.cat([out_k, e], dim=-1) if self.confidence_with_markov else out_k
            w_ = self.confidence_proj.weight.to(torch.float32)
            b_ = self.confidence_proj.bias.to(torch.float32)
            conf = (feat.to(torch.float32) @ w_[0]) + b_[0]
        return row, y, conf

    @torch.no_grad()
    def forward_block(self, context_tokens: torch.Tensor, aux_hidden: torch.Tensor, *,
                      temperature: float = 0.0, generator: torch.Generator | None = None,
                      prev_tokens: torch.Tensor | None = None) -> BlockOutput:
        """One DSpark drafting pass (backbone + sequential Markov / confidence heads).

        Args:
            context_tokens: LongTensor ``[1, T+1]`` (only the anchor ``[0, T]`` is used).
            aux_hidden: ``[1, T, A*H]``.
            temperature, generator: as :meth:`Drafter.propose`; sampling happens inside
                the sequential loop so each slot conditions on the token actually drawn.
            prev_tokens: optional LongTensor ``[N]`` of target ids to use as ``prev_s``
                (teacher forcing, as in training); default: anchor, then own picks.

        Returns:
            :class:`BlockOutput`; ``draft_logits`` are the Markov-biased logits.
        """
        tokens, g = self._check_inputs(context_tokens, aux_hidden)
        anchor = tokens[-1]
        pos, hidden, logits = self.backbone(anchor, g)
        return self._draft_from(anchor, pos, hidden, logits, temperature, generator,
                                prev_tokens=prev_tokens)

    def _draft_from(self, anchor: torch.Tensor, pos: torch.Tensor, hidden: torch.Tensor,
                    logits: torch.Tensor, temperature: float, generator: torch.Generator | None,
                    prev_tokens: torch.Tensor | None = None) -> BlockOutput:
        """The sequential Markov / confidence stage over the backbone's slots (module doc)."""
        slots = self.draft_slot_indices(hidden.device)
        N = slots.numel()
        if prev_tokens is not None:
            prev_tokens = prev_tokens.reshape(-1).to(hidden.device, torch.long)
            if prev_tokens.numel() != N:
                raise InvalidInputError(f"prev_tokens must have {N} entries")
        rows, picks, conf_logits = [], [], []
        prev = anchor
        for s in range(N):
            if prev_tokens is not None:
                prev = prev_tokens[s]
            row, y, conf = self._slot_step(hidden[int(slots[s])], logits[int(slots[s])], prev, temperature, generator)
            rows.append(row)
            picks.append(y)
            if conf is not None:
                conf_logits.append(conf)
            prev = self.vocab.to_target_ids(y)
        draft_logits = torch.stack(rows)
        draft_ids = torch.stack(picks)
        cl = torch.stack(conf_logits) if conf_logits else None
        return BlockOutput(
            positions=pos, hidden=hidden, slot_logits=logits, draft_slots=slots,
            draft_logits=draft_logits, target_logits=self.vocab.to_target_logits(draft_logits),
            draft_ids=draft_ids, tokens=self.vocab.to_target_ids(draft_ids),
            confidence_logits=cl, confidence=torch.sigmoid(cl) if cl is not None else None)
