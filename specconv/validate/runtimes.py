"""Drafter runtimes (:func:`runtimes`) and the gate comparing one with the torch reference (``docs/validate.md``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engines.base import CompareRule, Runtime
from ..format.algorithms import import_object

if TYPE_CHECKING:
    from ..format import SpeculatorsDraftConfig
    from ..verifier import Verifier
    from .backend import DrafterBackend, PlacedDrafter, ValidationRun
    from .gates import GateResult

#: The metric keys of each side of a comparison (``report[key]["torch"]`` and the runtime's).
SIDE_KEYS = ("acceptance_length", "acceptance_at_pos", "num_drafts", "num_accepted_tokens", "tpot_ms", "draft_ms")


#: the reference drafter every compared runtime is judged against (not an engine)
TORCH = Runtime("torch reference", "specconv.validate.runtimes:load_torch")


def runtimes() -> dict[str, Runtime]:
    """Runtime name → runtime: ``torch`` (the reference), then each engine's ``runtime`` under its key."""
    from ..engines import with_capability

    return {"torch": TORCH, **{e.key: e.runtime for e in with_capability("runtime")}}


def load_torch(drafter_dir: Path, verifier: Verifier, *, path: str | None, dtype: str, device: str,
               config: SpeculatorsDraftConfig | None = None):
    """The reference drafter (:func:`specconv.drafters.load_drafter`); ``path`` is unused."""
    import torch

    from ..drafters import load_drafter

    return load_drafter(drafter_dir, verifier, config=config, dtype=getattr(torch, dtype), device=device)


def get_runtime(name: str, what: str = "runtime") -> Runtime:
    """The runtime registered as ``name``; UsageError (naming option ``what``) for an unknown one."""
    from ..errors import UsageError

    known = runtimes()
    if name not in known:
        raise UsageError(f"unknown {what} {name!r} (known: {', '.join(known)})")
    return known[name]


def check_runtime(name: str | None, path: str | None, drafter_dir: Path, dtype: str) -> None:
    """Refuse a compared runtime that cannot run, before any model loads (None: no-op).

    Raises UsageError (unknown, the reference, no PATH) or its preflight's MissingExtraError /
    InvalidInputError (exit 2, 3).
    """
    from ..errors import UsageError

    rt = get_runtime(name) if name is not None else None
    if rt is not None and rt.rule is None:
        raise UsageError(f"runtime {name!r} is the reference: there is nothing to compare it with")
    if rt is not None and rt.preflight:
        if not path:
            raise UsageError(f"--{rt.key} needs a PATH")
        import_object(rt.preflight)(path, drafter_dir, dtype)


def runtime_flags(name: str | None, path: str | None) -> dict[str, str | None]:
    """``{key: PATH or None}`` per compared runtime, as the CLI flags were given (report ``options``)."""
    return {rt.key: (path if n == name else None) for n, rt in runtimes().items() if rt.key}


def runtime_from_flags(paths: dict[str, Any], backend: str = "torch") -> tuple[str | None, str | None]:
    """``(name, path)`` of the runtime flag given (``{"onnx": PATH, "engine": None}``), else Nones;
    UsageError (exit 2) for more than one runtime."""
    known = runtimes()
    given = [(n, rt.key) for n, rt in known.items() if rt.key and paths.get(rt.key)]
    check_one_runtime(backend, [n for n, _ in given])
    return (given[0][0], str(paths[given[0][1]])) if given else (None, None)


def check_one_runtime(backend: str, runtimes: list[str]) -> None:
    """At most one of a non-torch ``--backend`` and the compared ``runtimes``; UsageError (exit 2) names
    the flags (or an unknown runtime)."""
    from ..errors import UsageError

    given = [f"--backend {backend}"] if backend != "torch" else []
    given += [f"--{get_runtime(n).key}" for n in runtimes]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)} are mutually exclusive: validate one runtime at a time")


