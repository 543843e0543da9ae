"""What llama.cpp can represent, and the GGUF plan of a Speculators block drafter (docs/llamacpp.md).

Facts of ggml-org/llama.cpp@0c1e57098: ``src/models/dflash.cpp``, ``common/speculative.cpp`` and
``conversion/qwen.py`` + ``conversion/base.py``; names come from the algorithm description
(:class:`specconv.format.algorithms.LlamaCppFacts`). :func:`plan_gguf` refuses by name (exit 3) or
returns a :class:`GgufPlan`, in which every drafter tensor is written or named in ``not_written``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...errors import InvalidInputError, UnsupportedFormatError, UsageError

if TYPE_CHECKING:  # pragma: no cover
    from ...format import SpeculatorsDraftConfig
    from ...format.algorithms import Algorithm
    from ...tensors import TensorStore
    from ...verifier import Verifier

__all__ = ["DTYPES", "GgufPlan", "PlannedTensor", "plan_gguf", "refuse", "target_layers"]

#: ``--dtype`` → GGML type of the 2-D weights (``keep``: each tensor's own float type).
DTYPES = {"keep": None, "float32": "F32", "float16": "F16", "bfloat16": "BF16"}
#: safetensors float dtype → GGML type (others are refused: no quantised output, docs/llamacpp.md).
_FLOAT = {"F32": "F32", "F16": "F16", "BF16": "BF16"}
#: GGML type → the ``<dtype>`` of ``drafter-<dtype>.gguf`` (never a ``dflash-``/``dspark-`` prefix:
#: llama.cpp's ``-hf`` download rules take such names for sidecars).
FILE_TAGS = {"F32": "f32", "F16": "f16", "BF16": "bf16"}
#: Markov heads llama.cpp's graph computes (``build_dspark_markov_head``: vanilla only).
MARKOV_HEAD_TYPES = ("vanilla",)
#: RoPE types written: llama.cpp's DFlash reads ``rope.freq_base`` only from specconv's GGUF.
ROPE_TYPES = (None, "default")


def refuse(code: str, message: str, hint: str | None = None) -> UnsupportedFormatError:
    """The one refusal of this room: exit 3, ``gguf_<what>``, nothing written."""
    return UnsupportedFormatError(message, code=f"gguf_{code}", format_id=f"gguf_{code}",
                                  hint=hint or "llama.cpp cannot serve this drafter as it is (docs/llamacpp.md)")


@dataclass(frozen=True)
class PlannedTensor:
    """One GGUF tensor.

    Attributes:
        gguf_name: the GGUF name (llama.cpp's). source: the drafter tensor it comes from, or
            ``verifier:embed`` / ``verifier:lm_head``. ggml_type: ``F32`` | ``F16`` | ``BF16`` | ``I64``.
        shape: the source shape (torch order, ``[out, in]``); GGUF stores it reversed.
    """

    gguf_name: str
    source: str
    ggml_type: str
    shape: tuple[int, ...]


@dataclass
class GgufPlan:
    """Everything the writer writes, derived once from the drafter dir.

    Attributes:
        arch: ``general.architecture``. file_type: GGML type of the 2-D weights.
        keys: ``(key, value, kind)``; kind ``u32`` | ``f32`` | ``bool`` | ``str`` | ``array``.
        tensors: in file order. not_written: drafter tensor → why llama.cpp gets no copy.
        from_verifier: the verifier tensors the file carries (``embed``, ``lm_head``).
        spec_type, spec_draft_n_max: the ``--spec-type`` / ``--spec-draft-n-max`` to serve it with.
        target_layers: ``dflash.target_layers`` (verifier layers whose *input* llama.cpp captures).
        d2t: int64 ``[Vd]`` absolute target ids of a pruned vocabulary (what llama.cpp reads), or None.
    """

    arch: str
    file_type: str
    keys: list[tuple[str, Any, str]] = field(default_factory=list)
    tensors: list[PlannedTensor] = field(default_factory=list)
    not_written: dict[str, str] = field(default_factory=dict)
    from_verifier: list[str] = field(default_factory=list)
    spec_type: str = ""
    spec_draft_n_max: int = 0
    target_layers: list[int] = field(default_factory=list)
    d2t: Any = None

    @property
    def file_name(self) -> str:
        """``drafter-<dtype>.gguf``."""
        return f"drafter-{FILE_TAGS[self.file_type]}.gguf"


def target_layers(aux_layer_ids: list[int]) -> list[int]:
    """``dflash.target_layers`` for Speculators aux ids: the same numbers (``llama_set_embeddings_layer_inp``
    records layer inputs; ``conversion/qwen.py`` maps ids through ``i - 1`` then ``+ 1``)."""
    return [int(i) for i in aux_layer_ids]


def _layer_config(cfg: SpeculatorsDraftConfig) -> Mapping[str, Any]:
    return cfg.transformer_layer_config.written()


# ------------------------------------------------------------------ refusals
def refuse_algorithm(alg: Algorithm) -> str:
    """P-EAGLE and any algorithm llama.cpp has no GGUF architecture for (the description says why).
    Returns the GGUF architecture."""
    facts = alg.llamacpp
    if facts.refusal or not facts.gguf_architecture:
        raise refuse("algorithm", f"{alg.display_name}: {facts.refusal or 'llama.cpp has no GGUF architecture for it'}")
    return facts.gguf_architecture


def refuse_config(cfg: SpeculatorsDraftConfig, alg: Algorithm, spec: Any, verifier: Verifier) -> None:
    """Config-level refusals (exit 3, one code each; docs/llamacpp.md, "Refused")."""
    if alg.markov_head:
        _refuse_heads(cfg)
    kinds = {(spec.layer_window(i) is not None) and not cfg.sliding_window_non_causal
             for i in range(spec.num_hidden_layers)}
    if len(kinds) > 1:
        raise refuse("mixed_causality", "config.json: some layers are causal inside the block (sliding-window "
                     "layers, sliding_window_non_causal false) and others bidirectional; llama.cpp has one causal "
                     "flag for the whole draft (dflash.attention.causal)")
    swa = [i for i in range(spec.num_hidden_layers) if (spec.layer_window(i) is not None)]
    if swa:
        raise refuse("sliding_window", f"config.json: layers {swa} are sliding-window layers (window "
                     f"{spec.window}); specconv writes no SWA into a GGUF until a test shows llama.cpp's "
                     "window equals the reference drafter's")
    top_k_key = alg.llamacpp.lattice_top_k_key
    top_k = int(getattr(cfg, top_k_key)) if top_k_key else 0
    if spec.hidden_size < top_k * (top_k + 1):
        raise refuse("selector_lattice", f"config.json: {top_k_key} {top_k} needs hidden_size >= "
                     f"{top_k * (top_k + 1)} (K x (K + 1)); llama.cpp packs the candidate lattice into one "
                     f"{spec.hidden_size}-wide row (src/models/dflash.cpp)")
    th = cfg.target_hidden_size
    if th is not None and int(th) != spec.hidden_size:
        raise refuse("target_hidden_size", f"config.json: target_hidden_size {th} != hidden_size {spec.hidden_size}; "
                     "llama.cpp sizes fc as len(target_layers) x the draft's own width")
    n = verifier.num_hidden_layers
    if any(int(i) >= n for i in cfg.aux_layer_ids or []):
        raise refuse("aux_id_last_layer", f"config.json: aux_hidden_state_layer_ids {cfg.aux_layer_ids} include "
                     f"{n}, the verifier's layer count (its final hidden state); llama.cpp records layer inputs "
                     f"only, for layers 0..{n - 1}")
    _refuse_layer_options(spec, _layer_config(cfg))


def _refuse_heads(cfg: Any) -> None:
    rank = int(cfg.markov_rank or 0)
    if rank > 0 and cfg.markov_head_type not in MARKOV_HEAD_TYPES:
        raise refuse("markov_head_type", f"config.json: markov_head_type {cfg.markov_head_type!r}; llama.cpp's "
                     f"graph computes only {', '.join(MARKOV_HEAD_TYPES)} (markov_w2 · markov_w1[prev])")
    if cfg.enable_confidence_head and (not cfg.confidence_head_with_markov or rank == 0):
        raise refuse("confidence_without_markov", "config.json: the confidence head does not take the Markov "
                     "input (confidence_head_with_markov false or markov_rank 0); llama.cpp's conf_proj reads "
                     "[hidden ; markov_w1[prev]]")


def _refuse_layer_options(spec: Any, tl: Mapping[str, Any]) -> None:
    if spec.attention_bias or spec.mlp_bias:
        raise refuse("bias", "transformer_layer_config: attention_bias / mlp_bias is true; llama.cpp's DFlash "
                     "layers have no attention or MLP biases")
    params = {**(tl.get("rope_scaling") or {}), **(tl.get("rope_parameters") or {})}
    rope_type = params.get("rope_type", params.get("type"))
    prf = params.get("partial_rotary_factor", tl.get("partial_rotary_factor"))
    if rope_type not in ROPE_TYPES or prf not in (None, 1, 1.0):
        raise refuse("rope_scaling", f"transformer_layer_config: rope_type {rope_type!r}, partial_rotary_factor "
                     f"{prf!r}; specconv writes plain RoPE (rope.freq_base) only")


def refuse_tensors(store: TensorStore, names: list[str], vocab_size: int) -> Any:
    """Bias tensors and a bad ``d2t``; returns ``d2t`` as absolute target ids (int64 numpy) or None.

    Raises:
        UnsupportedFormatError: ``gguf_bias``; ``gguf_d2t`` (duplicate or out-of-range targets).
    """
    import numpy as np

    biased = [n for n in names if n.startswith("layers.") and n.endswith(".bias")]
    if biased:
        raise refuse("bias", f"model.safetensors: {', '.join(biased[:4])}: llama.cpp's DFlash layers have no biases")
    if "d2t" not in names:
        return None
    off = store.read_numpy("d2t").astype(np.int64).reshape(-1)
    ids = off + np.arange(off.size, dtype=np.int64)
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.size:
        raise refuse("d2t", f"d2t maps draft ids to target ids outside [0, {vocab_size}): {bad[:6].tolist()}")
    if np.unique(ids).size != ids.size:
        raise refuse("d2t", "d2t maps two draft ids to the same target id (llama.cpp scatters the draft logits "
                     "by d2t: duplicates overwrite each other)")
    return ids


# ------------------------------------------------------------------ the plan
def plan_gguf(cfg: SpeculatorsDraftConfig, store: TensorStore, verifier: Verifier, dtype: str = "keep",
              source: str = "config.json") -> GgufPlan:
    """The GGUF of a Speculators DFlash / DSpark drafter (``dtype``: ``--dtype``), or a refusal.

    Raises:
        UnsupportedFormatError: exit 3, ``gguf_*``: what llama.cpp cannot represent.
        InvalidInputError: a tensor the config needs is missing, or one has no GGUF slot.
        UsageError: an unknown ``dtype``.
    """
    from ...format.algorithms import algorithm

    if dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}")
    alg = algorithm(cfg.speculators_model_type)
    arch = refuse_algorithm(alg)
    spec = cfg.transformer_layer_config
    refuse_config(cfg, alg, spec, verifier)
    names = store.names()
    d2t = refuse_tensors(store, names, spec.vocab_size)
    plan = GgufPlan(arch=arch, file_type=_file_type(store, dtype))
    _tensor_plan(plan, cfg, alg, store, spec, dtype)
    plan.target_layers = target_layers(list(cfg.aux_layer_ids or []))
    _serve_flags(plan, cfg, alg)
    plan.keys = _arch_keys(plan, cfg, alg, spec)
    plan.d2t = d2t
    return plan


def _file_type(store: TensorStore, dtype: str) -> str:
    """GGML type of the 2-D weights: ``--dtype``'s, or (``keep``) ``fc.weight``'s."""
    ggml = DTYPES[dtype]
    if ggml:
        return ggml
    src = store.info("fc.weight").dtype
    if src not in _FLOAT:
        raise refuse("dtype", f"fc.weight is {src}; specconv writes F32 / F16 / BF16 GGUFs (no quantised types)")
    return _FLOAT[src]


def ggml_type(gguf_name: str, ndim: int, src_dtype: str, dtype: str) -> str:
    """The GGML type llama.cpp's converter gives a tensor (``conversion/base.py``
    ``prepare_tensors``): ``d2t`` I64; 1-D tensors, ``*_norm.weight`` and names not ending in
    ``.weight`` F32; else ``--dtype``'s type (``keep``: the tensor's own)."""
    if gguf_name == "d2t":
        return "I64"
    if ndim <= 1 or gguf_name.endswith("_norm.weight") or not gguf_name.endswith(".weight"):
        return "F32"
    ggml = DTYPES[dtype]
    if ggml:
        return ggml
    if src_dtype not in _FLOAT:
        raise refuse("dtype", f"{gguf_name}: {src_dtype} tensors are not written (F32 / F16 / BF16 only)")
    return _FLOAT[src_dtype]


def _tensor_plan(plan: GgufPlan, cfg: Any, alg: Algorithm, store: TensorStore, spec: Any, dtype: str) -> None:
    """Every tensor of the description's map that the drafter holds, the embedding / head rule,
    the heads the config enables; every other drafter tensor is named in ``not_written``."""
    facts = alg.llamacpp
    shared = {"embed_tokens.weight", "lm_head.weight"}
    pairs = [(src.format(i=i), dst.format(i=i)) for src, dst in facts.gguf_tensors if "{i}" in src
             for i in range(spec.num_hidden_layers)]
    pairs = [(s, d) for s, d in facts.gguf_tensors if "{i}" not in s] + pairs
    plan.not_written.update({n: why for n, why in facts.gguf_not_written if n in store})
    plan.not_written.update(_disabled_heads(cfg, alg, store))
    for src, dst in pairs:
        if src in shared or src in plan.not_written or src not in store:
            continue
        info = store.info(src)
        plan.tensors.append(PlannedTensor(dst, src, ggml_type(dst, len(info.shape), info.dtype, dtype), info.shape))
    _embed_and_head(plan, cfg, store, spec, dict(pairs), dtype)
    _account(plan, store, cfg, spec)


def _disabled_heads(cfg: Any, alg: Algorithm, store: TensorStore) -> dict[str, str]:
    """A disabled confidence head's tensors: speculators ignores them, so llama.cpp gets none
    (its converter infers the head from the tensors instead: docs/llamacpp.md)."""
    if not alg.markov_head or cfg.enable_confidence_head:
        return {}
    why = "enable_confidence_head is false: the head is disabled (speculators ignores these tensors)"
    return {n: why for n in ("confidence_head.proj.weight", "confidence_head.proj.bias") if n in store}


def _embed_and_head(plan: GgufPlan, cfg: Any, store: TensorStore, spec: Any, names: dict[str, str],
                    dtype: str) -> None:
    """``token_embd`` and ``output`` together or neither (``TENSOR_DUPLICATED``; docs/llamacpp.md);
    a missing one is the verifier's (``from_verifier``)."""
    vt, h = spec.vocab_size, spec.hidden_size
    pruned = int(cfg.draft_vocab_size or vt) != vt
    own = {k: k in store for k in ("embed_tokens.weight", "lm_head.weight")}
    if not (pruned or any(own.values())):
        return
    if pruned and not own["lm_head.weight"]:
        raise InvalidInputError(f"draft_vocab_size {cfg.draft_vocab_size} < vocab_size {vt} but the drafter "
                                "has no lm_head.weight", code="gguf_missing_tensor")
    for src, role, shape in (("embed_tokens.weight", "embed", (vt, h)), ("lm_head.weight", "lm_head", (vt, h))):
        dst = names[src]
        if own[src]:
            info = store.info(src)
            plan.tensors.append(PlannedTensor(dst, src, ggml_type(dst, 2, info.dtype, dtype), info.shape))
        else:
            plan.tensors.append(PlannedTensor(dst, f"verifier:{role}", plan.file_type, shape))
            plan.from_verifier.append(role)


