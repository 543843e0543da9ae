"""The engines' command-line surfaces, built from the registry (:mod:`specconv.engines`): each
engine's options (plain :class:`~specconv.engines.base.OptionSpec` data) as click options, and each
export capability's command (``export onnx``, ``export gguf``, ``export sglang``, ``build-engine``).
Importing this module imports click and the engines' declarations only (no torch, no pydantic).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from ..engines.base import Exporter, OptionSpec

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def _type(spec: OptionSpec) -> Any:
    if spec.kind == "choice":
        return click.Choice(list(spec.choices))
    if spec.kind in ("int", "float"):
        lo, hi = spec.minimum, spec.maximum
        if lo is None and hi is None:
            return int if spec.kind == "int" else float
        if spec.kind == "float":
            return click.FloatRange(min=lo, max=hi)
        return click.IntRange(min=None if lo is None else int(lo), max=None if hi is None else int(hi))
    if spec.kind == "path":
        return click.Path(dir_okay=False, path_type=Path)
    if spec.kind == "dir":
        return click.Path(file_okay=False, path_type=Path)
    if spec.kind == "any_path":
        return click.Path(path_type=Path)
    return None


def click_option(spec: OptionSpec) -> Decorator:
    """The click option of ``spec``."""
    kw: dict[str, Any] = {"help": spec.help or None, "envvar": spec.envvar, "metavar": spec.metavar,
                          "multiple": spec.multiple, "show_default": spec.show_default}
    if spec.kind == "flag" and "/" not in spec.flags[0]:
        kw["is_flag"] = True
    elif spec.kind == "flag":
        kw["default"] = bool(spec.default)
    else:
        kw.update(type=_type(spec), default=spec.default)
        if spec.flag_value is not None:
            kw.update(is_flag=False, flag_value=spec.flag_value)
    return click.option(*spec.flags, spec.dest, **{k: v for k, v in kw.items() if v is not None})


def with_options(specs: Iterable[OptionSpec]) -> Decorator:
    """Apply ``specs`` in order (the first one listed first in ``--help``)."""
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        for spec in reversed(list(specs)):
            fn = click_option(spec)(fn)
        return fn
    return deco


def _common(cap: Exporter) -> list[Decorator]:
    """The shared options an export command takes (``cap.common``), in their usual order."""
    out: list[Decorator] = []
    if "output" in cap.common:
        out.append(click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path),
                                help=f"Output dir [default: DIR/{cap.dir_name}]."))
    if "verifier" in cap.common:
        out.append(click.option("--verifier", help="Verifier dir or Hub id [default: the one in DIR/specconv.json]."))
    return out


def _overwrite(label: str) -> Decorator:
    return click.option("--overwrite", is_flag=True, help="Replace an existing output dir that is empty or an earlier "
                        f"specconv {label}; anything else is refused (exit 3).")


def export_command(cap: Exporter) -> click.Command:
    """The click command of an export capability (its :attr:`~specconv.engines.base.Exporter.surface`)."""
    from .common import run_command
    from .options import output_format_option

    name = cap.surface.command[-1]
    engine_opts = cap.engine.options

    def body(drafter_dir: Path, output: Path | None = None, output_format: str = "human", **options: Any) -> Any:
        return cap.run(drafter_dir, output, **options)

    fn: Callable[..., Any] = run_command(body)
    fn = output_format_option(fn)
    tail = [_overwrite(cap.engine.output_kinds[cap.kind].name)] if "overwrite" in cap.common else []
    own = list(cap.surface.options)
    checks = [s for s in own if s.kind == "flag" and s.dest in ("no_check", "check")]
    for deco in reversed([*_common(cap), *[click_option(s) for s in own if s not in checks],
                          *[click_option(s) for s in engine_opts], *tail, *[click_option(s) for s in checks]]):
        fn = deco(fn)
    fn = click.argument("drafter_dir", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))(fn)
    return click.command(name, help=cap.surface.help)(fn)


def exporters(top_level: bool) -> list[Exporter]:
    """Every registered export capability: those under ``export`` (``top_level`` False) or those
    that are commands of their own (``build-engine``)."""
    from ..engines import with_capability

    caps = [e.export for e in with_capability("export")]
    return [c for c in caps if (c.surface.command[0] != "export") == top_level]


def _release_specs() -> list[tuple[str | None, OptionSpec]]:
    """``(engine key or None, spec)``: each exporter's release flag (keyed by its engine) and the
    options of those engines (None: shared, each ``dest`` once), in registry order."""
    out: list[tuple[str | None, OptionSpec]] = []
    seen: set[str] = set()
    for cap in exporters(top_level=False) + exporters(top_level=True):
        if cap.surface.flag is None:
            continue
        out.append((cap.engine.key, cap.surface.flag))
        for spec in cap.engine.options:
            if spec.dest not in seen:
                seen.add(spec.dest)
                out.append((None, spec))
    return sorted(out, key=lambda kv: kv[0] is None)  # the flags first, then the engines' options


def release_flags(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``release``'s engine flags (``--export-onnx``, ``--build-engine``, ``--export-sglang``,
    ``--export-gguf``, ...) and those engines' options, from the registry."""
    return with_options([spec for _, spec in _release_specs()])(fn)


