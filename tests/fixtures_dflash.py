"""Spec-built DFlash-family source checkpoints (tiny, random) for converter tests.

Each builder writes what one producer writes — ``config.json`` keys and tensor names as
described in docs/formats.md — with shapes chosen to match the tiny
Qwen3 verifier of ``tests/conftest.py`` (H=64, 6 layers, vocab 256, bos 1 / eos 2 /
pad 0). Values are seeded random numbers; only names, shapes, dtypes and config keys
carry meaning.

Layouts (``fmt``):

* ``zlab_dflash`` (§3 F1): ``architectures [DFlashDraftModel]``, ``model_type qwen3``,
  ``dflash_config.{target_layer_ids, mask_token_id}``, ``block_size`` top level
  (or nested / both), ``auto_map``, ``num_target_layers``; z-lab tensor names.
* ``specforge_dflash`` (§6.2): the F1 export inside ``epoch_E_step_S/`` with a
  ``training_state.pt`` (here junk bytes: it must never be read) and ``dflash.py``.
* ``modelopt_dflash`` (§7 F5): F1 config + ``dflash_config.projector_type: dflash``,
  ``torch_dtype``, top-level ``rope_theta``, no ``auto_map``.
* ``nemo_dflash`` (§8 F6): ``architectures [Qwen3DFlashDraftModel]``, F1 keys/tensors.
* ``muse_glimmer_dflash`` (§3 F1b): ``MuseGlimmerAssistantModel``, flat ``block_size``,
  ``mask_token_id``, ``target_layer_ids``, sliding ``layer_types``; ``encoder.fc.weight``,
  ``encoder.output_norm_enc.weight``.
* ``deepspec_dflash`` (§9 F7): ``Qwen3DSparkModel`` with ``markov_rank: 0``, flat
  ``target_layer_ids`` (``-1`` = embeddings allowed) and ``mask_token_id``, top-level
  ``block_size``, ``num_anchors``; ships ``embed_tokens``/``lm_head`` copies of the verifier.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

#: Tiny verifier facts (tests/conftest.py ``tiny_verifier_dir``).
H, VOCAB, VERIFIER_LAYERS = 64, 256, 6
HEADS, KV_HEADS, HEAD_DIM, INTER = 4, 2, 16, 128
MASK = 200  # not bos (1) / eos (2) / pad (0) of the tiny verifier
DEFAULT_IDS = (0, 2, 4)  # z-lab convention → speculators 1, 3, 5

#: Supported registry formats whose fixtures are not spec-built here or in tests/fixtures_dspark.py:
#: the speculators trainer's own checkpoints (tests/converters/test_speculators_trainer.py).
BUILT_ELSEWHERE = frozenset({"speculators_dflash", "speculators_dspark"})


def registry_formats(algorithm: str) -> tuple[str, ...]:
    """The converter registry's supported formats of target ``algorithm`` (``dflash`` |
    ``dspark``), registry order, less :data:`BUILT_ELSEWHERE`: the formats a family's
    parametrised tests run over. A new format registered for the algorithm joins them and
    needs its fixture builder (:func:`source_config` / ``fixtures_dspark.BUILDERS``)."""
    from specconv.converters import REGISTRY

    return tuple(fid for fid, cls in REGISTRY.items()
                 if cls.supported and cls.algorithm == algorithm and fid not in BUILT_ELSEWHERE)


#: The DFlash source formats :func:`make_source` builds (every one the registry lists).
FORMATS = registry_formats("dflash")

_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


def body_tensors(
    *,
    layers: int = 2,
    n_aux: int = 3,
    fc_in: int | None = None,
    hidden: int = H,
    dtype: str = "bfloat16",
    seed: int = 0,
    bias: bool = False,
) -> dict[str, Any]:
    """z-lab-named DFlash body tensors: ``fc [H, n_aux·H]``, ``hidden_norm``, ``norm``,
    and per layer the Qwen3 decoder tensors (q/k norms included).

    Args:
        fc_in: override the ``fc.weight`` input width (to build inconsistent sources).
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    tdt = getattr(torch, dtype)

    def w(*shape):
        return (torch.randn(*shape, generator=g) / shape[-1] ** 0.5).to(tdt)

    def gain(n):
        return (1.0 + 0.1 * torch.randn(n, generator=g)).to(tdt)

    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    t = {
        "fc.weight": w(hidden, fc_in if fc_in is not None else n_aux * hidden),
        "hidden_norm.weight": gain(hidden),
        "norm.weight": gain(hidden),
    }
    for i in range(layers):
        p = f"layers.{i}."
        t[p + "input_layernorm.weight"] = gain(hidden)
        t[p + "post_attention_layernorm.weight"] = gain(hidden)
        t[p + "self_attn.q_proj.weight"] = w(q, hidden)
        t[p + "self_attn.k_proj.weight"] = w(kv, hidden)
        t[p + "self_attn.v_proj.weight"] = w(kv, hidden)
        t[p + "self_attn.o_proj.weight"] = w(hidden, q)
        t[p + "self_attn.q_norm.weight"] = gain(HEAD_DIM)
        t[p + "self_attn.k_norm.weight"] = gain(HEAD_DIM)
        if bias:
            for n, d in (("q", q), ("k", kv), ("v", kv)):
                t[p + f"self_attn.{n}_proj.bias"] = (0.01 * torch.randn(d, generator=g)).to(tdt)
        t[p + "mlp.gate_proj.weight"] = w(INTER, hidden)
        t[p + "mlp.up_proj.weight"] = w(INTER, hidden)
        t[p + "mlp.down_proj.weight"] = w(hidden, INTER)
    return t


