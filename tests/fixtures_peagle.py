"""Fixture builders for the P-EAGLE sources and the speculators trainer output.

Every drafter is first built by speculators 0.9.0 itself (``from_training_args`` on a
tiny local verifier from ``tests/conftest.make_tiny_verifier``, weights randomised,
``save_pretrained``) — the reference the conversions are compared with. The foreign
layouts (AWS / vLLM eagle3 + parallel drafting, SpecForge export, NeMo Automodel, early
speculators branches) have no installable producer, so they are re-laid-out from that
reference following external_formats.md §6.3–§6.4 (SpecForge), §8 (NeMo), §11 (AWS),
§12 (F10): same values, the producer's names, config keys and shapes. The trainer save
dirs follow speculators ``train/checkpointer.py`` (§13).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

H, VOCAB, MASK = 64, 256, 250
AUX = [1, 3, 5]


# ---------------------------------------------------------------------------- helpers
def pruned_maps(vocab: int, vd: int, seed: int = 3):
    """Sorted pruned vocab (speculators' layout): ``(t2d bool [V], d2t int64 [Vd] offsets)``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    keep = torch.sort(torch.randperm(vocab, generator=g)[:vd]).values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[keep] = True
    return t2d, keep - torch.arange(vd)


def randomise(model, skip=(), seed: int = 99) -> None:
    """O(1)-scale random values in every float parameter (norm gains around 1)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(name.startswith(s) for s in skip) or name.startswith("verifier_"):
                continue
            if p.dim() == 1 and "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))


def load_tensors(d: Path) -> dict[str, Any]:
    """All tensors of a dir (single file or shards) as torch tensors."""
    from safetensors.torch import load_file

    d = Path(d)
    idx = d / "model.safetensors.index.json"
    files = sorted(set(json.loads(idx.read_text())["weight_map"].values())) if idx.is_file() else ["model.safetensors"]
    out: dict[str, Any] = {}
    for f in files:
        out.update(load_file(str(d / f)))
    return out


def save_tensors(d: Path, tensors: dict[str, Any], *, shards: int = 1) -> None:
    """Save as ``model.safetensors`` or ``shards`` files + ``model.safetensors.index.json``."""
    from safetensors.torch import save_file

    d.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous().clone() for k, v in tensors.items()}
    if shards == 1:
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
        return
    names = sorted(tensors)
    wm, total = {}, 0
    for i in range(shards):
        part = names[i::shards]
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, str(d / fname), metadata={"format": "pt"})
        for n in part:
            wm[n] = fname
            total += tensors[n].numel() * tensors[n].element_size()
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": wm},
                                                               indent=2))


def read_json(p: Path) -> dict:
    return json.loads(Path(p).read_text())


def write_json(p: Path, d: dict) -> None:
    Path(p).parent.mkdir(parents=True, exist_ok=True)
    Path(p).write_text(json.dumps(d, indent=2))


# ------------------------------------------------------------- speculators references
def build_speculators_peagle(
    verifier_dir: Path,
    out: Path,
    *,
    layers: int = 2,
    vd: int | None = None,
    aux: list[int] = AUX,
    mask: int = MASK,
    nbr: bool = True,
    num_depths: int = 4,
    norm_before_fc: bool = False,
    dtype: str = "float32",
    seed: int = 0,
) -> Path:
    """A P-EAGLE drafter built and saved by speculators 0.9.0 (``PEagleDraftModel``).

    The draft layers copy the verifier's architecture (llama or qwen3 — per-head q/k norms).
    ``vd`` < vocab prunes the vocabulary (``d2t``/``t2d`` saved).
    """
    import torch
    from speculators.models import PEagleDraftModel
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(verifier_dir)
    cfg.num_hidden_layers = layers
    if getattr(cfg, "layer_types", None) is not None:  # as the trainer's layer config: one per draft layer
        cfg.layer_types = ["full_attention"] * layers
    V = cfg.vocab_size
    vd = vd or V
    t2d, d2t = pruned_maps(V, vd, seed=seed + 3) if vd < V else (None, None)
    model = PEagleDraftModel.from_training_args(
        cfg, t2d=t2d, d2t=d2t, verifier_name_or_path=str(verifier_dir), draft_vocab_size=vd,
        target_layer_ids=list(aux), mask_token_id=mask, draft_attn_impl="eager",
        norm_before_residual=nbr, norm_before_fc=norm_before_fc, num_depths=num_depths,
    )
    randomise(model, skip=("lm_head",), seed=seed + 99)
    model.eval()
    if dtype != "float32":
        model.to(getattr(torch, dtype))
    model.save_pretrained(out)
    return Path(out)


def build_speculators_block(
    verifier_dir: Path,
    out: Path,
    algorithm: str,
    *,
    layers: int = 1,
    vd: int | None = None,
    aux: list[int] = AUX,
    mask: int = MASK,
    block_size: int = 4,
    sample_from_anchor: bool | None = None,
    markov_rank: int = 8,
    dtype: str = "bfloat16",
    seed: int = 0,
    full_attention: bool = False,
) -> Path:
    """A DFlash or DSpark drafter built and saved by speculators 0.9.0 (sliding-window layers,
    window 32; ``full_attention``: full-attention layers, no window)."""
    import torch
    from speculators.models import DFlashDraftModel, DSparkDraftModel
    from transformers import AutoConfig

    cls = {"dflash": DFlashDraftModel, "dspark": DSparkDraftModel}[algorithm]
    cfg = AutoConfig.from_pretrained(verifier_dir)
    cfg.num_hidden_layers = layers
    cfg.layer_types = ["full_attention" if full_attention else "sliding_attention"] * layers
    cfg.sliding_window = None if full_attention else 32
    cfg.use_sliding_window = not full_attention
    V = cfg.vocab_size
    vd = vd or V
    t2d, d2t = pruned_maps(V, vd, seed=seed + 5) if vd < V else (None, None)
    kw: dict[str, Any] = dict(
        verifier_name_or_path=str(verifier_dir), draft_vocab_size=vd, block_size=block_size,
        target_layer_ids=list(aux), mask_token_id=mask, draft_attn_impl="eager",
    )
    if sample_from_anchor is not None:
        kw["sample_from_anchor"] = sample_from_anchor
    if algorithm == "dspark":
        kw.update(markov_rank=markov_rank, markov_head_type="vanilla")
    model = cls.from_training_args(cfg, t2d=t2d, d2t=d2t, **kw)
    randomise(model, skip=("embed_tokens", "lm_head"), seed=seed + 7)
    model.eval()
    model.to(getattr(torch, dtype))
    model.save_pretrained(out)
    return Path(out)


def _flat_llama_config(spec: dict) -> dict:
    """The flat HF draft config a foreign P-EAGLE producer writes (no wrapper keys)."""
    tl = dict(spec["transformer_layer_config"])
    for k in ("architectures", "dtype", "torch_dtype", "_name_or_path", "transformers_version"):
        tl.pop(k, None)
    rp = tl.get("rope_parameters") or {}
    if "rope_theta" in rp:  # transformers-4 style, as older exporters write it
        tl["rope_theta"] = rp["rope_theta"]
    tl["draft_vocab_size"] = spec["draft_vocab_size"]
    tl["torch_dtype"] = spec.get("dtype", "float32")
    return tl


# ------------------------------------------------------------------- foreign layouts
def to_aws(
    spec_dir: Path,
    out: Path,
    *,
    mask_keys: tuple[str, ...] = ("pard_token",),
    mask_values: dict[str, int] | None = None,
    midlayer: bool = False,
    mask_hidden_2d: bool = True,
    keep_t2d: bool = False,
    aux_in_config: bool = True,
    nbr_in_config: bool = True,
    num_depths: int | None = None,
    keep_embed: bool = True,
) -> Path:
    """vLLM "eagle3 + parallel drafting" layout (AWS P-EAGLE, external_formats.md §11)."""
    spec = read_json(spec_dir / "config.json")
    cfg = _flat_llama_config(spec)
    cfg["architectures"] = ["LlamaForCausalLMEagle3"]
    cfg["model_type"] = "llama"
    for k in mask_keys:
        cfg[k] = (mask_values or {}).get(k, spec["mask_token_id"])
    if aux_in_config:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": spec["eagle_aux_hidden_state_layer_ids"],
                               "use_aux_hidden_state": True}
    if nbr_in_config:
        cfg["norm_before_residual"] = spec["norm_before_residual"]
    if num_depths is not None:
        cfg["num_depths"] = num_depths
    t = load_tensors(spec_dir)
    if midlayer:
        t = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in t.items()}
    if mask_hidden_2d:
        t["mask_hidden"] = t["mask_hidden"].reshape(1, -1)
    if not keep_t2d:
        t.pop("t2d", None)
    if not keep_embed:
        t.pop("embed_tokens.weight")
    save_tensors(out, t)
    write_json(out / "config.json", cfg)
    return Path(out)


def to_specforge(
    spec_dir: Path,
    out: Path,
    *,
    default_mapping: bool = True,
    aux_in_config: bool = False,
    num_depths: int | None = None,
) -> Path:
    """SpecForge ``--to hf`` P-EAGLE export (external_formats.md §6.3–§6.4): flat llama
    config, ``PEagleDraftModel``, no mask id; full vocab keeps the default all-true ``t2d``
    and all-zero ``d2t`` buffers."""
    import torch

    spec = read_json(spec_dir / "config.json")
    cfg = _flat_llama_config(spec)
    cfg["architectures"] = ["PEagleDraftModel"]
    cfg["model_type"] = "llama"
    cfg["norm_before_residual"] = spec["norm_before_residual"]
    if aux_in_config:
        cfg["eagle_aux_hidden_state_layer_ids"] = spec["eagle_aux_hidden_state_layer_ids"]
    if num_depths is not None:
        cfg["num_depths"] = num_depths
    t = load_tensors(spec_dir)
    V, vd = cfg["vocab_size"], cfg["draft_vocab_size"]
    if default_mapping and vd == V:
        t["t2d"] = torch.ones(V, dtype=torch.bool)
        t["d2t"] = torch.zeros(vd, dtype=torch.int64)
    save_tensors(out, t)
    write_json(out / "config.json", cfg)
    return Path(out)


def to_nemo(
    spec_dir: Path,
    root: Path,
    *,
    shards: int = 2,
    consolidated: bool = True,
    mask_hidden_2d: bool = True,
    mapping_in_meta: bool = False,
) -> Path:
    """NeMo Automodel P-EAGLE checkpoint (external_formats.md §8): returns the save root;
    the HF dir is ``root/epoch_0_step_20/model[/consolidated]`` (plus an older
    ``epoch_0_step_10`` to exercise the latest-checkpoint pick)."""
    import torch

    spec = read_json(spec_dir / "config.json")
    cfg = _flat_llama_config(spec)
    cfg["architectures"] = ["LlamaEagle3DraftModel"]
    cfg["model_type"] = "llama"
    cfg["parallel_drafting"] = True
    cfg["mask_token_id"] = spec["mask_token_id"]
    cfg["num_depths"] = spec["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    cfg["eagle_aux_hidden_state_layer_ids"] = spec["eagle_aux_hidden_state_layer_ids"]
    cfg["norm_before_residual"] = spec["norm_before_residual"]
    t = load_tensors(spec_dir)
    top = {"lm_head.weight", "d2t", "t2d", "mask_hidden"}
    meta = {}
    if mapping_in_meta:
        for k in ("d2t", "t2d"):
            if k in t:
                meta[k] = t.pop(k)
    if mask_hidden_2d:
        t["mask_hidden"] = t["mask_hidden"].reshape(1, -1)
    t = {(k if k in top else "model." + k): v for k, v in t.items()}
    for step, _final in ((10, False), (20, True)):
        epoch = root / f"epoch_0_step_{step}"
        d = epoch / "model" / ("consolidated" if consolidated else "")
        save_tensors(d, t, shards=shards)
        write_json(d / "config.json", cfg)
        if meta:
            torch.save({**meta, "num_depths": cfg["num_depths"]}, epoch / "eagle_meta.pt")
    return Path(root)


def to_early_speculators(spec_dir: Path, out: Path, *, para_num: int | None = None) -> Path:
    """F10: an early speculators P-EAGLE branch (PRs #327–#480): ``ptd_token_id`` instead of
    ``mask_token_id`` plus the legacy COD keys (external_formats.md §12)."""
    cfg = read_json(spec_dir / "config.json")
    cfg["ptd_token_id"] = cfg.pop("mask_token_id")
    k = cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    cfg["para_num"] = para_num if para_num is not None else k
    cfg["down_sample_ratio"] = 0.7
    cfg["down_sample_ratio_min"] = 0.2
    cfg["loss_type"] = "kl_div"
    cfg["speculators_version"] = "0.5.0.dev327"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(spec_dir / "model.safetensors", out / "model.safetensors")
    write_json(out / "config.json", cfg)
    return Path(out)


# ------------------------------------------------------------- trainer save directory
def trainer_save_dir(
    root: Path,
    epochs: dict[int, Path],
    *,
    best: int | None = None,
    interrupted: Path | None = None,
    config_patch: dict | None = None,
    config_drop: tuple[str, ...] = (),
) -> Path:
    """A speculators trainer ``save_path`` (speculators ``train/checkpointer.py``):
    ``<epoch>/`` dirs (save_pretrained output + ``optimizer_state_dict.pt``,
    ``scheduler_state_dict.pt``, ``training_state.json``, ``val_metrics.json``,
    ``train_command.txt``), a relative ``checkpoint_best`` symlink, human-readable
    ``epoch<E>_end`` symlinks and an optional ``interrupted/`` save."""
    import torch

    root.mkdir(parents=True, exist_ok=True)
    (root / "train_command.txt").write_text("speculators train --speculator-type ... (fixture)\n")
    for e, built in sorted(epochs.items()):
        d = root / str(e)
        shutil.copytree(built, d)
        cfg = read_json(d / "config.json")
        cfg.update(config_patch or {})
        for k in config_drop:
            cfg.pop(k, None)
        write_json(d / "config.json", cfg)
        torch.save({"state": {0: {"step": torch.tensor(float(e + 1))}}, "param_groups": [{"lr": 1e-4}]},
                   d / "optimizer_state_dict.pt")
        torch.save({"last_epoch": e}, d / "scheduler_state_dict.pt")
        write_json(d / "training_state.json", {"epoch": e, "local_step": 0, "global_step": 100 * (e + 1)})
        write_json(d / "val_metrics.json", {"loss_epoch": 1.0 / (e + 1)})
        shutil.copy(root / "train_command.txt", d / "train_command.txt")
        os.symlink(str(e), root / f"epoch{e}_end", target_is_directory=True)
    if best is not None:
        os.symlink(str(best), root / "checkpoint_best", target_is_directory=True)
    if interrupted is not None:
        shutil.copytree(interrupted, root / "interrupted")
    return root
