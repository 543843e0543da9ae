"""The llama.cpp part of ``--backend llamacpp``: refusals, the target GGUF, τ band and the report's
``llamacpp_serve`` (docs/llamacpp.md, "The check")."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import InvalidInputError, UsageError

if TYPE_CHECKING:
    from ...verifier import Verifier

__all__ = ["LLAMACPP_TAU_TOLERANCE", "find_target", "preflight", "serve_summary", "tau_band"]

#: The fixed τ tolerance of ``--backend llamacpp`` for a quantised target (measured: docs/llamacpp.md).
LLAMACPP_TAU_TOLERANCE = 0.05


def tau_band(tau_torch: float) -> float:
    """The largest |τ_llama.cpp − τ_torch| G3 accepts: max(:data:`LLAMACPP_TAU_TOLERANCE`, 2 % of τ_torch)."""
    return max(LLAMACPP_TAU_TOLERANCE, 0.02 * tau_torch)


def preflight(drafter_dir: Path, opts: Any) -> dict[str, Any]:
    """What the backend needs, found before any model is loaded.

    Returns:
        ``{gguf, meta, server}``.

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
    server = resolve_server((getattr(opts, "engine_options", None) or {}).get("llama_server"))
    if server is None:
        raise InvalidInputError("--backend llamacpp needs llama-server: none given and no `make llama-cpp` build",
                                code="llama_server_missing", hint="make llama-cpp, or --llama-server FILE")
    return {"gguf": gguf, "meta": meta, "server": server}


def find_target(drafter_dir: Path, verifier: Verifier, verifier_gguf: str | None) -> tuple[Path, str | None, dict]:
    """The verifier as a GGUF (``llama-server -m``), found as ``export gguf`` finds it:
    ``(path, its Hub repo or None, read_target's facts)``.

    Raises:
        InvalidInputError: ``verifier_gguf_missing``; a target that is not the verifier (exit 3).
    """
    from .export import recorded_verifier_name
    from .target import VERIFIER_GGUF_ENV, default_verifier_gguf, read_target, refuse_target

    path, repo = default_verifier_gguf(verifier, verifier_gguf, (recorded_verifier_name(drafter_dir),))
    if path is None:
        raise InvalidInputError("--backend llamacpp needs the verifier as a GGUF (llama-server -m)",
                                code="verifier_gguf_missing", hint=f"--verifier-gguf FILE or ${VERIFIER_GGUF_ENV}")
    target = read_target(path)
    refuse_target(target, verifier)
    return path, repo, target


def serve_summary(res: dict, tau_torch: float, target: dict, repo: str | None, found: dict) -> dict[str, Any]:
    """``llamacpp_serve`` of the report (``res``: :func:`.check.run_check`'s; ``found``: :func:`preflight`'s)."""
    band = tau_band(tau_torch)
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
