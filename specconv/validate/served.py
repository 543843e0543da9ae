"""The one driver judging a drafter served by a registered engine's :class:`~specconv.engines.base.Serve`
(``docs/validate.md``, "``--backend vllm``"; ``docs/llamacpp.md``, "The check").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .backend import ValidationRun, copy_top
from .gates import GateResult, gate_acceptance, served_engine_checks, skipped

if TYPE_CHECKING:
    from ..engines.base import Serve
    from ..verifier import Verifier

__all__ = ["MIN_TOKEN_AGREEMENT", "ServedBackend", "available_memory", "fits_here", "lossless_gate",
           "torch_reference_outputs"]

#: G4 against a reference: Σ common prefix / Σ longer output (the serving tests' rule).
MIN_TOKEN_AGREEMENT = 0.90


class ServedBackend:
    """``--backend <engine>``: its counters are G3, or (``after_torch``) it is compared with the torch run."""

    def __init__(self, serve: Serve) -> None:
        self.serve = serve
        self.name = serve.backend

    def preflight(self, drafter_dir: Path, opts: Any) -> None:
        """The engine's refusals before any model is loaded."""
        self.serve.preflight(drafter_dir, opts)

    def run(self, run: ValidationRun) -> None:
        """:func:`_served_gates` or (``after_torch``) :func:`_after_torch_gates`."""
        (_after_torch_gates if self.serve.after_torch else _served_gates)(self.serve, run)


def _served_gates(s: Serve, run: ValidationRun) -> None:
    """Serve, then G3 on the engine's counters (plus ``after_acceptance``'s errors) and G4 against a
    non-speculative reference (:func:`lossless_gate`); G2 is skipped."""
    from ..format.algorithms import find_algorithm
    from .metrics import summary

    vm = s.measure(run.drafter_dir, run.verifier, run.rendered, run.options, None, {})
    rep = run.report
    rep["device"] = vm.pop("device", {"device": s.backend})
    run.results.append(skipped("parity", f"--backend {s.backend}: parity runs in the torch harness"))
    g3 = gate_acceptance(vm, min_tau=run.options.min_tau)
    runners = s.runners(find_algorithm(rep.get("algorithm")))
    vm["serving"].update(served_engine_checks(run, g3, s.server_name,
                                              [r.get("prompt_token_ids") for r in vm["requests"]],
                                              vm["serving"]["runner"], runners))
    rep[s.report_key] = s.summary(vm)
    rep["metrics"] = vm
    rep["k"] = len(vm.get("acceptance_at_pos") or [])
    s.after_acceptance(g3, vm, run.options)
    run.results.append(g3)
    run.results.append(lossless_gate(run, vm, s))
    copy_top(rep, vm)
    rep["summary"] = summary(vm)


def lossless_gate(run: ValidationRun, vm: dict, s: Serve) -> GateResult:
    """G4 of a served run: greedy outputs against the engine's ``reference`` or else the torch loop
    (skipped "not checked: <reason>" without one); passes at ≥ :data:`MIN_TOKEN_AGREEMENT` of the
    tokens (kernels may flip a near-tie)."""
    from ..engines.served import token_agreement

    if run.options.temperature > 0:
        return skipped("lossless", "not checked: T > 0 (greedy outputs only)")
    ref, source = s.reference(run.drafter_dir, run.verifier, run.rendered, run.options) or (
        torch_reference_outputs(run), "torch")
    if isinstance(ref, str):
        return skipped("lossless", f"not checked: {ref}")
    agree = token_agreement([r["output_ids"] for r in vm["requests"]], ref)
    g = GateResult(name="lossless", passed=agree["agreement"] >= MIN_TOKEN_AGREEMENT,
                   details={"reference": source, **agree, "min_agreement": MIN_TOKEN_AGREEMENT})
    diverged = [f"{r['prompt_id']}: first divergence at token {d}"
                for r, d in zip(vm["requests"], agree["first_divergence"], strict=True)
                if d is not None]
    (g.warnings if g.passed else g.errors).extend(diverged[:5])
    return g


