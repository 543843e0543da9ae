"""Lint rules on the draft layers, attention layout, heads, aux ids and the verifier.

Facts: speculators 0.9.0 ``src/speculators/models/{peagle,dflash,dspark}/``; vLLM 0.33
``vllm/transformers_utils/configs/speculators/algos.py`` and ``vllm/model_executor/models/``;
transformers ``models/qwen3/configuration_qwen3.py`` (sliding-window defaults).
"""

from __future__ import annotations

from ..schema import BlockDraftConfig, DSparkConfig, PEagleConfig, effective_window
from .registry import Hit, LintContext, rule

_MT_KEY = "transformer_layer_config.model_type"
_LT_KEY = "transformer_layer_config.layer_types"


def _swa_flags(ctx: LintContext) -> list[bool]:
    window = effective_window(ctx.layer)
    return [x == "sliding_attention" and window is not None for x in ctx.layer_types]


def _unknown_types(ctx: LintContext) -> list[str]:
    return sorted({x for x in ctx.layer_types if x not in ("full_attention", "sliding_attention")})


@rule("layer-model-type-unsupported", "error")
def _layer_model_type_unsupported(ctx: LintContext) -> Hit | None:
    """A drafter whose layer class follows the model type: vLLM raises outside its list."""
    mt, alg = ctx.layer.get("model_type"), ctx.alg
    if not alg.qk_norm_always and mt not in alg.layer_model_types:
        supported = " or ".join(repr(t) for t in alg.layer_model_types)
        return (f"transformer_layer_config.model_type={mt!r}: {alg.display_name} supports only {supported} "
                "(vLLM raises ValueError)", _MT_KEY)
    return None


@rule("layer-model-type-not-qwen3", "warning")
def _layer_model_type_not_qwen3(ctx: LintContext) -> Hit | None:
    """A drafter that builds Qwen3-style layers whatever the model type says."""
    mt = ctx.layer.get("model_type")
    if ctx.alg.qk_norm_always and mt not in ctx.alg.layer_model_types:
        return (f"transformer_layer_config.model_type={mt!r}: DFlash/DSpark always build Qwen3-style "
                "layers (per-head q/k norm); use 'qwen3'", _MT_KEY)
    return None


@rule("gqa-heads", "error")
def _gqa(ctx: LintContext) -> Hit | None:
    nh, nkv = ctx.layer["num_attention_heads"], ctx.layer["num_key_value_heads"]
    if nh % nkv:
        return (f"num_attention_heads={nh} is not a multiple of num_key_value_heads={nkv}",
                "transformer_layer_config.num_key_value_heads")
    return None


@rule("layer-types-implicit", "info")
def _layer_types_implicit(ctx: LintContext) -> Hit | None:
    if "layer_types" not in ctx.layer:
        return (f"layer_types is absent; derived {ctx.layer_types} from the HF default rule — write "
                "it explicitly", _LT_KEY)
    return None


@rule("layer-types-length", "error")
def _layer_types_length(ctx: LintContext) -> Hit | None:
    n, L = len(ctx.layer_types), ctx.cfg.num_layers
    if n != L:
        return f"layer_types has {n} entries but num_hidden_layers={L}", _LT_KEY
    return None


@rule("layer-types-unknown", "error")
def _layer_types_unknown(ctx: LintContext) -> Hit | None:
    unknown = _unknown_types(ctx)
    if unknown:
        return f"layer_types contains {unknown}; expected full_attention/sliding_attention", _LT_KEY
    return None


def _declared_swa(ctx: LintContext) -> int:
    return sum(x == "sliding_attention" for x in ctx.layer_types)


def _swa_switched_off(ctx: LintContext) -> bool:
    return ctx.layer.get("model_type") == "qwen3" and not ctx.layer.get("use_sliding_window", False)


@rule("swa-disabled", "warning")
def _swa_disabled(ctx: LintContext) -> Hit | None:
    n = _declared_swa(ctx)
    if n and _swa_switched_off(ctx):
        return (f"layer_types lists {n} sliding_attention layer(s) but use_sliding_window is false: "
                "transformers' Qwen3Config then sets sliding_window to None and those layers run as "
                "full attention in speculators and vLLM", "transformer_layer_config.use_sliding_window")
    return None


@rule("swa-window-missing", "warning")
def _swa_window_missing(ctx: LintContext) -> Hit | None:
    if _declared_swa(ctx) and not _swa_switched_off(ctx) and effective_window(ctx.layer) is None:
        return ("layer_types lists sliding_attention layers but sliding_window is null: they run as "
                "full attention", "transformer_layer_config.sliding_window")
    return None


