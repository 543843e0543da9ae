"""vLLM: the Speculators dir itself is what ``vllm serve DIR`` loads. ``validate --backend vllm``
serves it (:mod:`.serve`, :mod:`.server`; ``--server-url``: :mod:`.remote`), ``--vllm-load-check`` runs
vLLM's own loader in its venv (:mod:`.check`, :mod:`.runner`), and the card's serve lines are built
by :mod:`.serve_line`; docs/validate.md. This module is the engine's declaration (standard library only).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..base import Engine, LoadCheck, OptionSpec, Serve

if TYPE_CHECKING:
    from ...verifier import Verifier

#: the vLLM loader's interpreter (``--vllm-loader-python``; default ``.venv-vllm``)
LOADER_ENV = "SPECCONV_VLLM_LOADER_PYTHON"

LOAD_CHECK = LoadCheck(
    flag=OptionSpec(("--vllm-load-check",), "vllm_load_check", "Also load DIR with vLLM's own loader (strict; "
                    "separate vLLM venv, see docs/validate.md).", kind="flag", default=False),
    python=OptionSpec(("--vllm-loader-python",), "vllm_loader_python", f"vLLM 0.33 interpreter for --vllm-load-check "
                      f"[default: ${LOADER_ENV}, else .venv-vllm].", metavar="PATH"),
    report_key="vllm_load", runner="specconv.engines.vllm.check:run_load_checks_for_dir",
    preflight="specconv.engines.vllm.check:preflight", gates_validation=True,
)

class VllmServe(Serve):
    """``validate --backend vllm``: τ through a real ``vllm serve`` started here (:mod:`.serve`) or
    already running (``--server-url``: :mod:`.remote`); G4 against ``--reference-url`` when given."""

    backend = "vllm"
    help = "a vLLM-CPU server"
    report_key = "vllm_serve"
    server_name = "vLLM"

    def measure(self, drafter_dir: Path, verifier: Verifier, rendered: list[tuple[str, list[int]]], options: Any,
                found: Any, torch_report: dict[str, Any]) -> dict[str, Any]:
        vopts = getattr(options, "vllm", None)
        if vopts is not None and vopts.remote:
            from .remote import run_remote_validation as measure_run
        else:
            from .serve import run_vllm_validation as measure_run
        return measure_run(drafter_dir, verifier, rendered, options)

    def summary(self, measured: dict[str, Any]) -> dict[str, Any]:
        from .serve import serve_summary

        return {**serve_summary(measured), "server": measured.pop("server", {})}

    def runners(self, algorithm: Any) -> tuple[str, ...]:
        return tuple(algorithm.vllm.runners) if algorithm is not None else ()

    def after_acceptance(self, g3: Any, measured: dict[str, Any], options: Any) -> None:
        """A server specconv did not start (``--server-url``) must have served this run only."""
        if measured["serving"]["mode"] == "remote":
            from .remote import traffic_check

            traffic_check(g3, measured["serving"]["other_traffic"], bool(options.vllm.allow_shared_server))

    def reference(self, drafter_dir: Path, verifier: Verifier, rendered: list[tuple[str, list[int]]],
                  options: Any) -> tuple[list[list[int]], str] | None:
        vopts = getattr(options, "vllm", None)
        if not (vopts and vopts.reference_url):
            return None
        from .remote import reference_url_outputs

        return reference_url_outputs(drafter_dir, verifier, rendered, options, vopts.reference_url), "reference_url"


ENGINE = Engine(key="vllm", display="vLLM", extra="validate", order=10, load_check=LOAD_CHECK, serve=VllmServe())
