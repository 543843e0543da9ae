#!/usr/bin/env python
"""Benchmark: ``specconv convert`` of a Qwen3-8B-sized z-lab DFlash drafter vs ``cp -r``.

A conversion is a byte copy plus a config rewrite, so it should cost about what
``cp -r`` costs. This script

1. generates (once, into ``--workdir``) a z-lab-layout DFlash drafter with the shapes of
   ``z-lab/Qwen3-8B-DFlash-b16`` (hidden 4096, 32 q / 8 kv heads x 128, intermediate
   12288, 5 aux layers -> ``fc.weight [4096, 20480]``; 2 draft layers by default, which
   gives ~0.94 GB of bf16 like the published file) filled with random finite bf16
   values, plus a Qwen3-8B-shaped verifier dir (config.json with 36 layers, hidden
   4096, vocab 151,936, untied). In the verifier only ``model.embed_tokens.weight``,
   ``lm_head.weight`` and ``model.norm.weight`` have their real sizes; every decoder
   layer tensor is a small placeholder, so the verifier is ~2.5 GB instead of 16 GB.
   A conversion reads only those three tensors from the verifier, so the placeholders do
   not change what is measured;
2. runs four commands, interleaved (the order rotates each round), ``--repeats`` times
   each, taking each command's own peak RSS from ``wait4`` in a tiny launcher process
   (see ``_LAUNCHER``; ``rss_floor_mb`` is what ``true`` reports that way):

   * ``cp -r <drafter> <dst>``;
   * ``specconv convert`` with the digest/scan cache warm (``copy_file_range`` path);
   * ``specconv convert`` cold (``SPECCONV_HASH_CACHE=0``: every byte read once, hashed,
     scanned for NaN/Inf and written from one buffer);
   * ``cp -r`` and ``sha256sum`` of the drafter files side by side (the cold baseline),
     and the same with ``openssl dgst -sha256`` when ``openssl`` is installed (coreutils'
     ``sha256sum`` may not use the CPU's SHA extensions, OpenSSL and hashlib do);
3. prints one JSON line: wall times, medians, per-pair ratios, peak RSS in MB and the
   goals (warm <= 1.3x cp, cold <= 1.2x cp + sha256sum, peak RSS <= 64 MB) with pass/fail.

Both commands read a drafter that sits in the page cache (it was just written or read),
so the comparison is copy cost against copy cost, not disk speed.

Usage::

    python benchmarks/convert_vs_cp.py [--workdir DIR] [--repeats 3] [--keep]

Exit status: 0 when the goals are met, 1 when a goal is missed, 2 when convert failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from specconv.tensors import OutTensor, open_store, write_safetensors

# ---- shapes (Qwen3-8B / z-lab Qwen3-8B-DFlash-b16) -----------------------------------
HIDDEN = 4096
INTERMEDIATE = 12288
N_HEADS = 32
N_KV_HEADS = 8
HEAD_DIM = 128
VOCAB = 151936
VERIFIER_LAYERS = 36
TARGET_LAYER_IDS = [1, 9, 17, 25, 33]  # z-lab convention (decoder layer indices)
MASK_TOKEN_ID = 151669
BLOCK_SIZE = 16
TARGET_DRAFTER_BYTES = 0.94e9

RATIO_WARM_GOAL = 1.3  # warm cache: convert / cp -r
RATIO_COLD_GOAL = 1.2  # cold: convert (hash + scan) / (cp -r and sha256sum side by side)
RSS_GOAL_MB = 64.0
VERIFIER_NAME = "Qwen/Qwen3-8B"


def _layer_shapes(i: int, prefix: str = "") -> dict[str, tuple[int, ...]]:
    p = f"{prefix}layers.{i}."
    return {
        p + "input_layernorm.weight": (HIDDEN,),
        p + "post_attention_layernorm.weight": (HIDDEN,),
        p + "self_attn.q_proj.weight": (N_HEADS * HEAD_DIM, HIDDEN),
        p + "self_attn.k_proj.weight": (N_KV_HEADS * HEAD_DIM, HIDDEN),
        p + "self_attn.v_proj.weight": (N_KV_HEADS * HEAD_DIM, HIDDEN),
        p + "self_attn.o_proj.weight": (HIDDEN, N_HEADS * HEAD_DIM),
        p + "self_attn.q_norm.weight": (HEAD_DIM,),
        p + "self_attn.k_norm.weight": (HEAD_DIM,),
        p + "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
        p + "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
        p + "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
    }


def drafter_shapes(n_layers: int) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of a z-lab DFlash drafter (no embed_tokens / lm_head)."""
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (HIDDEN, len(TARGET_LAYER_IDS) * HIDDEN),
        "hidden_norm.weight": (HIDDEN,),
        "norm.weight": (HIDDEN,),
    }
    for i in range(n_layers):
        shapes.update(_layer_shapes(i))
    return shapes


