"""Reference DFlash drafter (``speculators_model_type: "dflash"``).

One drafting step (speculators 0.9.0 ``src/speculators/models/dflash/{core,attention,
model_definitions}.py``; z-lab ``dflash/model.py``; vLLM
``vllm/model_executor/models/qwen3_dflash.py``):

1. context features ``c_i = hidden_norm(fc(g_i))`` for the ``T`` accepted positions
   (RoPE positions ``0..T-1``), shared by every layer;
2. block ``[anchor, mask, ..., mask]`` (``B`` slots) at positions ``a..a+B-1`` with
   ``a = T``, ``h = embed_tokens[block]``;
3. per layer: ``n = input_layernorm(h)``; queries from ``n``; keys/values are the
   layer's own ``k_proj``/``v_proj`` of the context ``c`` (no ``input_layernorm``;
   ``k_norm`` applies) followed by those of ``n``; full-attention layers see everything
   (bidirectional block); SWA layers see context positions ``>= a - W`` and block slots
   ``<= j`` unless ``sliding_window_non_causal``; then o_proj + residual + MLP;
4. ``logits = lm_head(norm(h))``; drafts from slots ``1..B-1`` (``sample_from_anchor``
   false) or ``0..B-1`` (true), mapped with ``d2t``.

The stateless step and the cached session run the same block pass (:meth:`_block_pass`).
"""

from __future__ import annotations

import warnings
from functools import partial
from typing import TYPE_CHECKING

import torch

from ..errors import InvalidInputError
from .base import BlockOutput, Drafter, require_int
from .cache import ContextCache, DraftSession
from .layers import Attend, Keys, Linear, RMSNorm, WeightTaker, attend_grouped
from .step import StepBatch, StepOutput, sample_pick

if TYPE_CHECKING:  # pragma: no cover
    from ..format import DFlashConfig
    from ..verifier import Verifier

__all__ = ["DFlashDrafter"]


