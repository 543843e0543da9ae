"""Plain-torch building blocks shared by the reference drafters.

Everything here is written with explicit tensor ops (no transformers model classes) so
the numerics are easy to follow and to mirror in ONNX / TensorRT exports:

* :class:`RMSNorm` — Llama/Qwen3 RMSNorm (variance in fp32, gain applied in the input
  dtype), as in transformers ``Qwen3RMSNorm`` / ``LlamaRMSNorm``.
* :class:`Rotary` — neox / rotate-half RoPE with absolute positions; ``default``,
  ``linear`` and ``llama3`` rope types (transformers ``modeling_rope_utils``).
* :func:`attend` — GQA scaled-dot-product attention with an explicit boolean mask
  (True = visible), softmax in fp32 like transformers' ``eager_attention_forward``;
  :func:`attend_grouped` — the same without repeating K/V (the cached path,
  :mod:`specconv.drafters.cache`).
* :class:`Attention`, :class:`MLP`, :class:`DecoderLayer` — pre-norm Llama/Qwen3 decoder
  pieces; ``q_norm``/``k_norm`` (per-head RMSNorm) only when the layer has them.

Weights are held as frozen ``nn.Parameter`` so ``Module.to(dtype, device)`` works; the
drafters are inference-only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InvalidInputError, UnsupportedFormatError
from ..format.facts import unsupported_layer_keys

if TYPE_CHECKING:  # pragma: no cover
    from ..format import SpeculatorsDraftConfig

__all__ = [
    "RMSNorm",
    "Rotary",
    "Linear",
    "Attention",
    "MLP",
    "DecoderLayer",
    "LayerSpec",
    "attend",
    "attend_grouped",
    "rotate_half",
    "apply_rope",
    "sample_rows",
    "WeightTaker",
]


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.detach(), requires_grad=False)


class WeightTaker:
    """Hands out tensors from a name→tensor mapping and records which were used.

    The drafter loaders use it for strict key accounting: anything left unused at the
    end is an unsupported extra (e.g. gated-attention ``g_proj``) and is refused.
    """

    def __init__(self, tensors: Mapping[str, torch.Tensor], source: str):
        self.tensors = dict(tensors)
        self.source = source
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.tensors

    def take(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """Return tensor ``name`` (checking ``shape`` when given) and mark it used.

        Raises:
            InvalidInputError: missing tensor or wrong shape; names the file.
        """
        if name not in self.tensors:
            raise InvalidInputError(
                f"{self.source}: required tensor {name!r} is missing", code="missing_tensor"
            )
        t = self.tensors[name]
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise InvalidInputError(
                f"{self.source}: tensor {name!r} has shape {tuple(t.shape)}, "
                f"expected {tuple(shape)}",
                code="tensor_shape",
            )
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
    """RMSNorm ``w * x / sqrt(mean(x^2) + eps)``; the variance is computed in fp32.

    Args:
        weight: ``[N]`` gain.
        eps: ``rms_norm_eps``.
    """

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
    """Apply RoPE. ``x``: ``[heads, S, D]``; ``cos``/``sin``: ``[S, D]`` in x's dtype."""
    return x * cos + rotate_half(x) * sin


