#!/usr/bin/env python
"""Benchmark: one drafting step, ONNX Runtime vs torch eager (CPU), for the bundled drafter.

Converts ``examples/smollm2-dflash-b8`` against SmolLM2-135M-Instruct, exports it with
``specconv export onnx --dtype float32``, then times one drafting step of the same
inputs with the torch wrapper (eager, reference attention) and with ONNX Runtime (CPU
provider) at context 64 / 256 / 1024 and batch 1 / 4. Prints one JSON object with the
median milliseconds and the ratio ORT / torch per point (goal: ≤ 1.0). With ``--loop``
it also runs ``specconv validate --onnx`` and reports the loop's TPOT and the ORT-alone
draft time next to the torch drafter's. Not a test: numbers depend on the machine.

    python benchmarks/drafter_step.py [--reps 7] [--threads 1] [--loop]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DRAFTER = REPO / "examples" / "smollm2-dflash-b8"


def specconv() -> list[str]:
    exe = Path(sys.executable).parent / "specconv"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "specconv.cli.main"]


def _run(*args: str) -> dict:
    r = subprocess.run([*specconv(), *args, "--format", "json"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit(f"specconv {args[0]} failed (exit {r.returncode})")
    return json.loads(r.stdout)


def _median_ms(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def step_points(spec_dir: Path, verifier: Path, reps: int) -> list[dict]:
    import torch

    from specconv.drafters import load_drafter
    from specconv.drafters.step import batch_inputs
    from specconv.engines.onnx.parity import ort_session
    from specconv.engines.onnx.wrappers import make_wrapper

    drafter = load_drafter(spec_dir, verifier)
    wrapper = make_wrapper(drafter, outputs=("ids", "logprobs"))
    sess = ort_session(spec_dir / "onnx" / "fp32" / "drafter.onnx")
    g = torch.Generator().manual_seed(0)
    points = []
    for ctx in (64, 256, 1024):
        for batch in (1, 4):
            reqs = [(torch.randint(0, wrapper.shape.vocab_size, (ctx + 1,), generator=g),
                     torch.randn(ctx, wrapper.shape.aux_width, generator=g)) for _ in range(batch)]
            inputs = batch_inputs(wrapper.shape, reqs)
            feeds = {n: t.numpy() for n, t in zip(wrapper.input_names, inputs, strict=True)}
            with torch.inference_mode():
                t_ms = _median_ms(lambda inputs=inputs: wrapper(*inputs), reps)
            o_ms = _median_ms(lambda feeds=feeds: sess.run(None, feeds), reps)
            points.append({"context": ctx, "batch": batch, "torch_ms": round(t_ms, 2),
                           "ort_ms": round(o_ms, 2), "ratio_ort_over_torch": round(o_ms / t_ms, 3)})
    return points


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1, help="torch and ORT intra-op threads")
    ap.add_argument("--loop", action="store_true", help="also run validate --onnx for the loop TPOT")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args(argv)
    import torch

    from specconv.offline import smollm2_verifier_dir

    torch.set_num_threads(args.threads)
    verifier = smollm2_verifier_dir()
    out: dict = {"drafter": str(DRAFTER.relative_to(REPO)), "threads": args.threads, "reps": args.reps}
    with tempfile.TemporaryDirectory(prefix="specconv-bench-") as tmp:
        d = Path(tmp) / "drafter"
        _run("convert", str(DRAFTER), "--verifier", str(verifier), "--verifier-name",
             "HuggingFaceTB/SmolLM2-135M-Instruct", "-o", str(d))
        _run("export", "onnx", str(d), "--dtype", "float32", "--no-check")
        out["step"] = step_points(d, verifier, args.reps)
        ratios = [p["ratio_ort_over_torch"] for p in out["step"]]
        out["ratio_median"] = round(statistics.median(ratios), 3)
        if args.loop:
            rep = _run("validate", str(d), "--verifier", str(verifier), "--onnx", str(d / "onnx"),
                       "--prompts", "humaneval", "--num-prompts", str(args.num_prompts),
                       "--max-new-tokens", str(args.max_new_tokens), "--dtype", "float32",
                       "--report-dir", str(Path(tmp) / "rep"))
            ox = rep["onnx"]
            out["loop"] = {"tau_torch": ox["torch"]["acceptance_length"], "tau_onnx": ox["onnx"]["acceptance_length"],
                           "tpot_ms_torch_drafter": ox["torch"]["tpot_ms"],
                           "draft_ms_torch_drafter": ox["torch"]["draft_ms"],
                           "draft_ms_median_ort_alone": ox["drafts"]["primary_draft_ms_median"],
                           "note": ox["timing_note"]}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