def default_draft_layers() -> int:
    """Number of draft layers whose bf16 total is closest to ~0.94 GB (gives 2)."""
    def size(n: int) -> int:
        return 2 * sum(int(np.prod(s)) for s in drafter_shapes(n).values())

    return min(range(1, 9), key=lambda n: abs(size(n) - TARGET_DRAFTER_BYTES))


def _bf16_producer(shape: tuple[int, ...], seed: int):
    """Random finite bf16 bytes (|x| < 2: the top exponent bit is cleared, no inf/NaN)."""
    def produce():
        rng = np.random.default_rng(seed)
        bits = rng.integers(0, 1 << 16, size=int(np.prod(shape)), dtype=np.uint16)
        bits &= np.uint16(0xBFFF)
        return memoryview(bits).cast("B")  # no extra copy of a 1.2 GB buffer
    return produce


def _write_random(out: Path, shapes: dict[str, tuple[int, ...]], max_shard: str | None) -> int:
    outs = [
        OutTensor(name, "BF16", shape, produce=_bf16_producer(shape, seed))
        for seed, (name, shape) in enumerate(sorted(shapes.items()))
    ]
    write_safetensors(out, outs, max_shard_size=max_shard)
    return sum(2 * int(np.prod(s)) for s in shapes.values())


def make_drafter(d: Path, n_layers: int) -> int:
    d.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "block_size": BLOCK_SIZE,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "dflash_config": {"mask_token_id": MASK_TOKEN_ID, "target_layer_ids": TARGET_LAYER_IDS},
        "dtype": "bfloat16",
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": INTERMEDIATE,
        "layer_types": ["full_attention"] * n_layers,
        "max_position_embeddings": 40960,
        "max_window_layers": n_layers,
        "num_attention_heads": N_HEADS,
        "num_hidden_layers": n_layers,
        "num_key_value_heads": N_KV_HEADS,
        "num_target_layers": VERIFIER_LAYERS,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB,
    }
    n = _write_random(d, drafter_shapes(n_layers), None)
    (d / "config.json").write_text(json.dumps(config, indent=2) + "\n")  # last: marks done
    return n


def make_verifier(d: Path, max_shard: str) -> int:
    d.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": INTERMEDIATE,
        "max_position_embeddings": 40960,
        "max_window_layers": VERIFIER_LAYERS,
        "num_attention_heads": N_HEADS,
        "num_hidden_layers": VERIFIER_LAYERS,
        "num_key_value_heads": N_KV_HEADS,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB,
        "_specconv_benchmark_note": "layer tensors are small placeholders; only "
        "embed_tokens, lm_head and model.norm have real sizes",
    }
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        "lm_head.weight": (VOCAB, HIDDEN),
        "model.norm.weight": (HIDDEN,),
    }
    for i in range(VERIFIER_LAYERS):
        for name, shape in _layer_shapes(i, "model.").items():
            shapes[name] = shape if len(shape) == 1 else (8, 8)  # placeholder matrices
    n = _write_random(d, shapes, max_shard)
    (d / "config.json").write_text(json.dumps(config, indent=2) + "\n")  # last: marks done
    return n


def _dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


# Peak RSS is read with wait4() in a tiny launcher process, not in this one: on Linux a
# child's ru_maxrss starts at the high-water mark of the memory it was forked from
# (exec records the old mm's peak), so measuring from this process (which held ~1.3 GB
# while generating) would report our own peak, not the command's.
_LAUNCHER = r"""
import json, os, sys, time
res, log, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        os.write(2, ("cannot start %s: %s\n" % (cmd[0], e)).encode())
        os._exit(127)
_, status, ru = os.wait4(pid, 0)
wall = time.perf_counter() - t0
with open(res, "w") as f:
    json.dump({"wall_s": wall, "rc": os.waitstatus_to_exitcode(status),
               "peak_rss_mb": ru.ru_maxrss / 1024.0}, f)
"""


