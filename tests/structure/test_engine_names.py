"""Generic code never dispatches on an engine's name (issue 26; the rule ``tests/format`` applies to
algorithm names): outside ``specconv/engines/<key>/`` no product module compares with, keys a dict
by, subscripts with or matches on an engine's key (or its directory / record name: ``gguf``,
``trt``)."""

from __future__ import annotations

import ast
import functools
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMES = {"vllm", "onnx", "tensorrt", "sglang", "llamacpp", "gguf", "trt"}
#: import names → extras, not engines (``specconv/extras.py`` maps Python packages)
NOT_DISPATCH = {"specconv/extras.py"}
#: "file: name" → places not yet folded into the registry (none left). Only ever remove or lower entries.
ALLOWED: Counter = Counter()


def _is_name(n: ast.AST) -> bool:
    return isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in NAMES


def _dispatch(node: ast.AST) -> list[ast.Constant]:
    """The engine names ``node`` dispatches on (a comparison, a dict key, a subscript, a match case)."""
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        found = [c for c in sides if _is_name(c)]
        return found + [e for c in sides if isinstance(c, (ast.Tuple, ast.List, ast.Set)) for e in c.elts
                        if _is_name(e)]
    if isinstance(node, ast.Dict):
        return [k for k in node.keys if k is not None and _is_name(k)]
    if isinstance(node, ast.Subscript):
        return [node.slice] if _is_name(node.slice) else []
    if isinstance(node, ast.match_case):
        return [x for x in ast.walk(node.pattern) if _is_name(x)]
    return []


@functools.cache  # one scan of the tree per session, shared by the module's tests (read-only)
def places() -> Counter:
    found: Counter = Counter()
    for path in sorted((ROOT / "specconv").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        parts = rel.split("/")
        if rel in NOT_DISPATCH or (parts[1] == "engines" and len(parts) > 3):  # an engine's own package
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for c in _dispatch(node):
                found[f"{rel}: {c.value}"] += 1
    return found


def test_no_dispatch_on_an_engine_name_beyond_the_list():
    grown = {k: (ALLOWED.get(k, 0), n) for k, n in places().items() if n > ALLOWED.get(k, 0)}
    assert not grown, f"dispatch on an engine's name outside specconv/engines/<key>/ (allowed, now): {grown}"


def test_the_list_only_shrinks():
    now = places()
    stale = sorted(k for k, n in ALLOWED.items() if now.get(k, 0) < n)
    assert not stale, f"fewer places now: lower or delete these entries: {stale}"
