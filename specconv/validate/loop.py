"""Speculative decoding loop (greedy and T>0) with per-step bookkeeping (``docs/validate.md``; the
order of z-lab ``dflash/model.py`` ``spec_generate``). ``drafter=None`` decodes plainly (the baseline).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import InvalidInputError
from .sampling import greedy_accept, probs_from_logits, speculative_sample

if TYPE_CHECKING:
    from .verifier_runner import VerifierRunner

log = logging.getLogger("specconv.validate")


@dataclass
class StepRecord:
    """One verify step: ``k`` drafts verified; ``accepted`` = emitted − 1 (z-lab's ``produced − 1``);
    ``accepted_raw`` before the stop/length cut; wall times in ms (CUDA synchronised); DSpark
    ``confidence`` probabilities; ``k_proposed`` before any truncation."""

    k: int
    accepted: int
    accepted_raw: int
    emitted: int
    draft_ms: float
    verify_ms: float
    confidence: list[float] | None = None
    k_proposed: int = 0


@dataclass
class RequestResult:
    """One request: ``output_ids`` include ``x_0``; ``k`` 0 for plain decoding; times in ms; ``gaps`` /
    ``top1``: the verifier's top-1 − top-2 gap and top-1 logit at each output token."""

    prompt_id: str
    prompt_tokens: int
    output_ids: list[int]
    steps: list[StepRecord]
    k: int
    ttft_ms: float
    decode_ms: float
    stopped: bool
    gaps: list[float] = field(default_factory=list)
    top1: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _module_attr(drafter, name: str, default):
    v = getattr(drafter, name, None)
    if v is not None:
        return v
    params = getattr(drafter, "parameters", None)
    if callable(params):
        try:
            p = next(iter(params()))
            return getattr(p, name)
        except StopIteration:
            pass
    return default


def _gaps(logits) -> tuple[list[float], list[float]]:
    import torch

    if logits.shape[-1] < 2:
        top = logits.max(-1).values
        return [float("inf")] * logits.shape[0], top.tolist()
    t2 = torch.topk(logits, 2, dim=-1).values
    return (t2[:, 0] - t2[:, 1]).tolist(), t2[:, 0].tolist()


def _as_probabilities(conf) -> list[float]:
    """DSpark confidence as probabilities (apply σ if the drafter returned logits)."""
    import torch

    c = conf.detach().float().flatten()
    if c.numel() and (c.min() < 0 or c.max() > 1):
        c = torch.sigmoid(c)
    return c.tolist()


def _confidence_cut(conf: list[float], threshold: float) -> int:
    """Number of leading slots whose cumulative confidence product is ≥ ``threshold``."""
    prod, n = 1.0, 0
    for c in conf:
        prod *= c
        if prod < threshold:
            break
        n += 1
    return n


@dataclass
class _LoopConfig:
    """What stays fixed over one request."""

    stops: set[int]
    greedy: bool
    temperature: float
    generator: Any
    device: Any  # the verifier's
    drafter_device: Any
    drafter_dtype: Any
    confidence_threshold: float | None


@dataclass
class _State:
    """Decode state of one request: ``s`` is the anchor position (= ``tokens[-1]``)."""

    tokens: list[int]
    out_ids: list[int]
    feats: Any  # [s, A*H] aux features of the emitted positions, or None (plain decode)
    s: int
    stopped: bool
    cache: Any = None  # the verifier's KV cache
    gaps: list[float] = field(default_factory=list)
    top1: list[float] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)


@dataclass
class _Draft:
    """One drafting step's output, cut to the ``k`` drafts that will be verified."""

    tokens: Any  # LongTensor [k] (cpu)
    k: int
    q: Any = None  # draft probabilities [k, V] for T > 0
    confidence: list[float] | None = None
    k_proposed: int = 0
    ms: float = 0.0


