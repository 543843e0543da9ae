"""``specconv formats``: the source-format registry (supported and refused)."""

from __future__ import annotations

import click

from .common import emit, output_format_option, run_command


def formats_table() -> list[dict]:
    from specconv.converters import ordered

    return [c.describe() for c in ordered()]


def _human(result: dict) -> str:
    lines = [f"{'format':28} {'algorithm':9} {'supported':9} source"]
    for r in result["formats"]:
        lines.append(f"{r['format']:28} {r['algorithm']:9} {('yes' if r['supported'] else 'refused'):9} {r['title']}")
    return "\n".join(lines)


@click.command("formats")
@output_format_option
@run_command
def formats_cmd(output_format: str) -> None:
    """List every source format specconv detects, in detection order."""
    emit({"formats": formats_table()}, output_format, _human)
