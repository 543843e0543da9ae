"""Capture (or check) the golden behaviour files under ``tests/golden/data/``.

What is recorded, per case (``data/<group>/<case>.json``): every CLI call's normalised
argv, exit code, ``--format json`` stdout (key for key), uncaught exception, whether stderr
holds a traceback, and the files it added / changed / removed; for conversions also every
output file (``config.json``, ``specconv.json``, the card: full normalised content; tensor
files: sha256). Groups: ``convert`` (one per supported source format + variants),
``refusals`` (``tests/fixtures_dspark.REFUSAL_CASES``), ``bad_inputs`` (the hostile inputs of
``tests/cli/test_bad_inputs_convert.py`` / ``test_bad_inputs_publish.py``), ``commands`` (formats, push
``--dry-run`` against the loopback Hub double, validate), ``slow`` (export onnx, release
``--dry-run``). The one normaliser is :mod:`golden.normalise`.

Usage (from the repo root)::

    PYTHONPATH=. .venv/bin/python tests/golden/capture.py --check   # compare; exit 1 + diff on a change
    PYTHONPATH=. .venv/bin/python tests/golden/capture.py           # REWRITE the goldens
    ... [--group convert] [--case zlab_dflash] [--no-slow] [--keep]

Rewriting is a deliberate act: run it only after an intended behaviour change, then review
``git diff tests/golden/data`` line by line and commit it with the change that caused it.

Inputs are built by the suite's own builders, imported (not copied): ``conftest``
(``make_tiny_verifier``), ``fixtures_dflash`` / ``fixtures_dspark`` / ``fixtures_peagle``,
``test_bad_inputs_convert`` / ``test_bad_inputs_publish`` (helpers and ``parametrize`` lists),
``conftest.make_validate_set``, ``hub_double``. When tests move, update those imports in
``golden/*.py`` only; the golden files must not change.
"""

from __future__ import annotations

import argparse
import difflib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `golden` (tests/golden) importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from golden import cases_bad, cases_bad_output, cases_bad_publish, cases_commands, cases_convert, cases_engines  # noqa: E402
from golden.workspace import Workspace, golden_env  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
Runner = Callable[[Workspace, Path], dict[str, Any]]
MAX_DIFF_LINES = 40


@dataclass(frozen=True)
class Group:
    """The cases of one group (``name → runner(ws, case dir)``); ``slow`` groups are marked so."""

    cases: dict[str, Runner]
    slow: bool = False
    #: case → (pytest markers, a check that says why the case cannot run on this machine, or None)
    needs: dict[str, tuple[tuple[str, ...], Callable[[], str | None] | None]] = field(default_factory=dict)


def _merged(*parts: dict[str, Runner]) -> dict[str, Runner]:
    out: dict[str, Runner] = {}
    for part in parts:
        clash = sorted(set(out) & set(part))
        if clash:
            raise ValueError(f"golden case ids defined twice: {clash}")
        out.update(part)
    return out


GROUPS: dict[str, Group] = {
    "convert": Group({name: cases_convert.case(name) for name in cases_convert.CASES}),
    "refusals": Group(cases_bad.REFUSALS),
    "bad_inputs": Group(_merged(cases_bad.CASES, cases_bad_output.CASES, cases_bad_publish.CASES)),
    "commands": Group(cases_commands.CASES),
    "slow": Group(cases_commands.SLOW, slow=True),
    "engines": Group(cases_engines.CASES, slow=True, needs=cases_engines.NEEDS),
}


def golden_path(group: str, case: str) -> Path:
    return DATA / group / f"{case}.json"


def golden_ids(group: str) -> list[str]:
    """Case ids that have a golden file (stale ones included)."""
    d = DATA / group
    return sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []


def all_ids(group: str) -> list[str]:
    """Registered case ids ∪ golden ids (a stale golden fails its check)."""
    return sorted(set(GROUPS[group].cases) | set(golden_ids(group)))


def compute(ws: Workspace, group: str, case: str) -> dict[str, Any]:
    """Run one case in a fresh dir under the golden environment; return its JSON-clean record."""
    runner = GROUPS[group].cases[case]
    _, why_not = GROUPS[group].needs.get(case, ((), None))
    reason = why_not() if why_not is not None else None
    if reason:
        raise RuntimeError(f"{group}/{case} cannot run on this machine: {reason}")
    d = ws.case_dir(group, case)
    with golden_env(ws):
        rec = runner(ws, d)
    return json.loads(json.dumps(rec))


