"""``specconv inspect SRC``: detect a source checkpoint (headers only) and lint it."""

from __future__ import annotations

import click

from .common import run_command
from .options import (
    checkpoint_option,
    endpoint_option,
    output_format_option,
    subfolder_option,
    verifier_name_option,
    verifier_option,
)


@click.command("inspect")
@click.argument("src")
@verifier_option(required=False, help="Verifier (local dir or Hub id): also dry-run the conversion plan.")
@verifier_name_option(help="Hub id to record when --verifier is a local dir.")
@subfolder_option
@checkpoint_option
@endpoint_option
@click.option("--scan", is_flag=True, help="Also read every float tensor and report NaN/Inf (exit 3 if any).")
@output_format_option
@run_command
def inspect_cmd(src: str, verifier: str | None, verifier_name: str | None, subfolder: str | None,
                checkpoint: str | None, endpoint: str | None, scan: bool, output_format: str):
    """Detect SRC's format without reading tensor data; lint Speculators dirs.

    Exit 0 when the source is supported (and lint has no errors), 3 otherwise.
    """
    from specconv.convert import inspect_source

    return inspect_source(src, verifier=verifier, verifier_name=verifier_name, subfolder=subfolder,
                          checkpoint=checkpoint, endpoint=endpoint, scan=scan)
