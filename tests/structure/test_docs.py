"""docs/cli.md documents every option of every command; its --help copies equal the real ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_runner import invoke
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
    res = invoke(*words.split(), "--help", as_json=False, prog_name="specconv", terminal_width=78)
    assert res.code == 0
    assert text == res.output, f"docs/cli.md's copy of `specconv {words} --help` is stale: paste the real one"


ROOT = Path(__file__).resolve().parents[2]
USER_DOCS = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]


def _doc_commands(doc: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every ``specconv <command> …`` a user would copy from ``doc``: each
    one in a fenced block (``\\``-continued and indented synopsis lines joined) and each inline
    `` `specconv …` `` span."""
    import re

    text, found = (ROOT / doc).read_text(), []
    for m in re.finditer(r"```[^\n]*\n(.*?)```", text, flags=re.S):
        first = text[:m.start()].count("\n") + 2
        current = None
        for i, line in enumerate(m.group(1).replace("\\\n", " \n").splitlines()):
            start = re.search(r"\bspecconv ([a-z].*)", line)
            if start:
                current = [first + i, "specconv " + start.group(1)]
                found.append(current)
            elif current and line[:1].isspace() and line.strip():
                current[1] += " " + line.strip()
            else:
                current = None
    found += [[text[:m.start()].count("\n") + 1, m.group(1)]
              for m in re.finditer(r"(?<!`)`(specconv [a-z][^`]*)`(?!`)", text)]
    return [(line, cmd) for line, cmd in found]


def _resolve(words: list[str]):
    """The click command the leading ``words`` name (``export onnx`` …) and those words."""
    import click

    cmd, used = cli, []
    for w in words:
        sub = cmd.get_command(click.Context(cmd), w) if isinstance(cmd, click.Group) else None
        if sub is None:
            break
        cmd, used = sub, [*used, w]
    return cmd, used


@pytest.mark.parametrize("doc", USER_DOCS)
def test_doc_commands_use_real_flags(doc):
    """Every ``--flag`` of every ``specconv`` command a doc prints is an option of that command
    (``--vllm-arg=--x`` words are the server's, not specconv's)."""
    import re

    bad = []
    for line, cmd in _doc_commands(doc):
        command, used = _resolve(cmd.split()[1:])
        if not used:
            continue
        known = {o for p in command.params for o in [*p.opts, *getattr(p, "secondary_opts", [])]}
        flags = re.findall(r"(?<![\w=-])(--[a-z][a-z0-9-]*)", cmd.split(" # ")[0])
        bad += [f"{doc}:{line}: specconv {' '.join(used)} {f}" for f in flags if f not in known]
    assert not bad, "doc commands use options the command does not have:\n" + "\n".join(bad)


@pytest.mark.parametrize("doc", USER_DOCS)
def test_doc_choice_lists_are_the_commands(doc):
    """A doc's ``--opt a|b|c`` for a choice option lists exactly that option's choices."""
    import re

    import click

    bad = []
    for line, cmd in _doc_commands(doc):
        command, used = _resolve(cmd.split()[1:])
        params = {o: p for p in command.params for o in p.opts}
        for opt, vals in re.findall(r"(?<![\w=-])(--[a-z-]+)[ =]([\w+.:-]+(?:\|[\w+.:-]+)+)", cmd):
            p = params.get(opt)
            if used and p is not None and isinstance(p.type, click.Choice):
                if set(vals.split("|")) != set(map(str, p.type.choices)):
                    bad.append(f"{doc}:{line}: specconv {' '.join(used)} {opt} {vals} (choices: "
                               f"{'|'.join(map(str, p.type.choices))})")
    assert not bad, "\n".join(bad)


def test_doc_commands_are_found():
    """The extraction above sees the commands it should (a regex gone blind passes vacuously)."""
    cmds = [c for doc in USER_DOCS for _, c in _doc_commands(doc)]
    assert len(cmds) > 100
    synopsis = [c for c in cmds if c.startswith("specconv validate DIR --verifier V [--source SRC]")]
    assert synopsis and "--sglang-load-check" in synopsis[0]


def test_test_modules_have_unique_basenames() -> None:
    """pytest's default import mode (rootdir, no ``__init__.py`` per room) imports test modules by
    basename: two rooms with the same ``test_x.py`` stop collection of the whole suite (CI did)."""
    root = Path(__file__).resolve().parents[1]
    seen: dict[str, list[str]] = {}
    for path in sorted(root.rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(root)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