def _with_context(context_kv: tuple[torch.Tensor, torch.Tensor], block_k: torch.Tensor, block_v: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Context keys/values followed by the block's (the stateless step's :data:`~.layers.Keys`)."""
    context_k, context_v = context_kv
    return torch.cat([context_k, block_k], dim=2), torch.cat([context_v, block_v], dim=2)


class DFlashDrafter(Drafter):
    """DFlash reference drafter. Build with :func:`specconv.drafters.load_drafter`."""

    algorithm = "dflash"

    def __init__(self, config: DFlashConfig, w: WeightTaker, verifier: Verifier | None, source: str):
        from ..format import expected_speculative_tokens

        super().__init__(config, w, verifier, source)
        self.block_size = require_int(config, "block_size", source, minimum=1)
        self.sample_from_anchor = bool(config.sample_from_anchor)  # class default: DFlash False, DSpark True
        self.sliding_window_non_causal = bool(config.sliding_window_non_causal)
        if self.block_size < 2 and not self.sample_from_anchor:
            raise InvalidInputError(f"{source}: block_size must be >= 2 when sample_from_anchor "
                                    "is false", code="config_key")
        self.num_draft_tokens = int(expected_speculative_tokens(config))  # B or B-1 by sample_from_anchor
        st = config.speculative_tokens
        if st != self.num_draft_tokens:
            warnings.warn(f"{source}: speculative_tokens {st} != {self.num_draft_tokens} implied "
                          "by block_size/sample_from_anchor (specconv.format.expected_speculative_tokens)",
                          stacklevel=2)
        H, A, eps = self.hidden_size, len(self.aux_layer_ids), config.transformer_layer_config.rms_norm_eps
        self.fc = Linear(w.take("fc.weight", (H, A * self.aux_hidden_size)))
        self.hidden_norm = RMSNorm(w.take("hidden_norm.weight", (H,)), eps)

    @property
    def draft_slots(self) -> tuple[int, ...]:
        """Block slots the drafts come from: ``1..B-1``, or ``0..B-1`` with ``sample_from_anchor``."""
        return tuple(range(0 if self.sample_from_anchor else 1, self.block_size))

    def block_mask(self, layer: int, batch: StepBatch) -> torch.Tensor:
        """Bool ``[B, S, C+S]``: the block queries of layer ``layer`` over ``[context, block]``
        keys (step 3 above; padding columns of the context are never visible)."""
        W = self.windows[layer]
        ctx_pos, blk_pos = batch.ctx_position_ids, batch.block_position_ids
        S = batch.block_ids.shape[1]
        ctx_vis = batch.ctx_valid[:, None, :].expand(-1, S, -1)
        blk = torch.ones(S, S, dtype=torch.bool, device=ctx_pos.device)
        if W is not None:
            anchor = blk_pos[:, :1, None]  # a = T: context keys at positions >= a - W
            ctx_vis = ctx_vis & (ctx_pos[:, None, :] >= anchor - W)
            if not self.sliding_window_non_causal:
                blk = torch.tril(blk)
        blk_vis = blk[None].expand(ctx_pos.shape[0], -1, -1)
        return torch.cat([ctx_vis, blk_vis], dim=2)

    def _block_pass(self, batch: StepBatch, keys, attention: Attend) -> torch.Tensor:
        """The block through every layer → ``norm(h) [B, S, H]``; ``keys(i)``: layer ``i``'s :data:`~.layers.Keys`."""
        h = self._embed(batch.block_ids)
        cos, sin = self.rotary(batch.block_position_ids, self.dtype)
        for i, layer in enumerate(self.layers):
            h = layer.attend(layer.input_layernorm(h), h, cos, sin, keys(i), self.block_mask(i, batch), attention)
        return self.norm(h)

    def _backbone(self, batch: StepBatch, attention: Attend, all_rows: bool) -> StepOutput:
        """The stateless block pass: every layer projects the whole context."""
        context = self.hidden_norm(self.fc(batch.aux_hidden))
        cos, sin = self.rotary(batch.ctx_position_ids, self.dtype)

        def keys(i: int) -> Keys:
            return partial(_with_context, self.layers[i].self_attn.kv(context, cos, sin))

        hidden = self._block_pass(batch, keys, attention)
        return StepOutput(positions=batch.block_position_ids, hidden=hidden, slot_logits=self._logits(hidden),
                          first_row=self.draft_slots[0])

    def _extend_context(self, g: torch.Tensor, cache: ContextCache) -> None:
        """Project and commit the context rows ``g[n:]`` not yet in ``cache`` (cropped to ``T``)."""
        T = g.shape[0]
        n = cache.reuse(T)
        if n == T:
            return
        context = self.hidden_norm(self.fc(g[None, n:]))
        cos, sin = self.rotary(torch.arange(n, T, device=g.device)[None], self.dtype)
        for buf, layer in zip(cache.layers, self.layers, strict=True):
            buf.append(*layer.self_attn.kv(context, cos, sin))

    @torch.no_grad()
    def forward_cached(self, context_tokens: torch.Tensor, aux_hidden: torch.Tensor,
                       cache: ContextCache, *, temperature: float = 0.0,
                       generator: torch.Generator | None = None) -> BlockOutput:
        """:meth:`forward_block` through ``cache``: only new context rows are projected; the block's
        keys/values are never committed."""
        tokens, g = self._check_inputs(context_tokens, aux_hidden)
        self._extend_context(g, cache)
        batch = self._request(tokens, g)
        hidden = self._block_pass(batch, lambda i: cache.layers[i].with_tail, attend_grouped)
        out = StepOutput(positions=batch.block_position_ids, hidden=hidden, slot_logits=self._logits(hidden),
                         first_row=self.draft_slots[0])
        return self._block_output(self._draft(out, batch, sample_pick(temperature, generator), True, None))

    def new_session(self) -> DraftSession:
        """A :class:`~specconv.drafters.cache.DraftSession` (context cache) for one request."""
        return DraftSession(self)
