#!/usr/bin/env python
"""Benchmark: drafter ms per validation-loop step, context-cached vs stateless, by context.

The stateless drafting step (``drafter.propose``) projects all ``T`` context positions
through ``fc`` and every layer's ``k_proj``/``v_proj``, so its cost grows with ``T``; the
cached step (``drafter.new_session().propose``, ``specconv.drafters.cache``) projects
only the positions accepted since the previous step. This script times one drafting step
at contexts 128 / 1k / 4k on two DFlash drafters:

* ``bundled`` — ``examples/smollm2-dflash-b8`` converted against SmolLM2-135M-Instruct
  (``specconv.offline.smollm2_verifier_dir()``), fp32, ``--repeats`` steps (median);
* ``8b-shaped`` — a Speculators DFlash dir with random weights in the shapes of
  ``z-lab/Qwen3-8B-DFlash-b16`` (hidden 4096, 32 q / 8 kv heads x 128, intermediate
  12288, 5 aux layers -> ``fc [4096, 20480]``, block 16) but ``--big-layers`` draft
  layers (default 1) and a ``--big-vocab`` vocabulary (default 32,000; the LM head runs
  on the 16 block rows only, the same in both paths), so it fits in ~3.5 GB (fp32);
  ``--big-repeats`` steps per point (default 3; 1 is enough to see the trend).

A cached step is measured the way the loop runs it: the session already holds
``T - new`` context positions, the step brings ``new`` (``--new``, default 4, about one
step's accepted tokens + 1) and drafts; the cache is cropped back between repeats.
Aux features are random (timing does not depend on their values). Threads: ``--threads``
(default 1). Prints a Markdown table on stderr and one JSON object on stdout.

    python benchmarks/validate_loop.py [--contexts 128,1024,4096] [--repeats 5] [--big-repeats 3]
        [--threads 1] [--big-layers 1] [--big-vocab 32000] [--skip-big]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "examples" / "smollm2-dflash-b8"


def bundled_drafter(work: Path):
    """The bundled trained DFlash drafter, converted with ``specconv.convert.convert``."""
    from specconv.convert import convert
    from specconv.converters import ConvertOptions
    from specconv.drafters import load_drafter
    from specconv.offline import smollm2_verifier_dir

    verifier = smollm2_verifier_dir()
    out = work / "bundled"
    convert(str(BUNDLED), verifier=str(verifier), output=out, options=ConvertOptions(),
            verifier_name="HuggingFaceTB/SmolLM2-135M-Instruct")
    return load_drafter(out, verifier, dtype=torch.float32)


def _layer_tensors(i: int, g: torch.Generator, H: int, inter: int, nh: int, nkv: int, D: int) -> dict:
    p = f"layers.{i}"

    def r(*shape):
        return (torch.randn(*shape, generator=g) / shape[-1] ** 0.5).to(torch.bfloat16)

    return {f"{p}.input_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
            f"{p}.post_attention_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
            f"{p}.self_attn.q_proj.weight": r(nh * D, H), f"{p}.self_attn.k_proj.weight": r(nkv * D, H),
            f"{p}.self_attn.v_proj.weight": r(nkv * D, H), f"{p}.self_attn.o_proj.weight": r(H, nh * D),
            f"{p}.self_attn.q_norm.weight": torch.ones(D, dtype=torch.bfloat16),
            f"{p}.self_attn.k_norm.weight": torch.ones(D, dtype=torch.bfloat16),
            f"{p}.mlp.gate_proj.weight": r(inter, H), f"{p}.mlp.up_proj.weight": r(inter, H),
            f"{p}.mlp.down_proj.weight": r(H, inter)}


def big_drafter(work: Path, layers: int, vocab: int):
    """A random-weight Speculators DFlash dir in Qwen3-8B-DFlash-b16 shapes (module doc)."""
    from safetensors.torch import save_file

    from specconv.drafters import load_drafter

    H, inter, nh, nkv, D, A, B = 4096, 12288, 32, 8, 128, 5, 16
    g = torch.Generator().manual_seed(0)
    t = {"fc.weight": (torch.randn(H, A * H, generator=g) / (A * H) ** 0.5).to(torch.bfloat16),
         "hidden_norm.weight": torch.ones(H, dtype=torch.bfloat16),
         "norm.weight": torch.ones(H, dtype=torch.bfloat16),
         "embed_tokens.weight": torch.randn(vocab, H, generator=g).to(torch.bfloat16),
         "lm_head.weight": (torch.randn(vocab, H, generator=g) / H ** 0.5).to(torch.bfloat16)}
    for i in range(layers):
        t.update(_layer_tensors(i, g, H, inter, nh, nkv, D))
    tl = {"model_type": "qwen3", "vocab_size": vocab, "hidden_size": H, "intermediate_size": inter,
          "num_hidden_layers": layers, "num_attention_heads": nh, "num_key_value_heads": nkv,
          "head_dim": D, "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 40960,
          "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
          "layer_types": ["full_attention"] * layers, "sliding_window": None}
    cfg = {"speculators_model_type": "dflash", "draft_vocab_size": vocab,
           "aux_hidden_state_layer_ids": [2, 10, 18, 26, 34], "mask_token_id": vocab - 1,
           "block_size": B, "sample_from_anchor": False, "transformer_layer_config": tl,
           "speculators_config": {"algorithm": "dflash", "default_proposal_method": "greedy",
                                  "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": B - 1,
                                                        "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                                  "verifier": {"name_or_path": "Qwen/Qwen3-8B",
                                               "architectures": ["Qwen3ForCausalLM"]}}}
    d = work / "big"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    save_file(t, str(d / "model.safetensors"))
    del t
    return load_drafter(d, None, dtype=torch.float32)


def _inputs(drafter, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(T)
    width = len(drafter.aux_layer_ids) * drafter.aux_hidden_size
    ctx = torch.randint(3, drafter.vocab_size - 2, (1, T + 1), generator=g)
    return ctx, torch.randn(1, T, width, generator=g)


def _timed(fn) -> tuple[float, list[int]]:
    """(wall ms of ``fn()``, the proposal's tokens)."""
    t0 = time.perf_counter()
    tokens = fn().tokens.tolist()
    return (time.perf_counter() - t0) * 1e3, tokens


def time_step(drafter, T: int, new: int, repeats: int) -> dict:
    """Median ms of a stateless step and of a cached step at context ``T`` (and whether
    both drafted the same tokens)."""
    ctx, aux = _inputs(drafter, T)
    with torch.inference_mode():
        stateless = [_timed(lambda: drafter.propose(ctx, aux)) for _ in range(repeats)]
        s = drafter.new_session()
        s.propose(ctx[:, : T - new + 1], aux[:, : T - new])  # the context of earlier steps
        cached = []
        for _ in range(repeats):
            s.crop(T - new)
            cached.append(_timed(lambda: s.propose(ctx, aux)))
    return {"context": T, "stateless_ms": statistics.median(ms for ms, _ in stateless),
            "cached_ms": statistics.median(ms for ms, _ in cached),
            "same_tokens": all(tok == stateless[0][1] for _, tok in stateless + cached)}


def run(name: str, drafter, contexts: list[int], new: int, repeats: int) -> list[dict]:
    rows = []
    with torch.inference_mode():
        drafter.propose(*_inputs(drafter, 16))  # warm-up
    for T in contexts:
        r = {"drafter": name, **time_step(drafter, T, new, repeats)}
        r["speedup"] = r["stateless_ms"] / r["cached_ms"]
        rows.append(r)
        print(f"{name} T={T}: stateless {r['stateless_ms']:.1f} ms, cached {r['cached_ms']:.1f} ms",
              file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict]) -> str:
    out = ["| drafter | context | stateless ms/step | cached ms/step | stateless / cached | same tokens |",
           "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        out.append(f"| {r['drafter']} | {r['context']} | {r['stateless_ms']:.1f} | {r['cached_ms']:.1f} | "
                   f"{r['speedup']:.1f}x | {'yes' if r['same_tokens'] else 'NO'} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", default="128,1024,4096")
    ap.add_argument("--repeats", type=int, default=5, help="steps per point for the bundled drafter")
    ap.add_argument("--new", type=int, default=4, help="context positions a cached step brings")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--big-repeats", type=int, default=3, help="steps per point for the 8B-shaped drafter")
    ap.add_argument("--big-layers", type=int, default=1)
    ap.add_argument("--big-vocab", type=int, default=32000)
    ap.add_argument("--skip-big", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    contexts = [int(c) for c in args.contexts.split(",")]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="specconv-bench-loop-") as tmp:
        rows += run("bundled (SmolLM2 DFlash b8)", bundled_drafter(Path(tmp)), contexts, args.new, args.repeats)
        if not args.skip_big:
            big = big_drafter(Path(tmp), args.big_layers, args.big_vocab)
            rows += run(f"8B-shaped, {args.big_layers} layer(s)", big, contexts, args.new, args.big_repeats)
    flat = {}
    for name in dict.fromkeys(r["drafter"] for r in rows):
        mine = [r for r in rows if r["drafter"] == name]
        flat[name] = mine[-1]["cached_ms"] / mine[0]["cached_ms"]
    print(table(rows), file=sys.stderr)
    print(json.dumps({"threads": args.threads, "new_per_step": args.new, "rows": rows,
                      "cached_growth_last_over_first": flat}))
    return 0 if all(r["same_tokens"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
