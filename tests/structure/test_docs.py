"""docs/cli.md documents every option of every command; its --help copies equal the real ones."""

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


def _help_blocks() -> list[tuple[str, str]]:
    """``(command words, text)`` of every ```` ```text ```` block of docs/cli.md that is a
    ``specconv <cmd> --help`` copy (it starts with ``Usage: specconv``)."""
    import re

    return [(m.group(2), m.group(1)) for m in
            re.finditer(r"```text\n(Usage: specconv ([a-z -]+?) \[OPTIONS\].*?)```", DOC, flags=re.S)]


def test_help_copies_are_found():
    assert {words for words, _ in _help_blocks()} >= {"inspect", "convert", "validate", "build-engine"}


@pytest.mark.parametrize("words,text", _help_blocks(), ids=[w for w, _ in _help_blocks()])
def test_help_copies_equal_the_real_help(words, text):
    """Each embedded ``--help`` equals the command's own, as printed on a terminal (click
    wraps at 78 columns for any terminal of 80 or more)."""
    from click.testing import CliRunner

    res = CliRunner().invoke(cli, [*words.split(), "--help"], prog_name="specconv", terminal_width=78)
    assert res.exit_code == 0
    assert text == res.output, f"docs/cli.md's copy of `specconv {words} --help` is stale: paste the real one"
