"""Options shared by several commands, declared once.

Each is a ``click.option`` decorator (or a factory where a command needs the option
required or with a command-specific help text). Importing this module imports click only.
"""

from __future__ import annotations

import click

#: ``--format``: how a command prints its result (see ``specconv.cli.common.render``)
output_format_option = click.option(
    "--format",
    "output_format",
    type=click.Choice(["human", "json"]),
    default="human",
    show_default=True,
    help="human: readable summary; json: one JSON object on stdout.",
)

#: ``--subfolder``: where inside SRC (a dir or a Hub repo) the checkpoint lives
subfolder_option = click.option("--subfolder", help="Subfolder of SRC holding the checkpoint.")

#: ``--revision``: Hub revision (branch, tag or commit) of SRC
revision_option = click.option("--revision", help="Hub revision of SRC.")

#: ``--endpoint``: the Hub endpoint; click reads ``HF_ENDPOINT`` when the command runs, not at import
endpoint_option = click.option("--endpoint", envvar="HF_ENDPOINT",
                               help="Hub endpoint [env HF_ENDPOINT, read at call time].")

#: ``--checkpoint``: which checkpoint of a trainer's save dir
checkpoint_option = click.option("--checkpoint", help="Trainer save dir: best | latest | a child name.")


def verifier_option(*, required: bool = True, help: str = "Verifier: local dir or Hub id."):
    """``--verifier``: the verifier LLM (local HF dir or Hub repo id)."""
    return click.option("--verifier", required=required, help=help)


def verifier_name_option(help: str = "Hub id to record as verifier.name_or_path when --verifier is local."):
    """``--verifier-name``: the Hub id recorded when ``--verifier`` is a local dir."""
    return click.option("--verifier-name", help=help)
