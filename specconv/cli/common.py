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
from collections.abc import Callable
from typing import Any, TextIO

import click

from ..errors import EXIT_INTERRUPTED, InvalidInputError, SpecconvError
from ..extras import quiet_library_bars
from .options import output_format_option  # noqa: F401  (re-exported for command modules)

log = logging.getLogger("specconv")

class _StderrHandler(logging.StreamHandler):
    """A stream handler writing to whatever ``sys.stderr`` is *now* (click's CliRunner and
    embedding callers swap it between invocations; the handler is installed only once)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
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


def dumps(obj: dict) -> str:
    """Serialise a result object the way every command prints it (sorted keys)."""
    from ..results import jsonable

    return json.dumps(obj, sort_keys=True, default=jsonable, indent=2)


def render(result: Any, output_format: str) -> None:
    """Print a typed stage result (``specconv.results.StageResult``) on stdout: ``--format
    json`` as one JSON object (:meth:`to_json`), ``--format human`` as :meth:`human`."""
    click.echo(result.to_json() if output_format == "json" else result.human())


def progress_enabled() -> bool:
    """Progress bars only when stderr is an interactive terminal."""
    return sys.stderr.isatty()


def _error_object(e: SpecconvError, fmt: str) -> int:
    """Print a SpecconvError (its result when it carries one); return its exit code."""
    if e.result is not None:
        render(e.result, fmt)
    elif fmt == "json":
        click.echo(dumps(e.to_dict()))
    msg = f"error: {e.message}"
    if e.hint:
        msg += f"\nhint: {e.hint}"
    click.echo(msg, err=True)
    return e.exit_code


def _exit(code: int) -> None:
    """End the command with ``code`` through click (``ctx.exit``), never a bare SystemExit."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:  # pragma: no cover - called outside click
        raise SystemExit(code)
    ctx.exit(code)


def _missing_extra(e: ModuleNotFoundError) -> SpecconvError:
    """The exit-2 error for a missing optional package; any other missing module re-raises."""
    from ..extras import missing_extra_error

    ctx = click.get_current_context(silent=True)
    err = missing_extra_error(e, feature=ctx.command_path if ctx is not None else "specconv")
    if err is None:
        raise e
    return err


def run_command(fn: Callable[..., Any]) -> Callable[..., None]:
    """Decorator: run a command body, render its result, map errors to exit codes.

    The wrapped function receives the click parameters (including ``output_format``) and
    returns a typed result (rendered here; the exit status is its ``exit_status()``) or
    ``None`` (``formats --markdown``: it printed itself). Errors are printed here: a
    :class:`~specconv.errors.SpecconvError` as its JSON object on stdout with ``--format
    json`` (its ``result`` instead when it carries one) plus a one-line message on
    stderr; a missing optional package (``specconv.extras.OPTIONAL_MODULES``) as exit 2
    with its ``pip install 'specconv[EXTRA]'`` line; ``OSError`` as exit 3; Ctrl-C as exit 130.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        fmt = kwargs.get("output_format", "human")
        code = 0
        quiet_library_bars()
        try:
            result = fn(*args, **kwargs)
            if result is not None:
                render(result, fmt)
                code = result.exit_status()
        except SpecconvError as e:
            code = _error_object(e, fmt)
        except ModuleNotFoundError as e:  # an optional package not installed: exit 2 + the install line
            code = _error_object(_missing_extra(e), fmt)
        except OSError as e:  # the environment, not a bug: disk full, read-only output, permissions
            where = f": {e.filename}" if e.filename else ""
            code = _error_object(InvalidInputError(f"{e.strerror or e}{where}", code="os_error"), fmt)
        except KeyboardInterrupt:  # Ctrl-C (convert: the writer has already removed its temp dir)
            interrupted = SpecconvError("interrupted (Ctrl-C)", code="interrupted")
            interrupted.exit_code = EXIT_INTERRUPTED
            code = _error_object(interrupted, fmt)
        if code:
            _exit(code)

    return wrapper