def pop_release_flags(kw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Take :func:`release_flags`' values out of ``kw``: ``(engine key → flag value, engine options)``."""
    exports: dict[str, Any] = {}
    options: dict[str, Any] = {}
    for key, spec in _release_specs():
        value = kw.pop(spec.dest, None)
        if key is not None:
            exports[key] = value
        else:
            options[spec.dest] = value
    return exports, options


def repo_option_specs() -> dict[str, OptionSpec]:
    """Engine key → the ``push`` / ``release`` option publishing its export as a repo of its own
    (``--sglang-repo-id``), in registry order."""
    return {cap.engine.key: cap.repo_option for cap in exporters(top_level=False) + exporters(top_level=True)
            if cap.repo_option is not None}


def _engine_specs(serve: bool) -> dict[str, OptionSpec]:
    """dest → spec of every registered engine's own options (``--llama-server``, ``--verifier-gguf``)
    and, with ``serve``, its serving backend's plain options (``--vllm-python``), each ``dest`` once."""
    from ..engines import engines

    seen: dict[str, OptionSpec] = {}
    for e in engines():
        for spec in (*e.options, *(e.serve.options if serve and e.serve is not None else ())):
            seen.setdefault(spec.dest, spec)
    return seen


def engines_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Every registered engine's own options (``--llama-server``, ``--verifier-gguf``), each ``dest`` once."""
    return with_options(_engine_specs(serve=False).values())(fn)


def serve_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``validate``'s engine options: every engine's own, and each serving backend's plain and
    serving options (``--vllm-python``, ``--tensor-parallel-size``, ``--server-url``, ...)."""
    from ..engines import serves

    serving = [s for _, serve in serves() for s in serve.serving_options]
    return with_options([*_engine_specs(serve=True).values(), *serving])(fn)


def pop_serve_options(kw: dict[str, Any], backend: str, compare: tuple[str, ...] = ()) -> tuple[dict[str, Any],
                                                                                            dict[str, Any]]:
    """Take :func:`serve_options`' values out of ``kw``: ``(engine options, engine key → typed
    serving options)``, after each backend's refusals of them (exit 2; an option named by an
    environment variable alone is no clash). An engine named by ``--compare`` serves in this run too."""
    from ..engines import serves

    plain = {dest: kw.pop(dest, spec.default) for dest, spec in _engine_specs(serve=True).items()}
    ctx = click.get_current_context(silent=True)
    cmdline = click.core.ParameterSource.COMMANDLINE
    given = {d for d in plain if ctx is not None and ctx.get_parameter_source(d) == cmdline}
    typed: dict[str, Any] = {}
    for key, serve in serves():
        value = serve.serve_options({s.dest: kw.pop(s.dest, s.default) for s in serve.serving_options})
        serve.check_options(serve.backend if key in compare or serve.backend in compare else backend, value, given)
        if value is not None:
            typed[key] = value
    return plain, typed


def _runtime_specs() -> list[tuple[str, OptionSpec]]:
    """``(flag key, spec)`` of every compared runtime's ``validate`` option (``--onnx PATH``,
    ``--engine PATH``), in registry order."""
    from ..engines import with_capability
    from ..engines.base import OptionSpec

    return [(rt.key, OptionSpec((f"--{rt.key}",), f"{rt.key}_path", rt.help, kind="any_path"))
            for rt in (e.runtime for e in with_capability("runtime")) if rt.key]


def runtime_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``validate``'s option per compared runtime (each engine's :class:`~specconv.engines.base.Runtime`)."""
    return with_options([spec for _, spec in _runtime_specs()])(fn)


def pop_runtime_paths(kw: dict[str, Any]) -> dict[str, Any]:
    """Take :func:`runtime_options`' values out of ``kw``: runtime flag key → PATH or None."""
    return {key: kw.pop(spec.dest, None) for key, spec in _runtime_specs()}


def load_check_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``validate``'s flag and interpreter option per loader check (``--vllm-load-check``,
    ``--vllm-loader-python``, ``--sglang-load-check``, ...), from the registry."""
    from ..engines import load_checks

    return with_options([s for _, check in load_checks() for s in (check.flag, check.python)])(fn)


def pop_load_checks(kw: dict[str, Any]) -> dict[str, str | None]:
    """Take :func:`load_check_options`' values out of ``kw``: engine key → interpreter (None: the
    default) of every check asked for."""
    from ..engines import load_checks

    out: dict[str, str | None] = {}
    for key, check in load_checks():
        on, python = kw.pop(check.flag.dest, False), kw.pop(check.python.dest, None)
        if on:
            out[key] = python
    return out
