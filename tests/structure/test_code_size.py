"""Small pieces: no function over 50 lines, no module over 800 lines, outside an allow-list
that may only shrink (docs/architecture.md, "Conventions").

The allow-list names each exception with its size *today*; a listed piece that grows fails,
and so does a listed piece that no longer needs its entry (delete the line).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("specconv",)
MAX_FUNCTION, MAX_MODULE = 50, 800

# "path:qualname" → lines today, "path" → module lines today. Only ever remove or lower entries.
ALLOWED: dict[str, int] = {
}


@functools.cache  # one scan of the tree per session, shared by the module's tests (read-only)
def _sizes() -> dict[str, int]:
    out: dict[str, int] = {}
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            src = path.read_text(encoding="utf-8")
            n = src.count("\n") + (0 if src.endswith("\n") else 1)
            if n > MAX_MODULE:
                out[rel] = n
            _functions(ast.parse(src), rel, "", out)
    return out


def _functions(node: ast.AST, rel: str, prefix: str, out: dict[str, int]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{child.name}"
            if not isinstance(child, ast.ClassDef):
                n = child.end_lineno - child.lineno + 1  # from `def` (click decorators are declarative)
                if n > MAX_FUNCTION:
                    out[f"{rel}:{name}"] = n
            _functions(child, rel, name + ".", out)


def test_no_long_functions_or_modules_outside_the_allow_list():
    sizes = _sizes()
    new = {k: v for k, v in sizes.items() if k not in ALLOWED}
    grown = {k: (ALLOWED[k], v) for k, v in sizes.items() if k in ALLOWED and v > ALLOWED[k]}
    assert not new, f"over {MAX_FUNCTION} lines per function / {MAX_MODULE} per module: {new}"
    assert not grown, f"allow-listed pieces grew (allowed, now): {grown}"


def test_allow_list_only_shrinks():
    sizes = _sizes()
    stale = sorted(k for k in ALLOWED if k not in sizes)
    shrunk = {k: (v, sizes[k]) for k, v in ALLOWED.items() if k in sizes and sizes[k] < v}
    assert not stale, f"no longer over the limit: delete these allow-list entries: {stale}"
    assert not shrunk, f"smaller now: lower these allow-list entries (allowed, now): {shrunk}"