def speculative_generate(verifier: VerifierRunner, drafter, prompt_ids: Sequence[int], *, max_new_tokens: int,
                         temperature: float = 0.0, stop_token_ids: Iterable[int] = (),
                         num_draft_tokens: int | None = None, generator=None, confidence_threshold: float | None = None,
                         prompt_id: str = "", drafter_cache: bool = True) -> RequestResult:
    """Decode one request (``max_new_tokens`` counts ``x_0``; stop tokens are emitted, then stop).

    ``confidence_threshold``: DSpark only, verify the leading drafts whose cumulative confidence
    product is ≥ it (None: the full block). ``drafter_cache``: draft through ``drafter.new_session()``
    when offered, else stateless ``propose`` (same tokens). Raises InvalidInputError: empty prompt,
    ``max_new_tokens`` < 1, aux layer ids differing from the verifier runner's.
    """
    k = _check_request(verifier, drafter, prompt_ids, max_new_tokens, num_draft_tokens, prompt_id)
    cfg = _loop_config(verifier, drafter, temperature, stop_token_ids, generator, confidence_threshold)
    st, ttft_ms = _prefill(verifier, prompt_ids, cfg, capture=drafter is not None)
    if drafter is not None and drafter_cache and callable(getattr(drafter, "new_session", None)):
        drafter = drafter.new_session()  # one context cache per request
    decode_t0 = time.perf_counter()
    while not st.stopped and len(st.out_ids) < max_new_tokens:
        budget = max_new_tokens - len(st.out_ids)
        d = _draft(drafter, st, min(k, budget - 1), cfg)
        _verify_and_emit(verifier, st, d, budget, cfg, capture=drafter is not None)
    _sync(cfg.device)
    return RequestResult(prompt_id=prompt_id, prompt_tokens=len(prompt_ids), output_ids=st.out_ids, steps=st.steps,
                         k=k, ttft_ms=ttft_ms, decode_ms=(time.perf_counter() - decode_t0) * 1e3,
                         stopped=st.stopped, gaps=st.gaps, top1=st.top1)


def _loop_config(verifier: VerifierRunner, drafter, temperature: float, stop_token_ids, generator,
                 confidence_threshold) -> _LoopConfig:
    dev = verifier.device
    return _LoopConfig(
        stops={int(t) for t in stop_token_ids}, greedy=temperature <= 0, temperature=float(temperature),
        generator=generator, device=dev, confidence_threshold=confidence_threshold,
        drafter_device=_module_attr(drafter, "device", dev) if drafter is not None else dev,
        drafter_dtype=_module_attr(drafter, "dtype", None) if drafter is not None else None,
    )


def _check_request(verifier: VerifierRunner, drafter, prompt_ids, max_new_tokens: int, num_draft_tokens: int | None,
                   prompt_id: str) -> int:
    """Refuse an unusable request; return the drafts per step ``k`` (0 without a drafter)."""
    if len(prompt_ids) == 0:
        raise InvalidInputError(f"prompt {prompt_id!r} renders to zero tokens")
    if max_new_tokens < 1:
        raise InvalidInputError("--max-new-tokens must be at least 1")
    if drafter is None:
        return 0
    k = int(num_draft_tokens if num_draft_tokens is not None else drafter.num_draft_tokens)
    ids = list(getattr(drafter, "aux_layer_ids", verifier.aux_layer_ids))
    if ids != list(verifier.aux_layer_ids):
        raise InvalidInputError(f"drafter aux layer ids {ids} differ from the verifier runner's "
                                f"{verifier.aux_layer_ids}")
    return min(k, int(drafter.num_draft_tokens))


def _prefill(verifier: VerifierRunner, prompt_ids, cfg: _LoopConfig, *, capture: bool) -> tuple[_State, float]:
    """Step 1: the verifier on the prompt (a new KV cache), ``x_0`` from its last row; (state, TTFT ms)."""
    import torch

    cache = verifier.new_cache()
    _sync(cfg.device)
    t0 = time.perf_counter()
    pre = verifier.forward(list(prompt_ids), cache, start=0, capture=capture)
    last = pre.logits[-1:]
    if cfg.greedy:
        x0 = int(torch.argmax(last[0]))
    else:
        x0 = int(torch.multinomial(probs_from_logits(last, cfg.temperature), 1, generator=cfg.generator)[0, 0])
    _sync(cfg.device)
    ttft_ms = (time.perf_counter() - t0) * 1e3
    g, t1 = _gaps(last)
    st = _State(tokens=[int(t) for t in prompt_ids] + [x0], out_ids=[x0], feats=pre.aux, s=len(prompt_ids),
                stopped=x0 in cfg.stops, cache=cache, gaps=list(g), top1=list(t1))
    return st, ttft_ms


def _draft(drafter, st: _State, k_t: int, cfg: _LoopConfig) -> _Draft:
    """Step 2: the drafter sees tokens ``0…s`` and the features of ``0…s−1``; drafts are
    cut to the budget, to what it proposed and (DSpark) at the confidence threshold."""
    import torch

    if drafter is None or k_t <= 0:
        return _Draft(tokens=torch.zeros(0, dtype=torch.long), k=k_t)
    ctx = torch.tensor([st.tokens], dtype=torch.long, device=cfg.drafter_device)
    aux = st.feats[None]
    if cfg.drafter_dtype is not None:
        aux = aux.to(device=cfg.drafter_device, dtype=cfg.drafter_dtype)
    _sync(cfg.device)
    ta = time.perf_counter()
    with torch.inference_mode():
        prop = drafter.propose(ctx, aux, temperature=cfg.temperature, generator=cfg.generator)
    _sync(cfg.device)
    d = _Draft(tokens=prop.tokens.reshape(-1).to("cpu", torch.long), k=k_t, ms=(time.perf_counter() - ta) * 1e3)
    d.k_proposed = int(d.tokens.shape[0])
    if getattr(prop, "confidence", None) is not None:
        d.confidence = _as_probabilities(prop.confidence)
        if cfg.confidence_threshold is not None:
            d.k = min(d.k, _confidence_cut(d.confidence, cfg.confidence_threshold))
    d.k = min(d.k, d.k_proposed)
    d.tokens = d.tokens[: d.k]
    if not cfg.greedy and d.k > 0:
        d.q = probs_from_logits(prop.logits[: d.k].to(cfg.device), cfg.temperature)
    return d


