"""Reference DFlash2 drafter (``speculators_model_type: "dflash2"``).

DFlash (:mod:`specconv.drafters.dflash`) plus two modules (z-lab ``dflash`` 0.1.0 ``dflash/model.py``
``GroupedDynamicCausalConv``, ``CandidateSelector``, ``Qwen3DFlashDecoderLayer.forward``; speculators 0.9.0
``src/speculators/models/dflash2/model_definitions.py``; vLLM 0.33 ``models/qwen3_dflash2.py``):

* per layer, a grouped dynamic causal convolution around self-attention and one around the MLP:
  ``n = input_layernorm(h)``; ``u = conv(n, base[0], δ[0])`` with ``δ = kernel_projection(n)``
  (``[S, 2, k, G]``); queries and the block's keys/values come from ``u`` (the context's do not pass
  through it); ``h = h + conv(o_proj(attn), base[1], δ[1])``; the same around the MLP with
  ``post_attention_layernorm``. ``conv(x, base, δ)[t, c] = Σ_τ (base[τ, c] + δ[t, τ, c // g]) · x[t - τ, c]``
  over the block's slots only (``x`` before slot 0 is zero);
* a candidate selector over the drafted slots ``j = 1..B-1``: candidates ``C_j = top-K(ℓ_j)`` of the
  unary logits, score ``s_j(p, c) = ℓ_j[c] + Σ_r P[p, r] · (W_h y_j)[r] · S[c, r]`` (``y_j`` the normed
  hidden), walked greedily from the anchor: ``p_1`` = the anchor, ``d_j`` = the pick over ``C_j``
  (argmax at T = 0, a draw from ``softmax(s_j / T)`` over ``C_j`` otherwise), ``p_{j+1} = d_j``.
  The draft's logits row is ``s_j`` at the candidates and ``-inf`` elsewhere (the q of rejection
  sampling). Scores are computed in fp32 (vLLM's walk scores in fp32).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from ..errors import InvalidInputError, UnsupportedFormatError
from .dflash import DFlashDrafter
from .layers import Attend, DecoderLayer, Linear, WeightTaker
from .step import StepBatch, StepOutput

if TYPE_CHECKING:  # pragma: no cover
    from ..format import DFlash2Config
    from ..verifier import Verifier
    from .step import Pick

__all__ = ["DFlash2Drafter", "GroupedConv"]


class GroupedConv(nn.Module):
    """One grouped dynamic causal convolution pair (``prepare`` on the sublayer input, ``finish`` on its
    output): ``base_kernel [2, k, H]``, ``kernel_projection.weight [2·k·G, H]`` with ``G = H / g``."""

    def __init__(self, w: WeightTaker, prefix: str, hidden: int, kernel: int, group: int):
        super().__init__()
        self.kernel, self.group, self.groups = kernel, group, hidden // group
        self.base_kernel = nn.Parameter(w.take(f"{prefix}.base_kernel", (2, kernel, hidden)), requires_grad=False)
        shape = (2 * kernel * self.groups, hidden)
        self.kernel_projection = Linear(w.take(f"{prefix}.kernel_projection.weight", shape))

    def _convolve(self, x: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        """``x [B, S, H]``, ``dynamic [B, S, k, G]`` (by output slot), ``base [k, H]`` → ``[B, S, H]``."""
        Bn, S, H = x.shape
        blocks = x.view(Bn, S, self.groups, self.group)
        out = torch.zeros_like(blocks)
        for tap in range(min(self.kernel, S)):
            shifted = blocks if tap == 0 else torch.cat([blocks.new_zeros(Bn, tap, self.groups, self.group),
                                                         blocks[:, :S - tap]], dim=1)
            weight = base[tap].view(1, 1, self.groups, self.group).to(x.dtype) + dynamic[:, :, tap, :, None]
            out = out + weight * shifted
        return out.view(Bn, S, H)

    def prepare(self, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``n [B, S, H]`` → (the input-side convolution of ``n``, the output side's dynamic taps ``[B, S, k, G]``)."""
        dynamic = self.kernel_projection(n).view(*n.shape[:-1], 2, self.kernel, self.groups)
        return self._convolve(n, dynamic[:, :, 0], self.base_kernel[0]), dynamic[:, :, 1]

    def finish(self, y: torch.Tensor, dynamic: torch.Tensor) -> torch.Tensor:
        """The output-side convolution of the sublayer output ``y [B, S, H]``."""
        return self._convolve(y, dynamic, self.base_kernel[1])


def _check(config: DFlash2Config, source: str, hidden: int, block_size: int, vocab: int, draft_vocab: int) -> None:
    """The constraints speculators 0.9.0 enforces (``dflash2/core.py`` 37-48, ``model_definitions.py`` 117-125)."""
    k, g, R, K = config.conv_kernel_size, config.conv_group_size, config.selector_rank, config.selector_top_k
    bad = [f"{name}={v!r} must be >= 1" for name, v in (("conv_kernel_size", k), ("conv_group_size", g),
                                                       ("selector_rank", R), ("selector_top_k", K)) if v < 1]
    if not bad and hidden % g:
        bad.append(f"hidden_size {hidden} is not a multiple of conv_group_size {g}")
    if not bad and k > block_size:
        bad.append(f"conv_kernel_size {k} exceeds block_size {block_size}")
    if not bad and K > vocab:
        bad.append(f"selector_top_k {K} exceeds the vocabulary ({vocab})")
    if draft_vocab != vocab:
        bad.append(f"draft_vocab_size {draft_vocab} != vocab_size {vocab} (DFlash2 drafts over the full vocabulary)")
    if bad:
        raise InvalidInputError(f"{source}: " + "; ".join(bad), code="config_key")


