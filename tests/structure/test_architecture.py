"""``docs/architecture.md`` stays true: its room table is the import graph of the code.

Every top-level module or package of ``specconv/`` is a room with one row in the table; the
row's "may import" cell is a comma list of rooms (``—`` for none). The rows run from the top of
the house to its floor: a room may import only rooms listed below it, so the table itself has
no cycle and no upward arrow. The graph is derived from the code — every ``import`` statement,
function-level and ``if TYPE_CHECKING:`` ones included — and each edge must be in the table.
``errors`` (the exceptions and exit codes) and the package root (``specconv.__version__``) may
be imported by every room.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "specconv"
DOC = ROOT / "docs" / "architecture.md"
#: imported by every room (besides the rows' lists)
EVERYWHERE = {"errors", "specconv"}


def rooms_in_code() -> set[str]:
    """Top-level modules and packages of ``specconv/`` (the package root itself excluded)."""
    return {p.stem if p.suffix == ".py" else p.name for p in PACKAGE.iterdir()
            if (p.suffix == ".py" and p.name != "__init__.py") or (p.is_dir() and (p / "__init__.py").is_file())}


def _module_name(path: Path) -> tuple[str, bool]:
    rel = path.relative_to(ROOT).with_suffix("")
    is_package = rel.name == "__init__"
    parts = rel.parts[:-1] if is_package else rel.parts
    return ".".join(parts), is_package


def _targets(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """Absolute module names an import statement reaches (``from x import y``: ``x`` and ``x.y``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = module.split(".")[: len(module.split(".")) - node.level + is_package]
        stem = ".".join(base + ([node.module] if node.module else []))
    else:
        stem = node.module or ""
    return [stem] + [f"{stem}.{a.name}" for a in node.names]


def _room_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "specconv":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in rooms_in_code() else "specconv"


@functools.cache  # one scan of the tree per session, shared by the module's tests (read-only)
def import_edges() -> dict[tuple[str, str], list[str]]:
    """``(room, imported room)`` → the ``file:line`` places, for every cross-room import."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module, is_package = _module_name(path)
        source = module.split(".")[1] if "." in module else "specconv"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _targets(node, module, is_package):
                room = _room_of(target)
                if room and room != source:
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    places = edges.setdefault((source, room), [])
                    if where not in places:
                        places.append(where)
    return edges


def table() -> list[tuple[str, set[str]]]:
    """``(room, rooms it may import)`` per row of the room table, top to bottom."""
    text = DOC.read_text(encoding="utf-8")
    body = text.split("## Rooms", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`specconv/"):
            continue
        room = re.fullmatch(r"`specconv/([a-z_]+)(?:/|\.py)`", cells[0])
        assert room, ("docs/architecture.md: one room per row, written `specconv/NAME/` or `specconv/NAME.py`: "
                      f"{cells[0]}")
        allowed = {c.strip().strip("`") for c in cells[2].split(",")} - {"—", ""}
        rows.append((room.group(1), allowed))
    return rows


def test_every_room_has_one_row():
    rooms = [r for r, _ in table()]
    assert len(rooms) == len(set(rooms)), sorted(r for r in rooms if rooms.count(r) > 1)
    assert set(rooms) == rooms_in_code(), (set(rooms) ^ rooms_in_code())


def test_the_table_points_only_downward():
    rows = table()
    below: set[str] = set()
    bad = []
    for room, allowed in reversed(rows):
        if allowed - below:
            bad.append(f"{room} may import {sorted(allowed - below)}, which are not listed below it")
        below.add(room)
    assert not bad, "\n".join(bad)


def test_every_import_is_one_the_table_allows():
    allowed = dict(table())
    bad = [f"{src} imports {dst} ({', '.join(places[:3])}): not in its row of docs/architecture.md"
           for (src, dst), places in sorted(import_edges().items())
           if dst not in EVERYWHERE and dst not in allowed.get(src, set())]
    assert not bad, "\n".join(bad)


def test_every_listed_import_exists():
    """A row lists what the room imports, not more: a stale entry is a statement no longer true."""
    edges = import_edges()
    stale = [f"{room} lists {dst} but never imports it" for room, listed in table() for dst in sorted(listed)
             if (room, dst) not in edges]
    assert not stale, "\n".join(stale)


def test_the_derivation_sees_every_kind_of_import(tmp_path):
    """Function-level, ``TYPE_CHECKING`` and relative imports all count."""
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..record import X\n"
                     "def f():\n    import specconv.hub\n    from . import sibling\n")
    found = [t for n in ast.walk(tree) for t in _targets(n, "specconv.validate.run", False)]
    assert "specconv.record" in found and "specconv.hub" in found and "specconv.validate.sibling" in found
    assert _room_of("specconv.record.X") == "record" and _room_of("specconv.__version__") == "specconv"