def _account(plan: GgufPlan, store: TensorStore, cfg: Any, spec: Any) -> None:
    """Never drop: every drafter tensor is written or in ``not_written``; every layer tensor the
    layout needs is there."""
    used = {t.source for t in plan.tensors} | set(plan.not_written)
    left = [n for n in store.names() if n not in used]
    if left:
        raise refuse("tensor", f"model.safetensors: {', '.join(left[:6])} {'has' if len(left) == 1 else 'have'} no "
                     "place in llama.cpp's dflash GGUF")
    need = ["fc.weight", "hidden_norm.weight", "norm.weight"]
    need += [f"layers.{i}.{k}" for i in range(spec.num_hidden_layers) for k in (
        "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
        "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
        "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")]
    if int(getattr(cfg, "markov_rank", 0) or 0) > 0:
        need += ["markov_head.markov_w1.weight", "markov_head.markov_w2.weight"]
    missing = [n for n in need if n not in store]
    if missing:
        raise InvalidInputError(f"model.safetensors lacks {', '.join(missing[:6])}", code="gguf_missing_tensor")


def _serve_flags(plan: GgufPlan, cfg: Any, alg: Algorithm) -> None:
    """``--spec-type`` and ``--spec-draft-n-max`` (docs/llamacpp.md, "The check")."""
    from ...format.facts import speculative_tokens_for

    markov = any(t.gguf_name.startswith("markov_") for t in plan.tensors)
    facts = alg.llamacpp
    spec_type = facts.spec_type_markov if (cfg.sample_from_anchor or markov) else facts.spec_type
    if spec_type is None:  # every algorithm with a GGUF architecture names its --spec-type
        raise refuse("algorithm", f"{alg.display_name}: llama.cpp has no --spec-type for it")
    plan.spec_type = spec_type
    plan.spec_draft_n_max = speculative_tokens_for(int(cfg.block_size), bool(cfg.sample_from_anchor))