def _accept(drafts, q, logits, cfg: _LoopConfig) -> tuple[int, int]:
    """Step 4: accepted drafts ``a`` and the next (bonus or correction) token."""
    import torch

    if cfg.greedy:
        return greedy_accept(drafts, logits)
    p = probs_from_logits(logits, cfg.temperature)
    if q is None:
        q = torch.zeros((0, p.shape[-1]), device=p.device)
    if q.shape[-1] != p.shape[-1]:  # drafter vocab padded/truncated vs lm_head rows
        v = p.shape[-1]
        q = q[..., :v] if q.shape[-1] > v else torch.nn.functional.pad(q, (0, v - q.shape[-1]))
        q = q / q.sum(-1, keepdim=True).clamp_min(1e-30)
    acc, nx = speculative_sample(drafts[None].to(p.device), q[None], p[None], generator=cfg.generator)
    return int(acc[0]), int(nx[0])


def _verify_and_emit(verifier: VerifierRunner, st: _State, d: _Draft, budget: int, cfg: _LoopConfig, *,
                     capture: bool) -> None:
    """Steps 3–5: verify ``[anchor, d_1 … d_k]`` at positions ``s…s+k``, accept, emit (cut at
    a stop token and the budget), crop the cache, append the emitted positions' features."""
    import torch

    _sync(cfg.device)
    tb = time.perf_counter()
    ver = verifier.forward([st.tokens[-1]] + d.tokens.tolist(), st.cache, start=st.s, capture=capture)
    logits = ver.logits  # [k+1, V]
    a, nxt = _accept(d.tokens, d.q, logits, cfg)
    _sync(cfg.device)
    verify_ms = (time.perf_counter() - tb) * 1e3
    new = d.tokens[:a].tolist() + [nxt]
    for j, t in enumerate(new):
        if t in cfg.stops:
            new = new[: j + 1]
            st.stopped = True
            break
    new = new[:budget]
    produced = len(new)
    g, t1 = _gaps(logits[:produced])
    st.gaps.extend(g)
    st.top1.extend(t1)
    st.tokens.extend(new)
    st.out_ids.extend(new)
    if st.feats is not None and ver.aux is not None:
        st.feats = torch.cat([st.feats, ver.aux[:produced].to(st.feats.device)], dim=0)
    st.s += produced
    verifier.crop(st.cache, st.s)
    st.steps.append(StepRecord(k=d.k, accepted=produced - 1, accepted_raw=a, emitted=produced, draft_ms=d.ms,
                               verify_ms=verify_ms, confidence=d.confidence, k_proposed=d.k_proposed))


def run_requests(verifier: VerifierRunner, drafter, prompts: Sequence[tuple[str, Sequence[int]]], *,
                 max_new_tokens: int, temperature: float = 0.0, stop_token_ids: Iterable[int] = (), seed: int = 0,
                 confidence_threshold: float | None = None, num_draft_tokens: int | None = None,
                 on_done: Callable[[int, RequestResult], Any] | None = None,
                 drafter_cache: bool = True) -> list[RequestResult]:
    """:func:`speculative_generate` over ``[(id, token ids)]``; at T > 0 request ``i`` gets a generator
    seeded ``seed + i`` on the verifier's device; ``on_done(i, result)`` after each."""
    import torch

    stops = list(stop_token_ids)
    results = []
    for i, (pid, ids) in enumerate(prompts):
        gen = None
        if temperature > 0:
            gen = torch.Generator(device=verifier.device).manual_seed(int(seed) + i)
        r = speculative_generate(verifier, drafter, ids, max_new_tokens=max_new_tokens, temperature=temperature,
                                 stop_token_ids=stops, generator=gen, confidence_threshold=confidence_threshold,
                                 num_draft_tokens=num_draft_tokens, prompt_id=str(pid), drafter_cache=drafter_cache)
        results.append(r)
        if on_done is not None:
            on_done(i, r)
    return results
