"""``validate --compare ENGINE``: after the torch gates, each named engine serves the same rendered token ids
with the same settings, one request at a time; per-request counts from every engine and from specconv's
loop (the reference) go through :func:`specconv.validate.compare.compare_engines` (``docs/validate.md``,
"Comparing engines"). The verdicts are reported and recorded; ``push`` gates on them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from .compare import EngineVerdict, RequestCounts, compare_engines

if TYPE_CHECKING:
    from ..engines.base import Serve
    from .backend import ValidationRun

log = logging.getLogger("specconv.validate")

__all__ = ["COUNTS_JSONL", "REFERENCE", "check_compare", "compare_step", "preflight_compare",
           "reference_counts", "write_counts"]

#: the JSONL beside the report, the reference's name in it and in the report
COUNTS_JSONL, REFERENCE = "engine_counts.jsonl", "torch"


def _serve(name: str) -> Serve:
    from ..engines import serves

    for key, serve in serves():
        if name in (key, serve.backend):
            return serve
    raise UsageError(f"--compare {name}: not an engine that serves (known: {', '.join(k for k, _ in serves())})")


def check_compare(names: Sequence[str], backend: str, temperature: float) -> None:
    """Refuse (exit 2) a comparison that cannot run: an unknown engine, one named twice, a backend other
    than torch (the reference is specconv's loop), or T > 0 (greedy only, for now)."""
    if not names:
        return
    for n in names:
        _serve(n)
    if len(set(names)) != len(names):
        raise UsageError("--compare names an engine twice")
    if backend != "torch":
        raise UsageError(f"--compare runs after the torch loop (the reference): drop --backend {backend}")
    if temperature > 0:
        raise UsageError("--compare is greedy only: --temperature must be 0")


def preflight_compare(drafter_dir: Path, options: Any) -> None:
    """Each ``--compare`` engine's refusals (its :meth:`~specconv.engines.base.Serve.preflight`), before
    any model loads."""
    for name in getattr(options, "compare", ()):
        _serve(name).preflight(drafter_dir, options)


def reference_counts(requests: Sequence[Any], k: int) -> list[RequestCounts]:
    """Per-request counts of specconv's loop (``RequestResult`` objects): one drafting step per step with
    drafts, vLLM's accounting (:func:`specconv.validate.metrics.counts_from_steps`)."""
    from .metrics import _draft_steps, _get, counts_from_steps

    out = []
    for r in requests:
        steps = _draft_steps(r)
        c = counts_from_steps([_get(s, "accepted") for s in steps], [_get(s, "k") for s in steps], k)
        out.append(RequestCounts.from_mapping(_get(r, "prompt_id"), c, len(_get(r, "output_ids"))))
    return out


def _served(run: ValidationRun, serve: Serve) -> tuple[list[RequestCounts], dict[str, Any]]:
    """One engine on the run's token ids: its per-request counts and its row's facts: lossless (the engine's
    own G4 when it has one — llama.cpp's target is a quantised GGUF, so its outputs may leave the loop's at a
    near tie — else ≥ 90 % of tokens equal to the loop's), the prompts whose output equals the loop's token
    for token (the only ones the verdict compares), version, runner, per-request counter checks."""
    from ..engines.served import token_agreement
    from .served import MIN_TOKEN_AGREEMENT

    found = serve.preflight(run.drafter_dir, run.options)
    found = serve.prepare(run.drafter_dir, run.verifier, run.options, found)
    run.progress(f"serving with {serve.backend}", 0, 1)
    measured = serve.measure(run.drafter_dir, run.verifier, run.rendered, run.options, found, run.report)
    reqs = measured.get("requests") or []
    counts = [RequestCounts.from_mapping(r["prompt_id"], r["counts"], len(r["output_ids"])) for r in reqs]
    ref_out = {r.prompt_id: list(r.output_ids) for r in run.spec_requests}
    agree = token_agreement([r["output_ids"] for r in reqs], [ref_out[r["prompt_id"]] for r in reqs])
    own = measured.get("lossless")  # the engine's own G4 (llama.cpp: with vs without the drafter, its target)
    lossless = bool(own) if isinstance(own, bool) else agree["agreement"] >= MIN_TOKEN_AGREEMENT
    paired = sorted(r["prompt_id"] for r in reqs if list(r["output_ids"]) == ref_out[r["prompt_id"]])
    mismatched = [r["prompt_id"] for r, c in zip(reqs, counts, strict=True)
                  if r.get("accepted_reported") is not None and int(r["accepted_reported"]) != c.num_accepted_tokens]
    facts = {**serve.engine_facts(measured), "lossless": lossless, "lossless_reference": (
                 "its own plain server" if isinstance(own, bool) else "specconv's loop"),
             "token_agreement": agree["agreement"], "exact_match": agree["exact_match"], "paired_prompts": paired,
             "counts_match_reported": not mismatched, **({"counts_mismatch": mismatched[:5]} if mismatched else {})}
    return counts, facts


def compare_step(run: ValidationRun, k: int) -> None:
    """Serve with every ``--compare`` engine, judge each against the torch loop (the run's ``spec_requests``);
    the report's ``engines`` (rows, reference, method, notes) and ``engine_counts`` (written as
    :data:`COUNTS_JSONL` by the report). No gate: the run's gates stay the reference's; ``push`` refuses
    a drafter an engine departs from unless told (``--allow-departing``)."""
    names = list(run.options.compare)
    ref = reference_counts(run.spec_requests, k)
    runs: dict[str, list[RequestCounts]] = {}
    facts: dict[str, dict[str, Any]] = {}
    for name in names:
        serve = _serve(name)
        runs[serve.backend], facts[serve.backend] = _served(run, serve)
    verdicts = compare_engines(ref, runs, lossless={n: f["lossless"] for n, f in facts.items()},
                               paired={n: set(f["paired_prompts"]) for n, f in facts.items()}, seed=run.options.seed)
    metrics = run.report.get("metrics") or {}
    run.report["engines"] = {
        "reference": {"engine": REFERENCE, "tau": metrics.get("acceptance_length"),
                      "tau_ci95": metrics.get("tau_ci95"), "c": metrics.get("conditional_acceptance_at_pos")},
        "rows": [{**v.as_dict(), **facts[v.engine]} for v in verdicts],
        "method": "paired cluster bootstrap over prompts; simultaneous (Bonferroni) 95 % intervals over the "
                  "judged positions and τ (docs/validate.md, \"Comparing engines\")",
    }
    run.report["engines"]["notes"] = _notes(verdicts, facts, k)
    run.report["engine_counts"] = {name: [asdict(r) for r in rs] for name, rs in {REFERENCE: ref, **runs}.items()}
    for note in run.report["engines"]["notes"]:
        log.warning("%s", note)


def _notes(verdicts: list[EngineVerdict], facts: dict[str, dict[str, Any]], k: int) -> list[str]:
    """What the report says of each engine that does not agree (a departure names where and why), and of one
    drafting fewer than the drafter's ``k`` tokens per step."""
    from .compare import CAUSES

    out = []
    for v in verdicts:
        per = facts[v.engine].get("draft_tokens_per_step")
        if per is not None and per < k:
            out.append(f"{v.engine} drafts {per:g} token{'' if per == 1 else 's'} per step, the drafter's K is {k}")
        if v.verdict == "departs":
            where = f"position {v.position}" if v.position else "τ"
            out.append(f"{v.engine} departs from the torch loop at {where} ({v.direction}): {v.reason}; "
                       f"likely cause {v.cause}: {CAUSES[v.cause or 'wrong_input']}")
        elif v.verdict == "inconclusive":
            out.append(f"{v.engine}: inconclusive ({v.reason})")
        if not facts[v.engine].get("counts_match_reported", True):
            out.append(f"{v.engine}: per-request counts differ from the counts it reports per request "
                       f"({', '.join(facts[v.engine]['counts_mismatch'])})")
    return out


def write_counts(report_dir: Path, counts: dict[str, list[dict[str, Any]]]) -> Path:
    """:data:`COUNTS_JSONL` in ``report_dir`` from the report's ``engine_counts`` (engine → request dicts;
    :func:`specconv.validate.compare.write_counts_jsonl`)."""
    from .compare import write_counts_jsonl

    return write_counts_jsonl(report_dir / COUNTS_JSONL, {
        name: [RequestCounts.from_mapping(r["prompt_id"], r) for r in rows] for name, rows in counts.items()})
