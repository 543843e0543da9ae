"""The CLI only parses options, calls one library function per command and renders its typed
result: no module of ``specconv/cli/`` writes a file or a directory itself (issue 15 item 2).

Static (AST) check of every ``specconv/cli/*.py``: ``open`` in a writing mode, ``Path``
writes (``write_text``, ``write_bytes``, ``mkdir``, ``touch``, ``unlink``, ``rmdir``,
``rename``, ``replace``, ``symlink_to``, ``hardlink_to``), anything of ``shutil`` or
``tempfile``, the ``os`` calls that change the file system, and the stages' own writers
(record, report, card, conversion, export): those belong to the library function the
command calls, which finishes its own work.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CLI = Path(__file__).resolve().parents[2] / "specconv" / "cli"

#: method names that write through a ``pathlib.Path`` (``str.replace`` is told apart: see ``_writes``)
PATH_WRITES = {"write_text", "write_bytes", "mkdir", "touch", "unlink", "rmdir", "rename", "symlink_to",
               "hardlink_to", "chmod"}
#: ``os`` functions that change the file system
OS_WRITES = {"replace", "rename", "renames", "remove", "unlink", "rmdir", "removedirs", "mkdir", "makedirs",
             "symlink", "link", "chmod", "truncate", "write", "open", "mkfifo"}
#: modules a CLI module must not call at all (every function of theirs writes or makes temp files)
WRITING_MODULES = {"shutil", "tempfile"}
#: the stages' writers: calling one from the CLI means the CLI finishes a stage's work
STAGE_WRITERS = {"update_record", "atomic_write", "write_report", "finish_report", "write_local_card",
                 "refresh_local_card", "list_card_in_record", "write_plan", "record_export", "record_in_specconv_json",
                 "write_safetensors", "move_into_place", "keep_previous_export"}


def _open_mode(call: ast.Call) -> str | None:
    """The mode of an ``open(...)`` call ("r" when not given; None when not a constant)."""
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    if mode is None:
        return "r"
    return mode.value if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else None


def _writes(tree: ast.AST) -> list[str]:
    """``line: what`` for every writing call (or import of a writing module / writer) in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            names = {a.name for a in node.names}
            if {m.split(".")[0] for m in mods} & WRITING_MODULES:
                found.append(f"{node.lineno}: import of {', '.join(mods)}")
            if isinstance(node, ast.ImportFrom) and names & STAGE_WRITERS:
                found.append(f"{node.lineno}: imports the stage writer(s) {sorted(names & STAGE_WRITERS)}")
            continue
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name):
            if f.id == "open":
                mode = _open_mode(node)
                if mode is None or set(mode) & set("wax+"):
                    found.append(f"{node.lineno}: open(..., {mode!r})")
            elif f.id in STAGE_WRITERS:
                found.append(f"{node.lineno}: {f.id}(...)")
        elif isinstance(f, ast.Attribute):
            base = f.value.id if isinstance(f.value, ast.Name) else None
            if base in WRITING_MODULES:
                found.append(f"{node.lineno}: {base}.{f.attr}(...)")
            elif base == "os" and f.attr in OS_WRITES:
                found.append(f"{node.lineno}: os.{f.attr}(...)")
            elif f.attr in STAGE_WRITERS:
                found.append(f"{node.lineno}: .{f.attr}(...)")
            elif f.attr in PATH_WRITES or (f.attr == "open" and set(_open_mode(node) or "w") & set("wax+")):
                found.append(f"{node.lineno}: .{f.attr}(...)")
            elif f.attr == "replace" and base not in (None, "os") and len(node.args) == 1:
                found.append(f"{node.lineno}: .replace(...) with one argument (Path.replace)")
    return found


@pytest.mark.parametrize("module", sorted(p.name for p in CLI.glob("*.py")))
def test_cli_module_writes_nothing(module):
    problems = _writes(ast.parse((CLI / module).read_text(encoding="utf-8")))
    assert not problems, (f"specconv/cli/{module} writes itself; the library function the command calls must "
                          "(issue 15 item 2):\n  " + "\n  ".join(problems))


@pytest.mark.parametrize("source, caught", [
    ("open(p, 'w')", True), ("open(p, mode='ab')", True), ("open(p)", False), ("open(p, 'rb')", False),
    ("Path(p).write_text('x')", True), ("out.mkdir(parents=True)", True), ("p.unlink()", True),
    ("p.replace(q)", True), ("'a,b'.replace(',', ' ')", False), ("value.replace(' ', '')", False),
    ("os.replace(a, b)", True), ("os.environ.get('X')", False), ("shutil.rmtree(d)", True),
    ("import shutil", True), ("from tempfile import mkdtemp", True),
    ("update_record(d, 'validation', s)", True), ("card.refresh_local_card(d)", True),
    ("from specconv.engines.card import refresh_local_card", True), ("from specconv.convert import convert", False),
    ("validate_drafter(d, v, opts)", False), ("click.echo(text)", False),
])
def test_the_check_catches_writes(source, caught):
    """The checker itself: each kind of write is caught, reads and str.replace are not."""
    assert bool(_writes(ast.parse(source))) is caught, source
