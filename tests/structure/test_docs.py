"""docs/cli.md documents every option of every command (it embeds their --help)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specconv.cli.main import COMMANDS, cli

DOC = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_is_documented(name):
    import click

    cmd = cli.get_command(click.Context(cli), name)
    assert f"## `specconv {name}`" in DOC
    for p in cmd.params:
        for opt in getattr(p, "opts", []):
            if opt.startswith("--"):
                assert opt in DOC, f"{name} {opt} missing from docs/cli.md"


@pytest.mark.parametrize("doc", ["docs/cli.md", "README.md"])
def test_exit_codes_documented(doc):
    """The "Exit codes" table of each doc lists exactly the codes of ``errors.EXIT_CODES``."""
    import re

    from specconv.errors import EXIT_CODES

    text = (Path(__file__).resolve().parents[2] / doc).read_text()
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    assert {int(c) for c in re.findall(r"^\| (\d+) \|", section, flags=re.M)} == set(EXIT_CODES)
