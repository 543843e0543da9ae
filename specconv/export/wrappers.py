"""Export wrappers: one drafting step of P-EAGLE / DFlash / DSpark as a pure function.

The "stateless" (v1) I/O contract: every call recomputes the drafter over the whole
accepted context, batch and context length are dynamic, the block is static.

Inputs (``B`` batch, ``C`` context length, ``S`` block rows, ``N`` drafts):

* ``aux_hidden`` ``[B, C, A·Ht]`` (model dtype) — the verifier's aux hidden states of
  the accepted positions, concatenated in ``aux_layer_ids`` order;
* P-EAGLE only: ``context_ids`` int32 ``[B, C]`` — the token of each context entry
  (entry ``i`` carries token ``t_{i+1}``; the last valid entry carries the bonus token);
* ``block_ids`` int32 ``[B, S]`` — DFlash/DSpark ``[anchor, mask, …, mask]``
  (``S = block_size``); P-EAGLE the ``K-1`` mask entries;
* ``ctx_position_ids`` int32 ``[B, C]``, ``block_position_ids`` int32 ``[B, S]`` — RoPE
  positions (separate inputs: ``torch.export`` allows no ``Dim + Dim`` axis);
* ``ctx_valid`` bool ``[B, C]`` — False marks padding. Rows are **left-padded** (the
  last column is the newest context position; P-EAGLE drafts from it);
* optional ``sampling_noise`` float32 ``[B, N, Vd]`` — added to the draft logits before
  ArgMax (Gumbel-max: pass ``T · Gumbel(0, 1)`` noise to sample at temperature ``T``;
  zeros = greedy).

Outputs: ``draft_ids`` int32 ``[B, N]`` (**target** ids, ``d2t`` applied in-graph),
``draft_logprobs`` float32 ``[B, N]`` (log-softmax of the draft logits at temperature 1,
at the picked id), optional ``topk_ids``/``topk_logprobs`` ``[B, N, k]``, optional
``logits`` float32 ``[B, N, Vt]`` (target vocabulary, ``-inf`` outside a pruned draft
vocabulary), DSpark ``confidence`` float32 ``[B, N]`` (sigmoid of the confidence head).

Attention uses explicit boolean masks (ONNX ``is_causal`` is upper-left aligned, wrong
for a block at the end of the context). In eager mode the wrappers compute attention
exactly as the reference drafters (``specconv.drafters.layers.attend``), so a batch-1
call reproduces ``Drafter.forward_block`` bit for bit; with ``onnx_attention=True`` (what
the exporter sets) attention is ``torch.onnx.ops.attention``, one ONNX ``Attention`` node
per layer.
"""

from __future__ import annotations

import torch
from torch import nn

from .reference import DrafterParts

__all__ = ["StepWrapper", "make_wrapper", "OUTPUT_CHOICES", "batch_inputs", "input_names"]

#: outputs a wrapper can emit (``--outputs``)
OUTPUT_CHOICES = ("ids", "logprobs", "topk", "logits", "confidence")
_NEG_INF = float("-inf")


