"""Produce genuine z-lab DFlash v1 checkpoints for SmolLM2-135M-Instruct with z-lab's own code.

The checkpoint is built by ``dflash.model.DFlashDraftModel`` (z-lab's MIT reference
implementation, ``dflash`` 0.1.0 on PyPI) and written by its ``save_pretrained``, so the
layout is exactly the one z-lab's code writes (docs/formats.md, ``zlab_dflash``):

* ``config.json``: Qwen3Config keys (``model_type: qwen3``; ``num_hidden_layers`` = draft
  layers), ``architectures: ["DFlashDraftModel"]``, ``num_target_layers``,
  ``dflash_config.{target_layer_ids, mask_token_id}`` and ``block_size`` at the top level,
  inside ``dflash_config`` or both (z-lab releases differ; ``_draft_value`` in
  ``dflash/model.py`` reads ``dflash_config[name]`` first, then the top-level attribute);
* ``model.safetensors``: ``fc.weight [576, n_aux*576]``, ``hidden_norm.weight``,
  ``norm.weight``, ``layers.{l}.*`` — no ``embed_tokens``, no ``lm_head`` (the drafter
  uses the verifier's embedding and LM head).

Shapes follow the SmolLM2-135M verifier (hidden 576, 9 query / 3 KV heads, head dim 64,
intermediate 1536, vocab 49,152, RMSNorm eps 1e-5, RoPE θ 1e5, 30 layers).
``target_layer_ids`` use z-lab's convention Z (id k reads ``hidden_states[k + 1]``); 29 is
the verifier's last decoder layer (speculators id 30).

The mask token is 16 (``<empty_output>``): an added special token of the SmolLM2
tokenizer that is not bos (1), eos (2), pad (2) or unk (0) and never occurs in chat text.

Usage::

    python examples/zlab_dflash.py OUT_DIR [--seed 0] [--target-layer-ids 1,14,27] ...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

#: SmolLM2-135M-Instruct shapes (verifier config.json).
SMOLLM2 = dict(
    hidden_size=576,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    intermediate_size=1536,
    vocab_size=49152,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    max_position_embeddings=8192,
    num_target_layers=30,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)
#: ``<empty_output>`` in the SmolLM2 tokenizer (special, unused in chat text).
SMOLLM2_MASK_TOKEN_ID = 16
#: Variant that reads the verifier's last decoder layer (z-lab id 29 = speculators id 30).
LAST_LAYER_TARGET_IDS = (1, 14, 29)


def zlab_config(
    *,
    target_layer_ids=(1, 14, 27),
    num_layers: int = 2,
    block_size: int = 8,
    mask_token_id: int = SMOLLM2_MASK_TOKEN_ID,
    layer_types=None,
    dtype: str = "bfloat16",
    block_size_location: str = "top",
):
    """Build the z-lab ``Qwen3Config`` of a SmolLM2-sized DFlash drafter.

    Args:
        target_layer_ids: verifier layers read (z-lab convention Z, 0-based layer outputs).
        num_layers: draft decoder layers (``num_hidden_layers``).
        block_size: DFlash block size B (B-1 drafted tokens per step).
        mask_token_id: token id filling slots 1..B-1.
        layer_types: optional per-layer ``full_attention``/``sliding_attention`` list.
        dtype: ``"bfloat16"``, ``"float16"`` or ``"float32"``.
        block_size_location: ``"top"`` (top-level ``block_size``, as the Qwen3/LLaMA b16
            releases), ``"nested"`` (``dflash_config.block_size``) or ``"both"``.

    Returns:
        transformers ``Qwen3Config``.

    Raises:
        ValueError: bad ``block_size_location`` or ``layer_types`` length.
    """
    from transformers import Qwen3Config

    if block_size_location not in ("top", "nested", "both"):
        raise ValueError(f"block_size_location must be top|nested|both, not {block_size_location!r}")
    dflash_config = {
        "target_layer_ids": [int(i) for i in target_layer_ids],
        "mask_token_id": int(mask_token_id),
    }
    kw = dict(SMOLLM2)
    if block_size_location in ("nested", "both"):
        dflash_config["block_size"] = int(block_size)
    if block_size_location in ("top", "both"):
        kw["block_size"] = int(block_size)
    if layer_types is not None:
        layer_types = list(layer_types)
        if len(layer_types) != num_layers:
            raise ValueError("layer_types needs one entry per draft layer")
        kw["layer_types"] = layer_types
    return Qwen3Config(
        **kw,
        num_hidden_layers=int(num_layers),
        tie_word_embeddings=False,
        dflash_config=dflash_config,
        architectures=["DFlashDraftModel"],
        dtype=dtype,
    )


def build_zlab_dflash(*, seed: int = 0, **config_kwargs):
    """Construct a randomly initialised z-lab ``DFlashDraftModel`` (fp32, eval mode).

    Args:
        seed: ``torch.manual_seed`` used before construction (initialisation is
            z-lab/transformers' own ``_init_weights``).
        **config_kwargs: forwarded to :func:`zlab_config`.

    Returns:
        ``dflash.model.DFlashDraftModel``.
    """
    import torch
    from dflash.model import DFlashDraftModel

    cfg = zlab_config(**config_kwargs)
    torch.manual_seed(seed)
    model = DFlashDraftModel(cfg).to(torch.float32)
    return model.eval()


def save_zlab(model, out_dir, *, dtype: str = "bfloat16") -> Path:
    """Cast a ``DFlashDraftModel`` to ``dtype`` and write it with z-lab's ``save_pretrained``.

    Returns:
        ``out_dir`` as a Path (contains ``config.json`` and ``model.safetensors``).
    """
    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype]
    model = model.to(tdt)
    model.config.dtype = dtype
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def make_zlab_dflash(
    out_dir,
    *,
    target_layer_ids=(1, 14, 27),
    num_layers: int = 2,
    block_size: int = 8,
    mask_token_id: int = SMOLLM2_MASK_TOKEN_ID,
    layer_types=None,
    seed: int = 0,
    dtype: str = "bfloat16",
    block_size_location: str = "top",
) -> Path:
    """Write a random-initialised z-lab DFlash drafter for SmolLM2-135M to ``out_dir``.

    Same ``seed`` and arguments give byte-identical ``model.safetensors``.

    Args:
        out_dir: output directory (created).
        target_layer_ids: z-lab convention Z ids; include 29 for the verifier's last layer.
        num_layers, block_size, mask_token_id, layer_types, dtype, block_size_location:
            see :func:`zlab_config`.
        seed: initialisation seed.

    Returns:
        Path of the written directory.
    """
    model = build_zlab_dflash(
        seed=seed,
        target_layer_ids=target_layer_ids,
        num_layers=num_layers,
        block_size=block_size,
        mask_token_id=mask_token_id,
        layer_types=layer_types,
        dtype=dtype,
        block_size_location=block_size_location,
    )
    return save_zlab(model, out_dir, dtype=dtype)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--target-layer-ids", default="1,14,27")
    ap.add_argument("--num-layers", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--mask-token-id", type=int, default=SMOLLM2_MASK_TOKEN_ID)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--block-size-location", default="top", choices=["top", "nested", "both"])
    a = ap.parse_args(argv)
    out = make_zlab_dflash(
        a.out_dir,
        target_layer_ids=[int(x) for x in a.target_layer_ids.split(",")],
        num_layers=a.num_layers,
        block_size=a.block_size,
        mask_token_id=a.mask_token_id,
        seed=a.seed,
        dtype=a.dtype,
        block_size_location=a.block_size_location,
    )
    print(json.dumps({"out_dir": str(out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
