"""Tensors a servable Speculators draft holds, with their shapes (:func:`expected_tensors`).

Names and shapes: speculators 0.9.0 ``src/speculators/models/{peagle,dflash,dspark}/core.py``
(module names as saved, no ``model.`` prefix) and the vLLM 0.33 draft models under
``vllm/model_executor/models/`` (what their ``load_weights`` map). ``nn.Linear`` weights are ``[out, in]``; q/k/v and \
gate/up are
stored separately.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .algorithms import algorithm as describe
from .schema import PEagleConfig, SpeculatorsDraftConfig

__all__ = ["TensorSpec", "expected_tensors"]


@dataclass(frozen=True)
class TensorSpec:
    """An expected tensor: ``kind`` ``float`` (any float dtype) | ``I64`` | ``BOOL``; ``need`` ``required``
    (error if absent) | ``recommended`` (warning) | ``optional``; ``why`` is quoted in the finding."""

    name: str
    shape: tuple[int, ...]
    kind: str = "float"
    need: str = "required"
    missing_code: str = "tensor-missing"
    why: str = ""


class _Specs(dict):
    """Insertion-ordered name → :class:`TensorSpec` with an ``add`` helper."""

    def add(self, name: str, shape: tuple[int, ...], **kw: Any) -> None:
        self[name] = TensorSpec(name, tuple(int(s) for s in shape), **kw)


def _add_layer(out: _Specs, cfg: SpeculatorsDraftConfig, i: int) -> None:
    t = cfg.transformer_layer_config
    H = cfg.hidden_size
    nH, nKV, D, inter = t.num_attention_heads, t.num_key_value_heads, t.head_dim, t.intermediate_size
    Hq, Hkv = nH * D, nKV * D
    alg = describe(cfg.speculators_model_type)
    d_in = alg.layer0_input_width(H) if i == 0 else H
    p = f"layers.{i}."
    out.add(p + "input_layernorm.weight", (H,))
    out.add(p + "post_attention_layernorm.weight", (H,))
    for proj, rows in (("q", Hq), ("k", Hkv), ("v", Hkv)):
        out.add(p + f"self_attn.{proj}_proj.weight", (rows, d_in))
    out.add(p + "self_attn.o_proj.weight", (H, Hq))
    if t.attention_bias:
        for proj, rows in (("q", Hq), ("k", Hkv), ("v", Hkv), ("o", H)):
            out.add(p + f"self_attn.{proj}_proj.bias", (rows,))
    if alg.qk_norm_always or t.model_type == "qwen3":  # per-head q/k norm
        out.add(p + "self_attn.q_norm.weight", (D,))
        out.add(p + "self_attn.k_norm.weight", (D,))
    out.add(p + "mlp.gate_proj.weight", (inter, H))
    out.add(p + "mlp.up_proj.weight", (inter, H))
    out.add(p + "mlp.down_proj.weight", (H, inter))
    if t.mlp_bias:
        for proj, rows in (("gate", inter), ("up", inter), ("down", H)):
            out.add(p + f"mlp.{proj}_proj.bias", (rows,))


def _add_peagle_heads(out: _Specs, cfg: PEagleConfig) -> None:
    H, Vt, Vd, A = cfg.hidden_size, cfg.vocab_size, cfg.draft_vocab_size, cfg.num_aux
    out.add("layers.0.hidden_norm.weight", (H,), why="RMSNorm of the fc output in layer 0")
    out.add("embed_tokens.weight", (Vt, H), missing_code="embed-tokens-missing",
            why="P-EAGLE trains its own embeddings")
    out.add("lm_head.weight", (Vd, H), missing_code="lm-head-missing",
            why="speculators always saves the P-EAGLE head")
    out.add("mask_hidden", (1, 1, A * H), missing_code="mask-hidden-missing",
            why="vLLM raises without it; speculators silently random-initialises it")
    if cfg.norm_before_fc:
        out.add("input_norm.weight", (A * H,), why="norm_before_fc is true")
    if cfg.fc_norm:
        for i in range(A):
            out.add(f"fc_norm.{i}.weight", (H,), why="fc_norm is true")


def _add_block_heads(out: _Specs, cfg: SpeculatorsDraftConfig) -> None:
    H, Vt, Vd = cfg.hidden_size, cfg.vocab_size, cfg.draft_vocab_size
    out.add("hidden_norm.weight", (H,), why="RMSNorm of fc(aux): the context features")
    out.add("embed_tokens.weight", (Vt, H), need="optional")
    out.add("lm_head.weight", (Vd, H), need="required" if Vd != Vt else "optional",
            missing_code="lm-head-missing",
            why="the verifier head cannot stand in for a pruned/padded draft vocab")


def _add_vocab_maps(out: _Specs, cfg: SpeculatorsDraftConfig) -> None:
    Vt, Vd = cfg.vocab_size, cfg.draft_vocab_size
    if Vd < Vt:
        out.add("d2t", (Vd,), kind="I64", missing_code="d2t-missing",
                why="vLLM maps draft ids to target ids with it (identity when absent)")
        out.add("t2d", (Vt,), kind="BOOL", missing_code="t2d-missing",
                why="speculators refuses to load a pruned draft without it")


def expected_tensors(cfg: SpeculatorsDraftConfig) -> dict[str, TensorSpec]:
    """Name → :class:`TensorSpec` a servable draft for ``cfg`` holds, in order: ``fc`` (absent without aux
    ids), final norm, the layers, the heads and vocabulary maps."""
    out = _Specs()
    H, A = cfg.hidden_size, cfg.num_aux
    if A:
        out.add("fc.weight", (H, A * H), why="projects the concatenated aux hidden states")
    out.add("norm.weight", (H,), why="final norm")
    for i in range(cfg.num_layers):
        _add_layer(out, cfg, i)
    if isinstance(cfg, PEagleConfig):
        _add_peagle_heads(out, cfg)
    else:
        _add_block_heads(out, cfg)
    _add_vocab_maps(out, cfg)
    for spec in cfg.extra_tensors():
        out[spec.name] = spec
    return dict(out)
