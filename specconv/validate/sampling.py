"""Acceptance rules of speculative decoding (greedy and T>0 rejection sampling).

Greedy: accept the longest prefix of draft tokens that equal the verifier's argmax at
the preceding position; the bonus token is the verifier argmax right after it.

T>0 (Leviathan et al. 2023; Chen et al. 2023; the same rule as z-lab's
``dflash._rejection_sample`` and vLLM's rejection sampler): draft token ``x_i`` drawn
from ``q_i`` is accepted with probability ``min(1, p_i(x_i) / q_i(x_i))`` — implemented
as ``u·q < p`` with ``u ~ U[0, 1)`` so that ``q = 0`` never divides — sequentially; at
the first rejection the next token is sampled from ``normalize(max(p_i − q_i, 0))``
(falling back to ``p_i`` when that residual is all zero); when every draft is accepted
the bonus is sampled from ``p_{k}``. The emitted sequence is then distributed exactly
as sampling from ``p`` token by token (Leviathan et al. 2023, "Fast Inference from
Transformers via Speculative Decoding", Algorithm 1; vLLM
``vllm/v1/sample/rejection_sampler.py``).
"""

from __future__ import annotations

from typing import Any


def probs_from_logits(logits, temperature: float):
    """Softmax of ``logits / temperature`` in float32 (``-inf`` entries get probability 0).

    Args:
        logits: FloatTensor[..., V].
        temperature: > 0.
    """
    import torch

    return torch.softmax(logits.float() / float(temperature), dim=-1)


def greedy_accept(draft_tokens, verifier_logits) -> tuple[int, int]:
    """Greedy acceptance for one block.

    Args:
        draft_tokens: LongTensor[k] proposed after the anchor.
        verifier_logits: FloatTensor[k+1, V]; row ``i`` predicts the token after input
            position ``i`` of ``[anchor, d_1 … d_k]``.

    Returns:
        ``(a, bonus)``: the number of accepted drafts (0…k) and the verifier's argmax
        token at row ``a``.
    """
    import torch

    target = torch.argmax(verifier_logits, dim=-1)
    k = int(draft_tokens.shape[0])
    if k == 0:
        return 0, int(target[0])
    match = (draft_tokens.to(target.device) == target[:k]).to(torch.int64)
    a = int(match.cumprod(0).sum())
    return a, int(target[a])


def speculative_sample(draft_tokens, q, p, generator=None) -> tuple[Any, Any]:
    """Batched rejection sampling (vectorised over ``N`` independent blocks).

    Args:
        draft_tokens: LongTensor[N, k] sampled from ``q``.
        q: FloatTensor[N, k, V] draft probabilities (rows sum to 1).
        p: FloatTensor[N, k+1, V] verifier probabilities; row ``k`` is the bonus row.
        generator: optional ``torch.Generator`` (on the tensors' device).

    Returns:
        ``(accepted, next_token)``: LongTensor[N] accepted counts (0…k) and LongTensor[N]
        the token emitted after the accepted drafts (residual sample or bonus).
    """
    import torch

    n, k = draft_tokens.shape
    dev = p.device
    if k == 0:
        nxt = torch.multinomial(p[:, 0], 1, generator=generator)[:, 0]
        return torch.zeros(n, dtype=torch.long, device=dev), nxt
    idx = draft_tokens[..., None]
    p_x = p[:, :k].gather(-1, idx)[..., 0]
    q_x = q.gather(-1, idx)[..., 0]
    u = torch.rand(p_x.shape, generator=generator, device=dev, dtype=p_x.dtype)
    ok = (u * q_x < p_x).to(torch.int64)
    accepted = ok.cumprod(-1).sum(-1)
    rows = torch.arange(n, device=dev)
    p_at = p[rows, accepted]  # [N, V]; row k is the bonus row
    q_pad = torch.cat([q, torch.zeros_like(q[:, :1])], dim=1)
    q_at = q_pad[rows, accepted]
    residual = (p_at - q_at).clamp_min(0)
    total = residual.sum(-1, keepdim=True)
    full = (accepted == k)[:, None]
    use_p = full | (total <= 0)
    dist = torch.where(use_p, p_at, residual / total.clamp_min(torch.finfo(residual.dtype).tiny))
    nxt = torch.multinomial(dist, 1, generator=generator)[:, 0]
    return accepted, nxt
