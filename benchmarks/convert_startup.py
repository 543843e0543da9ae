#!/usr/bin/env python
"""Benchmark (issue 26): ``specconv convert`` start-up, this checkout against another one.

Runs ``python -m specconv.cli.main convert examples/smollm2-dflash-b8 --verifier V -o OUT --format
json`` (a fresh OUT each run: detection, the verifier's config, the plan, the lint, the small
bundled drafter's weights and the card, which asks the engine registry for the exports' rows) with
``PYTHONPATH`` set to this checkout (A) and to ``--baseline`` (B) in turn,
A B A B ..., and prints one JSON object: each side's wall seconds (min / median / max) and the
median of the pair-by-pair ratios A/B (pairing keeps the ratio meaningful when the machine's speed
drifts). Goal: ratio ≤ 1.05 (no slower within noise).

Usage::

    python benchmarks/convert_startup.py --baseline ../other-checkout --verifier DIR [-n 10]

Exit status: 0 when the goal is met, 1 when it is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
GOAL = 1.05


def _run(checkout: Path, verifier: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(checkout), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "specconv.cli.main", "convert", str(HERE / "examples" / "smollm2-dflash-b8"),
                "--verifier", verifier, "-o", str(Path(tmp) / "out"), "--format", "json"]
        t0 = time.perf_counter()
        p = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=checkout)
        wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{checkout}: exit {p.returncode}: {p.stderr[-2000:]}")
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, required=True, help="the other checkout (B)")
    ap.add_argument("--verifier", required=True, help="verifier dir (SmolLM2-135M-Instruct)")
    ap.add_argument("-n", type=int, default=10, help="pairs (after one warm-up pair)")
    args = ap.parse_args()
    _run(HERE, args.verifier), _run(args.baseline.resolve(), args.verifier)  # warm the page cache
    a, b = [], []
    for _ in range(args.n):
        a.append(_run(HERE, args.verifier))
        b.append(_run(args.baseline.resolve(), args.verifier))
    ratio = statistics.median(x / y for x, y in zip(a, b, strict=True))
    out = {"pairs": args.n, "a_wall_s": [min(a), statistics.median(a), max(a)],
           "b_wall_s": [min(b), statistics.median(b), max(b)], "ratio_a_over_b": round(ratio, 3),
           "goal": f"ratio <= {GOAL}", "passed": ratio <= GOAL}
    print(json.dumps(out))
    return 0 if out["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
