"""Tiny spec-built DSpark source checkpoints and refusal inputs (no producer package exists
offline for DeepSpec, SpecForge or ModelOpt).

Every builder follows its format's layout as docs/formats.md describes it (the producer
named in its docstring) and derives all shapes from a tiny verifier dir (conftest
``tiny_verifier_dir``: Qwen3, H=64, 6 layers, vocab 256, 4 q / 2 kv heads, head_dim 16),
so the outputs load in speculators 0.9.0 against that verifier. Tensors are random
(seeded) except the verifier-equal copies (DeepSpec ``embed_tokens``/``lm_head``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fixtures_dflash import registry_formats

MASK = 250  # < vocab 256, not bos(1)/eos(2)/pad(0)


def vcfg(verifier_dir: Path) -> dict[str, Any]:
    return json.loads((Path(verifier_dir) / "config.json").read_text())


def _dt(dtype: str):
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype]


def _rand(g, *shape, std: float = 0.02, dtype: str = "bfloat16"):
    import torch

    return (torch.randn(*shape, generator=g) * std).to(_dt(dtype))


def _norm(g, n: int, dtype: str):
    import torch

    return (1.0 + 0.1 * torch.randn(n, generator=g)).to(_dt(dtype))


def draft_dims(verifier_dir: Path) -> dict[str, int]:
    v = vcfg(verifier_dir)
    H = v["hidden_size"]
    nq = v["num_attention_heads"]
    return dict(
        H=H, V=v["vocab_size"], I=v["intermediate_size"], nq=nq, nkv=v.get("num_key_value_heads", nq),
        hd=v.get("head_dim", H // nq), L=v["num_hidden_layers"],
    )


def body_tensors(verifier_dir: Path, *, n_aux: int, num_layers: int = 2, dtype: str = "bfloat16",
                 seed: int = 0) -> dict:
    """F1 DFlash body (external_formats.md §3 table): fc, hidden_norm, norm, layers.*"""
    import torch

    d = draft_dims(verifier_dir)
    g = torch.Generator().manual_seed(seed)
    H, inter, hd = d["H"], d["I"], d["hd"]
    t = {
        "fc.weight": _rand(g, H, n_aux * H, dtype=dtype),
        "hidden_norm.weight": _norm(g, H, dtype),
        "norm.weight": _norm(g, H, dtype),
    }
    for i in range(num_layers):
        p = f"layers.{i}."
        t[p + "input_layernorm.weight"] = _norm(g, H, dtype)
        t[p + "post_attention_layernorm.weight"] = _norm(g, H, dtype)
        t[p + "self_attn.q_proj.weight"] = _rand(g, d["nq"] * hd, H, dtype=dtype)
        t[p + "self_attn.k_proj.weight"] = _rand(g, d["nkv"] * hd, H, dtype=dtype)
        t[p + "self_attn.v_proj.weight"] = _rand(g, d["nkv"] * hd, H, dtype=dtype)
        t[p + "self_attn.o_proj.weight"] = _rand(g, H, d["nq"] * hd, dtype=dtype)
        t[p + "self_attn.q_norm.weight"] = _norm(g, hd, dtype)
        t[p + "self_attn.k_norm.weight"] = _norm(g, hd, dtype)
        t[p + "mlp.gate_proj.weight"] = _rand(g, inter, H, dtype=dtype)
        t[p + "mlp.up_proj.weight"] = _rand(g, inter, H, dtype=dtype)
        t[p + "mlp.down_proj.weight"] = _rand(g, H, inter, dtype=dtype)
    return t


def head_tensors(
    verifier_dir: Path, *, rank: int, mtype: str = "vanilla", confidence: bool = True, with_markov: bool = True,
    dtype: str = "bfloat16", seed: int = 1, prefix_markov: str = "markov_head.",
    prefix_conf: str = "confidence_head.proj.",
) -> dict:
    """DSpark heads (speculators_format.md §5.2, full vocab): markov_w1/w2 [V, r], gate/joint, confidence."""
    import torch

    d = draft_dims(verifier_dir)
    g = torch.Generator().manual_seed(seed)
    H, V, r = d["H"], d["V"], rank
    t = {}
    if r > 0:
        t[prefix_markov + "markov_w1.weight"] = _rand(g, V, r, std=0.01, dtype=dtype)
        t[prefix_markov + "markov_w2.weight"] = _rand(g, V, r, dtype=dtype)
        if mtype == "gated":
            t[prefix_markov + "gate_proj.weight"] = _rand(g, r, H + r, dtype=dtype)
            t[prefix_markov + "gate_proj.bias"] = _rand(g, r, dtype=dtype)
        if mtype == "rnn":
            t[prefix_markov + "joint_proj.weight"] = _rand(g, 3 * r, 2 * r + H, dtype=dtype)
            t[prefix_markov + "joint_proj.bias"] = _rand(g, 3 * r, dtype=dtype)
    if confidence:
        t[prefix_conf + "weight"] = _rand(g, 1, H + (r if with_markov else 0), dtype=dtype)
        t[prefix_conf + "bias"] = _rand(g, 1, dtype=dtype)
    return t


def f1_config(verifier_dir: Path, *, num_layers: int = 2, dtype: str = "bfloat16") -> dict[str, Any]:
    """The Qwen3 draft-decoder keys every DFlash-family export carries (external_formats.md §3)."""
    v = vcfg(verifier_dir)
    d = draft_dims(verifier_dir)
    return {
        "model_type": "qwen3",
        "hidden_size": d["H"], "intermediate_size": d["I"], "num_hidden_layers": num_layers,
        "num_attention_heads": d["nq"], "num_key_value_heads": d["nkv"], "head_dim": d["hd"],
        "vocab_size": d["V"], "rms_norm_eps": v.get("rms_norm_eps", 1e-6), "hidden_act": "silu",
        "max_position_embeddings": v.get("max_position_embeddings", 512), "attention_bias": False,
        "rope_theta": (v.get("rope_parameters") or {}).get("rope_theta", v.get("rope_theta")),
        "rope_scaling": None, "tie_word_embeddings": False, "num_target_layers": d["L"],
        "layer_types": ["full_attention"] * num_layers, "torch_dtype": dtype,
        "bos_token_id": v.get("bos_token_id"), "eos_token_id": v.get("eos_token_id"),
        "pad_token_id": v.get("pad_token_id"),
    }


def save(out: Path, cfg: dict[str, Any] | None, tensors: dict, *, files: dict[str, str] | None = None) -> Path:
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg is not None:
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
    if tensors:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"),
                  metadata={"format": "pt"})
    for name, text in (files or {}).items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    return out


def verifier_tensor(verifier_dir: Path, role: str):
    from safetensors.torch import load_file

    sd = load_file(str(Path(verifier_dir) / "model.safetensors"))
    names = {"embed": "model.embed_tokens.weight", "lm_head": "lm_head.weight"}
    return sd[names[role]]


# ----------------------------------------------------------------------------- F7
def make_deepspec_dspark(
    out: Path, verifier_dir: Path, *, target_layer_ids=(-1, 2, 4), block_size: int = 4,
    mask_token_id: int | None = MASK,
    markov_rank: int | None = 8, markov_head_type: str | None = "vanilla", enable_confidence_head: bool | None = True,
    confidence_head_with_markov: bool | None = True, num_layers: int = 2, embed: bool = True, drop_keys=(),
    extra_cfg: dict | None = None, extra_tensors: dict | None = None, drop_tensors=(), dtype: str = "bfloat16",
    tensor_heads: dict | None = None,
) -> Path:
    """DeepSpec ``Qwen3DSparkModel`` (external_formats.md §9): target config deep copy +
    flat overrides; DeepSpec omits ``markov_head_type`` when r = 0 and
    ``confidence_head_with_markov`` when the confidence head is off (``None`` = omitted)."""
    import copy

    cfg = copy.deepcopy(vcfg(verifier_dir))
    L = cfg["num_hidden_layers"]
    cfg.update(
        architectures=["Qwen3DSparkModel"], num_target_layers=L, num_hidden_layers=num_layers, block_size=block_size,
        tie_word_embeddings=False, layer_types=["full_attention"] * num_layers, target_layer_ids=list(target_layer_ids),
        num_anchors=16, dtype=dtype,
    )
    for k, v in (("mask_token_id", mask_token_id), ("markov_rank", markov_rank),
                 ("enable_confidence_head", enable_confidence_head)):
        if v is not None:
            cfg[k] = v
    if markov_rank and markov_head_type is not None:
        cfg["markov_head_type"] = markov_head_type
    if enable_confidence_head and confidence_head_with_markov is not None:
        cfg["confidence_head_with_markov"] = confidence_head_with_markov
    for k in drop_keys:
        cfg.pop(k, None)
    cfg.update(extra_cfg or {})
    t = body_tensors(verifier_dir, n_aux=len(target_layer_ids), num_layers=num_layers, dtype=dtype)
    hk = dict(rank=markov_rank or 0, mtype=markov_head_type or "vanilla", confidence=bool(enable_confidence_head),
              with_markov=bool(confidence_head_with_markov) and bool(enable_confidence_head), dtype=dtype)
    hk.update(tensor_heads or {})
    t.update(head_tensors(verifier_dir, **hk))
    if embed:
        t["embed_tokens.weight"] = verifier_tensor(verifier_dir, "embed").to(_dt(dtype))
        t["lm_head.weight"] = verifier_tensor(verifier_dir, "lm_head").to(_dt(dtype))
    t.update(extra_tensors or {})
    for k in drop_tensors:
        t.pop(k, None)
    return save(out, cfg, t)


# ----------------------------------------------------------------------------- F4 DSpark
def make_specforge_dspark(
    out: Path, verifier_dir: Path, *, target_layer_ids=(1, 3, 5), block_size: int = 4, mask_token_id: int | None = MASK,
    markov_rank: int = 8, markov_head_type: str = "vanilla", enable_confidence_head: bool = True,
    confidence_head_with_markov: bool = True, attention_mode: str = "gqa", head_location: str = "nested",
    logit_head: bool = False, domino_tensors: bool = False, num_layers: int = 2, extra_dflash: dict | None = None,
    extra_cfg: dict | None = None, dtype: str = "bfloat16",
) -> Path:
    """SpecForge ``DSparkDraftModel`` HF export (external_formats.md §6.3, §6.4): F1 body +
    heads, ``dflash_config`` holds the head/drafter keys (``head_location="top"``: the
    ``DSparkConfig`` top-level variant). ``logit_head=True``: early nested head names."""
    cfg = f1_config(verifier_dir, num_layers=num_layers, dtype=dtype)
    cfg.update(architectures=["DSparkDraftModel"], auto_map={"AutoModel": "dspark.DSparkDraftModel"},
               block_size=block_size)
    heads = dict(markov_rank=markov_rank, markov_head_type=markov_head_type,
                 enable_confidence_head=enable_confidence_head,
                 confidence_head_with_markov=confidence_head_with_markov, confidence_head_alpha=1.0)
    dc = {"projector_type": "dspark", "attention_mode": attention_mode, "target_layer_ids": list(target_layer_ids)}
    if mask_token_id is not None:
        dc["mask_token_id"] = mask_token_id
    if head_location == "nested":
        dc.update(heads)
    else:
        cfg.update(heads)
    dc.update(extra_dflash or {})
    cfg["dflash_config"] = dc
    cfg.update(extra_cfg or {})
    t = body_tensors(verifier_dir, n_aux=len(target_layer_ids), num_layers=num_layers, dtype=dtype)
    pre = "logit_head." if logit_head else ""
    t.update(head_tensors(verifier_dir, rank=markov_rank, mtype=markov_head_type, confidence=enable_confidence_head,
                          with_markov=confidence_head_with_markov, dtype=dtype,
                          prefix_markov=pre + "markov_head.", prefix_conf=pre + "confidence_head.proj."))
    if domino_tensors:
        import torch

        g = torch.Generator().manual_seed(3)
        H = draft_dims(verifier_dir)["H"]
        t[pre + "prefix_gru.weight_ih_l0"] = _rand(g, 3 * 8, H, dtype=dtype)
        t[pre + "prefix_gru.weight_hh_l0"] = _rand(g, 3 * 8, 8, dtype=dtype)
    return save(out, cfg, t)


# ----------------------------------------------------------------------------- F5 DSpark
def make_modelopt_dspark(
    out: Path, verifier_dir: Path, *, target_layer_ids=(1, 3, 5), block_size: int = 4, mask_token_id: int = MASK,
    markov_rank: int = 8, markov_head_type: str = "vanilla", use_confidence_head: bool = True,
    shift_label: bool | None = True, num_layers: int = 2, extra_dflash: dict | None = None, dtype: str = "bfloat16",
) -> Path:
    """ModelOpt DSpark export (external_formats.md §7): DFlash config + ``projector_type: dspark``,
    ``use_confidence_head``, ``shift_label``; head tensors at the TOP level (``markov_w1.weight``,
    ``confidence_proj.weight [1, H + r]``)."""
    cfg = f1_config(verifier_dir, num_layers=num_layers, dtype=dtype)
    cfg.update(architectures=["DFlashDraftModel"], block_size=block_size)
    dc = {"projector_type": "dspark", "mask_token_id": mask_token_id, "target_layer_ids": list(target_layer_ids),
          "markov_rank": markov_rank, "markov_head_type": markov_head_type, "use_confidence_head": use_confidence_head}
    if shift_label is not None:
        dc["shift_label"] = shift_label
    dc.update(extra_dflash or {})
    cfg["dflash_config"] = dc
    t = body_tensors(verifier_dir, n_aux=len(target_layer_ids), num_layers=num_layers, dtype=dtype)
    heads = head_tensors(verifier_dir, rank=markov_rank, mtype=markov_head_type, confidence=use_confidence_head,
                         with_markov=True, dtype=dtype, prefix_markov="", prefix_conf="confidence_proj.")
    t.update(heads)
    return save(out, cfg, t)


#: DSpark source format id → its builder ``(out, verifier_dir, **kw) -> Path``.
BUILDERS = {"deepspec_dspark": make_deepspec_dspark, "specforge_dspark": make_specforge_dspark,
            "modelopt_dspark": make_modelopt_dspark}


#: The DSpark source formats the registry lists (each needs its :data:`BUILDERS` entry).
FORMATS = registry_formats("dspark")


def make_source(out: Path, fmt: str, verifier_dir: Path, **kw) -> Path:
    """Build the ``fmt`` DSpark source into ``out`` with its :data:`BUILDERS` entry (``kw`` passed on).

    Raises:
        KeyError: a registered DSpark format has no builder here yet.
    """
    if fmt not in BUILDERS:
        raise KeyError(f"no DSpark fixture builder for {fmt!r}: add it to tests/fixtures_dspark.BUILDERS")
    return BUILDERS[fmt](out, verifier_dir, **kw)


# ----------------------------------------------------------------------------- F4 training dir
def make_specforge_training(
    run_dir: Path, verifier_dir: Path, *, strategy: str = "dspark", step: int = 100,
    prefix: str = "draft_model._orig_mod.",
    run_id: str = "run0", **kw,
) -> tuple[Path, Path]:
    """A SpecForge DataFlow checkpoint ``<run_dir>/<run_id>-step<N>/training_state.pt`` (external_formats.md §6.1):
    a real pickle (``torch.save``) with ``draft_state_dict`` (prefixed keys), ``strategy``,
    counters and an ``argparse.Namespace`` (so ``weights_only=True`` cannot load it), no
    config.json; plus the separate draft config file. Returns ``(checkpoint dir, draft config path)``."""
    import argparse
    import shutil
    import tempfile

    import torch
    from safetensors.torch import load_file

    tmp = Path(tempfile.mkdtemp())
    try:
        if strategy == "dspark":
            export = make_specforge_dspark(tmp / "export", verifier_dir, **kw)
        elif strategy == "dflash":
            export = make_zlab_dflash(tmp / "export", verifier_dir, **kw)
        else:
            raise ValueError(strategy)
        cfg = json.loads((export / "config.json").read_text())
        sd = load_file(str(export / "model.safetensors"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ckpt = Path(run_dir) / f"{run_id}-step{step}"
    ckpt.mkdir(parents=True, exist_ok=True)
    state = {
        "draft_state_dict": {prefix + k: v for k, v in sd.items()},
        "global_step": step, "epoch": 1, "epoch_batch": 7, "epoch_samples": 56, "strategy": strategy,
        "run_id": run_id, "world_size": 1, "args": argparse.Namespace(lr=1e-4, strategy=strategy),
    }
    torch.save(state, ckpt / "training_state.pt")
    # a seeded generator's state, not the process's: the file's bytes (and the goldens' sha256) then do not
    # depend on what ran before in the process
    torch.save({"optimizer": {}, "rng": torch.Generator().manual_seed(0).get_state()}, ckpt / "training_state_rank0.pt")
    draft_cfg = Path(run_dir) / f"{strategy}-draft-config.json"
    draft_cfg.write_text(json.dumps(cfg, indent=2))
    return ckpt, draft_cfg


def training_dir_from_export(
    run_dir: Path, export: Path, *, strategy: str, step: int = 7, prefix: str = "draft_model.", drop=(),
    run_id: str = "run1",
) -> tuple[Path, Path]:
    """Wrap an existing HF export dir as a SpecForge training checkpoint (same pickle layout
    as :func:`make_specforge_training`); ``drop`` removes tensors the training state does not
    hold (legacy states lack ``t2d``/``d2t``). Returns ``(checkpoint dir, draft config path)``."""
    import argparse

    import torch
    from safetensors.torch import load_file

    sd = load_file(str(Path(export) / "model.safetensors"))
    ckpt = Path(run_dir) / f"{run_id}-step{step}"
    ckpt.mkdir(parents=True, exist_ok=True)
    torch.save({"draft_state_dict": {prefix + k: v for k, v in sd.items() if k not in drop}, "global_step": step,
                "epoch": 0, "strategy": strategy, "run_id": run_id, "world_size": 1,
                "args": argparse.Namespace(strategy=strategy)}, ckpt / "training_state.pt")
    draft_cfg = Path(run_dir) / f"{strategy}-draft-config.json"
    draft_cfg.write_text((Path(export) / "config.json").read_text())
    return ckpt, draft_cfg


def make_zlab_dflash(out: Path, verifier_dir: Path, *, target_layer_ids=(1, 3, 5), block_size: int = 4,
                     mask_token_id: int = MASK, num_layers: int = 2, dtype: str = "bfloat16") -> Path:
    """A z-lab F1 DFlash export (external_formats.md §3), for the SpecForge dflash strategy."""
    cfg = f1_config(verifier_dir, num_layers=num_layers, dtype=dtype)
    cfg.update(architectures=["DFlashDraftModel"], auto_map={"AutoModel": "dflash.DFlashDraftModel"},
               block_size=block_size,
               dflash_config={"mask_token_id": mask_token_id, "target_layer_ids": list(target_layer_ids)})
    return save(out, cfg, body_tensors(verifier_dir, n_aux=len(target_layer_ids), num_layers=num_layers, dtype=dtype))


# ----------------------------------------------------------------------------- refusals
def _tiny(shape=(4, 4), dtype: str = "bfloat16"):
    import torch

    return torch.zeros(*shape, dtype=_dt(dtype))


def _f1(verifier_dir: Path, out: Path, **dc) -> tuple[dict, dict]:
    cfg = f1_config(verifier_dir)
    cfg.update(architectures=["DFlashDraftModel"], block_size=4,
               dflash_config={"mask_token_id": MASK, "target_layer_ids": [1, 3, 5], **dc})
    return cfg, body_tensors(verifier_dir, n_aux=3)


def make_refusal(kind: str, out: Path, verifier_dir: Path) -> Path:
    """The smallest input that triggers each refusal in ``converters/refusals.py`` (and the
    SpecForge training refusal). ``kind`` is the registry format id (with a ``:variant``
    suffix for alternative triggers)."""
    import torch

    out = Path(out)
    fid, _, variant = kind.partition(":")
    if fid == "dflash2_variant":
        cfg, t = _f1(verifier_dir, out)
        if variant == "config":  # DFlash-labelled, with DFlash2 keys
            cfg["dflash_config"].update(conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=4)
        elif variant == "tensors":  # DFlash-labelled, with a selector tensor
            t["candidate_selector.hidden_projection.weight"] = _tiny((8, 64))
        else:
            cfg.update(architectures=["MiniMaxDFlash2DraftModel" if variant == "minimax" else "DFlash2BeamDraftModel"],
                       is_causal=False)
            cfg["dflash_config"].update(conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=4)
        return save(out, cfg, t)
    if fid == "lilicorr":
        cfg, t = _f1(verifier_dir, out)
        cfg.update(architectures=["LiLiCorrDraftModel"], is_causal=False)
        return save(out, cfg, t)
    if fid == "laguna_dflash":
        cfg, t = _f1(verifier_dir, out)
        if variant == "tensors":
            t["aux_hidden_norms.0.weight"] = _tiny((64,))
        elif variant == "qkv":
            q = t.pop("layers.0.self_attn.q_proj.weight")
            k = t.pop("layers.0.self_attn.k_proj.weight")
            v = t.pop("layers.0.self_attn.v_proj.weight")
            t["layers.0.self_attn.qkv_proj.weight"] = torch.cat([q, k, v])
        else:
            cfg["model_type"] = "laguna"
        return save(out, cfg, t)
    if fid == "mimo_dflash":
        cfg, t = _f1(verifier_dir, out)
        if variant == "file":
            save(out, cfg, t)
            torch.save(torch.zeros(64), out / "mask_embedding.pt")
            return out
        if variant == "tensor":
            t["layers.0.self_attn.attention_sink_bias"] = _tiny((4,))
        else:
            cfg["attention_sink_bias"] = True
        return save(out, cfg, t)
    if fid == "domino":
        cfg, t = _f1(verifier_dir, out)
        if variant == "projector":
            cfg["dflash_config"].update(projector_type="domino", emb_dim=32, gru_hidden_dim=8)
        else:
            cfg["architectures"] = ["DominoDraftModel"]
        t["prefix_gru.weight_ih_l0"] = _tiny((24, 64))
        return save(out, cfg, t)
    if fid == "causal_dflash":
        cfg, t = _f1(verifier_dir, out, causal=True)
        cfg["architectures"] = ["Qwen3DFlashDraftModel"]
        return save(out, cfg, t)
    if fid == "gemma4_dspark":
        make_deepspec_dspark(out, verifier_dir,
                             extra_cfg={"architectures": ["Gemma4DSparkModel"], "target_model_type": "gemma4"})
        return out
    if fid == "mla_dspark":
        if variant == "glm5":
            return save(out, {"architectures": ["Glm5DSparkForCausalLM"], "hidden_size": 64},
                        {"fc.weight": _tiny((64, 192))})
        if variant == "kv_lora":
            return make_deepspec_dspark(out, verifier_dir, extra_cfg={"kv_lora_rank": 16, "q_lora_rank": 32})
        return make_specforge_dspark(out, verifier_dir, attention_mode="mla")
    if fid == "deepseek_v4_dspark":
        cfg = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "hidden_size": 64}
        if variant == "inference":
            return save(out, cfg, {"mtp.0.fc.weight": _tiny((64, 128))},
                        files={"inference/config.json": json.dumps({"dspark_block_size": 8,
                                                                    "dspark_markov_rank": 256})})
        cfg.update(dspark_block_size=8, dspark_markov_rank=256, dspark_target_layer_ids=[1, 2], dspark_noise_token_id=5)
        return save(out, cfg, {"layers.0.attn.wq_a.weight": _tiny((64, 64)), "embed.weight": _tiny((256, 64))})
    if fid == "quantized_drafter":
        cfg, t = _f1(verifier_dir, out)
        if variant == "hf_quant":
            return save(out, cfg, t,
                        files={"hf_quant_config.json": json.dumps({"quantization": {"quant_algo": "FP8"}})})
        if variant == "scale":
            t["layers.0.self_attn.q_proj.weight_scale"] = torch.ones(1, dtype=torch.float32)
        elif variant == "packed":
            t["layers.0.mlp.up_proj.weight_packed"] = torch.zeros(128, 32, dtype=torch.uint8)
        elif variant == "fp8":
            t["layers.0.mlp.up_proj.weight"] = t["layers.0.mlp.up_proj.weight"].to(torch.float8_e4m3fn)
        else:
            cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
        return save(out, cfg, t)
    if fid == "no_draft_body":
        cfg, t = _f1(verifier_dir, out)
        if variant == "embed_only":
            d = draft_dims(verifier_dir)
            return save(out, cfg,
                        {"embed_tokens.weight": _tiny((d["V"], d["H"])), "lm_head.weight": _tiny((d["V"], d["H"]))})
        return save(out, cfg, {})
    if fid == "eagle3":
        cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 64,
               "draft_vocab_size": 32,
               "vocab_size": 256, "num_hidden_layers": 1}
        t = {"midlayer.self_attn.q_proj.weight": _tiny((64, 128)), "fc.weight": _tiny((64, 192)),
             "d2t": torch.zeros(32, dtype=torch.int64)}
        if variant == "vocab_only":
            cfg["architectures"] = ["LlamaForCausalLM"]
        if variant == "nemo":
            cfg["architectures"] = ["LlamaEagle3DraftModel"]
        return save(out, cfg, t)
    if fid == "modelopt_eagle_parallel_heads":
        cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 64,
               "draft_vocab_size": 32,
               "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5], "parallel_draft_step": 3}}
        t = {"layers.0.self_attn.q_proj.weight": _tiny((64, 128)),
             "parallel_draft_heads.0.medusa_layers.0.linear.weight": _tiny((64, 64)),
             "parallel_draft_heads.0.lm_head.weight": _tiny((32, 64))}
        return save(out, cfg, t)
    if fid == "specforge_training":
        ckpt, _ = make_specforge_training(out, verifier_dir)
        return ckpt
    raise ValueError(kind)


#: every refusal trigger: (kind, expected format id)
REFUSAL_CASES = [
    ("dflash2_variant", "dflash2_variant"), ("dflash2_variant:minimax", "dflash2_variant"),
    ("dflash2_variant:config", "dflash2_variant"), ("dflash2_variant:tensors", "dflash2_variant"),
    ("lilicorr", "lilicorr"),
    ("laguna_dflash", "laguna_dflash"), ("laguna_dflash:tensors", "laguna_dflash"),
    ("laguna_dflash:qkv", "laguna_dflash"),
    ("mimo_dflash", "mimo_dflash"), ("mimo_dflash:file", "mimo_dflash"), ("mimo_dflash:tensor", "mimo_dflash"),
    ("domino", "domino"), ("domino:projector", "domino"),
    ("causal_dflash", "causal_dflash"),
    ("gemma4_dspark", "gemma4_dspark"),
    ("mla_dspark", "mla_dspark"), ("mla_dspark:glm5", "mla_dspark"), ("mla_dspark:kv_lora", "mla_dspark"),
    ("deepseek_v4_dspark", "deepseek_v4_dspark"), ("deepseek_v4_dspark:inference", "deepseek_v4_dspark"),
    ("quantized_drafter", "quantized_drafter"), ("quantized_drafter:hf_quant", "quantized_drafter"),
    ("quantized_drafter:scale", "quantized_drafter"), ("quantized_drafter:packed", "quantized_drafter"),
    ("quantized_drafter:fp8", "quantized_drafter"),
    ("no_draft_body", "no_draft_body"), ("no_draft_body:embed_only", "no_draft_body"),
    ("eagle3", "eagle3"), ("eagle3:vocab_only", "eagle3"), ("eagle3:nemo", "eagle3"),
    ("modelopt_eagle_parallel_heads", "modelopt_eagle_parallel_heads"),
]