def _arch_keys(plan: GgufPlan, cfg: Any, alg: Algorithm, spec: Any) -> list[tuple[str, Any, str]]:
    """The ``dflash.*`` keys and the mask token, in the converter's order (``conversion/base.py``
    ``TextModel.set_gguf_parameters``, ``conversion/qwen.py``; docs/llamacpp.md, "Keys beyond the converter's")."""
    from ...format import rope_theta_of

    k = alg.llamacpp.gguf_keys
    tl = _layer_config(cfg)
    theta = rope_theta_of(tl)
    if theta is None:
        raise InvalidInputError("transformer_layer_config: no rope_theta (rope_parameters.rope_theta or rope_theta)",
                                code="rope_theta")
    rows: list[tuple[str, Any, str]] = [(k["block_count"], spec.num_hidden_layers, "u32")]
    if isinstance(tl.get("max_position_embeddings"), int):
        rows.append((k["context_length"], tl["max_position_embeddings"], "u32"))
    rows += [(k["embedding_length"], spec.hidden_size, "u32"),
             (k["feed_forward_length"], spec.intermediate_size, "u32"),
             (k["head_count"], spec.num_attention_heads, "u32"), (k["head_count_kv"], spec.num_key_value_heads, "u32"),
             (k["rope_freq_base"], float(theta), "f32"), (k["rms_eps"], spec.rms_norm_eps, "f32"),
             (k["key_length"], spec.head_dim, "u32"), (k["value_length"], spec.head_dim, "u32"),
             (k["block_size"], int(cfg.block_size), "u32"),
             *[(gguf_key, int(getattr(cfg, key)), "u32") for key, gguf_key in alg.llamacpp.config_keys],
             (k["target_layers"], plan.target_layers, "array"),
             (k["sample_from_anchor"], bool(cfg.sample_from_anchor), "bool"),
             (k["has_confidence_head"], any(t.gguf_name.startswith("conf_proj.") for t in plan.tensors), "bool"),
             (k["causal"], False, "bool"), (k["mask_token_id"], int(cfg.mask_token_id), "u32")]
    return rows
