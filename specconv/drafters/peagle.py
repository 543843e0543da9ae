"""Reference P-EAGLE drafter (``speculators_model_type: "peagle"``).

One drafting step (speculators 0.9.0 ``src/speculators/models/peagle/core.py`` +
``src/speculators/models/eagle3/{core,model_definitions}.py``; vLLM
``vllm/model_executor/models/llama_eagle3.py`` with ``parallel_drafting``). All ``K`` drafts come from one pass over:

* ``T`` context entries ``i = 0..T-1``: token ``t_{i+1}`` (the last one is the bonus
  token) with verifier feature ``g_i``, at RoPE position ``i``;
* ``K-1`` mask entries ``j = 1..K-1``: ``mask_token_id`` with ``mask_hidden``, at
  position ``T-1+j``.

Per entry: ``e = embed_tokens[token]``, ``f = fc(prep(x))`` (``prep`` = ``input_norm``
if ``norm_before_fc``, per-chunk ``fc_norm`` if ``fc_norm``, else identity). Layer 0
attends with ``q,k,v = proj(cat(input_layernorm(e), hidden_norm(f)))`` and residual
``hidden_norm(f)`` (``norm_before_residual``) or ``f``; layers >= 1 are standard
pre-norm decoder layers. Attention is causal (a mask entry sees every context entry and
the earlier mask entries); SWA layers restrict **context** keys to positions in
``(q_pos - W, q_pos]`` (speculators ``peagle/attention.py``). qwen3 layers have per-head
``q_norm``/``k_norm``; llama layers do not. ``logits = lm_head(norm(h))``; drafts from
the bonus entry (row ``T-1``) and the mask entries, mapped with ``d2t``.

:meth:`PEagleDrafter.forward_block` recomputes every context entry on every call (the
stateless path: G2 parity, export); :meth:`PEagleDrafter.new_session` keeps the context
entries' keys/values between calls (:mod:`specconv.drafters.cache`).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch

from ..errors import InvalidInputError, UnsupportedFormatError, UsageError
from .base import (BlockOutput, Drafter, aux_ids_from_config, build_embedding, build_lm_head, build_vocab,
                   require_int, speculative_tokens, target_hidden)
from .cache import ContextCache, DraftSession
from .layers import (DecoderLayer, LayerSpec, layer_spec_of, Linear, RMSNorm, Rotary, WeightTaker, attend,
                     attend_grouped)

if TYPE_CHECKING:  # pragma: no cover
    from ..format import PEagleConfig
    from ..verifier import Verifier

__all__ = ["PEagleDrafter"]


class PEagleDrafter(Drafter):
    """P-EAGLE reference drafter. Build with :func:`specconv.drafters.load_drafter`."""

    algorithm = "peagle"

    def __init__(self, config: PEagleConfig, w: WeightTaker, verifier: Verifier | None, source: str):
        super().__init__(config, source)
        spec = layer_spec_of(config, source)
        if spec.model_type not in ("llama", "qwen3"):
            raise UnsupportedFormatError(
                f"{source}: P-EAGLE transformer_layer_config.model_type must be 'llama' or "
                f"'qwen3' (speculators and vLLM know only these), got {spec.model_type!r}")
        self.spec = spec
        H = spec.hidden_size
        norm_before_fc, fc_norm = self._read_config(config, verifier, source)
        A, Ht = len(self.aux_layer_ids), self.aux_hidden_size

        self.embed_tokens = torch.nn.Parameter(
            build_embedding(w, verifier, vocab_size=self.vocab_size, hidden=H),
            requires_grad=False)
        if not w.has("embed_tokens.weight"):
            warnings.warn(f"{source}: P-EAGLE without embed_tokens.weight; using the verifier's "
                          "embedding (P-EAGLE normally trains its own)", stacklevel=2)
        self._take_fc(w, norm_before_fc, fc_norm)
        if not w.has("mask_hidden"):
            raise InvalidInputError(
                f"{source}: mask_hidden is required for P-EAGLE (speculators would "
                "random-initialise it; vLLM refuses)", code="missing_tensor")
        self.mask_hidden = torch.nn.Parameter(
            w.take("mask_hidden", (1, 1, A * Ht)).reshape(A * Ht), requires_grad=False)
        self.hidden_norm = RMSNorm(w.take("layers.0.hidden_norm.weight", (H,)), spec.eps)
        self.layers = torch.nn.ModuleList(
            [DecoderLayer(w, i, spec, qk_norm=spec.model_type == "qwen3", attn_in=2 * H if i == 0 else None)
             for i in range(spec.num_layers)])
        self.norm = RMSNorm(w.take("norm.weight", (H,)), spec.eps)
        self.lm_head = build_lm_head(w, verifier, vocab_size=self.vocab_size,
                                     draft_vocab_size=self.draft_vocab_size, hidden=H,
                                     algorithm=self.algorithm)
        self.vocab = build_vocab(w, vocab_size=self.vocab_size,
                                 draft_vocab_size=self.draft_vocab_size)
        self.rotary = Rotary(config.transformer_layer_config, spec.head_dim,
                             source=f"{source}: transformer_layer_config")
        self.block_size = self.num_draft_tokens
        self.sample_from_anchor = False

    def _read_config(self, config: PEagleConfig, verifier: Verifier | None, source: str) -> tuple[bool, bool]:
        """Set the scalar attributes from the typed config; return ``(norm_before_fc, fc_norm)``."""
        self.hidden_size = self.spec.hidden_size
        self.vocab_size = self.spec.vocab_size
        self.draft_vocab_size = require_int(config, "draft_vocab_size", source, minimum=1)
        self.mask_token_id = require_int(config, "mask_token_id", source)
        if self.mask_token_id >= self.vocab_size:
            raise InvalidInputError(f"{source}: mask_token_id {self.mask_token_id} >= vocab_size "
                                    f"{self.vocab_size}", code="config_key")
        self.aux_layer_ids = aux_ids_from_config(config, verifier, source)
        st = speculative_tokens(config)
        if st < 1:
            raise InvalidInputError(
                f"{source}: speculators_config.proposal_methods[0].speculative_tokens must be >= 1 "
                f"for P-EAGLE (number of depths K), got {st}", code="config_key")
        self.num_draft_tokens = st
        self.norm_before_residual = bool(config.norm_before_residual)
        norm_before_fc, fc_norm = bool(config.norm_before_fc), bool(config.fc_norm)
        if norm_before_fc and fc_norm:
            raise InvalidInputError(f"{source}: norm_before_fc and fc_norm are mutually exclusive",
                                    code="config_key")
        self.aux_hidden_size = target_hidden(config, self.hidden_size, source)
        return norm_before_fc, fc_norm

    def _take_fc(self, w: WeightTaker, norm_before_fc: bool, fc_norm: bool) -> None:
        """``fc`` and its optional input norm (whole width) or per-chunk ``fc_norm``."""
        H, A, Ht, eps = self.hidden_size, len(self.aux_layer_ids), self.aux_hidden_size, self.spec.eps
        self.fc = Linear(w.take("fc.weight", (H, A * Ht)))
        self.input_norm = RMSNorm(w.take("input_norm.weight", (A * Ht,)), eps) if norm_before_fc else None
        self.fc_norm = (torch.nn.ModuleList([RMSNorm(w.take(f"fc_norm.{i}.weight", (Ht,)), eps) for i in range(A)])
                        if fc_norm else None)

    # -- pieces -------------------------------------------------------------------------
    def prep_fc(self, x: torch.Tensor) -> torch.Tensor:
        """``fc(prep(x))`` for ``x [S, A*H]`` (aux concat or ``mask_hidden``)."""
        if self.input_norm is not None:
            x = self.input_norm(x)
        if self.fc_norm is not None:
            chunks = x.chunk(len(self.fc_norm), dim=-1)
            x = torch.cat([n(c) for n, c in zip(self.fc_norm, chunks)], dim=-1)
        return self.fc(x)

    def attention_mask(self, layer: int, ctx_len: int, device: torch.device) -> torch.Tensor:
        """Bool ``[S, S]`` over ``T`` context entries then ``K-1`` mask entries."""
        return self.attention_mask_rows(layer, ctx_len, 0, device)

    def attention_mask_rows(self, layer: int, ctx_len: int, start: int,
                            device: torch.device) -> torch.Tensor:
        """Rows ``start..S-1`` of :meth:`attention_mask`: bool ``[S - start, S]``
        (the cached path computes only the queries from entry ``start`` on)."""
        T, M = ctx_len, self.num_draft_tokens - 1
        S = T + M
        idx = torch.arange(S, device=device)
        pos = torch.where(idx < T, idx, T - 1 + (idx - T + 1))
        depth = torch.where(idx < T, torch.zeros_like(idx), idx - T + 1)
        anchor = pos - depth  # context: own position; mask entries: T-1
        qa, ka = anchor[start:, None], anchor[None, :]
        qd, kd = depth[start:, None], depth[None, :]
        ctx_key = (kd == 0) & (ka <= qa)
        if self.spec.is_swa(layer):
            W = self.spec.sliding_window
            ctx_key = ctx_key & (ka > pos[start:, None] - W)
        same_rollout = (qa == ka) & (kd <= qd)
        return ctx_key | same_rollout

    def _context(self, context_tokens: torch.Tensor, aux_hidden: torch.Tensor):
        """Checked ``(tokens [T+1], features [T, A*H], T)``; ``UsageError`` when ``T == 0``."""
        tokens, g = self._check_inputs(context_tokens, aux_hidden)
        if g.shape[0] < 1:
            raise UsageError("P-EAGLE needs at least one context position (T >= 1)")
        return tokens, g, g.shape[0]

    @torch.no_grad()
    def forward_block(self, context_tokens: torch.Tensor, aux_hidden: torch.Tensor, *,
                      temperature: float = 0.0, generator: torch.Generator | None = None,
                      ) -> BlockOutput:
        """One P-EAGLE drafting pass (all ``K`` depths at once).

        Args:
            context_tokens: LongTensor ``[1, T+1]`` — ``t_0..t_T`` with ``t_T`` the bonus
                token; entry ``i`` uses ``t_{i+1}``.
            aux_hidden: ``[1, T, A*H]`` — ``g_0..g_{T-1}`` (``T >= 1``).
            temperature, generator: as :meth:`Drafter.propose` (depths drawn
                independently).

        Returns:
            :class:`BlockOutput` with ``S = T + K - 1`` rows (every context entry, then the
            mask entries); ``draft_slots = [T-1, T, ..., T+K-2]`` so ``draft_logits[d]``
            is depth ``d``.

        Raises:
            UsageError: ``T == 0``.
        """
        tokens, g, T = self._context(context_tokens, aux_hidden)
        K = self.num_draft_tokens
        dev, dt = g.device, self.dtype
        M = K - 1
        ent_tokens = torch.cat([tokens[1:], torch.full((M,), self.mask_token_id, dtype=torch.long,
                                                       device=dev)])
        x = torch.cat([g, self.mask_hidden[None].expand(M, -1)], dim=0)
        e = self.embed_tokens[ent_tokens]
        f = self.prep_fc(x)
        positions = torch.cat([torch.arange(T, device=dev), T - 1 + torch.arange(1, K, device=dev)])
        cos, sin = self.rotary(positions, dt)

        layer0 = self.layers[0]
        a_in = layer0.input_layernorm(e)
        b_in = self.hidden_norm(f)
        residual = b_in if self.norm_before_residual else f
        n = torch.cat([a_in, b_in], dim=-1)
        att = layer0.self_attn
        k, v = att.kv(n, cos, sin)
        out = attend(att.q(n, cos, sin), k, v, self.attention_mask(0, T, dev), att.scale)
        h = layer0.finish(residual, out)
        for i in range(1, len(self.layers)):
            h = self.layers[i].standard(h, cos, sin, self.attention_mask(i, T, dev))
        hidden = self.norm(h)
        logits = self.lm_head(hidden)
        slots = torch.arange(T - 1, T + M, device=dev)
        return self._finish(positions, hidden, logits, slots, temperature, generator)

    # -- cached path (specconv.drafters.cache) -------------------------------------------
    def _entries(self, tokens: torch.Tensor, g: torch.Tensor, start: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Entries ``start..T+K-2``: ``(embed [R, H], fc(prep(x)) [R, H], positions [R])``."""
        T, M, dev = g.shape[0], self.num_draft_tokens - 1, g.device
        ent_tokens = torch.cat([tokens[1 + start:],
                                torch.full((M,), self.mask_token_id, dtype=torch.long, device=dev)])
        x = torch.cat([g[start:], self.mask_hidden[None].expand(M, -1)], dim=0)
        positions = torch.cat([torch.arange(start, T, device=dev),
                               T - 1 + torch.arange(1, M + 1, device=dev)])
        return self.embed_tokens[ent_tokens], self.prep_fc(x), positions

    @staticmethod
    def _cached_attend(att, buf, n_in: torch.Tensor, new_ctx: int, cos: torch.Tensor,
                       sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Commit the ``new_ctx`` context rows' keys/values to ``buf``, put the mask rows'
        after them as scratch, attend the rows' queries over cached + new keys."""
        k, v = att.kv(n_in, cos, sin)
        buf.append(k[:, :new_ctx], v[:, :new_ctx])
        kk, vv = buf.with_tail(k[:, new_ctx:], v[:, new_ctx:])
        return attend_grouped(att.q(n_in, cos, sin), kk, vv, mask, att.scale)

    @torch.no_grad()
    def forward_cached(self, context_tokens: torch.Tensor, aux_hidden: torch.Tensor,
                       cache: "ContextCache", *, temperature: float = 0.0,
                       generator: torch.Generator | None = None) -> BlockOutput:
        """:meth:`forward_block` through ``cache`` (use a :class:`DraftSession`).

        Context entries attend causally among themselves, so their per-layer keys/values
        are cached; only entries from the first new (or changed-token) one on, and
        always the bonus entry ``T-1``, are run through the layers.

        Returns:
            :class:`BlockOutput` of the rows computed: context entries ``n..T-1`` then
            the ``K-1`` mask entries; ``draft_slots`` index those rows.

        Raises:
            UsageError: ``T == 0``.
        """
        tokens, g, T = self._context(context_tokens, aux_hidden)
        dev = g.device
        n = cache.reuse(T, tokens[1:], keep=T - 1)
        e, f, positions = self._entries(tokens, g, n)
        cos, sin = self.rotary(positions, self.dtype)
        layer0, new_ctx = self.layers[0], T - n
        b_in = self.hidden_norm(f)
        n_in = torch.cat([layer0.input_layernorm(e), b_in], dim=-1)
        out = self._cached_attend(layer0.self_attn, cache.layers[0], n_in, new_ctx, cos, sin,
                                  self.attention_mask_rows(0, T, n, dev))
        h = layer0.finish(b_in if self.norm_before_residual else f, out)
        for i in range(1, len(self.layers)):
            layer = self.layers[i]
            out = self._cached_attend(layer.self_attn, cache.layers[i], layer.input_layernorm(h),
                                      new_ctx, cos, sin, self.attention_mask_rows(i, T, n, dev))
            h = layer.finish(h, out)
        hidden = self.norm(h)
        slots = torch.arange(new_ctx - 1, hidden.shape[0], device=dev)
        return self._finish(positions, hidden, self.lm_head(hidden), slots, temperature, generator)

    def new_session(self) -> "DraftSession":
        """A :class:`~specconv.drafters.cache.DraftSession` (context cache) for one request."""
        return DraftSession(self)
