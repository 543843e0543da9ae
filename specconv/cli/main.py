"""``specconv`` command group. Subcommands are imported lazily so ``--help`` stays fast
(no torch import) and a broken optional dependency only affects its own command."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

import click

from .. import __version__
from ..errors import EXIT_CODES
from .common import setup_logging

if TYPE_CHECKING:
    from ..engines.base import Exporter

#: command name → "module:attribute" (relative to specconv.cli)
COMMANDS = {
    "inspect": "inspect:inspect_cmd",
    "convert": "convert:convert_cmd",
    "formats": "formats:formats_cmd",
    "validate": "validate:validate_cmd",
    "export": "export:export_group",
    "push": "push:push_cmd",
    "release": "release:release_cmd",
}

EPILOG = "Exit codes: " + ", ".join(f"{k} {v}" for k, v in sorted(EXIT_CODES.items()))


def _engine_commands() -> dict[str, Exporter]:
    """The commands engines declare of their own (``build-engine``), from the registry."""
    from .engine_options import exporters

    return {c.surface.command[-1]: c for c in exporters(top_level=True)}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*COMMANDS, *_engine_commands()])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            cap = _engine_commands().get(name)
            if cap is None:
                return None
            from .engine_options import export_command

            return export_command(cap)
        mod, attr = target.split(":")
        return getattr(importlib.import_module(f"specconv.cli.{mod}"), attr)

    def invoke(self, ctx: click.Context):
        """Usage errors (bad flag, missing option) still give one JSON object on stdout
        under ``--format json`` (exit 2); click prints its message on stderr as usual."""
        args = [*getattr(ctx, "_protected_args", []), *ctx.args]
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            if _wants_json(args):
                from ..errors import EXIT_USAGE
                from .common import dumps

                click.echo(dumps({"error": "usage", "message": e.format_message(), "exit_code": EXIT_USAGE}))
            raise


def _wants_json(args: list[str]) -> bool:
    return "--format=json" in args or any(a == "--format" and b == "json" for a, b in zip(args, args[1:], strict=False))


@click.group(cls=LazyGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="specconv")
@click.option("-v", "--verbose", count=True, help="More logging on stderr (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """Convert, validate and publish P-EAGLE / DFlash / DFlash2 / DSpark speculative-decoding drafters.

    Results go to stdout (one JSON object with --format json); logs and progress to stderr.
    """
    setup_logging(verbose)


def main() -> None:
    cli(prog_name="specconv")


if __name__ == "__main__":  # pragma: no cover
    main()