def available_memory(meminfo: str = "/proc/meminfo") -> int:
    """Bytes a new process can use: ``MemAvailable`` (counts reclaimable page cache), else ``SC_AVPHYS_PAGES``."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def fits_here(verifier: Verifier, dtype: str, device: str) -> str | None:
    """None when the verifier fits on ``device`` (CUDA: the placement rule; CPU: 1.15 × weights + 1 GiB),
    else why not."""
    from ..errors import SpecconvError
    from .torch_backend import _float_numel, plan_placement

    if verifier.hub_id is not None:
        return f"the verifier {verifier.hub_id} is a Hub id; its weights are not read here"
    try:
        if str(device).startswith("cuda"):
            plan_placement(verifier, Path(verifier.local_dir), device, dtype)
            return None
        need = _float_numel(verifier.store()) * (4 if dtype == "float32" else 2)
        avail = available_memory()
    except (SpecconvError, OSError, ValueError) as e:
        return getattr(e, "message", str(e))
    if need * 1.15 + 2**30 > avail:
        return f"the verifier needs {need / 2**30:.1f} GiB at {dtype}, {avail / 2**30:.1f} GiB is available here"
    return None


def torch_reference_outputs(run: ValidationRun) -> list[list[int]] | str:
    """Plain greedy decoding of the prompts with specconv's torch loop, or why it cannot run."""
    from ..errors import SpecconvError
    from ..extras import require

    try:
        require("transformers", "validate", feature="the losslessness reference of --backend vllm")
        from .loop import run_requests
        from .verifier_runner import VerifierRunner, resolve_device
    except SpecconvError as e:
        return e.message
    opts = run.options
    device = resolve_device(opts.device)
    why = fits_here(run.verifier, opts.dtype, device)
    if why:
        return why
    run.progress("plain decode (torch reference)", 0, 1)
    try:  # the reference is optional: a verifier transformers cannot load or render is "not checked"
        runner = VerifierRunner.load(run.verifier.local_dir, device=device, dtype=opts.dtype,
                                     attn_implementation=opts.attn_implementation)
    except SpecconvError as e:
        return f"the torch reference cannot load the verifier: {e.message}"
    try:
        res = run_requests(runner, None, run.rendered, max_new_tokens=opts.max_new_tokens, temperature=0.0,
                           stop_token_ids=runner.stop_token_ids(), seed=opts.seed)
    except SpecconvError as e:
        return f"the torch reference cannot run: {e.message}"
    finally:
        runner.close()
    return [list(r.output_ids) for r in res]


def _after_torch_gates(s: Serve, run: ValidationRun) -> None:
    """The torch backend's gates, then the engine serves the same token ids and G3 / G4 judge it too."""
    from .torch_backend import TorchBackend

    found = s.prepare(run.drafter_dir, run.verifier, run.options, s.preflight(run.drafter_dir, run.options))
    TorchBackend().run(run)
    section = s.measure(run.drafter_dir, run.verifier, run.rendered, run.options, found, run.report)
    prompt_n = section.pop("prompt_n")
    section.pop("requests", None)  # per-request counts: the engine comparison's (compare_run.py)
    run.report[s.report_key] = section
    _engine_judged(run, s, section, prompt_n)


def _engine_judged(run: ValidationRun, s: Serve, sec: dict[str, Any], prompt_n: list[int | None]) -> None:
    """G3: the engine's τ within ``band`` of the torch loop's, on the same prompt tokens (``prompt_n``);
    G4: its divergences from its own plain server (a near tie warns)."""
    by = {g.name: g for g in run.results}
    g3, g4 = by.get("acceptance"), by.get("lossless")
    key, display = s.engine.key, s.engine.display
    if g3 is not None:
        g3.details[key] = {k: sec[k] for k in ("tau", "tau_torch", "delta", "band")}
        if abs(sec["delta"]) > sec["band"]:
            g3.errors.append(f"{display} τ {sec['tau']:.4f} differs from the torch loop's {sec['tau_torch']:.4f} by "
                             f"more than {sec['band']:.4f}")
        sec.update(served_engine_checks(run, g3, s.server_name, prompt_n, None))
        g3.passed = not g3.errors
    if g4 is not None:
        g4.details[key] = {k: sec[k] for k in ("lossless", "exact_match", "divergences")}
        for d in sec["divergences"]:
            msg = (f"{d['prompt_id']}: {s.server_name} with the drafter diverges from the plain server at token "
                   f"{d['first_divergence']} (margin {d['margin']})")
            (g4.warnings if d["near_tie"] else g4.errors).append(msg + (" — near tie" if d["near_tie"] else ""))
        g4.passed = not g4.errors
