"""``--backend llamacpp`` (registered by dotted path in ``specconv.validate.backend.BACKENDS``): the torch loop, then the drafter's GGUF served by ``llama-server``.

Its refusals before any model is loaded: :func:`preflight`; the serve check
(:func:`specconv.gguf.check.run_check`), what it adds to G3 (:func:`tau_band`) and G4, and the
report's ``llamacpp_serve``: ``docs/llamacpp.md`` ("The check").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import InvalidInputError, UsageError
from ..validate.backend import ValidationRun

__all__ = ["LLAMACPP_TAU_TOLERANCE", "LlamaCppBackend", "preflight", "tau_band"]

#: The fixed τ tolerance of ``--backend llamacpp``: llama.cpp serves a quantised target (SmolLM2
#: Q4_1) while the torch loop runs its dequantised fp32 weights. Measured on the bundled drafter
#: (4 ``eval`` prompts, 32 tokens): identical counts, Δτ = 0.000; a GGUF whose target layers are
#: shifted by one gives Δτ = −0.068 on 2 prompts × 24 tokens (docs/llamacpp.md).
LLAMACPP_TAU_TOLERANCE = 0.05


def tau_band(tau_torch: float, torch_metrics: dict[str, Any]) -> float:
    """The largest |τ_llama.cpp − τ_torch| G3 accepts: max(:data:`LLAMACPP_TAU_TOLERANCE`, 2 % of
    τ_torch). Not the torch CI half-width: both runs decode the same prompt token ids, so the
    difference is the runtime's, not the prompts' spread (``torch_metrics`` is kept for the report)."""
    return max(LLAMACPP_TAU_TOLERANCE, 0.02 * tau_torch)


def preflight(drafter_dir: Path, opts: Any) -> dict[str, Any]:
    """What the backend needs, found before any model is loaded.

    Returns:
        ``{gguf, meta, server, target, target_repo}``.

    Raises:
        UsageError: ``--temperature`` > 0 (llama.cpp's check is greedy only; exit 2).
        InvalidInputError: no / stale ``DIR/gguf``, no llama-server, no verifier GGUF (exit 3);
            UnsupportedFormatError: a target llama.cpp cannot feed the drafter from.
    """
    from .export import find_export
    from .server import resolve_server

    if float(opts.temperature) > 0:
        raise UsageError("--backend llamacpp is greedy only: --temperature must be 0")
    gguf, meta = find_export(Path(drafter_dir))
    server = resolve_server(getattr(opts, "llama_server", None))
    if server is None:
        raise InvalidInputError("--backend llamacpp needs llama-server: none given and no `make llama-cpp` build",
                                code="llama_server_missing", hint="make llama-cpp, or --llama-server FILE")
    return {"gguf": gguf, "meta": meta, "server": server}


def _target(run: ValidationRun) -> tuple[Path, str | None, dict]:
    from .target import VERIFIER_GGUF_ENV, default_verifier_gguf, read_target, refuse_target

    path, repo = default_verifier_gguf(run.verifier, getattr(run.options, "verifier_gguf", None))
    if path is None:
        raise InvalidInputError("--backend llamacpp needs the verifier as a GGUF (llama-server -m)",
                                code="verifier_gguf_missing", hint=f"--verifier-gguf FILE or ${VERIFIER_GGUF_ENV}")
    target = read_target(path)
    refuse_target(target, run.verifier)
    return path, repo, target


class LlamaCppBackend:
    """``--backend llamacpp``: every torch gate, then llama-server's losslessness and τ."""

    name = "llamacpp"

    def preflight(self, drafter_dir: Path, opts: Any) -> None:
        """The backend's refusals before any model is loaded (:func:`preflight`)."""
        preflight(drafter_dir, opts)

    def run(self, run: ValidationRun) -> None:
        from .check import run_check
        from ..validate.torch_backend import TorchBackend

        found = preflight(run.drafter_dir, run.options)
        tpath, repo, target = _target(run)
        TorchBackend().run(run)
        prompts = _rendered(run)
        meta = found["meta"]
        res = run_check(found["gguf"], tpath, found["server"], prompts, n_predict=run.options.max_new_tokens,
                        spec_type=meta["spec_type"], n_max=meta["spec_draft_n_max"])
        summary = _summary(res, run, target, repo, found)
        run.report["llamacpp_serve"] = summary
        _gate(run, summary)


def _rendered(run: ValidationRun) -> list[tuple[str, list[int]]]:
    """The torch loop's prompt token ids (the same renderer on the same prompts)."""
    from transformers import AutoTokenizer

    from ..prompts import render

    tok = AutoTokenizer.from_pretrained(str(run.verifier.local_dir))
    return [(p.id, render(p, tok)) for p in run.prompts]


def _summary(res: dict, run: ValidationRun, target: dict, repo: str | None, found: dict) -> dict[str, Any]:
    metrics = run.report.get("metrics") or {}
    tau_torch = float(metrics.get("acceptance_length") or 0.0)
    band = tau_band(tau_torch, metrics)
    srv = res["server"]
    return {"commit": srv.get("commit"), "version": srv.get("version"),
            "verifier_gguf": {"name": target["name"], "sha256": target["sha256"],
                              "quantisation": target["quantisation"], "repo": repo},
            "gguf": {"file": found["meta"]["file"], "sha256": found["meta"]["files"][found["meta"]["file"]]},
            "tau": res["tau"], "tau_torch": tau_torch, "delta": res["tau"] - tau_torch, "band": band,
            "lossless": res["lossless"], "exact_match": res["exact_match"], "divergences": res["divergences"],
            "acceptance_at_pos": res["acceptance_at_pos"], "num_drafts": res["num_drafts"],
            "num_draft_tokens": res["num_draft_tokens"], "num_accepted_tokens": res["num_accepted_tokens"],
            "spec_type": res["spec_type"], "spec_draft_n_max": res["spec_draft_n_max"],
            "command": srv["spec"]["argv"], "plain_command": srv["plain"]["argv"]}


def _gate(run: ValidationRun, s: dict[str, Any]) -> None:
    """G3 and G4 also judge llama.cpp (details under ``llamacpp``)."""
    by = {g.name: g for g in run.results}
    g3, g4 = by.get("acceptance"), by.get("lossless")
    if g3 is not None:
        g3.details["llamacpp"] = {k: s[k] for k in ("tau", "tau_torch", "delta", "band")}
        if abs(s["delta"]) > s["band"]:
            g3.errors.append(f"llama.cpp τ {s['tau']:.4f} differs from the torch loop's {s['tau_torch']:.4f} by more "
                             f"than {s['band']:.4f}")
        g3.passed = not g3.errors
    if g4 is not None:
        g4.details["llamacpp"] = {k: s[k] for k in ("lossless", "exact_match", "divergences")}
        for d in s["divergences"]:
            msg = (f"{d['prompt_id']}: llama-server with the drafter diverges from the plain server at token "
                   f"{d['first_divergence']} (margin {d['margin']})")
            (g4.warnings if d["near_tie"] else g4.errors).append(msg + (" — near tie" if d["near_tie"] else ""))
        g4.passed = not g4.errors