def dumps(rec: dict[str, Any]) -> str:
    """The golden file text (sorted keys, stable)."""
    return json.dumps(rec, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------------------- the diff
def diff(golden: Any, now: Any, path: str = "") -> list[str]:
    """Human-readable differences, one line each: ``<key path>: golden … ≠ now …``."""
    where = path or "<record>"
    if isinstance(golden, dict) and isinstance(now, dict):
        out = [f"{path}.{k}: missing now (golden {_short(golden[k])})" for k in sorted(set(golden) - set(now))]
        out += [f"{path}.{k}: new key (now {_short(now[k])})" for k in sorted(set(now) - set(golden))]
        for k in sorted(set(golden) & set(now)):
            out += diff(golden[k], now[k], f"{path}.{k}")
        return out
    if isinstance(golden, list) and isinstance(now, list):
        if golden != now and golden and now and all(isinstance(x, str) for x in golden + now):
            return _text_diff(golden, now, where)
        out = []
        for i, (a, b) in enumerate(zip(golden, now, strict=False)):
            out += diff(a, b, f"{path}[{i}]")
        if len(golden) != len(now):
            extra = golden[len(now):] if len(golden) > len(now) else now[len(golden):]
            side = "only in golden" if len(golden) > len(now) else "only now"
            out.append(f"{where}: {len(golden)} items in golden, {len(now)} now ({side}: {_short(extra)})")
        return out
    if type(golden) is not type(now) or golden != now:
        return [f"{where}: golden {_short(golden)} ≠ now {_short(now)}"]
    return []


def _text_diff(golden: list[str], now: list[str], where: str) -> list[str]:
    """Lines of text (a card): a unified diff, ``-`` golden / ``+`` now."""
    body = difflib.unified_diff(golden, now, "golden", "now", n=1, lineterm="")
    return [f"{where}: {ln}" for ln in list(body)[2:]]


def _short(v: Any, n: int = 160) -> str:
    s = json.dumps(v, ensure_ascii=False, sort_keys=True)
    return s if len(s) <= n else s[: n - 1] + "…"


def check_case(ws: Workspace, group: str, case: str) -> list[str]:
    """Recompute one case and compare with its golden; [] when equal."""
    p = golden_path(group, case)
    if case not in GROUPS[group].cases:
        return [f"{group}/{case}: golden file {p.name} has no case any more (delete it by re-capturing)"]
    if not p.is_file():
        return [f"{group}/{case}: no golden file {p.relative_to(DATA.parent)} (run tests/golden/capture.py)"]
    lines = diff(json.loads(p.read_text()), compute(ws, group, case))
    if len(lines) > MAX_DIFF_LINES:
        lines = lines[:MAX_DIFF_LINES] + [f"… {len(lines) - MAX_DIFF_LINES} more differences"]
    return [f"{group}/{case}{ln}" if ln.startswith((".", "[")) else f"{group}/{case}: {ln}" for ln in lines]


# ------------------------------------------------------------------------------- main
def _selected(groups: list[str] | None, cases: list[str] | None, slow: bool) -> list[tuple[str, str]]:
    out = []
    for g in groups or list(GROUPS):
        if GROUPS[g].slow and not slow and not groups:
            continue
        out += [(g, c) for c in all_ids(g) if not cases or c in cases]
    return out


def _write(ws: Workspace, group: str, case: str) -> str:
    p = golden_path(group, case)
    if case not in GROUPS[group].cases:
        p.unlink()
        return "deleted (stale)"
    text = dumps(compute(ws, group, case))
    old = p.read_text() if p.is_file() else None
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return "unchanged" if old == text else ("new" if old is None else "REWRITTEN")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the goldens instead of writing them")
    ap.add_argument("--group", action="append", choices=sorted(GROUPS), help="only this group (repeatable)")
    ap.add_argument("--case", action="append", help="only this case id (repeatable)")
    ap.add_argument("--no-slow", action="store_true", help="skip the slow group unless named with --group")
    ap.add_argument("--keep", action="store_true", help="keep the scratch root (printed)")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="specconv-golden-"))
    ws, failures = Workspace(root / "ws"), []
    try:
        for group, case in _selected(args.group, args.case, slow=not args.no_slow):
            t = time.perf_counter()
            if args.check:
                problems = check_case(ws, group, case)
                failures += problems
                status = "DIFFERS" if problems else "ok"
            else:
                status = _write(ws, group, case)
            print(f"{group}/{case}: {status} ({time.perf_counter() - t:.1f} s)", file=sys.stderr)
    finally:
        ws.close()
        if args.keep:
            print(f"scratch root kept: {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    for line in failures:
        print(line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
