"""DFlash2 sources written by the real producers (``../shared/reference/dflash2.md`` §5):

* :func:`zlab_dflash2` — z-lab ``dflash`` 0.1.0 ``DFlash2DraftModel(config).save_pretrained`` (codebooks as
  ``….codebook.weight``); ``bare=True`` renames them as published checkpoints hold them;
* :func:`speculators_dflash2` — speculators 0.9.0 ``DFlash2DraftModel.from_training_args(...).save_pretrained``.

Both at the tiny verifier's sizes (H=64, vocab 256, ``tests/conftest.py::make_tiny_verifier``) unless given
others. ``base_kernel`` is set explicitly (z-lab leaves it uninitialised: dflash2.md pitfall 12).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

KEYS = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4}


def _randomise(model: torch.nn.Module, seed: int, codebook_std: float = 2.0) -> None:
    """O(1) random weights (norm gains near 1), identity-plus-noise convolution taps, codebooks of
    ``codebook_std`` (2: strong enough that the selector reorders the top-K)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(("verifier_", "embed_tokens", "lm_head")):
                continue
            if name.endswith("base_kernel"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
                p[:, 0] += 1.0
            elif "codebook" in name:
                p.copy_(codebook_std * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))


def _layer_keys(verifier: Path, layers: int) -> dict[str, Any]:
    v = json.loads((verifier / "config.json").read_text())
    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_parameters")
    return {k: v[k] for k in keys if k in v} | {"num_hidden_layers": layers, "tie_word_embeddings": False,
                                                "layer_types": ["full_attention"] * layers}


def zlab_dflash2(out: Path, verifier: Path, *, layers: int = 2, block_size: int = 8, target_layer_ids=(0, 2, 4),
                 mask_token_id: int | None = None, keys: dict[str, Any] | None = None, top_level: bool = False,
                 bare: bool = False, seed: int = 0, dtype: torch.dtype = torch.float32, codebook_std: float = 2.0,
                 **extra: Any) -> Path:
    """A z-lab DFlash2 checkpoint of ``layers`` layers for ``verifier``; ``top_level``: the four keys at the top
    level instead of in ``dflash_config`` (z-lab reads both); ``extra``: more top-level config keys."""
    from dflash.model import DFlash2DraftModel
    from transformers import Qwen3Config

    lk = _layer_keys(verifier, layers)
    mask = lk["vocab_size"] - 1 if mask_token_id is None else mask_token_id
    dflash_config: dict[str, Any] = {"block_size": block_size, "mask_token_id": mask,
                                     "target_layer_ids": list(target_layer_ids)}
    k = dict(KEYS if keys is None else keys)
    cfg = Qwen3Config(**lk, **(k if top_level else {}), **extra)
    if not top_level:
        dflash_config.update(k)
    cfg.architectures, cfg.num_target_layers, cfg.is_causal = ["DFlash2DraftModel"], 6, False
    cfg.dflash_config = dflash_config
    if top_level:  # z-lab's _draft_value falls back to the attribute
        for key, v in k.items():
            setattr(cfg, key, v)
    torch.manual_seed(seed)
    model = DFlash2DraftModel(cfg)
    _randomise(model, seed, codebook_std)
    model.to(dtype).save_pretrained(out)
    if bare:
        from safetensors.torch import load_file, save_file

        f = out / "model.safetensors"
        t = load_file(str(f))
        save_file({n.removesuffix(".weight") if "_codebook" in n else n: v for n, v in t.items()}, str(f),
                  metadata={"format": "pt"})
    return out


def speculators_dflash2(out: Path, verifier: Path, *, layers: int = 2, block_size: int = 8, seed: int = 0,
                        verifier_name: str = "org/tiny-qwen3", **keys: Any) -> Path:
    """A speculators 0.9.0 ``dflash2`` dir (its ``save_pretrained``) for ``verifier``, recorded as
    ``verifier_name`` (as a trainer run against a Hub verifier records it; the local path would vary)."""
    from speculators.models import DFlash2DraftModel
    from transformers import Qwen3Config

    lk = _layer_keys(verifier, layers)
    model = DFlash2DraftModel.from_training_args(
        Qwen3Config(**lk), verifier_name_or_path=str(verifier), draft_vocab_size=lk["vocab_size"],
        block_size=block_size, target_layer_ids=[1, 3, 6], mask_token_id=lk["vocab_size"] - 1,
        draft_attn_impl="eager", **(KEYS | keys))
    _randomise(model, seed)
    model.eval().save_pretrained(out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["speculators_config"]["verifier"]["name_or_path"] = verifier_name
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return out