class Rotary(nn.Module):
    """Rotary embedding tables from a draft ``transformer_layer_config``.

    ``rope_theta`` is read from ``rope_parameters.rope_theta`` (transformers 5) or a
    top-level ``rope_theta`` (older dumps); rope type from ``rope_parameters.rope_type``
    or ``rope_scaling.rope_type``/``type``. Supported: ``default``, ``linear``,
    ``llama3`` (formulas as transformers ``modeling_rope_utils``).

    Raises:
        UnsupportedFormatError: other rope types or ``partial_rotary_factor != 1``.
    """

    def __init__(self, cfg: Mapping, head_dim: int, source: str = "transformer_layer_config"):
        super().__init__()
        rp = cfg.get("rope_parameters")
        if isinstance(rp, Mapping) and any(isinstance(v, Mapping) for v in rp.values()):
            # per-layer-type nested dicts (Laguna): speculators flattens to sliding_attention
            rp = rp.get("sliding_attention") or next(v for v in rp.values() if isinstance(v, Mapping))
        rs = cfg.get("rope_scaling")
        params: dict = {}
        if isinstance(rs, Mapping):
            params.update(rs)
        if isinstance(rp, Mapping):
            params.update(rp)
        from ..format import rope_theta_of as _rope_theta_of  # the one rope-θ reader

        theta = _rope_theta_of({"rope_parameters": params, "rope_theta": cfg.get("rope_theta")})
        if theta is None:
            raise InvalidInputError(
                f"{source}: no rope_theta (looked in rope_parameters.rope_theta and rope_theta)",
                code="rope_theta",
                hint="write rope_theta explicitly: vLLM's DFlash layer and transformers default it differently",
            )
        rope_type = params.get("rope_type", params.get("type", "default")) or "default"
        prf = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
        if prf not in (None, 1, 1.0):
            raise UnsupportedFormatError(
                f"{source}: partial_rotary_factor={prf} is not supported by the reference drafters"
            )
        self.theta = float(theta)
        self.rope_type = str(rope_type)
        inv_freq = 1.0 / (
            self.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim)
        )
        self.register_buffer("inv_freq", _scaled_inv_freq(inv_freq, self.rope_type, params, source),
                             persistent=False)
        self.attention_scaling = 1.0

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions``: LongTensor ``[S]`` → ``(cos, sin)`` each ``[S, head_dim]`` in ``dtype``."""
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq.to(torch.float32)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)


def _scaled_inv_freq(inv_freq: torch.Tensor, rope_type: str, params: Mapping, source: str) -> torch.Tensor:
    """Apply a rope type's frequency scaling (transformers ``modeling_rope_utils``).

    Raises:
        UnsupportedFormatError: a rope type other than ``default`` / ``linear`` / ``llama3``.
    """
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
        f"{source}: rope_type {rope_type!r} is not supported by the reference "
        "drafters (default, linear, llama3)"
    )


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """GQA attention with an explicit boolean mask.

    Args:
        q: ``[nH, Sq, D]``; k, v: ``[nKV, Sk, D]`` (``nH % nKV == 0``).
        mask: bool ``[Sq, Sk]``, True = key visible to the query. Every row must see at
            least one key.
        scale: score scale (``D ** -0.5``).

    Returns:
        ``[Sq, nH * D]`` (heads concatenated, ready for ``o_proj``).
    """
    n_rep = q.shape[0] // k.shape[0]
    if n_rep > 1:
        k = k.repeat_interleave(n_rep, dim=0)
        v = v.repeat_interleave(n_rep, dim=0)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(probs, v)  # [nH, Sq, D]
    return out.transpose(0, 1).reshape(out.shape[1], -1)


def attend_grouped(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """:func:`attend` without materialising repeated K/V (the cached path's attention).

    The ``n_rep = nH / nKV`` query heads sharing a key/value head are stacked along the
    query axis instead of repeating ``k``/``v`` ``n_rep`` times, so a long cached
    context is read once per step, not copied. Same arguments, result and head order as
    :func:`attend` (equal up to float rounding).

    Args:
        q: ``[nH, Sq, D]``; k, v: ``[nKV, Sk, D]`` (may be strided views).
        mask: bool ``[Sq, Sk]``, True = visible.
        scale: score scale.

    Returns:
        ``[Sq, nH * D]``.
    """
    n_kv, (n_h, sq, d) = k.shape[0], q.shape
    n_rep = n_h // n_kv
    qg = q.reshape(n_kv, n_rep * sq, d)
    scores = torch.matmul(qg, k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask.repeat(n_rep, 1)[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(probs, v).reshape(n_h, sq, d)
    return out.transpose(0, 1).reshape(sq, -1)


def layer_spec_of(config: "SpeculatorsDraftConfig", source: str) -> "LayerSpec":
    """The :class:`LayerSpec` of a typed Speculators config's ``transformer_layer_config``.

    Raises:
        InvalidInputError: a shape key is missing or not a positive integer.
        UnsupportedFormatError: an activation or attention variant the drafters lack.
    """
    return LayerSpec(config.transformer_layer_config, source=f"{source}: transformer_layer_config")


class LayerSpec:
    """Shapes and options of one draft decoder layer (from ``transformer_layer_config``)."""

    def __init__(self, cfg: Mapping, source: str = "transformer_layer_config"):
        def req(key: str) -> int:
            v = cfg.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise InvalidInputError(
                    f"{source}: {key!r} must be a positive integer (got {v!r})", code="config_key"
                )
            return v

        self.hidden_size = req("hidden_size")
        self.intermediate_size = req("intermediate_size")
        self.num_layers = req("num_hidden_layers")
        self.num_heads = req("num_attention_heads")
        self.num_kv_heads = cfg.get("num_key_value_heads") or self.num_heads
        if self.num_heads % self.num_kv_heads:
            raise InvalidInputError(
                f"{source}: num_attention_heads {self.num_heads} is not a multiple of "
                f"num_key_value_heads {self.num_kv_heads}", code="config_key")
        self.head_dim = cfg.get("head_dim") or self.hidden_size // self.num_heads
        self.vocab_size = req("vocab_size")
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.attention_bias = bool(cfg.get("attention_bias", False))
        self.mlp_bias = bool(cfg.get("mlp_bias", False))
        self.model_type = cfg.get("model_type")
        act = cfg.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise UnsupportedFormatError(f"{source}: hidden_act {act!r} is not supported (silu only)")
        gated = unsupported_layer_keys(cfg)  # the one key set convert refuses too
        if gated:
            raise UnsupportedFormatError(
                f"{source}: gated attention ({', '.join(f'{k}={v!r}' for k, v in gated)}) is not supported by "
                "the Speculators drafters (no speculators/vLLM counterpart)",
                format_id="gated_attention",
            )
        lt = cfg.get("layer_types")
        if lt is None:
            lt = ["full_attention"] * self.num_layers
        if not isinstance(lt, list) or len(lt) != self.num_layers:
            raise InvalidInputError(
                f"{source}: layer_types must list one entry per draft layer "
                f"({self.num_layers}), got {lt!r}", code="config_key")
        for t in lt:
            if t not in ("full_attention", "sliding_attention"):
                raise UnsupportedFormatError(f"{source}: layer type {t!r} is not supported")
        self.layer_types: list[str] = list(lt)
        sw = cfg.get("sliding_window")
        self.sliding_window: int | None = int(sw) if sw else None
        self.scale = self.head_dim ** -0.5

    def is_swa(self, layer: int) -> bool:
        """True when layer ``layer`` is a sliding-window layer with a window set.

        A ``sliding_attention`` layer with ``sliding_window: null`` attends like a full
        layer (what speculators' mask builder does).
        """
        return self.layer_types[layer] == "sliding_attention" and self.sliding_window is not None


class Attention(nn.Module):
    """q/k/v/o projections (+ optional per-head ``q_norm``/``k_norm``)."""

    def __init__(self, w: WeightTaker, prefix: str, spec: LayerSpec, *, in_features: int,
                 qk_norm: bool):
        super().__init__()
        H, D = spec.hidden_size, spec.head_dim
        hq, hkv = spec.num_heads * D, spec.num_kv_heads * D
        b = spec.attention_bias

        def lin(name: str, out: int, inp: int) -> Linear:
            return Linear(w.take(f"{prefix}.{name}.weight", (out, inp)),
                          w.take(f"{prefix}.{name}.bias", (out,)) if b else None)

        self.q_proj = lin("q_proj", hq, in_features)
        self.k_proj = lin("k_proj", hkv, in_features)
        self.v_proj = lin("v_proj", hkv, in_features)
        self.o_proj = lin("o_proj", H, hq)
        self.q_norm = RMSNorm(w.take(f"{prefix}.q_norm.weight", (D,)), spec.eps) if qk_norm else None
        self.k_norm = RMSNorm(w.take(f"{prefix}.k_norm.weight", (D,)), spec.eps) if qk_norm else None
        self.head_dim = D
        self.scale = spec.scale

    def q(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x [S, in]`` → roped queries ``[nH, S, D]``."""
        q = self.q_proj(x).view(x.shape[0], -1, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        return apply_rope(q.transpose(0, 1), cos, sin)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [S, in]`` → roped keys and values, each ``[nKV, S, D]``."""
        k = self.k_proj(x).view(x.shape[0], -1, self.head_dim)
        if self.k_norm is not None:
            k = self.k_norm(k)
        v = self.v_proj(x).view(x.shape[0], -1, self.head_dim)
        return apply_rope(k.transpose(0, 1), cos, sin), v.transpose(0, 1)

    def out(self, attn: torch.Tensor) -> torch.Tensor:
        return self.o_proj(attn)


class MLP(nn.Module):
    """SiLU-gated MLP ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, w: WeightTaker, prefix: str, spec: LayerSpec):
        super().__init__()
        H, inter, b = spec.hidden_size, spec.intermediate_size, spec.mlp_bias

        def lin(name: str, out: int, inp: int) -> Linear:
            return Linear(w.take(f"{prefix}.{name}.weight", (out, inp)),
                          w.take(f"{prefix}.{name}.bias", (out,)) if b else None)

        self.gate_proj = lin("gate_proj", inter, H)
        self.up_proj = lin("up_proj", inter, H)
        self.down_proj = lin("down_proj", H, inter)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer weights: ``input_layernorm``, ``self_attn``,
    ``post_attention_layernorm``, ``mlp``. The algorithms drive the attention themselves
    (their key/value sets differ), then call :meth:`finish`."""

    def __init__(self, w: WeightTaker, idx: int, spec: LayerSpec, *, qk_norm: bool,
                 attn_in: int | None = None):
        super().__init__()
        p = f"layers.{idx}"
        H = spec.hidden_size
        self.input_layernorm = RMSNorm(w.take(f"{p}.input_layernorm.weight", (H,)), spec.eps)
        self.post_attention_layernorm = RMSNorm(
            w.take(f"{p}.post_attention_layernorm.weight", (H,)), spec.eps)
        self.self_attn = Attention(w, f"{p}.self_attn", spec, in_features=attn_in or H,
                                   qk_norm=qk_norm)
        self.mlp = MLP(w, f"{p}.mlp", spec)

    def finish(self, residual: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """``h = residual + o_proj(attn)``; ``h + mlp(post_attention_layernorm(h))``."""
        h = residual + self.self_attn.out(attn)
        return h + self.mlp(self.post_attention_layernorm(h))

    def standard(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 mask: torch.Tensor) -> torch.Tensor:
        """Ordinary self-attention layer over ``h [S, H]`` with mask ``[S, S]``."""
        n = self.input_layernorm(h)
        a = self.self_attn
        k, v = a.kv(n, cos, sin)
        return self.finish(h, attend(a.q(n, cos, sin), k, v, mask, a.scale))


def sample_rows(logits: torch.Tensor, temperature: float,
                generator: torch.Generator | None) -> torch.Tensor:
    """Pick one id per row: argmax at ``temperature <= 0``, else a draw from
    ``softmax(logits / temperature)`` (fp32). ``logits``: ``[N, V]`` → LongTensor ``[N]``."""
    if temperature <= 0:
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(logits.to(torch.float32) / float(temperature), dim=-1)
    if generator is not None and generator.device != probs.device:
        probs_cpu = probs.cpu()
        return torch.multinomial(probs_cpu, 1, generator=generator).view(-1).to(logits.device)
    return torch.multinomial(probs, 1, generator=generator).view(-1)

