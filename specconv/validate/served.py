"""The validate side of a served check: the backends that judge a drafter served by a real engine
(``--backend vllm``, ``--backend llamacpp``). The engine part (its argv, server, counters, version
probe and refusals) is ``specconv.engines.<key>``'s and imports nothing from here; what every served
engine adds to G3 is :func:`specconv.validate.gates.served_engine_checks`, its G4 reference is
either the engine's own plain server (llama.cpp) or a non-speculative reference (vLLM:
``--reference-url``, else :func:`torch_reference_outputs`). ``docs/validate.md``
("``--backend vllm``", "G4 with ``--backend vllm``"), ``docs/llamacpp.md`` ("The check").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .backend import ValidationRun, copy_top
from .gates import GateResult, gate_acceptance, served_engine_checks, skipped

if TYPE_CHECKING:
    from ..verifier import Verifier

__all__ = ["MIN_TOKEN_AGREEMENT", "LlamaCppBackend", "VllmBackend", "available_memory", "fits_here",
           "lossless_gate", "torch_reference_outputs"]

#: G4 against a reference: Σ common prefix / Σ longer output (the serving tests' rule).
MIN_TOKEN_AGREEMENT = 0.90


# ------------------------------------------------------------------------------------ vLLM
class VllmBackend:
    """``--backend vllm``: τ through a real ``vllm serve`` started here or already running
    (``--server-url``); G2 parity needs the torch harness and is reported as skipped."""

    name = "vllm"

    def run(self, run: ValidationRun) -> None:
        """Serve (a server started here, or ``--server-url``'s), then G3 on vLLM's counters (other
        traffic fails it unless ``--allow-shared-server``) and G4 against a non-speculative
        reference (:func:`lossless_gate`); G2 is skipped. The server gets the run's rendered token
        ids; what it says it saw and the model runner it ran are checked on G3
        (:func:`specconv.validate.gates.served_engine_checks`). Fills ``device``, ``vllm_serve``
        (``serve_summary`` + ``server``), ``metrics``, ``k`` and the top-level metrics of the report."""
        from ..engines.vllm.remote import run_remote_validation, traffic_check
        from ..engines.vllm.serve import run_vllm_validation, serve_summary
        from ..format.algorithms import find_algorithm
        from .metrics import summary

        vopts = getattr(run.options, "vllm", None)
        measure_run = run_remote_validation if vopts is not None and vopts.remote else run_vllm_validation
        vm = measure_run(run.drafter_dir, run.verifier, run.rendered, run.options)
        rep = run.report
        rep["device"] = vm.pop("device", {"device": "vllm"})
        run.results.append(skipped("parity", "--backend vllm: parity runs in the torch harness"))
        g3 = gate_acceptance(vm, min_tau=run.options.min_tau)
        alg = find_algorithm(rep.get("algorithm"))
        vm["serving"].update(served_engine_checks(run, g3, "vLLM", [r.get("prompt_token_ids") for r in vm["requests"]],
                                                  vm["serving"]["runner"], alg.vllm.runners if alg else ()))
        rep["vllm_serve"] = {**serve_summary(vm), "server": vm.pop("server", {})}
        rep["metrics"] = vm
        rep["k"] = len(vm.get("acceptance_at_pos") or [])
        if vm["serving"]["mode"] == "remote":  # a server specconv started on loopback serves this run only
            traffic_check(g3, vm["serving"]["other_traffic"], bool(vopts.allow_shared_server))
        run.results.append(g3)
        run.results.append(lossless_gate(run, vm))
        copy_top(rep, vm)
        rep["summary"] = summary(vm)


def lossless_gate(run: ValidationRun, vm: dict) -> GateResult:
    """G4 of a ``--backend vllm`` run: the server's greedy outputs against a non-speculative
    reference (``--reference-url``, else specconv's torch loop when the verifier fits
    here); skipped with "not checked: <reason>" otherwise.

    Passes when the outputs agree on ≥ :data:`MIN_TOKEN_AGREEMENT` of the tokens (common
    prefix per request / the longer output: vLLM's and transformers' kernels may flip a
    near-tie); divergences are warnings.
    """
    from ..engines.served import token_agreement
    from ..engines.vllm.remote import reference_url_outputs

    if run.options.temperature > 0:
        return skipped("lossless", "not checked: T > 0 (greedy outputs only)")
    vopts = getattr(run.options, "vllm", None)
    if vopts and vopts.reference_url:
        ref, source = reference_url_outputs(run.drafter_dir, run.verifier, run.rendered, run.options,
                                            vopts.reference_url), "reference_url"
    else:
        ref, source = torch_reference_outputs(run), "torch"
    if isinstance(ref, str):
        return skipped("lossless", f"not checked: {ref}")
    agree = token_agreement([r["output_ids"] for r in vm["requests"]], ref)
    g = GateResult(name="lossless", passed=agree["agreement"] >= MIN_TOKEN_AGREEMENT,
                   details={"reference": source, **agree, "min_agreement": MIN_TOKEN_AGREEMENT})
    diverged = [f"{r['prompt_id']}: first divergence at token {d}" for r, d in zip(vm["requests"], agree["first_divergence"])
                if d is not None]
    (g.warnings if g.passed else g.errors).extend(diverged[:5])
    return g


def available_memory(meminfo: str = "/proc/meminfo") -> int:
    """Bytes of memory a new process can use: Linux's ``MemAvailable`` (free memory plus the
    page cache it may reclaim), else the free pages (``SC_AVPHYS_PAGES``, which leaves the
    page cache out and reads low on a busy machine)."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def fits_here(verifier: Verifier, dtype: str, device: str) -> str | None:
    """None when the verifier's weights fit on ``device`` here (CUDA: the torch backend's
    placement rule; CPU: 1.15 × the weights + 1 GiB ≤ :func:`available_memory`), else why not."""
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