def run_measured(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> dict:
    """Run ``cmd`` (output to ``log``); return wall seconds, exit code, peak RSS (MB).

    Wall time is measured from fork to exit inside the launcher, so the launcher's own
    start-up is not counted; peak RSS is the command's own ``ru_maxrss`` (Linux: KiB).
    """
    res = log.with_suffix(".result.json")
    res.unlink(missing_ok=True)
    subprocess.run([sys.executable, "-I", "-S", "-c", _LAUNCHER, str(res), str(log), *cmd],
                   check=True, env={**os.environ, **(env or {})})
    return json.loads(res.read_text())


def find_specconv() -> list[str]:
    here = Path(sys.executable).parent / "specconv"
    if here.exists():
        return [str(here)]
    w = shutil.which("specconv")
    if w:
        return [w]
    return [sys.executable, "-m", "specconv.cli.main"]


def verify_output(drafter: Path, out: Path) -> dict:
    """Check the converted dir: every drafter tensor present with identical bytes."""
    src, dst = open_store(drafter), open_store(out)
    missing = [n for n in src.names() if n not in dst]
    differ = [n for n in src.names() if n in dst and src.read_bytes(n) != dst.read_bytes(n)]
    cfg = json.loads((out / "config.json").read_text())
    return {
        "missing_tensors": missing[:5],
        "differing_tensors": differ[:5],
        "speculators_model_type": cfg.get("speculators_model_type"),
        "ok": not missing and not differ and cfg.get("speculators_model_type") == "dflash",
    }


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where to generate the drafter/verifier (reused if present); "
                    "default: a temp dir, removed at the end unless --keep")
    ap.add_argument("--repeats", "-n", type=int, default=3, help="timed runs of each (3)")
    ap.add_argument("--draft-layers", type=int, default=None,
                    help="draft decoder layers (default: the count giving ~0.94 GB, i.e. 2)")
    ap.add_argument("--verifier-shard-size", default="1GB",
                    help="max shard size of the generated verifier (1GB)")
    ap.add_argument("--specconv", default=None,
                    help="command to run specconv (default: the venv's console script)")
    ap.add_argument("--convert-args", default="",
                    help="extra arguments appended to `specconv convert` (shell-quoted)")
    ap.add_argument("--no-verify", action="store_true",
                    help="skip the byte-for-byte check of the converted tensors")
    ap.add_argument("--keep", action="store_true", help="keep the generated temp dir")
    ap.add_argument("--generate-only", action="store_true",
                    help="only generate the drafter and verifier, then exit")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    return args


def _commands(args: argparse.Namespace, work: Path, drafter: Path, verifier: Path) -> dict[str, tuple[list[str], dict]]:
    """The four measured commands: name -> (argv, extra environment)."""
    specconv = shlex.split(args.specconv) if args.specconv else find_specconv()
    cv = specconv + ["convert", str(drafter), "--verifier", str(verifier), "--verifier-name", VERIFIER_NAME,
                     "-o", str(work / "convert-out"), "--format", "json"] + shlex.split(args.convert_args)
    files = " ".join(shlex.quote(str(p)) for p in sorted(drafter.iterdir()))
    cp = f"cp -r {shlex.quote(str(drafter))} {shlex.quote(str(work / 'cp-out'))}"
    side = f"{cp} & sha256sum {files} >/dev/null; wait"
    cmds = {
        "cp": (["cp", "-r", str(drafter), str(work / "cp-out")], {}),
        "convert_warm": (cv, {"SPECCONV_CACHE": str(work / "cache")}),
        # cold: no digest or scan cached, so every source byte is read, hashed and scanned
        "convert_cold": (cv, {"SPECCONV_HASH_CACHE": "0"}),
        "cp_and_sha256sum": (["sh", "-c", side], {}),
    }
    if shutil.which("openssl"):  # OpenSSL's sha256 (SHA-NI where the CPU has it, as hashlib)
        cmds["cp_and_openssl_sha256"] = (["sh", "-c", f"{cp} & openssl dgst -sha256 {files} >/dev/null; wait"], {})
    return cmds


def _measure(cmds: dict[str, tuple[list[str], dict]], work: Path, repeats: int) -> tuple[dict[str, list], dict | None]:
    """Run every command ``repeats`` times, interleaved (the order rotates each round),
    each starting with no dirty pages pending and no previous output."""
    runs: dict[str, list] = {k: [] for k in cmds}
    names = list(cmds)
    first_warm, _ = cmds["convert_warm"]
    run_measured(first_warm, work / "prime.log", {"SPECCONV_CACHE": str(work / "cache")})  # fill the cache
    for i in range(repeats):
        for which in names[i % len(names):] + names[: i % len(names)]:
            shutil.rmtree(work / ("convert-out" if which.startswith("convert") else "cp-out"), ignore_errors=True)
            os.sync()
            cmd, env = cmds[which]
            r = run_measured(cmd, work / f"{which}.log", env)
            runs[which].append(r)
            if r["rc"] != 0:
                return runs, {"cmd": shlex.join(cmd), "rc": r["rc"],
                              "log_tail": (work / f"{which}.log").read_text(errors="replace")[-2000:]}
    return runs, None


