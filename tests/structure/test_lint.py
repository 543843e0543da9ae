"""Lint and types (docs/ci.md "Lint and types"): ``make lint`` (ruff, then mypy) runs before every test tier, and
no module is exempt from mypy."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _overrides() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]


def test_make_test_and_test_fast_run_lint_first():
    make = (ROOT / "Makefile").read_text()
    assert re.search(r"^lint: .*\n\t\$\(PY\) -m ruff check specconv tests benchmarks examples\n\t\$\(PY\) -m mypy\n",
                     make, flags=re.M)
    assert re.search(r"^test: lint ", make, flags=re.M) and re.search(r"^test-fast: lint$", make, flags=re.M)


def test_no_module_is_exempt_from_mypy():
    """No ``ignore_errors`` override: every module of specconv/ is type-checked (only third-party packages
    without types are named, with ``ignore_missing_imports``)."""
    assert not [o for o in _overrides() if o.get("ignore_errors")]
    assert all(o.get("ignore_missing_imports") for o in _overrides())


def test_third_party_overrides_say_why():
    text = (ROOT / "pyproject.toml").read_text()
    for block in re.findall(r"((?:#[^\n]*\n)*)\[\[tool\.mypy\.overrides\]\]", text):
        assert block.strip(), "every [[tool.mypy.overrides]] block has a comment saying why"