@rule("swa-window-anchoring", "info")
def _swa_anchoring(ctx: LintContext) -> Hit | None:
    n_swa = sum(_swa_flags(ctx))
    if n_swa:
        return (f"{n_swa} sliding-window layer(s): speculators restricts context to the "
                f"W={effective_window(ctx.layer)} positions before the block anchor while vLLM uses a "
                "per-query window; expect small differences beyond ~W tokens of context",
                "transformer_layer_config.sliding_window")
    return None


def _dflash_layout(ctx: LintContext) -> tuple[int, int, bool] | None:
    """``(n_swa, n_layers, sliding_window_non_causal)`` of a drafter whose
    ``sliding_window_non_causal`` vLLM applies to every layer (DFlash), layer types known."""
    cfg = ctx.cfg
    if (ctx.alg.vllm.sliding_window_non_causal != "every-layer" or not isinstance(cfg, BlockDraftConfig)
            or not ctx.layer_types or _unknown_types(ctx)):
        return None
    swa = _swa_flags(ctx)
    return sum(swa), len(swa), cfg.sliding_window_non_causal


@rule("dflash-causal-full-attention", "error")
def _dflash_causal_full(ctx: LintContext) -> Hit | None:
    lay = _dflash_layout(ctx)
    if lay and lay[0] == 0 and not lay[2]:
        return ("all draft layers are full attention (trained bidirectional inside the block) but "
                "sliding_window_non_causal is false: vLLM >= 0.27 sets causal = not "
                "sliding_window_non_causal for every layer and would run them block-causal; set "
                "sliding_window_non_causal: true (a no-op for speculators, which applies it to "
                "sliding-window layers only): `specconv convert --sliding-window-non-causal` writes it",
                "sliding_window_non_causal")
    return None


@rule("dflash-mixed-attention", "warning")
def _dflash_mixed(ctx: LintContext) -> Hit | None:
    lay = _dflash_layout(ctx)
    if lay and 0 < lay[0] < lay[1] and not lay[2]:
        n_swa, n = lay[0], lay[1]
        return (f"mixed full+SWA draft ({n - n_swa} full, {n_swa} SWA) with "
                "sliding_window_non_causal=false is not faithfully servable in vLLM >= 0.27: the "
                "full-attention layers were trained bidirectional but run causal", "sliding_window_non_causal")
    return None


@rule("dflash-swa-non-causal", "warning")
def _dflash_swa_non_causal(ctx: LintContext) -> Hit | None:
    lay = _dflash_layout(ctx)
    if lay and lay[0] and lay[2]:
        return ("sliding_window_non_causal is true, so the SWA layers attend bidirectionally inside "
                "the block; the speculators trainer default is causal (false) — make sure the draft "
                "was trained this way", "sliding_window_non_causal")
    return None


@rule("dflash-vllm-version", "info")
def _dflash_vllm_version(ctx: LintContext) -> Hit | None:
    lay = _dflash_layout(ctx)
    if lay and lay[0] and lay[0] == lay[1] and not lay[2]:
        return ("causal all-SWA DFlash is served faithfully by vLLM >= 0.27 only (0.24 runs every "
                "layer bidirectional)", "sliding_window_non_causal")
    return None


@rule("dspark-swa-non-causal-ignored", "warning")
def _dspark_swa_flag(ctx: LintContext) -> Hit | None:
    cfg = ctx.cfg
    if (ctx.alg.vllm.sliding_window_non_causal == "ignored" and sum(_swa_flags(ctx))
            and isinstance(cfg, BlockDraftConfig) and cfg.sliding_window_non_causal):
        return ("sliding_window_non_causal is true but vLLM ignores it for DSpark and runs the SWA "
                "layers causal inside the block", "sliding_window_non_causal")
    return None


@rule("markov-rank-invalid", "error")
def _markov_rank_invalid(ctx: LintContext) -> Hit | None:
    cfg = ctx.cfg
    if isinstance(cfg, DSparkConfig) and cfg.markov_rank < 0:
        return f"markov_rank={cfg.markov_rank} must be >= 0", "markov_rank"
    return None


@rule("dspark-markov-rank-zero", "warning")
def _markov_rank_zero(ctx: LintContext) -> Hit | None:
    if isinstance(ctx.cfg, DSparkConfig) and ctx.cfg.markov_rank == 0:
        return ("markov_rank is 0: speculators disables the Markov head but vLLM always builds it "
                "(use r > 0 for vLLM)", "markov_rank")
    return None