class ComparingDrafter:
    """Proposes with ``primary`` and, at greedy steps, counts its differences from ``reference`` (the
    torch drafter) on the same inputs: near ties are torch top-1 − top-2 < ``margin``; ``kl``: also
    KL(torch ‖ primary) per draft where the logits have one shape."""

    def __init__(self, primary: DrafterBackend, reference: PlacedDrafter, *, margin: float, kl: bool = False):
        self.primary, self.reference, self.margin, self.kl = primary, reference, float(margin), kl
        for a in ("algorithm", "block_size", "num_draft_tokens", "aux_layer_ids", "device", "dtype"):
            setattr(self, a, getattr(primary, a))
        self.steps = self.drafts = self.mismatches = self.near_ties = self.near_tie_mismatches = 0
        self.primary_ms: list[float] = []  # the loop's draft_ms also counts the comparison
        self.kl_values: list[float] = []

    def propose(self, context_tokens, aux_hidden, *, temperature: float = 0.0, generator=None):
        """``primary``'s proposal (the :class:`~specconv.validate.backend.DrafterBackend` contract)."""
        import time

        import torch

        from .metrics import kl_rows

        t0 = time.perf_counter()
        prop = self.primary.propose(context_tokens, aux_hidden, temperature=temperature, generator=generator)
        self.primary_ms.append((time.perf_counter() - t0) * 1e3)
        if temperature > 0:
            return prop
        ref = self.reference.propose(context_tokens.to(self.reference.device),
                                     aux_hidden.to(self.reference.device, self.reference.dtype))
        top2 = torch.topk(ref.logits.float(), 2, dim=-1).values
        tie, diff = ((top2[:, 0] - top2[:, 1]) < self.margin).cpu(), prop.tokens.cpu() != ref.tokens.cpu()
        self.steps, self.drafts = self.steps + 1, self.drafts + int(diff.numel())
        self.mismatches, self.near_ties = self.mismatches + int(diff.sum()), self.near_ties + int(tie.sum())
        self.near_tie_mismatches += int((diff & tie).sum())
        if self.kl and prop.logits is not None and tuple(ref.logits.shape) == tuple(prop.logits.shape):
            self.kl_values.extend(kl_rows(ref.logits.cpu(), prop.logits.cpu()).tolist())
        return prop

    def counts(self) -> dict:
        """The comparison counts (``report[key]["drafts"]``)."""
        import statistics

        c = {"steps": self.steps, "drafts": self.drafts, "mismatches": self.mismatches,
             "near_ties": self.near_ties, "near_tie_mismatches": self.near_tie_mismatches,
             "near_tie_margin": self.margin,
             "primary_draft_ms_median": float(statistics.median(self.primary_ms)) if self.primary_ms else None}
        if self.kl:
            finite = [x for x in self.kl_values if x == x]
            c.update(top1_agreement=1.0 - self.mismatches / self.drafts if self.drafts else None,
                     kl_mean=sum(finite) / len(finite) if finite else None, kl_max=max(finite, default=None))
        return c


def judge(rule: CompareRule, tau_torch: float, tau_runtime: float, counts: dict, tokens_identical: bool,
          temperature: float) -> tuple[dict, bool | None, list[str]]:
    """``rule`` on one comparison: ``(verdict keys, passed (None: nothing gated), errors)``."""
    verdict: dict[str, Any] = {}
    checks: dict[str, bool] = {}
    if rule.identical_tokens:
        verdict.update(tokens_identical=tokens_identical, tau_equal=tau_torch == tau_runtime)
        if temperature <= 0:
            outside = counts["mismatches"] - counts["near_tie_mismatches"]
            checks["generated tokens differ from the torch run"] = tokens_identical
            checks[f"{outside} draft(s) differ outside near-ties"] = outside == 0
            checks[f"tau {tau_runtime:.4g} != torch tau {tau_torch:.4g} with no near-tie difference"] = (
                counts["near_tie_mismatches"] > 0 or verdict["tau_equal"])
    if rule.tau_rel_tol is not None:
        rel = verdict["tau_rel_diff"] = abs(tau_runtime - tau_torch) / tau_torch if tau_torch else float("inf")
        checks[f"tau {tau_runtime:.4g} is {rel:.1%} from torch tau {tau_torch:.4g} (> {rule.tau_rel_tol:.0%})"] = (
            rel <= rule.tau_rel_tol)
    return verdict, (all(checks.values()) if checks else None), [m for m, ok in checks.items() if not ok]


def compare_runtime(run: ValidationRun, reference: PlacedDrafter, decode: Callable[..., list],
                    spec_results: list, plain: list) -> GateResult:
    """The gate comparing ``run.options.runtime`` with the torch ``reference``: its requests run through
    ``decode(name, drafter)``, judged by its :class:`CompareRule`; fills ``run.report[key]``.
    Skipped when the rule gates nothing at this temperature."""
    from .gates import GateResult
    from .metrics import compute_metrics

    opts = run.options
    assert opts.runtime is not None, "the compare gate runs for a compared runtime only"
    rt = get_runtime(opts.runtime)
    rule, key = rt.rule, rt.key
    assert rule is not None and key is not None, "check_runtime refused the reference before any model loaded"
    drafter = rt.load(run.drafter_dir, run.verifier, path=opts.runtime_path, dtype=opts.dtype,
                      device=str(reference.device), config=run.config)
    cmp = ComparingDrafter(drafter, reference, margin=rule.near_tie_margin, kl=rule.kl)
    results = decode(f"speculative decode ({rt.display} drafter)", cmp)
    m_t, m_r = (compute_metrics(r, int(reference.num_draft_tokens), baseline=plain, seed=opts.seed)
                for r in (spec_results, results))
    same = all(a.output_ids == b.output_ids for a, b in zip(spec_results, results, strict=True))
    verdict, passed, errors = judge(rule, float(m_t["acceptance_length"]), float(m_r["acceptance_length"]),
                                    cmp.counts(), same, opts.temperature)
    run.report[key] = {
        **(drafter.describe() if hasattr(drafter, "describe") else {}), "torch": {x: m_t.get(x) for x in SIDE_KEYS},
        rt.side: {x: m_r.get(x) for x in SIDE_KEYS}, "drafts": cmp.counts(), **verdict, "passed": passed,
        "timing_note": f"{rt.side}.draft_ms / tpot_ms include the per-step torch comparison; "
                       f"drafts.primary_draft_ms_median is {rt.display} alone", "rule": rule.text()}
    return GateResult(name=key, passed=passed, errors=errors, details={**verdict, "drafts": cmp.counts()},
                      skipped_reason=None if passed is not None else "T > 0: this rule gates greedy runs only")
