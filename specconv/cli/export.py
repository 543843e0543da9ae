"""``specconv export <engine> DIR``: one subcommand per registered export capability (``onnx``,
``gguf``, ``sglang``, and any plug-in engine's), built from the registry (docs/engines.md)."""

from __future__ import annotations

import click


class _ExportGroup(click.Group):
    """The subcommands come from the engine registry (:func:`specconv.cli.engine_options.exporters`)."""

    def _commands(self) -> dict[str, click.Command]:
        from .engine_options import export_command, exporters

        return {c.surface.command[-1]: export_command(c) for c in exporters(top_level=False)}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self._commands())

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return self._commands().get(name)


@click.group("export", cls=_ExportGroup)
def export_group() -> None:
    """Export a Speculators drafter to deployment formats."""
