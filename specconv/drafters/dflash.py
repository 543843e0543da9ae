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

:meth:`DFlashDrafter.forward_block` recomputes the context on every call (the stateless
path: G2 parity, export); :meth:`DFlashDrafter.new_session` keeps the context keys/values
between calls (:mod:`specconv.drafters.cache`, the validation loop's default).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch

from ..errors import InvalidInputError
from .base import (BlockOutput, Drafter, aux_ids_from_config, build_embedding, build_lm_head, build_vocab,
                   require_int, speculative_tokens, target_hidden)
from .cache import ContextCache, DraftSession
from .layers import (DecoderLayer, LayerSpec, layer_spec_of, Linear, RMSNorm, Rotary, WeightTaker, attend,
                     attend_grouped)

if TYPE_CHECKING:  # pragma: no cover
    from ..format import DFlashConfig
    from ..verifier import Verifier

__all__ = ["DFlashDrafter"]


class DFlashDrafter(Drafter):
    """DFlash reference drafter. Build with :func:`specconv.drafters.load_drafter`."""

    algorithm = "dflash"

    def __init__(self, config: DFlashConfig, w: WeightTaker, verifier: Verifier | None, source: str):
        from ..format import expected_speculative_tokens

        super().__init__(config, source)
        spec = layer_spec_of(config, source)
        tl = config.transformer_layer_config
        self.spec = spec
        H = spec.hidden_size
        self.hidden_size = H
        self.vocab_size = spec.vocab_size
        self.draft_vocab_size = require_int(config, "draft_vocab_size", source, minimum=1)
        self.block_size = require_int(config, "block_size", source, minimum=1)
        self.mask_token_id = require_int(config, "mask_token_id", source)
        if self.mask_token_id >= self.vocab_size:
            raise InvalidInputError(f"{source}: mask_token_id {self.mask_token_id} >= vocab_size "
                                    f"{self.vocab_size}", code="config_key")
        self.sample_from_anchor = bool(config.sample_from_anchor)  # class default: DFlash False, DSpark True
        self.sliding_window_non_causal = bool(config.sliding_window_non_causal)
        self.aux_layer_ids = aux_ids_from_config(config, verifier, source)
        if self.block_size < 2 and not self.sample_from_anchor:
            raise InvalidInputError(f"{source}: block_size must be >= 2 when sample_from_anchor "
                                    "is false", code="config_key")
        self.num_draft_tokens = int(expected_speculative_tokens(config))  # B or B-1 by sample_from_anchor
        st = speculative_tokens(config)
        if st is not None and st != self.num_draft_tokens:
            warnings.warn(f"{source}: speculative_tokens {st} != {self.num_draft_tokens} implied "
                          "by block_size/sample_from_anchor (specconv.format.expected_speculative_tokens)",
                          stacklevel=2)
        A = len(self.aux_layer_ids)
        Ht = self.aux_hidden_size = target_hidden(config, H, source)

        self.embed_tokens = torch.nn.Parameter(
            build_embedding(w, verifier, vocab_size=self.vocab_size, hidden=H),
            requires_grad=False)
        self.fc = Linear(w.take("fc.weight", (H, A * Ht)))
        self.hidden_norm = RMSNorm(w.take("hidden_norm.weight", (H,)), spec.eps)
        self.layers = torch.nn.ModuleList(
            [DecoderLayer(w, i, spec, qk_norm=True) for i in range(spec.num_layers)])
        self.norm = RMSNorm(w.take("norm.weight", (H,)), spec.eps)
        self.lm_head = build_lm_head(w, verifier, vocab_size=self.vocab_size,
                                     draft_vocab_size=self.draft_vocab_size, hidden=H,
                                     algorithm=self.algorithm)
        self.vocab = build_vocab(w, vocab_size=self.vocab_size,
                                 draft_vocab_size=self.draft_vocab_size)
        self.rotary = Rotary(tl, spec.head_dim, source=f"{source}: transformer_layer_config")

    # -- masks ------------------------------------------------------------------------
    def layer_mask(self, layer: int, ctx_len: int, device: torch.device) -> torch.Tensor:
        """Bool ``[B, T+B]`` visibility for block queries of layer ``layer`` (step 3 above)."""
        B = self.block_size
        if not self.spec.is_swa(layer):
            return torch.ones(B, ctx_len + B, dtype=torch.bool, device=device)
        W = self.spec.sliding_window
        ctx_pos = torch.arange(ctx_len, device=device)
        ctx_vis = (ctx_pos >= ctx_len - W)[None, :].expand(B, ctx_len)  # anchor a = ctx_len
        if self.sliding_window_non_causal:
            blk_vis = torch.ones(B, B, dtype=torch.bool, device=device)
        else:
            j = torch.arange(B, device=device)
            blk_vis = j[None, :] <= j[:, None]
        return torch.cat([ctx_vis, blk_vis], dim=1)

    # -- forward ----------------------------------------------------------------------
    def backbone(self, anchor: torch.Tensor, g: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the block.

        Args:
            anchor: LongTensor scalar — the bonus/anchor token (target id) at position ``T``.
            g: ``[T, A*H]`` aux features of positions ``0..T-1``.

        Returns:
            ``(positions [B], hidden = norm(h) [B, H], slot_logits [B, Vd])``.
        """
        dev, dt = g.device, self.dtype
        T, B = g.shape[0], self.block_size
        c = self.hidden_norm(self.fc(g))
        block = torch.full((B,), self.mask_token_id, dtype=torch.long, device=dev)
        block[0] = anchor
        h = self.embed_tokens[block]
        ctx_pos = torch.arange(T, device=dev)
        blk_pos = T + torch.arange(B, device=dev)
        cos_c, sin_c = self.rotary(ctx_pos, dt)
        cos_b, sin_b = self.rotary(blk_pos, dt)
        for i, layer in enumerate(self.layers):
            a = layer.self_attn
            n = layer.input_layernorm(h)
            q = a.q(n, cos_b, sin_b)
            kc, vc = a.kv(c, cos_c, sin_c)
            kb, vb = a.kv(n, cos_b, sin_b)
            k = torch.cat([kc, kb], dim=1)
            v = torch.cat([vc, vb], dim=1)
            out = attend(q, k, v, self.layer_mask(i, T, dev), a.scale)
            h = layer.finish(h, out)
        hidden = self.norm(h)
        return blk_pos, hidden, self.lm_head(hidden)

    def _extend_context(self, g: torch.Tensor, cache: "ContextCache") -> None:
        """Project the context rows ``g[n:]`` not yet in ``cache`` (after cropping it to
        ``T``) and commit their per-layer keys/values at RoPE positions ``n..T-1``."""
        T = g.shape[0]
        n = cache.reuse(T)
        if n == T:
            return
        c = self.hidden_norm(self.fc(g[n:]))
        cos, sin = self.rotary(torch.arange(n, T, device=g.device), self.dtype)
        for buf, layer in zip(cache.layers, self.layers):
            kc, vc = layer.self_attn.kv(c, cos, sin)
            buf.append(kc, vc)

    def cached_backbone(self, anchor: torch.Tensor, g: torch.Tensor, cache: "ContextCache"
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`backbone` with the context keys/values kept in ``cache``.

        Only the context rows new since the previous call are projected; the block's
        keys/values are scratch rows past the cached context (never committed).

        Args:
            anchor: LongTensor scalar — the anchor token at position ``T``.
            g: ``[T, A*H]`` aux features of positions ``0..T-1`` (rows already cached
                must be the ones seen before).
            cache: the session's :class:`~specconv.drafters.cache.ContextCache`.

        Returns:
            ``(positions [B], hidden [B, H], slot_logits [B, Vd])`` as :meth:`backbone`.
        """
        self._extend_context(g, cache)
        dev, T, B = g.device, g.shape[0], self.block_size
        block = torch.full((B,), self.mask_token_id, dtype=torch.long, device=dev)
        block[0] = anchor
        h = self.embed_tokens[block]
        blk_pos = T + torch.arange(B, device=dev)
        cos_b, sin_b = self.rotary(blk_pos, self.dtype)
        for i, (buf, layer) in enumerate(zip(cache.layers, self.layers)):
            a = layer.self_attn
            n = layer.input_layernorm(h)
            kb, vb = a.kv(n, cos_b, sin_b)
            k, v = buf.with_tail(kb, vb)
            out = attend_grouped(a.q(n, cos_b, sin_b), k, v, self.layer_mask(i, T, dev), a.scale)
            h = layer.finish(h, out)
        hidden = self.norm(h)
        return blk_pos, hidden, self.lm_head(hidden)

    def _draft_from(self, anchor: torch.Tensor, pos: torch.Tensor, hidden: torch.Tensor,
                    logits: torch.Tensor, temperature: float,
                    generator: torch.Generator | None) -> BlockOutput:
        """Drafts from the backbone's slots (DSpark overrides: Markov / confidence heads)."""
        slots = self.draft_slot_indices(hidden.device)
        return self._finish(pos, hidden, logits, slots, temperature, generator)

    @torch.no_grad()
    def forward_cached(self, context_tokens: torch.Tensor, aux_hidden: torch.Tensor,
                       cache: "ContextCache", *, temperature: float = 0.0,
                       generator: torch.Generator | None = None) -> BlockOutput:
        """:meth:`forward_block` through ``cache`` (use a :class:`DraftSession`).

        Same arguments and :class:`BlockOutput` as :meth:`forward_block`; ``cache`` is
        cropped / extended to the given context.
        """
        tokens, g = self._check_inputs(context_tokens, aux_hidden)
        pos, hidden, logits = self.cached_backbone(tokens[-1], g, cache)
        return self._draft_from(tokens[-1], pos, hidden, logits, temperature, generator)

    def new_session(self) -> "DraftSession":
        """A :class:`~specconv.drafters.cache.DraftSession` (context cache) for one request."""
        return DraftSession(self)

    def draft_slot_indices(self, device: torch.device) -> torch.Tensor:
        start = 0 if self.sample_from_anchor else 1
        return torch.arange(start, self.block_size, device=device)

    @torch.no_grad()
    def forward_block(self, context_tokens: torch.Tensor, aux_hidden: torch.Tensor, *,
                      temperature: float = 0.0, generator: torch.Generator | None = None,
                      ) -> BlockOutput:
        """One DFlash drafting pass.

        Args:
            context_tokens: LongTensor ``[1, T+1]`` (only the anchor ``[0, T]`` is used).
            aux_hidden: ``[1, T, A*H]`` aux features of positions ``0..T-1``.
            temperature, generator: as :meth:`Drafter.propose`; slots are drawn
                independently.

        Returns:
            :class:`BlockOutput` with ``S = B`` rows; drafts from slots ``1..B-1`` or
            ``0..B-1``.
        """
        tokens, g = self._check_inputs(context_tokens, aux_hidden)
        pos, hidden, logits = self.backbone(tokens[-1], g)
        slots = self.draft_slot_indices(g.device)
        return self._finish(pos, hidden, logits, slots, temperature, generator)
