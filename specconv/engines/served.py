"""The generic part of a served check (vLLM, ``llama-server``): the prompts sent between two scrapes of
``/metrics``, the speculative counters parsed by the engine's series names, their difference, τ from
it, and how two greedy outputs agree. The gates are ``specconv.validate``'s. Standard library only.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import InvalidInputError
from .counts import metrics_from_counts

__all__ = ["SPEC_KEYS", "CounterNames", "counter_metrics", "diff_counters", "first_divergence", "measure",
           "measure_each", "parse_counters", "settled", "token_agreement"]

#: The speculative counters every served engine exports (vLLM's names for them).
SPEC_KEYS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")

_LINE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\d+)?\s*$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
R = TypeVar("R")


@dataclass(frozen=True)
class CounterNames:
    """The ``/metrics`` series (without the optional ``_total``) of an engine's counters: ``counters``
    (series → one of :data:`SPEC_KEYS`), ``per_position`` (labelled ``position="i"``) and ``traffic``
    (series of all the server's work → a key of its own)."""

    counters: Mapping[str, str]
    per_position: str
    traffic: Mapping[str, str] = field(default_factory=dict)


def parse_counters(text: str, names: CounterNames) -> dict[str, Any]:
    """The speculative counters of a ``/metrics`` page (Prometheus text).

    Returns:
        ``{num_drafts, num_draft_tokens, num_accepted_tokens, accepted_per_pos: list,
        spec_counters: bool}`` (floats, summed over label sets; ``accepted_per_pos`` in
        ``position`` order; ``spec_counters``: the page has one of ``names.counters`` at all) plus
        each ``names.traffic`` key the page has. ``*_created`` series and unreadable lines are skipped.
    """
    out: dict[str, Any] = {v: 0.0 for v in names.counters.values()}
    out["spec_counters"] = False
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        line = line.strip()
        m = _LINE.match(line) if line and not line.startswith("#") else None
        if not m or m.group("name").endswith("_created"):
            continue
        name = m.group("name")
        base = name[: -len("_total")] if name.endswith("_total") else name
        try:
            val = float(m.group("value"))
        except ValueError:
            continue
        if base in names.counters:
            out[names.counters[base]] += val
            out["spec_counters"] = True
        elif base in names.traffic:
            out[names.traffic[base]] = out.get(names.traffic[base], 0.0) + val
        elif base == names.per_position:
            pos = int(dict(_LABEL.findall(m.group("labels") or "")).get("position", 0))
            per_pos[pos] = per_pos.get(pos, 0.0) + val
    out["accepted_per_pos"] = [per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)] if per_pos else []
    return out


def diff_counters(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """``after − before`` for the :data:`SPEC_KEYS` and ``accepted_per_pos`` of two
    :func:`parse_counters` scrapes (a position ``before`` lacks counts from 0)."""
    out: dict[str, Any] = {k: after[k] - before.get(k, 0.0) for k in SPEC_KEYS}
    a, b = after.get("accepted_per_pos", []), before.get("accepted_per_pos", [])
    out["accepted_per_pos"] = [a[i] - (b[i] if i < len(b) else 0.0) for i in range(len(a))]
    return out


def counter_metrics(diff: Mapping[str, Any]) -> dict:
    """τ, α, p_i, c_i of a counter difference (:func:`diff_counters`), by the torch harness's
    definitions (:func:`specconv.engines.counts.metrics_from_counts`)."""
    return metrics_from_counts(diff["num_drafts"], diff["num_draft_tokens"], diff["num_accepted_tokens"],
                               diff["accepted_per_pos"])


def settled(read: Callable[[], dict], timeout: float = 15.0) -> dict:
    """Call ``read`` (one parsed ``/metrics`` scrape) until two consecutive scrapes agree, at
    most ``timeout`` seconds (an engine that publishes its counters asynchronously, a little
    after the answers: vLLM)."""
    t0 = time.monotonic()
    last = read()
    while time.monotonic() - t0 < timeout:
        time.sleep(1.0)
        cur = read()
        if cur == last:
            return cur
        last = cur
    return last


def measure(read: Callable[[], dict], send: Callable[[], R], *,
            settle: Callable[[Callable[[], dict]], dict] | None = None) -> tuple[R, dict, dict]:
    """Counters before, ``send()`` (the run's requests), counters after (through ``settle``,
    e.g. :func:`settled`, when the engine publishes them late): ``(what send returned, before, after)``."""
    before = read()
    sent = send()
    return sent, before, settle(read) if settle is not None else read()


def measure_each(read: Callable[[], dict], items: Sequence[Any], send_one: Callable[[Any], dict], *,
                 settle: Callable[[Callable[[], dict]], dict] | None = None) -> tuple[list[dict], dict, dict]:
    """Counters around every request, one request at a time: each answer of ``send_one(item)`` gets
    ``counts`` (:func:`diff_counters` of the scrapes around it: the per-request counts an engine does not
    report itself). Returns ``(answers, counters before the first, counters after the last)``; the
    per-request counts sum to ``after − before``."""
    scrape = (lambda: settle(read)) if settle is not None else read
    before = prev = scrape()
    answers = []
    for item in items:
        answer = send_one(item)
        cur = scrape()
        answers.append({**answer, "counts": diff_counters(prev, cur)})
        prev = cur
    return answers, before, prev


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int:
    """The first index where two token sequences differ (the shorter length when one is a prefix
    of the other; ``len`` when equal)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def token_agreement(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> dict:
    """How far two sets of greedy outputs (token ids per request, same order) agree, request by
    request: its common prefix (later tokens have different histories).

    Returns:
        ``{agreement: Σ common prefix / Σ max(len), exact_match: fraction of identical
        requests, first_divergence: per request (None when identical)}``.

    Raises:
        InvalidInputError: not as many requests on both sides.
    """
    if len(a) != len(b):
        raise InvalidInputError(f"{len(a)} vs {len(b)} requests: outputs cannot be compared")
    common = total = same = 0
    first: list[int | None] = []
    for x, y in zip(a, b, strict=True):
        x, y = list(x or []), list(y or [])
        n = first_divergence(x, y)
        common += n
        total += max(len(x), len(y))
        same += int(x == y)
        first.append(None if x == y else n)
    return {"agreement": common / total if total else 1.0, "exact_match": same / len(a) if a else 1.0,
            "first_divergence": first}
