"""llama.cpp as the oracle: a drafter GGUF served by ``llama-server`` without and with ``-md``, compared
by G4's near-tie rule, τ from ``/metrics`` (docs/llamacpp.md, "The check")."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("specconv.engines.llamacpp")

__all__ = ["CHECK_NEW_TOKENS", "CHECK_PROMPTS", "compare_outputs", "run_check", "serve_prompts"]

#: Prompts (evenly spaced over ``eval``) and new tokens of the check ``export gguf`` runs.
CHECK_PROMPTS, CHECK_NEW_TOKENS = 4, 32
#: The dtype name the G4 near-tie rule gets for a llama.cpp target: not float32 (quantised weights).
TARGET_DTYPE = "quantised"


def serve_prompts(argv: Sequence[str], prompts: Sequence[tuple[str, list[int]]], n_predict: int, log_path: Path, *,
                  n_probs: int = 0) -> tuple[list[dict], dict | None, dict]:
    """Start one server, send every prompt, read the counters, stop it.

    Returns:
        ``(outputs per prompt (with a draft: each with its ``counts``), counter difference or None without a
        draft, {startup_s, log})``.
    """
    from ..served import diff_counters, measure_each
    from .server import LlamaServer, completion

    with LlamaServer(argv, log_path) as srv:  # counters around each request (updated before it answers)
        outs, before, after = measure_each(
            srv.counters, prompts, lambda p: {"prompt_id": p[0], **completion(srv, p[1], n_predict, n_probs=n_probs)})
    return outs, (diff_counters(before, after) if "-md" in argv else None), {"startup_s": srv.startup_s,
                                                                             "log": str(log_path)}


def compare_outputs(plain: Sequence[dict], spec: Sequence[dict]) -> dict[str, Any]:
    """Speculative vs plain greedy outputs, request by request (the G4 rule at the first divergence).

    Returns:
        ``{lossless, exact_match, n, divergences: [{prompt_id, first_divergence, margin, near_tie}]}``;
        ``lossless`` is false when a request diverges at a clear margin (or without a margin).
    """
    from ..counts import near_tie
    from ..served import first_divergence

    divs = []
    for p, s in zip(plain, spec, strict=True):
        a, b = p["tokens"], s["tokens"]
        if a == b:
            continue
        j = first_divergence(a, b)
        margin = p["margins"][j] if j < len(p["margins"]) else None
        top1 = p["top1"][j] if j < len(p["top1"]) else None
        tie = margin is not None and near_tie(margin, top1 or 0.0, TARGET_DTYPE)
        divs.append({"prompt_id": p["prompt_id"], "first_divergence": j, "margin": margin, "near_tie": tie})
    n = len(plain)
    return {"lossless": all(d["near_tie"] for d in divs), "exact_match": (n - len(divs)) / n if n else 1.0, "n": n,
            "divergences": divs}


def _tau(counts: dict) -> dict[str, Any]:
    from ..served import counter_metrics

    m = counter_metrics(counts)
    return {"tau": m["acceptance_length"], "acceptance_at_pos": m.get("acceptance_at_pos"),
            "num_drafts": int(counts["num_drafts"]), "num_draft_tokens": int(counts["num_draft_tokens"]),
            "num_accepted_tokens": int(counts["num_accepted_tokens"])}


def run_check(draft: Path, target: Path, server: Path, prompts: Sequence[tuple[str, list[int]]], *, n_predict: int,
              spec_type: str, n_max: int, plain: Sequence[dict] | None = None, threads: int = 1,
              workdir: Path | None = None) -> dict[str, Any]:
    """Serve ``prompts`` (``(id, token ids)``) without and with the drafter; compare; read τ.
    ``plain``: earlier plain outputs (skips that server); ``workdir``: the logs (default: a kept temp dir).

    Returns:
        ``{passed, lossless, drafts_accepted, tau, ..., plain_outputs, spec_outputs, server}``;
        ``passed``: lossless and at least one draft token accepted.

    Raises:
        InvalidInputError: ``llama_server_failed`` (a server died, refused the files, or a request failed).
    """
    from ..local_server import free_port
    from .server import server_argv, server_version

    logs = Path(workdir or tempfile.mkdtemp(prefix="specconv-llamacpp-"))
    info: dict[str, Any] = {"binary": str(server), **server_version(server)}
    if plain is None:
        argv = server_argv(server, target, free_port(), threads=threads)
        plain, _, info["plain"] = serve_prompts(argv, prompts, n_predict, logs / "plain.log", n_probs=2)
        info["plain"]["argv"] = argv
    argv = server_argv(server, target, free_port(), draft=draft, spec_type=spec_type, n_max=n_max, threads=threads)
    spec, counts, info["spec"] = serve_prompts(argv, prompts, n_predict, logs / "spec.log")
    assert counts is not None, "serve_prompts reads the counters of a server with a draft (-md)"
    info["spec"]["argv"] = argv
    cmp = compare_outputs(plain, spec)
    out = {**cmp, **_tau(counts), "spec_type": spec_type, "spec_draft_n_max": n_max, "n_predict": n_predict,
           "prompts": [pid for pid, _ in prompts], "server": info}
    out["drafts_accepted"] = out["num_accepted_tokens"] > 0
    out["passed"] = bool(cmp["lossless"] and out["drafts_accepted"])
    out["plain_outputs"], out["spec_outputs"] = list(plain), spec
    return out
