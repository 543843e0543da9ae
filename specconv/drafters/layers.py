"""Plain-torch building blocks of the reference drafters, in explicit tensor ops mirrored by the exports.

Numerics as transformers: ``Qwen3RMSNorm`` (gain in the input dtype), neox rope, fp32 softmax as
``eager_attention_forward``. Rows are ``[B, S, ·]``, heads ``[B, n, S, D]``; weights are frozen
``nn.Parameter`` (inference only).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, overload

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InvalidInputError, UnsupportedFormatError
from ..format.facts import unsupported_layer_keys

if TYPE_CHECKING:  # pragma: no cover
    from ..format.schema import TransformerLayerConfig

#: ``(queries [B, nH, Sq, D], keys / values [B, nKV, Sk, D], bool mask [B, Sq, Sk], scale)``
#: → ``[B, Sq, nH·D]``: :func:`attend`, :func:`attend_grouped` or the export's ONNX op.
Attend = Callable[..., torch.Tensor]
#: ``(keys, values)`` of the rows themselves → what they attend over (context + own rows).
Keys = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

__all__ = ["RMSNorm", "Rotary", "Linear", "Attention", "MLP", "DecoderLayer", "attend", "attend_grouped",
           "rotate_half", "apply_rope", "check_layers", "merge_heads", "sample_rows", "WeightTaker"]


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.detach(), requires_grad=False)


class WeightTaker:
    """Hands out tensors by name and records which were used (anything unused is refused)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], source: str):
        self.tensors = dict(tensors)
        self.source = source
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.tensors

    def take(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """Tensor ``name`` (shape checked when given), marked used; InvalidInputError if missing or misshapen."""
        if name not in self.tensors:
            raise InvalidInputError(f"{self.source}: required tensor {name!r} is missing", code="missing_tensor")
        t = self.tensors[name]
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise InvalidInputError(f"{self.source}: tensor {name!r} has shape {tuple(t.shape)}, "
                                    f"expected {tuple(shape)}", code="tensor_shape")
        self.used.add(name)
        return t

    def take_opt(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor | None:
        return self.take(name, shape) if name in self.tensors else None

    def ignore(self, name: str) -> None:
        if name in self.tensors:
            self.used.add(name)

    def unused(self) -> list[str]:
        return sorted(set(self.tensors) - self.used)


class RMSNorm(nn.Module):
    """RMSNorm ``w * x / sqrt(mean(x^2) + eps)`` with an ``[N]`` gain; the variance in fp32."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = _param(weight)
        self.eps = float(eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = x.dtype
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dt)


class Linear(nn.Module):
    """``y = x W^T (+ b)`` with ``W`` of shape ``[out, in]`` (HF layout)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.weight = _param(weight)
        self.bias = _param(bias) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """neox-style rotation: ``[x1, x2] -> [-x2, x1]`` over the last dim halves."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply RoPE. ``x``: ``[B, heads, S, D]``; ``cos``/``sin``: ``[B, 1, S, D]`` in x's dtype."""
    return x * cos + rotate_half(x) * sin


class Rotary(nn.Module):
    """Rotary tables from :meth:`TransformerLayerConfig.rope` (types ``default``, ``linear``, ``llama3``).

    Raises InvalidInputError (no rope θ) or UnsupportedFormatError (another type, ``partial_rotary_factor != 1``).
    """

    inv_freq: torch.Tensor  # a registered buffer

    def __init__(self, rope: Mapping[str, Any], head_dim: int, source: str = "transformer_layer_config"):
        super().__init__()
        theta = rope.get("rope_theta")
        if theta is None:
            raise InvalidInputError(
                f"{source}: no rope_theta (looked in rope_parameters.rope_theta and rope_theta)",
                code="rope_theta",
                hint="write rope_theta explicitly: vLLM's DFlash layer and transformers default it differently",
            )
        rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
        prf = rope.get("partial_rotary_factor", 1.0)
        if prf not in (None, 1, 1.0):
            raise UnsupportedFormatError(f"{source}: partial_rotary_factor={prf} is not supported by the "
                                         "reference drafters")
        self.theta = float(theta)
        self.rope_type = str(rope_type)
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim))
        self.register_buffer("inv_freq", _scaled_inv_freq(inv_freq, self.rope_type, rope, source),
                             persistent=False)
        self.attention_scaling = 1.0

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions``: int ``[B, S]`` → ``(cos, sin)`` each ``[B, 1, S, head_dim]`` in ``dtype``
        (the head axis inserted, ready for :func:`apply_rope`)."""
        freqs = positions.to(torch.float32)[..., None] * self.inv_freq.to(torch.float32)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype)[:, None], sin.to(dtype)[:, None]


def _scaled_inv_freq(inv_freq: torch.Tensor, rope_type: str, params: Mapping, source: str) -> torch.Tensor:
    """A rope type's frequency scaling (transformers ``modeling_rope_utils``)."""
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(params["factor"])
    if rope_type == "llama3":
        factor = float(params["factor"])
        lo = float(params["low_freq_factor"])
        hi = float(params["high_freq_factor"])
        old = float(params["original_max_position_embeddings"])
        lo_wl, hi_wl = old / lo, old / hi
        wavelen = 2 * math.pi / inv_freq
        inv_l = torch.where(wavelen > lo_wl, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < hi_wl) * ~(wavelen > lo_wl)
        return torch.where(medium, smoothed, inv_l)
    raise UnsupportedFormatError(
        f"{source}: rope_type {rope_type!r} is not supported by the reference drafters (default, linear, llama3)")


