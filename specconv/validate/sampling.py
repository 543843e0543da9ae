"""Acceptance rules of speculative decoding: greedy prefix match, and T>0 rejection sampling.

T>0 (Leviathan et al. 2023, Algorithm 1; z-lab ``dflash._rejection_sample``; vLLM
``vllm/v1/sample/rejection_sampler.py``): accept ``x_i ~ q_i`` when ``u·q < p`` (``u ~ U[0, 1)``, no
division by ``q = 0``); at the first rejection sample ``normalize(max(p_i − q_i, 0))`` (``p_i`` when
all zero); after full acceptance the bonus comes from ``p_k``.
"""

from __future__ import annotations

from typing import Any


def probs_from_logits(logits, temperature: float):
    """Softmax of ``logits [..., V] / temperature`` (> 0) in float32 (``-inf`` → probability 0)."""
    import torch

    return torch.softmax(logits.float() / float(temperature), dim=-1)


def greedy_accept(draft_tokens, verifier_logits) -> tuple[int, int]:
    """``(a, bonus)`` for drafts ``[k]`` and verifier logits ``[k+1, V]`` of ``[anchor, d_1 … d_k]``:
    accepted drafts (0…k) and the verifier's argmax at row ``a``."""
    import torch

    target = torch.argmax(verifier_logits, dim=-1)
    k = int(draft_tokens.shape[0])
    if k == 0:
        return 0, int(target[0])
    match = (draft_tokens.to(target.device) == target[:k]).to(torch.int64)
    a = int(match.cumprod(0).sum())
    return a, int(target[a])


def speculative_sample(draft_tokens, q, p, generator=None) -> tuple[Any, Any]:
    """Rejection sampling over ``N`` blocks: drafts ``[N, k]`` from ``q [N, k, V]``, verifier ``p [N, k+1, V]``
    (row ``k``: bonus) → long ``(accepted [N], next_token [N])``."""
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