def qwen3_keys(*, layers: int = 2, dtype: str = "bfloat16", rope: str = "parameters") -> dict[str, Any]:
    """The Qwen3Config keys of a tiny DFlash drafter (what ``save_pretrained`` writes)."""
    cfg: dict[str, Any] = {
        "model_type": "qwen3",
        "hidden_size": H,
        "intermediate_size": INTER,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 512,
        "vocab_size": VOCAB,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * layers,
        "sliding_window": None,
        "use_sliding_window": False,
        "max_window_layers": layers,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": dtype,
        "transformers_version": "5.19.0",
    }
    if rope == "parameters":
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 1000000.0}
    elif rope == "theta":
        cfg["rope_theta"] = 1000000.0
    return cfg


def _merge(base: dict[str, Any], upd: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``upd`` into ``base``; a value ``DELETE`` removes the key."""
    for k, v in upd.items():
        if v is DELETE:
            base.pop(k, None)
        elif isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = copy.deepcopy(v)
    return base


class _Delete:
    def __repr__(self) -> str:
        return "DELETE"


#: Marker for ``config_updates``: remove this key.
DELETE = _Delete()


def source_config(
    fmt: str,
    *,
    layers: int = 2,
    target_layer_ids=DEFAULT_IDS,
    block_size: int | None = 4,
    block_at: str = "top",
    mask_token_id: int | None = MASK,
    mask_at: str | None = None,
    dtype: str = "bfloat16",
) -> dict[str, Any]:
    """The ``config.json`` a producer writes (see module docstring).

    Args:
        block_at: ``top`` | ``nested`` | ``both`` (nested = ``dflash_config.block_size``).
        mask_at: ``nested`` | ``top`` | ``both``; default: where the producer keeps it.
        block_size / mask_token_id / target_layer_ids: ``None`` leaves the key out.
    """
    ids = None if target_layer_ids is None else [int(i) for i in target_layer_ids]
    if fmt in ("zlab_dflash", "specforge_dflash", "modelopt_dflash", "nemo_dflash"):
        cfg = qwen3_keys(layers=layers, dtype=dtype, rope="theta" if fmt == "modelopt_dflash" else "parameters")
        dc: dict[str, Any] = {}
        if ids is not None:
            dc["target_layer_ids"] = ids
        mask_at = mask_at or "nested"
        cfg["architectures"] = ["Qwen3DFlashDraftModel" if fmt == "nemo_dflash" else "DFlashDraftModel"]
        cfg["num_target_layers"] = VERIFIER_LAYERS
        if fmt in ("zlab_dflash", "specforge_dflash"):
            cfg["auto_map"] = {"AutoModel": "dflash.DFlashDraftModel"}
        if fmt == "modelopt_dflash":
            dc["projector_type"] = "dflash"
            cfg["torch_dtype"] = cfg.pop("dtype")
        cfg["dflash_config"] = dc
    elif fmt == "muse_glimmer_dflash":
        cfg = qwen3_keys(layers=layers, dtype=dtype)
        cfg.update(
            architectures=["MuseGlimmerAssistantModel"],
            model_type="muse_glimmer_assistant",
            layer_types=["sliding_attention"] * layers,
            sliding_window=32,
            use_sliding_window=True,
        )
        if ids is not None:
            cfg["target_layer_ids"] = ids
        mask_at = mask_at or "top"
    elif fmt == "deepspec_dflash":
        cfg = qwen3_keys(layers=layers, dtype=dtype)
        cfg.update(
            architectures=["Qwen3DSparkModel"],
            num_target_layers=VERIFIER_LAYERS,
            num_anchors=512,
            markov_rank=0,
            enable_confidence_head=False,
        )
        if ids is not None:
            cfg["target_layer_ids"] = ids
        mask_at = mask_at or "top"
    else:
        raise ValueError(f"unknown fixture format {fmt!r}")
    if block_size is not None:
        if block_at in ("top", "both"):
            cfg["block_size"] = block_size
        if block_at in ("nested", "both"):
            cfg.setdefault("dflash_config", {})["block_size"] = block_size
    if mask_token_id is not None:
        if mask_at in ("top", "both"):
            cfg["mask_token_id"] = mask_token_id
        if mask_at in ("nested", "both"):
            cfg.setdefault("dflash_config", {})["mask_token_id"] = mask_token_id
    return cfg


def source_tensors(fmt: str, *, layers: int = 2, n_aux: int = 3, dtype: str = "bfloat16", seed: int = 0,
                   fc_in: int | None = None, verifier_dir: Path | None = None) -> dict[str, Any]:
    """Tensors as the producer names them (Muse-Glimmer ``encoder.*``; DeepSpec adds
    ``embed_tokens``/``lm_head`` copied from ``verifier_dir`` when given)."""
    t = body_tensors(layers=layers, n_aux=n_aux, dtype=dtype, seed=seed, fc_in=fc_in)
    if fmt == "muse_glimmer_dflash":
        t["encoder.fc.weight"] = t.pop("fc.weight")
        t["encoder.output_norm_enc.weight"] = t.pop("hidden_norm.weight")
    elif fmt == "deepspec_dflash":
        import torch

        tdt = getattr(torch, dtype)
        if verifier_dir is not None:
            from safetensors.torch import load_file

            vt = load_file(str(Path(verifier_dir) / "model.safetensors"))
            emb = vt["model.embed_tokens.weight"]
            head = vt.get("lm_head.weight", emb)
            t["embed_tokens.weight"] = emb.to(tdt).clone()
            t["lm_head.weight"] = head.to(tdt).clone()
        else:
            g = torch.Generator().manual_seed(seed + 1)
            t["embed_tokens.weight"] = torch.randn(VOCAB, H, generator=g).to(tdt)
            t["lm_head.weight"] = torch.randn(VOCAB, H, generator=g).to(tdt)
    return t


def write_source(out: Path, config: dict[str, Any] | None, tensors: dict[str, Any], *,
                 extra_files: dict[str, bytes] | None = None) -> Path:
    """Write ``config.json`` (if given) + ``model.safetensors`` (+ extra files) into ``out``."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    for name, data in (extra_files or {}).items():
        (out / name).write_bytes(data)
    return out


def make_source(
    root: Path,
    fmt: str = "zlab_dflash",
    *,
    layers: int = 2,
    target_layer_ids=DEFAULT_IDS,
    block_size: int | None = 4,
    block_at: str = "top",
    mask_token_id: int | None = MASK,
    mask_at: str | None = None,
    dtype: str = "bfloat16",
    seed: int = 0,
    fc_in: int | None = None,
    config_updates: dict[str, Any] | None = None,
    extra_tensors: dict[str, Any] | None = None,
    drop_tensors: tuple[str, ...] = (),
    verifier_dir: Path | None = None,
) -> Path:
    """Write one tiny source checkpoint of layout ``fmt`` under ``root``; return the path
    to pass to ``specconv convert`` (for SpecForge: the ``epoch_1_step_100`` dir).

    ``n_aux`` (and so ``fc.weight``'s width) follows ``len(target_layer_ids)`` unless
    ``fc_in`` overrides it. ``config_updates`` is deep-merged last (``DELETE`` removes a
    key); ``extra_tensors`` are added and ``drop_tensors`` removed by (source) name.
    """
    root = Path(root)
    n_aux = len(target_layer_ids) if target_layer_ids is not None else 3
    cfg = source_config(fmt, layers=layers, target_layer_ids=target_layer_ids, block_size=block_size,
                        block_at=block_at, mask_token_id=mask_token_id, mask_at=mask_at, dtype=dtype)
    _merge(cfg, config_updates or {})
    t = source_tensors(fmt, layers=layers, n_aux=n_aux, dtype=dtype, seed=seed, fc_in=fc_in, verifier_dir=verifier_dir)
    for n in drop_tensors:
        del t[n]
    t.update(extra_tensors or {})
    extra: dict[str, bytes] = {}
    out = root / fmt
    if fmt == "specforge_dflash":
        out = root / "specforge_run" / "epoch_1_step_100"
        # a pickle-looking payload that must never be unpickled (it would fail loudly)
        extra = {"training_state.pt": b"not a pickle: specconv must never read this file\n",
                 "dflash.py": b"# z-lab remote code copy\n"}
    elif fmt in ("zlab_dflash",):
        extra = {"dflash.py": b"# z-lab remote code (auto_map)\n"}
    return write_source(out, cfg, t, extra_files=extra)


# --------------------------------------------------------------- conversion helpers
#: Hub id recorded as the verifier name in tests (the tiny verifier is local).
HUB = "org/tiny-qwen3"


def cli_convert(src, verifier, out, *args, name=HUB):
    """Run ``specconv convert --format json`` in-process; return (exit code, JSON, stderr)."""
    from cli_runner import convert

    return convert(src, verifier, out, *args, name=name).code_json_stderr


def api_convert(src, verifier, out=None, *, name=HUB, max_shard_size=None, overwrite=False, dry_run=False, **opts):
    """``specconv.convert.convert`` with ``ConvertOptions(**opts)``; returns its ``ConversionResult``."""
    from specconv.convert import convert
    from specconv.converters import ConvertOptions

    return convert(str(src), verifier=str(verifier), output=out, options=ConvertOptions(**opts), verifier_name=name,
                   max_shard_size=max_shard_size, overwrite=overwrite, dry_run=dry_run)


def read(out: Path, name: str = "config.json") -> dict:
    """Parse a JSON file of an output dir."""
    return json.loads((Path(out) / name).read_text())


def codes(findings, level=None):
    """Finding codes (optionally of one level) from a report's ``findings`` list."""
    return {f["code"] for f in findings if level is None or f["level"] == level}


def out_tensors(out: Path) -> dict:
    """``{name: TensorInfo}`` of an output dir (single file or shards)."""
    from specconv.tensors import TensorStore

    st = TensorStore.open(Path(out))
    return {n: st.info(n) for n in st.names()}


def sha_tree(d: Path) -> dict[str, str]:
    """sha256 of every file directly in ``d``."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(d).iterdir())}


__all__ = [
    "H", "VOCAB", "VERIFIER_LAYERS", "MASK", "DEFAULT_IDS", "FORMATS", "BUILT_ELSEWHERE", "registry_formats", "DELETE",
    "HUB", "api_convert", "cli_convert", "read", "codes", "out_tensors", "sha_tree",
    "body_tensors", "qwen3_keys", "source_config", "source_tensors", "write_source", "make_source",
]