# ------------------------------------------------------------------------------- llama.cpp
class LlamaCppBackend:
    """``--backend llamacpp``: every torch gate, then llama-server's losslessness and τ
    (the engine's part: ``specconv.engines.llamacpp.backend`` and ``.check``)."""

    name = "llamacpp"

    def preflight(self, drafter_dir: Path, opts: Any) -> None:
        """The backend's refusals before any model is loaded (``engines.llamacpp.backend.preflight``)."""
        from ..engines.llamacpp.backend import preflight

        preflight(drafter_dir, opts)

    def run(self, run: ValidationRun) -> None:
        """The torch backend's gates, then the drafter's GGUF served without and with ``-md``
        on the torch loop's token ids; ``llamacpp_serve`` of the report and G3 / G4's additions."""
        from ..engines.llamacpp.backend import find_target, preflight, serve_summary
        from ..engines.llamacpp.check import run_check
        from .torch_backend import TorchBackend

        found = preflight(run.drafter_dir, run.options)
        tpath, repo, target = find_target(run.drafter_dir, run.verifier, getattr(run.options, "verifier_gguf", None))
        TorchBackend().run(run)
        meta = found["meta"]
        res = run_check(found["gguf"], tpath, found["server"], run.rendered, n_predict=run.options.max_new_tokens,
                        spec_type=meta["spec_type"], n_max=meta["spec_draft_n_max"])  # the torch loop's token ids
        tau_torch = float((run.report.get("metrics") or {}).get("acceptance_length") or 0.0)
        summary = serve_summary(res, tau_torch, target, repo, found)
        run.report["llamacpp_serve"] = summary
        _llamacpp_gates(run, summary, [o.get("prompt_n") for o in res["spec_outputs"]])


def _llamacpp_gates(run: ValidationRun, s: dict[str, Any], prompt_n: list[int | None]) -> None:
    """G3 and G4 also judge llama.cpp (details under ``llamacpp``); G3 also checks that
    llama-server evaluated the torch loop's prompt tokens (``prompt_n``, per request)."""
    by = {g.name: g for g in run.results}
    g3, g4 = by.get("acceptance"), by.get("lossless")
    if g3 is not None:
        g3.details["llamacpp"] = {k: s[k] for k in ("tau", "tau_torch", "delta", "band")}
        if abs(s["delta"]) > s["band"]:
            g3.errors.append(f"llama.cpp τ {s['tau']:.4f} differs from the torch loop's {s['tau_torch']:.4f} by more "
                             f"than {s['band']:.4f}")
        s.update(served_engine_checks(run, g3, "llama-server", prompt_n, None))
        g3.passed = not g3.errors
    if g4 is not None:
        g4.details["llamacpp"] = {k: s[k] for k in ("lossless", "exact_match", "divergences")}
        for d in s["divergences"]:
            msg = (f"{d['prompt_id']}: llama-server with the drafter diverges from the plain server at token "
                   f"{d['first_divergence']} (margin {d['margin']})")
            (g4.warnings if d["near_tie"] else g4.errors).append(msg + (" — near tie" if d["near_tie"] else ""))
        g4.passed = not g4.errors
