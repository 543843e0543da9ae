"""``validate --backend vllm``'s serving options (docs/validate.md), declared once and folded
into one ``vllm_serve`` argument (a :class:`specconv.engines.vllm.server.VllmServeOptions`,
None when none was given). Importing this module imports click only."""

from __future__ import annotations

import functools
from typing import Any, Callable

import click

#: click parameter names of the options below (= ``VllmServeOptions`` fields)
_NAMES = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "vllm_args", "server_url",
          "api_key_env", "reference_url", "allow_shared_server", "max_concurrency")

_OPTIONS = (
    click.option("--tensor-parallel-size", type=click.IntRange(min=1),
                 help="--backend vllm: tensor-parallel size of the server specconv starts (checked against the heads first)."),
    click.option("--pipeline-parallel-size", type=click.IntRange(min=1),
                 help="--backend vllm: pipeline-parallel size of the server specconv starts."),
    click.option("--data-parallel-size", type=click.IntRange(min=1),
                 help="--backend vllm: data-parallel size of the server specconv starts."),
    click.option("--vllm-arg", "vllm_args", multiple=True, metavar="WORD",
                 help="--backend vllm: one argv word for the server specconv starts, repeatable: "
                      "--vllm-arg=--max-model-len=2048 --vllm-arg=--distributed-executor-backend=ray. "
                      "Flags specconv sets (--model, --port, --dtype …) and -tp/-pp/-dp are refused."),
    click.option("--server-url", metavar="URL",
                 help="--backend vllm: measure this running OpenAI-compatible vLLM server instead of starting one "
                      "(recorded apart: never a gate for push/release)."),
    click.option("--api-key-env", metavar="NAME", help="--server-url: environment variable holding the server's API key."),
    click.option("--reference-url", metavar="URL",
                 help="--backend vllm: a plain (non-speculative) endpoint of the verifier for G4 "
                      "[default: specconv's torch loop when the verifier fits here]."),
    click.option("--allow-shared-server", is_flag=True,
                 help="--server-url: other traffic on the server is reported, not a G3 failure."),
    click.option("--max-concurrency", type=click.IntRange(min=1), default=1, show_default=True,
                 help="--backend vllm: requests in flight at once."),
)


def vllm_serve_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add the options above to a command; its callback receives them as one
    ``vllm_serve`` keyword (None when every one is at its default), after their refusals
    (:func:`specconv.engines.vllm.server.check_options`, exit 2) against the command's
    ``backend`` and ``vllm_python``. Apply it below ``run_command`` so a refusal is rendered."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from specconv.engines.vllm.server import VllmServeOptions, check_options

        values = {n: kwargs.pop(n) for n in _NAMES}
        values["vllm_args"] = tuple(values["vllm_args"] or ())
        opts = VllmServeOptions(**values)
        check_options(kwargs["backend"], opts, _typed("vllm_python", kwargs))
        return fn(*args, vllm_serve=opts if opts.given() else None, **kwargs)

    for option in reversed(_OPTIONS):
        wrapper = option(wrapper)
    return wrapper


def _typed(name: str, kwargs: dict[str, Any]) -> Any:
    """``kwargs[name]`` when it was given on the command line, else None (an environment
    variable such as ``$SPECCONV_VLLM_PYTHON`` set for every run is no clash)."""
    ctx = click.get_current_context(silent=True)
    source = ctx.get_parameter_source(name) if ctx is not None else None
    return kwargs.get(name) if source == click.core.ParameterSource.COMMANDLINE else None
