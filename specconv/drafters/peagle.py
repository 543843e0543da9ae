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
pre-norm decoder layers; what an entry attends to: :meth:`PEagleDrafter.entry_mask`. qwen3
layers have per-head ``q_norm``/``k_norm``; llama layers do not. ``logits = lm_head(norm(h))``;
drafts from the bonus entry (row ``T-1``) and the mask entries, mapped with ``d2t``.

The stateless step and the cached session (new entries only) run the same :meth:`_entry_pass`.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch

from ..errors import InvalidInputError, UsageError
from .base import BlockOutput, Drafter
from .cache import ContextCache, DraftSession, KVBuffer
from .layers import Attend, Keys, Linear, RMSNorm, WeightTaker, attend_grouped, own_keys
from .step import StepBatch, StepOutput, sample_pick

if TYPE_CHECKING:  # pragma: no cover
    from ..format import PEagleConfig
    from ..verifier import Verifier

__all__ = ["PEagleDrafter"]


def _commit_context(buf: KVBuffer, new_ctx: int, k: torch.Tensor, v: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The cached path's :data:`~.layers.Keys`: commit the first ``new_ctx`` rows, the mask entries as scratch."""
    buf.append(k[:, :, :new_ctx], v[:, :, :new_ctx])
    return buf.with_tail(k[:, :, new_ctx:], v[:, :, new_ctx:])


class PEagleDrafter(Drafter):
    """P-EAGLE reference drafter. Build with :func:`specconv.drafters.load_drafter`."""

    algorithm = "peagle"

    def __init__(self, config: PEagleConfig, w: WeightTaker, verifier: Verifier | None, source: str):
        super().__init__(config, w, verifier, source)
        st = config.speculative_tokens
        if st < 1:
            raise InvalidInputError(
                f"{source}: speculators_config.proposal_methods[0].speculative_tokens must be >= 1 "
                f"for P-EAGLE (number of depths K), got {st}", code="config_key")
        self.block_size = self.num_draft_tokens = st
        self.norm_before_residual = bool(config.norm_before_residual)
        if config.norm_before_fc and config.fc_norm:
            raise InvalidInputError(f"{source}: norm_before_fc and fc_norm are mutually exclusive",
                                    code="config_key")
        if self.alg.trains_embedding and not w.has("embed_tokens.weight"):
            warnings.warn(f"{source}: P-EAGLE without embed_tokens.weight; using the verifier's "
                          "embedding (P-EAGLE normally trains its own)", stacklevel=2)
        H, A, Ht, eps = (self.hidden_size, len(self.aux_layer_ids), self.aux_hidden_size,
                         config.transformer_layer_config.rms_norm_eps)
        self.fc = Linear(w.take("fc.weight", (H, A * Ht)))
        self.input_norm = RMSNorm(w.take("input_norm.weight", (A * Ht,)), eps) if config.norm_before_fc else None
        self.fc_norm = (torch.nn.ModuleList([RMSNorm(w.take(f"fc_norm.{i}.weight", (Ht,)), eps) for i in range(A)])
                        if config.fc_norm else None)
        if not w.has("mask_hidden"):
            raise InvalidInputError(
                f"{source}: mask_hidden is required for P-EAGLE (speculators would "
                "random-initialise it; vLLM refuses)", code="missing_tensor")
        self.mask_hidden = torch.nn.Parameter(
            w.take("mask_hidden", (1, 1, A * Ht)).reshape(A * Ht), requires_grad=False)
        self.hidden_norm = RMSNorm(w.take("layers.0.hidden_norm.weight", (H,)), eps)

    def prep_fc(self, x: torch.Tensor) -> torch.Tensor:
        """``fc(prep(x))`` for ``x [B, S, A*H]`` (aux concat or ``mask_hidden``)."""
        if self.input_norm is not None:
            x = self.input_norm(x)
        if self.fc_norm is not None:
            chunks = x.chunk(len(self.fc_norm), dim=-1)
            x = torch.cat([n(c) for n, c in zip(self.fc_norm, chunks, strict=True)], dim=-1)
        return self.fc(x)

    @staticmethod
    def entries(batch: StepBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(positions, depth, valid)`` each ``[B, C+M]`` of the context entries then the
        mask entries (depth 0 = a context entry; mask entry ``j`` has depth ``j``)."""
        B, M = batch.block_ids.shape
        pos = torch.cat([batch.ctx_position_ids, batch.block_position_ids], dim=1)
        depth = torch.cat([torch.zeros_like(batch.ctx_position_ids),
                           torch.arange(1, M + 1, dtype=pos.dtype, device=pos.device).expand(B, M)], dim=1)
        valid = torch.cat([batch.ctx_valid, torch.ones(B, M, dtype=torch.bool, device=pos.device)], dim=1)
        return pos, depth, valid

    def entry_mask(self, layer: int, pos: torch.Tensor, depth: torch.Tensor, valid: torch.Tensor,
                   q_from: int = 0) -> torch.Tensor:
        """Bool ``[B, R - q_from, R]``: queries from entry ``q_from`` on over every entry
        (speculators ``peagle/attention.py``: a context key anchored at or before the query's
        anchor, inside the window on SWA layers, or an earlier entry of the query's own
        rollout; padding keys never, and every row sees itself, so padding rows stay finite)."""
        W = self.windows[layer]
        anchor = pos - depth  # context: own position; mask entries: T-1
        qa, ka = anchor[:, q_from:, None], anchor[:, None, :]
        qd, kd = depth[:, q_from:, None], depth[:, None, :]
        ctx_key = (kd == 0) & (ka <= qa)
        if W is not None:
            ctx_key = ctx_key & (ka > pos[:, q_from:, None] - W)
        idx = torch.arange(pos.shape[1], device=pos.device)
        own = idx[q_from:, None] == idx[None, :]
        return (valid[:, None, :] & (ctx_key | ((qa == ka) & (kd <= qd)))) | own

    def _entry_pass(self, batch: StepBatch, q_from: int, keys, attention: Attend
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Entries ``q_from..`` through every layer → ``(h [B, R - q_from, H]`` before the final norm,
        ``positions [B, R - q_from])``; ``keys(i)``: layer ``i``'s :data:`~.layers.Keys`."""
        pos, depth, valid = self.entries(batch)
        new = batch.context_from(q_from)
        assert new.context_ids is not None, "P-EAGLE's step inputs include context_ids"
        B, M = new.block_ids.shape
        e = self._embed(torch.cat([new.context_ids, new.block_ids], dim=1))
        f = self.prep_fc(torch.cat([new.aux_hidden, self.mask_hidden.expand(B, M, -1)], dim=1))
        cos, sin = self.rotary(pos[:, q_from:], self.dtype)
        layer0 = self.layers[0]
        b_in = self.hidden_norm(f)
        x = torch.cat([layer0.input_layernorm(e), b_in], dim=-1)
        h = layer0.attend(x, b_in if self.norm_before_residual else f, cos, sin, keys(0),
                          self.entry_mask(0, pos, depth, valid, q_from), attention)
        for i in range(1, len(self.layers)):
            layer = self.layers[i]
            h = layer.attend(layer.input_layernorm(h), h, cos, sin, keys(i),
                             self.entry_mask(i, pos, depth, valid, q_from), attention)
        return h, pos[:, q_from:]

    def _backbone(self, batch: StepBatch, attention: Attend, all_rows: bool) -> StepOutput:
        """The stateless entry pass; the LM head runs on the bonus entry (the last context
        column) and the mask entries, or on every entry (``all_rows``)."""
        h, pos = self._entry_pass(batch, 0, lambda i: own_keys, attention)
        C = batch.aux_hidden.shape[1]
        first = 0 if all_rows else C - 1
        hidden = self.norm(h[:, first:])
        return StepOutput(positions=pos[:, first:], hidden=hidden, slot_logits=self._logits(hidden),
                          first_row=C - 1 - first)

    def _check_inputs(self, context_tokens: torch.Tensor, aux_hidden: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`Drafter._check_inputs`; ``UsageError`` when ``T == 0``."""
        tokens, g = super()._check_inputs(context_tokens, aux_hidden)
        if g.shape[0] < 1:
            raise UsageError("P-EAGLE needs at least one context position (T >= 1)")
        return tokens, g

    @torch.no_grad()
    def forward_cached(self, context_tokens: torch.Tensor, aux_hidden: torch.Tensor,
                       cache: ContextCache, *, temperature: float = 0.0,
                       generator: torch.Generator | None = None) -> BlockOutput:
        """:meth:`forward_block` through ``cache``: only entries from the first new (or changed-token)
        one, and always the bonus entry ``T-1``, run; rows: entries ``n..T-1`` then the ``K-1`` mask
        entries. UsageError when ``T == 0``."""
        tokens, g = self._check_inputs(context_tokens, aux_hidden)
        T = g.shape[0]
        n = cache.reuse(T, tokens[1:], keep=T - 1)
        batch = self._request(tokens, g)

        def keys(i: int) -> Keys:
            return lambda k, v: _commit_context(cache.layers[i], T - n, k, v)

        h, pos = self._entry_pass(batch, n, keys, attend_grouped)
        hidden = self.norm(h)
        out = StepOutput(positions=pos, hidden=hidden, slot_logits=self._logits(hidden), first_row=T - n - 1)
        return self._block_output(self._draft(out, batch, sample_pick(temperature, generator), True, None))

    def new_session(self) -> DraftSession:
        """A :class:`~specconv.drafters.cache.DraftSession` (context cache) for one request."""
        return DraftSession(self)