class DFlash2Drafter(DFlashDrafter):
    """DFlash2 reference drafter. Build with :func:`specconv.drafters.load_drafter`."""

    algorithm = "dflash2"

    def __init__(self, config: DFlash2Config, w: WeightTaker, verifier: Verifier | None, source: str):
        super().__init__(config, w, verifier, source)
        if self.sample_from_anchor:
            raise UnsupportedFormatError(
                f"{source}: sample_from_anchor is true: DFlash2 drafts slots 1..B-1 from the anchor (z-lab "
                "dflash_generate; vLLM 0.33 raises for it)", format_id="dflash2_sample_from_anchor")
        H, V = self.hidden_size, self.vocab_size
        _check(config, source, H, self.block_size, V, self.draft_vocab_size)
        k, g = config.conv_kernel_size, config.conv_group_size
        self.attention_convs = nn.ModuleList(
            [GroupedConv(w, f"layers.{i}.attention_conv", H, k, g) for i in range(len(self.layers))])
        self.mlp_convs = nn.ModuleList(
            [GroupedConv(w, f"layers.{i}.mlp_conv", H, k, g) for i in range(len(self.layers))])
        R, self.top_k = config.selector_rank, config.selector_top_k
        self.hidden_projection = Linear(w.take("candidate_selector.hidden_projection.weight", (R, H)))
        self.predecessor_codebook = nn.Parameter(w.take("candidate_selector.predecessor_codebook", (V, R)),
                                                 requires_grad=False)
        self.successor_codebook = nn.Parameter(w.take("candidate_selector.successor_codebook", (V, R)),
                                               requires_grad=False)

    def _layer(self, i: int, layer: DecoderLayer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               keys, mask: torch.Tensor, attention: Attend) -> torch.Tensor:
        """Layer ``i`` with its two convolutions (module doc) over the block ``h [B, S, H]``."""
        a = layer.self_attn
        conv_a, conv_m = cast(GroupedConv, self.attention_convs[i]), cast(GroupedConv, self.mlp_convs[i])
        u, dyn = conv_a.prepare(layer.input_layernorm(h))
        k, v = keys(*a.kv(u, cos, sin))
        h = h + conv_a.finish(a.o_proj(attention(a.q(u, cos, sin), k, v, mask, a.scale)), dyn)
        u, dyn = conv_m.prepare(layer.post_attention_layernorm(h))
        return h + conv_m.finish(layer.mlp(u), dyn)

    def _block_pass(self, batch: StepBatch, keys, attention: Attend) -> torch.Tensor:
        """The block through every layer with its convolutions → ``norm(h) [B, S, H]``."""
        h = self._embed(batch.block_ids)
        cos, sin = self.rotary(batch.block_position_ids, self.dtype)
        for i, layer in enumerate(self.layers):
            h = self._layer(i, layer, h, cos, sin, keys(i), self.block_mask(i, batch), attention)
        return self.norm(h)

    def _draft(self, out: StepOutput, batch: StepBatch, pick: Pick, confidence: bool,
               prev_tokens: torch.Tensor | None) -> StepOutput:
        """The selector's walk (module doc) over the draft rows ``first_row..+N-1``; ``prev_tokens [B, N]``
        forces the predecessors (teacher forcing, as speculators trains). InvalidInputError: wrong ``N``."""
        N, first = int(self.num_draft_tokens), out.first_row
        if prev_tokens is not None and prev_tokens.shape[-1] != N:
            raise InvalidInputError(f"prev_tokens must have {N} entries")
        logits = out.slot_logits[:, first:first + N].to(torch.float32)
        unary, candidates = torch.topk(logits, self.top_k, dim=-1)
        projected = self.hidden_projection(out.hidden[:, first:first + N]).to(torch.float32)
        successors = self.successor_codebook[candidates].to(torch.float32)  # [B, N, K, R]
        prev = batch.block_ids[:, 0].to(torch.int64)
        rows, picks = [], []
        for s in range(N):
            if prev_tokens is not None:
                prev = prev_tokens[:, s].to(torch.int64)
            bilinear = (self.predecessor_codebook[prev].to(torch.float32) * projected[:, s])[:, None, :]
            scores = unary[:, s] + (bilinear * successors[:, s]).sum(-1)
            row = torch.full_like(logits[:, s], float("-inf")).scatter(-1, candidates[:, s], scores)
            y = pick(row, s)
            rows.append(row)
            picks.append(y)
            prev = y.to(torch.int64)
        out.draft_logits, out.draft_ids = torch.stack(rows, dim=1), torch.stack(picks, dim=1)
        return out