def _summary(runs: dict[str, list]) -> dict:
    med = {k: statistics.median(r["wall_s"] for r in v) for k, v in runs.items()}
    pairs = {
        "warm_vs_cp": [w["wall_s"] / c["wall_s"] for w, c in zip(runs["convert_warm"], runs["cp"], strict=True)],
        "cold_vs_cp_and_sha256sum": [w["wall_s"] / c["wall_s"]
                                     for w, c in zip(runs["convert_cold"], runs["cp_and_sha256sum"], strict=True)],
    }
    out = {f"{k}_s": [round(r["wall_s"], 3) for r in v] for k, v in runs.items()}
    out.update({f"{k}_median_s": round(v, 3) for k, v in med.items()})
    out["ratio_warm"] = round(med["convert_warm"] / med["cp"], 3)
    out["ratio_cold"] = round(med["convert_cold"] / med["cp_and_sha256sum"], 3)
    if "cp_and_openssl_sha256" in med:  # the stricter baseline: the same sha256 code as hashlib
        out["ratio_cold_vs_openssl"] = round(med["convert_cold"] / med["cp_and_openssl_sha256"], 3)
    out["pair_ratios"] = {k: {"median": round(statistics.median(v), 3), "min": round(min(v), 3),
                              "max": round(max(v), 3)} for k, v in pairs.items()}
    out["peak_rss_mb"] = {k: round(max(r["peak_rss_mb"] for r in v), 1) for k, v in runs.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    tmp_owned = args.workdir is None
    work = Path(tempfile.mkdtemp(prefix="specconv-bench-")) if tmp_owned else args.workdir
    work.mkdir(parents=True, exist_ok=True)
    n_layers = args.draft_layers or default_draft_layers()
    drafter = work / f"zlab-Qwen3-8B-DFlash-b16-L{n_layers}"
    verifier = work / "Qwen3-8B-placeholder-layers"
    try:
        gen_s = _generate(drafter, verifier, n_layers, args.verifier_shard_size)
        if args.generate_only:
            print(json.dumps({"drafter": str(drafter), "verifier": str(verifier), "generate_s": round(gen_s, 2),
                              "drafter_bytes": _dir_bytes(drafter), "verifier_bytes": _dir_bytes(verifier)}))
            return 0
        for d in (drafter, verifier):  # page cache warm for every command alike
            for p in d.iterdir():
                with open(p, "rb") as f:
                    while f.read(1 << 24):
                        pass
        floor = run_measured(["true"], work / "true.log")["peak_rss_mb"]
        runs, fail = _measure(_commands(args, work, drafter, verifier), work, args.repeats)
        result = {"benchmark": "convert_vs_cp", "repeats": args.repeats, "rss_floor_mb": round(floor, 1),
                  "drafter": {"path": str(drafter), "draft_layers": n_layers, "bytes": _dir_bytes(drafter),
                              "dtype": "bfloat16", "like": "z-lab/Qwen3-8B-DFlash-b16"},
                  "verifier": {"path": str(verifier), "bytes": _dir_bytes(verifier)},
                  "goals": {"ratio_warm_max": RATIO_WARM_GOAL, "ratio_cold_max": RATIO_COLD_GOAL,
                            "peak_rss_mb_max": RSS_GOAL_MB},
                  "generate_s": round(gen_s, 2), "cpu_count": os.cpu_count(), "loadavg": os.getloadavg()}
        if fail:
            result.update(convert_failed=fail, pass_=False)
            print(json.dumps(result))
            return 2
        result.update(_summary(runs))
        return _verdict(result, args, drafter, work)
    finally:
        for d in ("cp-out", "convert-out"):
            shutil.rmtree(work / d, ignore_errors=True)
        if tmp_owned and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        elif tmp_owned:
            print(f"kept {work}", file=sys.stderr)


def _generate(drafter: Path, verifier: Path, n_layers: int, shard: str) -> float:
    t0 = time.perf_counter()
    if not (drafter / "config.json").exists():
        print(f"generating drafter ({n_layers} layers) in {drafter} ...", file=sys.stderr)
        make_drafter(drafter, n_layers)
    if not (verifier / "config.json").exists():
        print(f"generating verifier in {verifier} ...", file=sys.stderr)
        make_verifier(verifier, shard)
    return time.perf_counter() - t0


def _verdict(result: dict, args: argparse.Namespace, drafter: Path, work: Path) -> int:
    if not args.no_verify:
        result["output_check"] = verify_output(drafter, work / "convert-out")
    rss = max(result["peak_rss_mb"]["convert_warm"], result["peak_rss_mb"]["convert_cold"])
    result["pass"] = {
        "ratio_warm": result["ratio_warm"] <= RATIO_WARM_GOAL,
        "ratio_cold": result["ratio_cold"] <= RATIO_COLD_GOAL,
        "peak_rss": rss <= RSS_GOAL_MB,
        "output": result.get("output_check", {}).get("ok", True),
    }
    print(json.dumps(result))
    return 0 if all(result["pass"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