def _rope(rotary, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched :class:`~specconv.drafters.layers.Rotary`: ``pos [B, S]`` → ``[B, 1, S, D]``."""
    freqs = pos.to(torch.float32)[..., None] * rotary.inv_freq.to(torch.float32)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos() * rotary.attention_scaling
    sin = emb.sin() * rotary.attention_scaling
    return cos.to(dtype)[:, None], sin.to(dtype)[:, None]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _heads(proj, norm, x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """``x [B, S, in]`` → ``[B, heads, S, D]`` (per-head norm when present)."""
    y = proj(x).view(x.shape[0], x.shape[1], -1, head_dim)
    if norm is not None:
        y = norm(y)
    return y.transpose(1, 2)


def _q(attn, x, cos, sin):
    q = _heads(attn.q_proj, attn.q_norm, x, attn.head_dim)
    return q * cos + _rotate_half(q) * sin


def _kv(attn, x, cos, sin):
    k = _heads(attn.k_proj, attn.k_norm, x, attn.head_dim)
    v = _heads(attn.v_proj, None, x, attn.head_dim)
    return k * cos + _rotate_half(k) * sin, v


def _attend(q, k, v, mask, scale: float, onnx_attention: bool) -> torch.Tensor:
    """GQA attention. ``q [B, nH, Sq, D]``, ``k/v [B, nKV, Sk, D]``, bool ``mask
    [B, Sq, Sk]`` (True = visible) → ``[B, Sq, nH·D]``."""
    B, Sq = q.shape[0], q.shape[2]
    if onnx_attention:
        out = torch.onnx.ops.attention(q, k, v, mask[:, None], scale=scale)[0]
    else:  # exactly specconv.drafters.layers.attend, with a leading batch axis
        n_rep = q.shape[1] // k.shape[1]
        if n_rep > 1:
            k = k.repeat_interleave(n_rep, dim=1)
            v = v.repeat_interleave(n_rep, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)) * scale
        scores = scores.masked_fill(~mask[:, None], _NEG_INF)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v)
    return out.transpose(1, 2).reshape(B, Sq, -1)


class StepWrapper(nn.Module):
    """One drafting step of a reference drafter as a batched pure function.

    Args:
        parts: from :func:`specconv.export.reference.parts_of`.
        owner: the module holding ``parts``' weights (the reference drafter).
        outputs: subset of :data:`OUTPUT_CHOICES` (``ids`` always emitted;
            ``confidence`` only for DSpark with a confidence head).
        top_k: ``k`` of the ``topk`` outputs.
        sampling_noise: take a ``sampling_noise`` input.
        onnx_attention: attention as ``torch.onnx.ops.attention`` (export) instead of the
            reference drafters' formula (eager bit-exactness).
    """

    def __init__(self, parts: DrafterParts, owner: nn.Module, *, outputs=("ids", "logprobs"),
                 top_k: int = 4, sampling_noise: bool = False, onnx_attention: bool = False):
        super().__init__()
        self.p = parts
        self.owner = owner  # registers every weight (graph initializers keep the drafter's names)
        self.top_k = int(top_k)
        self.sampling_noise = bool(sampling_noise)
        self.onnx_attention = bool(onnx_attention)
        outs = ["draft_ids"]
        if "logprobs" in outputs:
            outs.append("draft_logprobs")
        if "topk" in outputs:
            outs += ["topk_ids", "topk_logprobs"]
        if "logits" in outputs:
            outs.append("logits")
        if "confidence" in outputs and parts.extra.get("confidence_proj") is not None:
            outs.append("confidence")
        self.output_names = outs
        self.input_names = input_names(parts.algorithm, self.sampling_noise)
        if parts.draft_to_target is not None:
            self.register_buffer("d2t_ids", parts.draft_to_target.clone(), persistent=False)
        else:
            self.d2t_ids = None

    # -- pieces ---------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return self.p.embed.dtype

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.p.embed[ids.to(torch.int64)]

    def _lm_head(self, h: torch.Tensor) -> torch.Tensor:
        """LM head. Tied verifier: ``linear`` on a 2-D view, which the exporter emits as
        ``Gemm(transB=1)`` on the embedding itself, so the graph stores the weight once
        (a 3-D ``linear`` becomes ``MatMul`` with a folded, second, transposed copy)."""
        if not self.p.tied_head:
            return self.p.lm_head(h)
        flat = torch.nn.functional.linear(h.reshape(-1, h.shape[-1]), self.p.embed)
        return flat.reshape(*h.shape[:-1], flat.shape[-1])

    def _to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return ids if self.d2t_ids is None else self.d2t_ids[ids]

    def _target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        if self.d2t_ids is None:
            return logits
        out = logits.new_full((*logits.shape[:-1], self.p.vocab_size), _NEG_INF)
        out[..., self.d2t_ids] = logits
        return out

    def _dflash_hidden(self, aux, block_ids, ctx_pos, blk_pos, ctx_valid) -> torch.Tensor:
        """DFlash backbone over the block: ``norm(h)`` ``[B, S, H]``."""
        p = self.p
        c = p.hidden_norm(p.fc(aux))
        h = self._embed(block_ids)
        cos_c, sin_c = _rope(p.rotary, ctx_pos, self.dtype)
        cos_b, sin_b = _rope(p.rotary, blk_pos, self.dtype)
        S = block_ids.shape[1]
        for i, layer in enumerate(p.layers):
            a = layer.self_attn
            n = layer.input_layernorm(h)
            q = _q(a, n, cos_b, sin_b)
            kc, vc = _kv(a, c, cos_c, sin_c)
            kb, vb = _kv(a, n, cos_b, sin_b)
            k = torch.cat([kc, kb], dim=2)
            v = torch.cat([vc, vb], dim=2)
            mask = self._dflash_mask(i, ctx_pos, blk_pos, ctx_valid, S)
            h = layer.finish(h, _attend(q, k, v, mask, a.scale, self.onnx_attention))
        return p.norm(h)

    def _dflash_mask(self, layer: int, ctx_pos, blk_pos, ctx_valid, S: int) -> torch.Tensor:
        """Bool ``[B, S, C+S]``: block queries over ``[context, block]`` keys."""
        W = self.p.swa[layer]
        ctx_vis = ctx_valid[:, None, :].expand(-1, S, -1)
        blk = torch.ones(S, S, dtype=torch.bool, device=ctx_pos.device)
        if W is not None:
            anchor = blk_pos[:, :1, None]  # a = T: context keys at positions >= a - W
            ctx_vis = ctx_vis & (ctx_pos[:, None, :] >= anchor - W)
            if not self.p.non_causal_swa:
                blk = torch.tril(blk)
        blk_vis = blk[None].expand(ctx_pos.shape[0], -1, -1)
        return torch.cat([ctx_vis, blk_vis], dim=2)

    def _select(self, logits: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        """ArgMax of ``logits [B, Vd]`` (+ noise) → draft-vocab ids ``[B]``."""
        scores = logits.to(torch.float32)
        if noise is not None:
            scores = scores + noise
        return torch.argmax(scores, dim=-1)

    def _heads_out(self, draft_logits: torch.Tensor, draft_ids: torch.Tensor,
                   confidence: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        lp = None
        outs: list[torch.Tensor] = [self._to_target(draft_ids).to(torch.int32)]
        if len(self.output_names) > 1:
            lp = torch.log_softmax(draft_logits.to(torch.float32), dim=-1)
        for name in self.output_names[1:]:
            if name == "draft_logprobs":
                outs.append(torch.gather(lp, -1, draft_ids[..., None])[..., 0])
            elif name == "topk_ids":
                tv, ti = torch.topk(lp, self.top_k, dim=-1)
                outs += [self._to_target(ti).to(torch.int32), tv]
            elif name == "logits":
                outs.append(self._target_logits(draft_logits.to(torch.float32)))
            elif name == "confidence":
                outs.append(confidence)
        return tuple(outs)

    # -- algorithms -------------------------------------------------------------------
    def _dflash(self, aux, block_ids, ctx_pos, blk_pos, ctx_valid, noise):
        p = self.p
        hidden = self._dflash_hidden(aux, block_ids, ctx_pos, blk_pos, ctx_valid)
        logits = self._lm_head(hidden)[:, p.draft_slots[0]:p.draft_slots[-1] + 1]
        if p.algorithm == "dspark":
            return self._dspark(hidden, logits, block_ids, noise)
        scores = logits.to(torch.float32)
        if noise is not None:
            scores = scores + noise
        ids = torch.argmax(scores, dim=-1)
        return self._heads_out(logits, ids, None)

    def _dspark(self, hidden, logits, block_ids, noise):
        """Markov head unrolled over the static block (each slot sees the previous pick)."""
        p = self.p
        w1, bias_fn = p.extra["markov_w1"], p.extra["markov_bias"]
        proj = p.extra["confidence_proj"]
        prev = block_ids[:, 0].to(torch.int64)
        rows, picks, confs = [], [], []
        for s, k in enumerate(p.draft_slots):
            out_k = hidden[:, k]
            row = logits[:, s]
            e = None
            if w1 is not None:
                e = w1[prev]
                row = row + bias_fn(out_k, e)
            y = self._select(row, None if noise is None else noise[:, s])
            if proj is not None and "confidence" in self.output_names:
                feat = torch.cat([out_k, e], dim=-1) if p.extra["confidence_with_markov"] else out_k
                w_ = proj.weight.to(torch.float32)
                b_ = proj.bias.to(torch.float32)
                confs.append(torch.sigmoid((feat.to(torch.float32) @ w_[0]) + b_[0]))
            rows.append(row)
            picks.append(y)
            prev = self._to_target(y)
        conf = torch.stack(confs, dim=1) if confs else None
        return self._heads_out(torch.stack(rows, dim=1), torch.stack(picks, dim=1), conf)

    def _peagle(self, aux, ctx_ids, block_ids, ctx_pos, blk_pos, ctx_valid, noise):
        p = self.p
        B, C = ctx_ids.shape
        M = block_ids.shape[1]
        x = torch.cat([aux, p.extra["mask_hidden"].expand(B, M, -1)], dim=1)
        e = self._embed(torch.cat([ctx_ids, block_ids], dim=1))
        f = p.extra["prep_fc"](x)
        pos = torch.cat([ctx_pos, blk_pos], dim=1)
        cos, sin = _rope(p.rotary, pos, self.dtype)
        layer0 = p.layers[0]
        a_in = layer0.input_layernorm(e)
        b_in = p.hidden_norm(f)
        residual = b_in if p.extra["norm_before_residual"] else f
        n = torch.cat([a_in, b_in], dim=-1)
        att = layer0.self_attn
        k, v = _kv(att, n, cos, sin)
        out = _attend(_q(att, n, cos, sin), k, v, self._peagle_mask(0, ctx_pos, blk_pos, ctx_valid),
                      att.scale, self.onnx_attention)
        h = layer0.finish(residual, out)
        for i in range(1, len(p.layers)):
            lay = p.layers[i]
            nn_ = lay.input_layernorm(h)
            a = lay.self_attn
            kk, vv = _kv(a, nn_, cos, sin)
            mask = self._peagle_mask(i, ctx_pos, blk_pos, ctx_valid)
            h = lay.finish(h, _attend(_q(a, nn_, cos, sin), kk, vv, mask, a.scale, self.onnx_attention))
        logits = self._lm_head(p.norm(h[:, C - 1:]))  # bonus entry (last column) + mask entries
        scores = logits.to(torch.float32)
        if noise is not None:
            scores = scores + noise
        return self._heads_out(logits, torch.argmax(scores, dim=-1), None)

    def _peagle_mask(self, layer: int, ctx_pos, blk_pos, ctx_valid) -> torch.Tensor:
        """Bool ``[B, C+M, C+M]`` (speculators ``peagle/attention.py`` semantics)."""
        W = self.p.swa[layer]
        B, C = ctx_pos.shape
        M = blk_pos.shape[1]
        anchor_m = blk_pos[:, :1] - 1  # mask entries belong to the rollout anchored at T-1
        q_anchor = torch.cat([ctx_pos, anchor_m.expand(-1, M)], dim=1)  # [B, C+M]
        q_pos = torch.cat([ctx_pos, blk_pos], dim=1)
        ctx_key = ctx_valid[:, None, :] & (ctx_pos[:, None, :] <= q_anchor[:, :, None])
        if W is not None:
            ctx_key = ctx_key & (ctx_pos[:, None, :] > q_pos[:, :, None] - W)
        eye_c = torch.eye(C, dtype=torch.bool, device=ctx_pos.device)[None].expand(B, -1, -1)
        top = torch.cat([ctx_key[:, :C] | eye_c, torch.zeros(B, C, M, dtype=torch.bool,
                                                             device=ctx_pos.device)], dim=2)
        tri = torch.tril(torch.ones(M, M, dtype=torch.bool, device=ctx_pos.device))
        bottom = torch.cat([ctx_key[:, C:], tri[None].expand(B, -1, -1)], dim=2)
        return torch.cat([top, bottom], dim=1)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Run one step; inputs in :attr:`input_names` order, outputs in
        :attr:`output_names` order."""
        if self.p.algorithm == "peagle":
            aux, ctx_ids, block_ids, ctx_pos, blk_pos, ctx_valid, *rest = inputs
            return self._peagle(aux, ctx_ids, block_ids, ctx_pos, blk_pos, ctx_valid,
                                rest[0] if rest else None)
        aux, block_ids, ctx_pos, blk_pos, ctx_valid, *rest = inputs
        return self._dflash(aux, block_ids, ctx_pos, blk_pos, ctx_valid, rest[0] if rest else None)


def input_names(algorithm: str, sampling_noise: bool) -> list[str]:
    """Graph input names of a wrapper, in positional order."""
    names = ["aux_hidden"] + (["context_ids"] if algorithm == "peagle" else []) + [
        "block_ids", "ctx_position_ids", "block_position_ids", "ctx_valid"]
    return names + (["sampling_noise"] if sampling_noise else [])


def make_wrapper(drafter, **kw) -> StepWrapper:
    """:class:`StepWrapper` of a loaded reference drafter (``kw`` as its constructor)."""
    from .reference import parts_of

    return StepWrapper(parts_of(drafter), drafter, **kw).eval()


def batch_inputs(parts: DrafterParts, requests: list[tuple[torch.Tensor, torch.Tensor]], *,
                 sampling_noise: bool = False, pad_to: int | None = None) -> tuple[torch.Tensor, ...]:
    """Wrapper inputs for a batch of requests (left-padded to a common context length).

    Args:
        parts: the drafter's parts.
        requests: per request ``(context_tokens [T+1] int, aux_hidden [T, A·Ht])`` in the
            :meth:`~specconv.drafters.Drafter.propose` convention (token ``T`` is the
            anchor / bonus token).
        sampling_noise: append a zero ``sampling_noise`` input (greedy).
        pad_to: context length ``C`` (default: the longest request).

    Returns:
        Tensors in :func:`input_names` order.
    """
    B = len(requests)
    C = pad_to or max(int(a.shape[0]) for _, a in requests)
    S = parts.block_size if parts.algorithm != "peagle" else parts.num_draft_tokens - 1
    dt = parts.embed.dtype
    aux = torch.zeros(B, C, parts.aux_width, dtype=dt)
    ctx_ids = torch.zeros(B, C, dtype=torch.int32)
    ctx_pos = torch.zeros(B, C, dtype=torch.int32)
    valid = torch.zeros(B, C, dtype=torch.bool)
    blk_ids = torch.full((B, S), parts.mask_token_id, dtype=torch.int32)
    blk_pos = torch.zeros(B, S, dtype=torch.int32)
    for b, (tok, a) in enumerate(requests):
        tok = tok.reshape(-1)
        T = int(a.shape[0])
        aux[b, C - T:] = a.to(dt)
        ctx_ids[b, C - T:] = tok[1:T + 1].to(torch.int32)
        ctx_pos[b, C - T:] = torch.arange(T, dtype=torch.int32)
        valid[b, C - T:] = True
        if parts.algorithm == "peagle":
            blk_pos[b] = T + torch.arange(S, dtype=torch.int32)  # depth j at T-1+j, j>=1
        else:
            blk_ids[b, 0] = int(tok[T])
            blk_pos[b] = T + torch.arange(S, dtype=torch.int32)
    out = [aux] + ([ctx_ids] if parts.algorithm == "peagle" else []) + [blk_ids, ctx_pos, blk_pos, valid]
    if sampling_noise:
        out.append(torch.zeros(B, parts.num_draft_tokens, parts.draft_vocab_size))
    return tuple(out)
