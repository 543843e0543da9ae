"""Shared CLI plumbing: ``--format``, result emission, error → exit-code mapping.

Contract for every command:

* ``--format json`` prints exactly one JSON object on stdout (sorted keys);
  ``--format human`` prints a short human summary on stdout.
* Logs, warnings and progress go to stderr; rich progress bars only when stderr is a TTY.
* A :class:`~specconv.errors.SpecconvError` becomes its ``exit_code``; with ``--format json``
  the error object ``{"error", "message", "exit_code", "hint"?}`` is still printed on stdout.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
from typing import Any, Callable

import click

from ..errors import EXIT_INVALID_INPUT, SpecconvError

#: exit status after Ctrl-C (128 + SIGINT, the shell convention)
EXIT_INTERRUPTED = 130

log = logging.getLogger("specconv")

output_format_option = click.option(
    "--format",
    "output_format",
    type=click.Choice(["human", "json"]),
    default="human",
    show_default=True,
    help="human: readable summary; json: one JSON object on stdout.",
)


class _StderrHandler(logging.StreamHandler):
    """A stream handler writing to whatever ``sys.stderr`` is *now* (click's CliRunner and
    embedding callers swap it between invocations; the handler is installed only once)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def setup_logging(verbose: int = 0) -> None:
    """Route specconv logs to stderr (rich handler on a TTY, plain otherwise)."""
    level = logging.DEBUG if verbose > 1 else logging.INFO if verbose == 1 else logging.WARNING
    root = logging.getLogger("specconv")
    if root.handlers:
        root.setLevel(level)
        return
    if sys.stderr.isatty():
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(show_path=False, markup=False)
    else:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False


def _jsonable(o: Any) -> Any:
    from pathlib import Path

    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def dumps(obj: dict) -> str:
    """Serialise a result object the way every command prints it (sorted keys)."""
    return json.dumps(obj, sort_keys=True, default=_jsonable, indent=2)


def emit(result: dict, output_format: str, human: Callable[[dict], str] | None = None) -> None:
    """Print a command result on stdout in the selected format."""
    if output_format == "json":
        click.echo(dumps(result))
    elif human is not None:
        click.echo(human(result))
    else:
        click.echo(dumps(result))


def progress_enabled() -> bool:
    """Progress bars only when stderr is an interactive terminal."""
    return sys.stderr.isatty()


def run_command(fn: Callable[..., dict | None]) -> Callable[..., None]:
    """Decorator: run a command body, map SpecconvError to its exit code.

    The wrapped function receives the click parameters (including ``output_format``)
    and returns ``None`` (it already emitted) — errors are printed here: as JSON on
    stdout with ``--format json`` (plus a one-line message on stderr), else on stderr.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        fmt = kwargs.get("output_format", "human")
        try:
            fn(*args, **kwargs)
        except SpecconvError as e:
            if fmt == "json":
                click.echo(dumps(e.to_dict()))
            msg = f"error: {e.message}"
            if e.hint:
                msg += f"\nhint: {e.hint}"
            click.echo(msg, err=True)
            sys.exit(e.exit_code)
        except OSError as e:  # the environment, not a bug: disk full, read-only output, permissions
            where = f": {e.filename}" if e.filename else ""
            err = {"error": "os_error", "message": f"{e.strerror or e}{where}", "exit_code": EXIT_INVALID_INPUT}
            if fmt == "json":
                click.echo(dumps(err))
            click.echo(f"error: {err['message']}", err=True)
            sys.exit(EXIT_INVALID_INPUT)
        except KeyboardInterrupt:  # Ctrl-C (convert: the writer has already removed its temp dir)
            if fmt == "json":
                click.echo(dumps({"error": "interrupted", "message": "interrupted (Ctrl-C)", "exit_code": EXIT_INTERRUPTED}))
            click.echo("error: interrupted (Ctrl-C)", err=True)
            sys.exit(EXIT_INTERRUPTED)

    return wrapper