@rule("dspark-confidence-markov-rank-zero", "error")
def _confidence_rank_zero(ctx: LintContext) -> Hit | None:
    cfg = ctx.cfg
    if (isinstance(cfg, DSparkConfig) and cfg.markov_rank == 0 and cfg.confidence_head_with_markov
            and cfg.enable_confidence_head):
        return ("confidence_head_with_markov is true but markov_rank is 0: the confidence input "
                "needs markov_w1", "confidence_head_with_markov")
    return None


@rule("dspark-markov-head-type", "warning")
def _markov_head_type(ctx: LintContext) -> Hit | None:
    cfg = ctx.cfg
    if isinstance(cfg, DSparkConfig) and cfg.markov_head_type != "vanilla":
        return (f"markov_head_type={cfg.markov_head_type!r}: vLLM implements the vanilla head only; "
                "the extra weights have nowhere to load", "markov_head_type")
    return None


@rule("norm-flags-exclusive", "error")
def _norm_flags(ctx: LintContext) -> Hit | None:
    cfg = ctx.cfg
    if isinstance(cfg, PEagleConfig) and cfg.norm_before_fc and cfg.fc_norm:
        return "norm_before_fc and fc_norm are both true; speculators rejects this", "fc_norm"
    return None


@rule("peagle-fc-norm", "warning")
def _peagle_fc_norm(ctx: LintContext) -> Hit | None:
    if isinstance(ctx.cfg, PEagleConfig) and ctx.cfg.fc_norm:
        return ("fc_norm is true but vLLM's peagle updater does not forward it (the per-chunk norms "
                "are not loaded)", "fc_norm")
    return None


_NA_KEY = "transformer_layer_config.num_aux_hidden_states"


def _llama_aux(ctx: LintContext) -> tuple[int, object] | None:
    """``(A, num_aux_hidden_states)`` of a Llama P-EAGLE with A != 3."""
    if not isinstance(ctx.cfg, PEagleConfig) or ctx.layer.get("model_type") != "llama":
        return None
    A = ctx.cfg.num_aux
    return (A, ctx.layer.get("num_aux_hidden_states")) if A != 3 else None


@rule("peagle-llama-aux-count", "warning")
def _llama_aux_unset(ctx: LintContext) -> Hit | None:
    la = _llama_aux(ctx)
    if la and la[1] is None:
        return (f"Llama P-EAGLE with {la[0]} aux layers: vLLM's Llama eagle3 model sizes fc for 3 "
                f"unless transformer_layer_config.num_aux_hidden_states={la[0]} is set (or use qwen3 "
                "layers)", _NA_KEY)
    return None


@rule("peagle-llama-aux-count-mismatch", "error")
def _llama_aux_wrong(ctx: LintContext) -> Hit | None:
    la = _llama_aux(ctx)
    if la and la[1] is not None and la[1] != la[0]:
        return (f"transformer_layer_config.num_aux_hidden_states={la[1]} but there are {la[0]} aux "
                "layer ids", _NA_KEY)
    return None


@rule("peagle-aux-count", "warning")
def _peagle_aux_count(ctx: LintContext) -> Hit | None:
    cfg = ctx.cfg
    if not isinstance(cfg, PEagleConfig) or cfg.num_aux == 3:
        return None
    A, H = cfg.num_aux, cfg.hidden_size
    return (f"P-EAGLE with {A} aux layers: mask_hidden is [1, 1, {A}·{H}] = [1, 1, {A * H}], but older "
            f"vLLM releases size mask_hidden as 3·H = {3 * H} and fail to load this draft; serve it "
            "with a vLLM that sizes mask_hidden from the aux count (check with "
            "`specconv validate --vllm-load-check`)", "eagle_aux_hidden_state_layer_ids")


@rule("aux-ids-implicit", "warning")
def _aux_implicit(ctx: LintContext) -> Hit | None:
    key = ctx.alg.aux_ids_key
    if ctx.alg.aux_ids_default_from_verifier and not ctx.cfg.aux_layer_ids:
        return (f"{key} is null: speculators resolves [2, n//2, n-3] from "
                "the verifier at load time; write the trained ids explicitly", key)
    return None


@rule("aux-ids-missing", "error")
def _aux_missing(ctx: LintContext) -> Hit | None:
    key = ctx.alg.aux_ids_key
    if not ctx.alg.aux_ids_default_from_verifier and not ctx.cfg.aux_layer_ids:
        return f"{key} is missing or empty: the model cannot be built and vLLM raises KeyError", key
    return None


