"""Formats specconv recognises and refuses by name (:class:`~specconv.converters.base.RefusedFormat`;
each class names its upstream source in ``spec_ref``). Each refusal is routed ahead of the
supported format it would otherwise be mistaken for (:mod:`specconv.converters.dispatch`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..format.algorithms import display_names
from .base import PROJECTOR_DOMINO, PROJECTOR_DSPARK, RefusedFormat, SourceInfo, register

# --------------------------------------------------------------------------- helpers


def _any_name(src: SourceInfo, pattern: str) -> bool:
    rx = re.compile(pattern)
    return any(rx.search(n) for n in src.tensor_names())


def _keys_anywhere(src: SourceInfo) -> dict[str, Any]:
    """Top-level config keys merged with ``dflash_config`` (nested wins nothing: both seen)."""
    out = dict(src.config or {})
    for k, v in src.dflash_config.items():
        out.setdefault(k, v)
    return out


def _is_dflash_family(src: SourceInfo) -> bool:
    return isinstance(src.cfg("dflash_config"), dict) or any("DFlash" in a for a in src.architectures)


def _is_dspark_like(src: SourceInfo) -> bool:
    return (
        any("DSpark" in a for a in src.architectures)
        or src.projector_type == PROJECTOR_DSPARK
        or src.cfg("markov_rank") is not None
        or src.dflash_config.get("markov_rank") is not None
    )


# ------------------------------------------------------------- targets / whole checkpoints


@register
class DeepSeekV4DSpark(RefusedFormat):
    format_id = "deepseek_v4_dspark"
    algorithm = "dspark"
    title = "DeepSeek-V4 embedded DSpark (draft inside the target checkpoint)"
    detection = ("`model_type == deepseek_v4` with `dspark_*` keys (config.json or inference/config.json) or "
                 "`mtp.*` tensors")
    refusal = (
        "the DSpark drafter of DeepSeek-V4-{Flash,Pro}-DSpark lives inside the 800+ GB target checkpoint "
        "(mtp.* tensors, shared embed/head) and uses sparse MLA attention; it is not a standalone drafter and "
        "Speculators has no MLA DSpark type (serve it with vLLM's deepseek_v4 DSpark path)"
    )
    spec_ref = "deepseek-ai/DeepSeek-V4-{Flash,Pro}-DSpark `inference/config.json` (`dspark_*`, `mtp.*` tensors)"

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        if src.cfg("model_type") != "deepseek_v4":
            return False
        if any(k.startswith("dspark_") for k in src.config or {}):
            return True
        inf = src.path / "inference" / "config.json"
        if inf.is_file():
            try:
                data = json.loads(inf.read_text())
            except (OSError, ValueError, RecursionError):
                data = {}
            if isinstance(data, dict) and any(k.startswith("dspark_") for k in data):
                return True
        return _any_name(src, r"^mtp\.")


#: Tensor-name suffixes written by quantizers (ModelOpt FP8/NVFP4, compressed-tensors,
#: GPTQ/AWQ, DeepSeek FP8 block scales).
_QUANT_TENSOR = re.compile(
    r"(_scale|_scale_inv|_scale_2|weight_packed|weight_shape|weight_zero_point|\.qweight|\.qzeros|\.scales|\.g_idx)$"
)
_QUANT_DTYPES = {"F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "I4", "U4"}


@register
class QuantizedDrafter(RefusedFormat):
    format_id = "quantized_drafter"
    algorithm = "any"
    title = "Quantized drafter (FP8 / NVFP4 / INT4 export)"
    detection = (
        "`quantization_config` in config.json, an `hf_quant_config.json` file, tensors named `*_scale`/"
        "`*_scale_inv`/`weight_packed`/`qweight`/`qzeros`, or FP8/FP4 tensor dtypes"
    )
    refusal = (
        "specconv does not convert or validate quantized drafters (scales / packed tensors: its reference drafters, "
        "parity gates and exports are floating-point); a Speculators-format directory that is quantized already "
        "(e.g. compressed-tensors FP8-block, `quantization_config` in config.json) serves as it is — speculators and "
        "vLLM load it without specconv; any other quantized export: convert the unquantized (bf16) drafter, then "
        "quantize the Speculators output"
    )
    spec_ref = ("NVIDIA/Model-Optimizer `examples/speculative_decoding/scripts/export_hf_checkpoint.py` "
                "(`hf_quant_config.json`); compressed-tensors / GPTQ / AWQ tensor names")

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        if src.config is None:
            return False
        if src.cfg("quantization_config") is not None or src.cfg("compression_config") is not None:
            return True
        if "hf_quant_config.json" in src.files:
            return True
        names = src.tensor_names()
        if any(_QUANT_TENSOR.search(n) for n in names):
            return True
        if names:
            try:
                return any(src.store.info(n).dtype in _QUANT_DTYPES for n in names)
            except Exception:  # unreadable headers: let the real converter report it
                return False
        return False


#: Tensors that never make a draft body on their own (vocabulary-sized tables and maps).
_NON_BODY = re.compile(
    r"^(model\.)?(embed_tokens|tok_embeddings|wte|embed|lm_head|head|output)\.weight$|^(model\.)?(d2t|t2d)$"
)


@register
class NoDraftBody(RefusedFormat):
    format_id = "no_draft_body"
    algorithm = "any"
    title = "Checkpoint without draft-body weights"
    detection = (
        "`config.json` present but no weight files, or only embedding / LM-head / d2t / t2d tensors "
        "(no `fc`, `layers.*`, `midlayer.*` ...)"
    )
    refusal = (
        "the directory has a config but no draft-body tensors (weights missing, not downloaded, or only the "
        "embedding/LM head); point SRC at the directory holding the drafter's safetensors (see --subfolder, "
        "--checkpoint)"
    )
    spec_ref = "specconv `specconv/converters/refusals.py` (embedding / LM head / d2t / t2d only)"

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        if src.config is None:
            return False
        if not src.has_weights():
            return True
        names = src.tensor_names()
        if not names and src._store_error is not None:  # unreadable: the converter reports why
            return False
        return not any(not _NON_BODY.search(n) for n in names)


# ------------------------------------------------------------------ architecture level


#: DFlash2 architectures specconv converts (:mod:`.zlab_dflash2`); any other DFlash-family source carrying DFlash2's
#: keys or tensors is refused by :class:`DFlash2Variant`.
DFLASH2_ARCHITECTURES = ("DFlash2DraftModel", "Qwen3DFlash2DraftModel")


@register
class DFlash2Variant(RefusedFormat):
    format_id = "dflash2_variant"
    algorithm = "dflash2"
    title = "DFlash2 variants (beam search, MiniMax) and mislabelled DFlash2 dirs"
    detection = (
        "`architectures` ∈ {`DFlash2BeamDraftModel`, `MiniMaxDFlash2DraftModel`}, or a DFlash-family dir that is "
        "not `DFlash2DraftModel` yet holds `dflash_config.conv_kernel_size`/`selector_rank` or "
        "`candidate_selector.*` / `*_conv.base_kernel` tensors"
    )
    refusal = (
        "speculators 0.9.0 has no type for the beam-search or MiniMax DFlash2 variants (vLLM 0.33 serves the beam "
        "variant through its own `DFlash2BeamForCausalLM`, SGLang 0.5.23 both through `models/dflash.py`); a "
        "DFlash-labelled dir with convolutions or a selector would lose them as plain DFlash (never downgraded). "
        "z-lab `DFlash2DraftModel` dirs convert (format `zlab_dflash2`)"
    )
    spec_ref = ("vLLM 0.33 `vllm/model_executor/models/registry.py` (`DFlash2BeamDraftModel`); SGLang 0.5.23 "
                "`srt/models/dflash.py` (`MiniMaxDFlash2DraftModel`)")

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        if any(a in ("DFlash2BeamDraftModel", "MiniMaxDFlash2DraftModel") for a in src.architectures):
            return True
        if any(a in DFLASH2_ARCHITECTURES for a in src.architectures):
            return False
        dc = src.dflash_config
        if isinstance(src.cfg("dflash_config"), dict) and ("conv_kernel_size" in dc or "selector_rank" in dc):
            return True
        return _is_dflash_family(src) and _any_name(src, r"^candidate_selector\.|(attention|mlp)_conv\.")


@register
class LiLiCorr(RefusedFormat):
    format_id = "lilicorr"
    algorithm = "lilicorr"
    title = "LiLiCorr (DFlash2 with an anchor-hidden correction)"
    detection = "`architectures[0] == LiLiCorrDraftModel`"
    refusal = (
        "speculators 0.9.0 has no LiLiCorr type and specconv describes none; vLLM 0.33 serves it with its own "
        "`LiLiCorrForCausalLM` and a speculator that carries the anchor's hidden state between steps, which the "
        "Speculators dflash2 type cannot hold"
    )
    spec_ref = ("vLLM 0.33 `vllm/model_executor/models/registry.py` (`LiLiCorrDraftModel`), "
                "`vllm/v1/worker/gpu/spec_decode/lilicorr/speculator.py`")

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        return "LiLiCorrDraftModel" in src.architectures


@register
class Domino(RefusedFormat):
    format_id = "domino"
    algorithm = "domino"
    title = "Domino (SpecForge / ModelOpt / NeMo)"
    detection = "`architectures[0] == DominoDraftModel` or `dflash_config.projector_type == \"domino\"`"
    refusal = (
        "Domino's prefix GRU and embedding-projection head (prefix_gru.*, embed_proj.*) have no Speculators "
        "(or vLLM) counterpart"
    )
    spec_ref = "sgl-project/SpecForge `specforge/modeling/draft/domino.py`"

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        return "DominoDraftModel" in src.architectures or src.projector_type == PROJECTOR_DOMINO


@register
class Gemma4DSpark(RefusedFormat):
    format_id = "gemma4_dspark"
    algorithm = "dspark"
    title = "DeepSpec Gemma4 DSpark (Gemma4DSparkModel)"
    detection = "`architectures[0] == Gemma4DSparkModel`"
    refusal = (
        "the Gemma4 DSpark body uses Gemma4 layers (pre/post-feedforward norms, optional v_norm, k=v attention) "
        "while the Speculators DSpark body is a Qwen3 layer"
    )
    spec_ref = "deepseek-ai/DeepSpec `deepspec/modeling/dspark/` (Gemma4 body)"

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        return "Gemma4DSparkModel" in src.architectures


_MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim")


@register
class MLADSpark(RefusedFormat):
    format_id = "mla_dspark"
    algorithm = "dspark"
    title = "MLA DSpark body (GLM-5 / Kimi / SpecForge attention_mode mla)"
    detection = (
        "DSpark checkpoint with `attention_mode: mla` (top level or `dflash_config`), `Glm5DSparkForCausalLM`, "
        "MLA keys (`kv_lora_rank`, `q_lora_rank`) or `kv_a_proj_with_mqa` tensors"
    )
    refusal = (
        "multi-head latent attention (MLA) DSpark bodies have no Speculators equivalent (the Speculators DSpark "
        "body is a GQA/MHA Qwen3 layer; speculators RFC #1052 is open)"
    )
    spec_ref = "sgl-project/SpecForge `specforge/modeling/draft/dspark.py` (`attention_mode`); speculators RFC #1052"

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        if "Glm5DSparkForCausalLM" in src.architectures:
            return True
        if not _is_dspark_like(src):
            return False
        keys = _keys_anywhere(src)
        if str(keys.get("attention_mode", "")).lower() == "mla":
            return True
        if any(keys.get(k) for k in _MLA_KEYS):
            return True
        return _any_name(src, r"kv_a_proj_with_mqa|kv_b_proj")


# ------------------------------------------------------------- dflash_config variants


@register
class LagunaDFlash(RefusedFormat):
    format_id = "laguna_dflash"
    algorithm = "dflash"
    title = "poolside Laguna DFlash (gated, fused QKV)"
    detection = (
        "`model_type == laguna`, or a DFlash config with `qkv_proj` / `g_proj` / `aux_hidden_norms.*` tensors"
    )
    refusal = (
        "Laguna drafts gate attention (g_proj) and normalise each aux hidden state (aux_hidden_norms.*), which the "
        "Speculators dflash body cannot express; dropping them loads but collapses acceptance (ROCmFPX PR #48: 0.28)"
    )
    spec_ref = "vLLM `vllm/model_executor/models/laguna_dflash.py` (vLLM PR #46853)"

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        if src.cfg("model_type") == "laguna" or src.dflash_config.get("model_type") == "laguna":
            return True
        if not _is_dflash_family(src):
            return False
        return _any_name(src, r"(^|\.)aux_hidden_norms\.|self_attn\.(qkv_proj|g_proj)\.")


@register
class MiMoDFlash(RefusedFormat):
    format_id = "mimo_dflash"
    algorithm = "dflash"
    title = "Xiaomi MiMo DFlash with attention sinks / learned mask embedding"
    detection = (
        "DFlash config with `attention_sink_bias` (top level or `dflash_config`), "
        "`*.attention_sink_bias` tensors, or a `mask_embedding.pt` side file"
    )
    refusal = (
        "MiMo drafts add per-head attention-sink biases and/or a learned mask embedding (mask_embedding.pt) that "
        "replaces the verifier's mask-token row; the Speculators dflash format has neither"
    )
    spec_ref = "XiaomiMiMo/MiMo-V2.5-Pro-FP4-DFlash (`dflash/` subfolder, `mask_embedding.pt`)"

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        if not _is_dflash_family(src) and "mask_embedding.pt" not in src.files:
            return False
        if src.cfg("attention_sink_bias") or src.dflash_config.get("attention_sink_bias"):
            return True
        if "mask_embedding.pt" in src.files:
            return True
        return _any_name(src, r"attention_sink_bias$")


@register
class CausalDFlash(RefusedFormat):
    format_id = "causal_dflash"
    algorithm = "dflash"
    title = "JetSpec / block-causal DFlash (dflash_config.causal: true)"
    detection = "DFlash config with `dflash_config.causal: true` or top-level `is_causal: true`"
    refusal = (
        "trained with block-causal attention inside the draft block; Speculators DFlash full-attention layers are "
        "always bidirectional in the block, so the converted drafter would not behave as trained"
    )
    spec_ref = "NVIDIA-NeMo/Automodel JetSpec recipe (`dflash_config.causal: true`)"

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        if not isinstance(src.cfg("dflash_config"), dict):
            return False
        return src.dflash_config.get("causal") is True or src.cfg("is_causal") is True


# -------------------------------------------------------------------------- EAGLE family


_PEAGLE_KEYS = ("pard_token", "ptd_token_id", "num_depths", "para_num")


def _has_peagle_markers(src: SourceInfo) -> bool:
    return (
        src.cfg("speculators_model_type") is not None
        or any("PEagle" in a or "Peagle" in a for a in src.architectures)
        or bool(src.cfg("parallel_drafting"))
        or any(src.cfg(k) is not None for k in _PEAGLE_KEYS)
        or _any_name(src, r"(^|\.)mask_hidden$")
    )


@register
class EagleMedusaParallelHeads(RefusedFormat):
    format_id = "modelopt_eagle_parallel_heads"
    algorithm = "eagle3"
    title = "ModelOpt EAGLE-3 + Medusa parallel draft heads"
    detection = "`parallel_draft_heads.*` tensors (or `eagle_config.parallel_draft_step > 1`)"
    refusal = (
        "EAGLE-3 with Medusa-style parallel draft heads (parallel_draft_heads.*) is ModelOpt's own scheme, not "
        "P-EAGLE; Speculators has no type for it — deploy it with ModelOpt / TensorRT-LLM"
    )
    spec_ref = "NVIDIA/Model-Optimizer `modelopt/torch/export/plugins/hf_spec_export.py` (`parallel_draft_heads.*`)"

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        ec = src.cfg("eagle_config")
        if isinstance(ec, dict) and isinstance(ec.get("parallel_draft_step"), int) and ec["parallel_draft_step"] > 1:
            return True
        return _any_name(src, r"(^|\.)parallel_draft_heads\.")


@register
class Eagle3(RefusedFormat):
    format_id = "eagle3"
    algorithm = "eagle3"
    title = "EAGLE-3 drafter (SafeAILab / SpecForge / ModelOpt / NeMo)"
    detection = (
        "`architectures` containing `Eagle3` (`LlamaForCausalLMEagle3`, `Eagle3DeepseekV2ForCausalLM`, "
        "`LlamaEagle3DraftModel` without `parallel_drafting`) or `draft_vocab_size` / `midlayer.*` tensors, "
        "without P-EAGLE markers (`mask_hidden`, `pard_token`, `ptd_token_id`, `parallel_drafting`)"
    )
    refusal = (
        f"EAGLE-3 is out of specconv's scope ({display_names()} only); convert it with "
        "`speculators convert --algorithm eagle3` (speculators' EAGLE-3 converter)"
    )
    spec_ref = ("SafeAILab/EAGLE (`LlamaForCausalLMEagle3`); vllm-project/speculators "
                "`speculators convert --algorithm eagle3`")

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        if src.config is None or _has_peagle_markers(src) or isinstance(src.cfg("dflash_config"), dict):
            return False
        if any("Eagle3" in a or "EAGLE3" in a for a in src.architectures):
            return True
        if src.cfg("draft_vocab_size") is not None:
            return True
        return _any_name(src, r"^midlayer\.")