def merge_heads(out: torch.Tensor) -> torch.Tensor:
    """``[B, nH, S, D]`` → ``[B, S, nH·D]`` (heads concatenated, ready for ``o_proj``)."""
    return out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """GQA attention: ``q [B, nH, Sq, D]``, ``k``/``v`` ``[B, nKV, Sk, D]``, bool ``mask [B, Sq, Sk]``
    (True = visible; every row sees a key) → ``[B, Sq, nH * D]``."""
    n_rep = q.shape[1] // k.shape[1]
    if n_rep > 1:
        k = k.repeat_interleave(n_rep, dim=1)
        v = v.repeat_interleave(n_rep, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return merge_heads(torch.matmul(probs, v))


def attend_grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
                   ) -> torch.Tensor:
    """:func:`attend` (up to rounding) with the query heads of one K/V head stacked along the query
    axis instead of repeating K/V, so a long cached context is read once; ``k``/``v`` may be views."""
    (b, n_h, sq, d), n_kv = q.shape, k.shape[1]
    n_rep = n_h // n_kv
    qg = q.reshape(b, n_kv, n_rep * sq, d)
    scores = torch.matmul(qg, k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask.repeat(1, n_rep, 1)[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return merge_heads(torch.matmul(probs, v).reshape(b, n_h, sq, d))


def check_layers(layer: TransformerLayerConfig, source: str) -> list[int | None]:
    """Each draft layer's sliding window or None (full attention); refuses what the drafters lack.

    Raises InvalidInputError (heads not a multiple of KV heads, ``layer_types`` length) or
    UnsupportedFormatError (not SiLU, gated attention, another layer type).
    """
    if layer.num_attention_heads % layer.num_key_value_heads:
        raise InvalidInputError(
            f"{source}: num_attention_heads {layer.num_attention_heads} is not a multiple of "
            f"num_key_value_heads {layer.num_key_value_heads}", code="config_key")
    if layer.hidden_act not in ("silu", "swish"):
        raise UnsupportedFormatError(f"{source}: hidden_act {layer.hidden_act!r} is not supported (silu only)")
    gated = unsupported_layer_keys(layer.written())  # the one key set convert refuses too
    if gated:
        raise UnsupportedFormatError(
            f"{source}: gated attention ({', '.join(f'{k}={v!r}' for k, v in gated)}) is not supported by "
            "the Speculators drafters (no speculators/vLLM counterpart)",
            format_id="gated_attention",
        )
    kinds = layer.resolved_layer_types
    if len(kinds) != layer.num_hidden_layers:
        raise InvalidInputError(
            f"{source}: layer_types must list one entry per draft layer "
            f"({layer.num_hidden_layers}), got {layer.layer_types!r}", code="config_key")
    for kind in kinds:
        if kind not in ("full_attention", "sliding_attention"):
            raise UnsupportedFormatError(f"{source}: layer type {kind!r} is not supported")
    return [layer.layer_window(i) for i in range(layer.num_hidden_layers)]


def _linear(w: WeightTaker, name: str, out: int, inp: int, bias: bool) -> Linear:
    return Linear(w.take(f"{name}.weight", (out, inp)), w.take(f"{name}.bias", (out,)) if bias else None)


class Attention(nn.Module):
    """q/k/v/o projections (+ optional per-head ``q_norm``/``k_norm``)."""

    def __init__(self, w: WeightTaker, prefix: str, layer: TransformerLayerConfig, *, in_features: int,
                 qk_norm: bool):
        super().__init__()
        H, D, eps = layer.hidden_size, layer.head_dim, layer.rms_norm_eps
        hq, hkv = layer.num_attention_heads * D, layer.num_key_value_heads * D
        b = layer.attention_bias
        self.q_proj = _linear(w, f"{prefix}.q_proj", hq, in_features, b)
        self.k_proj = _linear(w, f"{prefix}.k_proj", hkv, in_features, b)
        self.v_proj = _linear(w, f"{prefix}.v_proj", hkv, in_features, b)
        self.o_proj = _linear(w, f"{prefix}.o_proj", H, hq, b)
        self.q_norm = RMSNorm(w.take(f"{prefix}.q_norm.weight", (D,)), eps) if qk_norm else None
        self.k_norm = RMSNorm(w.take(f"{prefix}.k_norm.weight", (D,)), eps) if qk_norm else None
        self.head_dim = D
        self.scale = D ** -0.5

    def _heads(self, proj: Linear, norm: RMSNorm | None, x: torch.Tensor) -> torch.Tensor:
        """``x [B, S, in]`` → ``[B, heads, S, D]`` (per-head norm when present)."""
        y = proj(x).view(x.shape[0], x.shape[1], -1, self.head_dim)
        if norm is not None:
            y = norm(y)
        return y.transpose(1, 2)

    def q(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x [B, S, in]`` → roped queries ``[B, nH, S, D]``."""
        return apply_rope(self._heads(self.q_proj, self.q_norm, x), cos, sin)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [B, S, in]`` → roped keys and values, each ``[B, nKV, S, D]``."""
        k = self._heads(self.k_proj, self.k_norm, x)
        return apply_rope(k, cos, sin), self._heads(self.v_proj, None, x)


class MLP(nn.Module):
    """SiLU-gated MLP ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, w: WeightTaker, prefix: str, layer: TransformerLayerConfig):
        super().__init__()
        H, inter, b = layer.hidden_size, layer.intermediate_size, layer.mlp_bias
        self.gate_proj = _linear(w, f"{prefix}.gate_proj", inter, H, b)
        self.up_proj = _linear(w, f"{prefix}.up_proj", inter, H, b)
        self.down_proj = _linear(w, f"{prefix}.down_proj", H, inter, b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer weights; the algorithms say what its rows attend over (:meth:`attend`)."""

    def __init__(self, w: WeightTaker, idx: int, layer: TransformerLayerConfig, *, qk_norm: bool,
                 attn_in: int):
        super().__init__()
        p = f"layers.{idx}"
        H, eps = layer.hidden_size, layer.rms_norm_eps
        self.input_layernorm = RMSNorm(w.take(f"{p}.input_layernorm.weight", (H,)), eps)
        self.post_attention_layernorm = RMSNorm(w.take(f"{p}.post_attention_layernorm.weight", (H,)), eps)
        self.self_attn = Attention(w, f"{p}.self_attn", layer, in_features=attn_in, qk_norm=qk_norm)
        self.mlp = MLP(w, f"{p}.mlp", layer)

    def attend(self, x: torch.Tensor, residual: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               keys: Keys, mask: torch.Tensor, attention: Attend) -> torch.Tensor:
        """One layer over normed rows ``x [B, S, in]``, attending over ``keys(k, v)`` with ``mask [B, S, Sk]``."""
        a = self.self_attn
        k, v = keys(*a.kv(x, cos, sin))
        h = residual + a.o_proj(attention(a.q(x, cos, sin), k, v, mask, a.scale))
        return h + self.mlp(self.post_attention_layernorm(h))


if TYPE_CHECKING:
    class DecoderLayers(nn.ModuleList):
        """An ``nn.ModuleList`` of :class:`DecoderLayer` (its items typed as such)."""

        @overload
        def __getitem__(self, idx: slice) -> DecoderLayers: ...
        @overload
        def __getitem__(self, idx: int) -> DecoderLayer: ...
        def __getitem__(self, idx: int | slice) -> DecoderLayer | DecoderLayers: ...
        def __iter__(self) -> Iterator[DecoderLayer]: ...
else:
    DecoderLayers = nn.ModuleList


def own_keys(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:data:`Keys` of rows that attend over themselves only (P-EAGLE's stateless step)."""
    return k, v


def sample_rows(logits: torch.Tensor, temperature: float,
                generator: torch.Generator | None) -> torch.Tensor:
    """One id per row of ``[N, V]`` logits: argmax at ``temperature <= 0``, else a fp32 softmax draw."""
    if temperature <= 0:
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(logits.to(torch.float32) / float(temperature), dim=-1)
    if generator is not None and generator.device != probs.device:
        probs_cpu = probs.cpu()
        return torch.multinomial(probs_cpu, 1, generator=generator).view(-1).to(logits.device)
    return torch.multinomial(probs, 1, generator=generator).view(-1)