@rule("aux-ids-duplicate", "error")
def _aux_duplicate(ctx: LintContext) -> Hit | None:
    ids, key = ctx.cfg.aux_layer_ids, ctx.alg.aux_ids_key
    if ids and len(set(ids)) != len(ids):
        return f"{key}={ids} has duplicate ids", key
    return None


@rule("aux-ids-order", "warning")
def _aux_order(ctx: LintContext) -> Hit | None:
    ids, key = ctx.cfg.aux_layer_ids, ctx.alg.aux_ids_key
    if ids and len(set(ids)) == len(ids) and list(ids) != sorted(ids):
        return (f"{key}={ids} is not ascending: vLLM gathers the aux hidden states in ascending layer order "
                f"({sorted(ids)}; vLLM 0.32/0.33 model_executor/models/interfaces.py "
                "_set_aux_hidden_state_layers), llama.cpp and specconv's loop in this order, so the engines "
                "serve different drafters (`specconv validate --compare vllm,llamacpp` shows which one departs)",
                key)
    return None


@rule("aux-ids-out-of-range", "error")
def _aux_range(ctx: LintContext) -> Hit | None:
    ids, key = ctx.cfg.aux_layer_ids, ctx.alg.aux_ids_key
    n = ctx.verifier.num_hidden_layers if ctx.verifier is not None else None
    bad = [i for i in ids or [] if i < 0 or (n is not None and i > n)]
    if bad:
        rng = f"[0, {n}]" if n is not None else ">= 0"
        return (f"{key} contains {bad} outside {rng} (speculators convention: 0 = embeddings, n = "
                "final pre-norm hidden state)", key)
    return None


#: Engines known to capture aux id == num_hidden_layers (the last decoder layer's output),
#: from their pull requests: vLLM PR #36063 (``EagleModelMixin._maybe_add_hidden_state`` in
#: ``vllm/model_executor/models/llama.py``, ``qwen2.py``, ``gpt_oss.py`` ...), vLLM PR #46973
#: (``deepseek_v2.py`` family); llama.cpp PR #25794 (gpt-oss EAGLE-3 only).
FINAL_STATE_ENGINES = (
    "vLLM: llama/qwen2/qwen3-family verifiers from the release with PR #36063, deepseek_v2-family "
    "(DeepSeek V2/V3, GLM-MoE, Kimi) from the release with PR #46973 — older releases capture aux "
    "states only at decoder-layer inputs and silently drop the id (one hidden state short); "
    "llama.cpp: gpt-oss EAGLE-3 since PR #25794"
)


@rule("aux-ids-final-hidden-state", "warning", needs=("verifier",))
def _aux_final(ctx: LintContext) -> Hit | None:
    ids, key, v = ctx.cfg.aux_layer_ids, ctx.alg.aux_ids_key, ctx.verifier
    if v is None or not ids or v.num_hidden_layers not in ids:
        return None
    n = v.num_hidden_layers
    return (f"{key} contains {n} = the verifier's num_hidden_layers: the drafter reads the verifier's "
            "final pre-norm hidden state (HF output_hidden_states[n] is the post-norm one). Only "
            f"engines that capture the last decoder layer's output can serve it — {FINAL_STATE_ENGINES}; "
            "pin such a version and check with `specconv validate --vllm-load-check`", key)


@rule("hidden-size-mismatch", "error", needs=("verifier",))
def _hidden_mismatch(ctx: LintContext) -> Hit | None:
    v, H = ctx.verifier, ctx.cfg.hidden_size
    if v is not None and v.hidden_size != H:
        return (f"draft hidden_size={H} but the verifier's is {v.hidden_size}",
                "transformer_layer_config.hidden_size")
    return None


@rule("vocab-size-mismatch", "error", needs=("verifier",))
def _vocab_mismatch(ctx: LintContext) -> Hit | None:
    v, Vt = ctx.verifier, ctx.cfg.vocab_size
    if v is not None and v.vocab_size != Vt and Vt != v.embedding_rows:  # rows: a padded verifier
        return (f"draft transformer_layer_config.vocab_size={Vt} but the verifier's is {v.vocab_size}",
                "transformer_layer_config.vocab_size")
    return None


@rule("draft-vocab-invalid", "error")
def _draft_vocab_invalid(ctx: LintContext) -> Hit | None:
    Vd = ctx.cfg.draft_vocab_size
    if Vd < 1:
        return f"draft_vocab_size={Vd} must be positive", "draft_vocab_size"
    return None
