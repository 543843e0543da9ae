"""Lint rules on the envelope, the mask token, K and the verifier reference.

Facts: speculators 0.9.0 ``src/speculators/config.py``; vLLM 0.33
``vllm/transformers_utils/configs/speculators/algos.py``, ``vllm/config/speculative.py``.
"""

from __future__ import annotations

import json
import shlex

from ..facts import disputed_layout
from ..schema import BlockDraftConfig, expected_speculative_tokens, speculators_default
from ..verifier_facts import is_hub_repo_id
from .registry import Hit, LintContext, rule

K_KEY = "speculators_config.proposal_methods.0.speculative_tokens"

def serve_hint(ctx: LintContext) -> str:
    """The long-form ``vllm serve`` line for the draft, shell-quoted: the words of
    ``specconv.engines.vllm.serve_line.long_form_argv`` (a test holds them equal)."""
    spec = ctx.alg.vllm.speculative_config("<draft_dir>", ctx.cfg.speculative_tokens)
    return shlex.join(["vllm", "serve", "<verifier>", "--speculative-config", json.dumps(spec)])


@rule("top-level-model-type", "error")
def _top_level_model_type(ctx: LintContext) -> Hit | None:
    extra = ctx.cfg.model_extra or {}
    if "model_type" in extra:
        return (f"top-level model_type {extra['model_type']!r} is present: vLLM then treats the "
                "directory as a plain HF model instead of a speculators draft; remove it "
                "(dump_config never writes it)", "model_type")
    return None


@rule("auto-map", "info")
def _auto_map(ctx: LintContext) -> Hit | None:
    if "auto_map" in (ctx.cfg.model_extra or {}):
        return ("auto_map (and config.py) are save_pretrained artifacts that speculators and vLLM "
                "ignore; dump_config drops them", "auto_map")
    return None


@rule("tie-word-embeddings", "warning")
def _tied(ctx: LintContext) -> Hit | None:
    if ctx.cfg.tie_word_embeddings:
        return "tie_word_embeddings is true; speculators drafts always write false", "tie_word_embeddings"
    return None


@rule("algorithm-mismatch", "warning")
def _algorithm_mismatch(ctx: LintContext) -> Hit | None:
    sc_algo = ctx.cfg.speculators_config.algorithm
    if sc_algo != ctx.algo:
        return (f"speculators_config.algorithm is {sc_algo!r} but speculators_model_type is "
                f"{ctx.algo!r}", "speculators_config.algorithm")
    return None


@rule("architectures-unexpected", "info")
def _architectures(ctx: LintContext) -> Hit | None:
    want = ctx.alg.architecture
    if ctx.cfg.architectures != [want]:
        return (f"architectures is {ctx.cfg.architectures}; speculators writes [{want!r}] "
                "(vLLM overrides it)", "architectures")
    return None


@rule("multiple-proposal-methods", "info")
def _multiple_methods(ctx: LintContext) -> Hit | None:
    if len(ctx.cfg.speculators_config.proposal_methods) > 1:
        return ("vLLM only reads proposal_methods[0].speculative_tokens",
                "speculators_config.proposal_methods")
    return None


@rule("target-hidden-size", "warning")
def _target_hidden_size(ctx: LintContext) -> Hit | None:
    ths, H = ctx.cfg.target_hidden_size, ctx.cfg.hidden_size
    if ths is not None and ths != H:
        return (f"target_hidden_size={ths} differs from hidden_size={H}: vLLM sizes fc from it "
                "while speculators insists draft H == verifier H; keep it null", "target_hidden_size")
    return None


def _implicit(ctx: LintContext, agreed: bool) -> list[Hit]:
    return [
        (f"{ik.key} is absent from the file" + (f" ({ik.why})" if ik.why else "") + "; write it explicitly", ik.key)
        for ik in ctx.alg.implicit_keys
        if ik.agreed is agreed and ik.key not in ctx.cfg.model_fields_set
    ]


@rule("implicit-key", "warning")
def _implicit_disputed(ctx: LintContext) -> list[Hit]:
    return _implicit(ctx, agreed=False)


@rule("implicit-key-agreed", "info")
def _implicit_agreed(ctx: LintContext) -> list[Hit]:
    return _implicit(ctx, agreed=True)


@rule("serve-method-mismatch", "error", needs=("serve_method",))
def _serve_method(ctx: LintContext) -> Hit | None:
    want = ctx.alg.vllm.method
    if ctx.serve_method != want:
        return (f"method {ctx.serve_method!r} does not serve a {ctx.algo} drafter (vLLM 0.33 "
                f"accepts it without a word and builds the wrong draft model); use method "
                f"{want!r}: {serve_hint(ctx)}", "method")
    return None


@rule("mask-token-missing", "error")
def _mask_missing(ctx: LintContext) -> Hit | None:
    if ctx.cfg.mask_token_id is None:
        return ("mask_token_id is missing: vLLM requires it for peagle (pard_token), dflash and "
                "dspark, and it is a training-time constant (take it from the source checkpoint "
                "or the user, never from a default)", "mask_token_id")
    return None


@rule("mask-token-out-of-range", "error")
def _mask_range(ctx: LintContext) -> Hit | None:
    m, Vt = ctx.cfg.mask_token_id, ctx.cfg.vocab_size
    if m is not None and (m < 0 or m >= Vt):
        return f"mask_token_id={m} is outside the target vocabulary [0, {Vt})", "mask_token_id"
    return None


@rule("mask-token-special", "warning", needs=("verifier",))
def _mask_special(ctx: LintContext) -> Hit | None:
    m, v = ctx.cfg.mask_token_id, ctx.verifier
    if m is None or v is None:
        return None
    role = v.special_token_ids().get(m)
    if role:
        return (f"mask_token_id={m} equals the verifier's {role} token id; the masked slots then "
                f"look like real {role} tokens — check the training config", "mask_token_id")
    if m in v.added_special_tokens:
        return (f"mask_token_id={m} is the verifier tokenizer's added special token "
                f"{v.added_special_tokens[m]!r} (tokenizer.json / tokenizer_config.json): the masked "
                "slots then look like that token wherever the verifier emits it — check the "
                "training config", "mask_token_id")
    return None


@rule("speculative-tokens-invalid", "error")
def _k_invalid(ctx: LintContext) -> Hit | None:
    k = ctx.cfg.speculative_tokens
    if k < 1:
        return (f"speculative_tokens={k}: must be >= 1 (speculators rejects it; vLLM uses it as "
                "num_speculative_tokens)", K_KEY)
    return None


def _no_slot(cfg: BlockDraftConfig) -> bool:
    exp = expected_speculative_tokens(cfg)
    return cfg.block_size < 1 or (exp is not None and exp < 1)


@rule("block-size-invalid", "error")
def _block_invalid(ctx: LintContext) -> Hit | None:
    cfg = ctx.cfg
    if isinstance(cfg, BlockDraftConfig) and _no_slot(cfg):
        return (f"block_size={cfg.block_size} with sample_from_anchor={cfg.sample_from_anchor} "
                "gives no draft slot", "block_size")
    return None


@rule("speculative-tokens-mismatch", "error")
def _k_mismatch(ctx: LintContext) -> Hit | None:
    cfg, k = ctx.cfg, ctx.cfg.speculative_tokens
    if not isinstance(cfg, BlockDraftConfig) or _no_slot(cfg) or k < 1:
        return None
    exp = expected_speculative_tokens(cfg)
    if k == exp:
        return None
    B, layout = cfg.block_size, str(cfg.sample_from_anchor).lower()
    if "sample_from_anchor" not in cfg.model_fields_set:
        return (f"sample_from_anchor is absent and speculative_tokens={k} is neither block_size-1 "
                f"({B - 1}, 1+N layout) nor block_size ({B}, anchor-first): the block layout cannot be "
                "told (the legacy rule `specconv convert` applies); write sample_from_anchor", K_KEY)
    return (f"speculative_tokens={k} but the trained layout (block_size={B}, sample_from_anchor={layout}) "
            f"drafts {exp} tokens per pass; vLLM does not check this", K_KEY)


def _legacy_disputed(ctx: LintContext) -> bool | None:
    """None unless the legacy rule told ``sample_from_anchor``; then whether speculators
    0.9.0 reads the absent key otherwise (its class default for the algorithm)."""
    cfg = ctx.cfg
    if not isinstance(cfg, BlockDraftConfig) or not cfg.sample_from_anchor_from_legacy:
        return None
    return speculators_default(ctx.algo, "sample_from_anchor") != cfg.sample_from_anchor


@rule("sample-from-anchor-disputed", "error")
def _sample_from_anchor_disputed(ctx: LintContext) -> Hit | None:
    cfg = ctx.cfg
    if _legacy_disputed(ctx) and isinstance(cfg, BlockDraftConfig):
        readings = disputed_layout(cfg.block_size, cfg.speculative_tokens, cfg.sample_from_anchor,
                                   not cfg.sample_from_anchor, ctx.alg.display_name)
        return (f"sample_from_anchor is absent: {readings}; the block layout cannot be told (a flipped "
                "layout drafts every token from the wrong slot) — `specconv convert --sample-from-anchor` or "
                "`--no-sample-from-anchor` (how the drafter was trained) writes it", "sample_from_anchor")
    return None


@rule("sample-from-anchor-legacy", "info")
def _sample_from_anchor_legacy(ctx: LintContext) -> Hit | None:
    cfg = ctx.cfg
    if _legacy_disputed(ctx) is False and isinstance(cfg, BlockDraftConfig):
        rule_text = "== block_size → anchor-first" if cfg.sample_from_anchor else "== block_size-1 → 1+N"
        return (f"sample_from_anchor is absent; read as {str(cfg.sample_from_anchor).lower()} by the "
                f"legacy rule (speculative_tokens {cfg.speculative_tokens} {rule_text}), as "
                "`specconv convert` writes it", "sample_from_anchor")
    return None


@rule("peagle-depths-exceeded", "warning")
def _peagle_depths(ctx: LintContext) -> Hit | None:
    depths = (ctx.cfg.model_extra or {}).get("num_depths")
    k = ctx.cfg.speculative_tokens
    if ctx.alg.parallel_drafting and isinstance(depths, int) and not isinstance(depths, bool) and k > depths:
        return f"speculative_tokens={k} exceeds the recorded num_depths={depths} trained", K_KEY
    return None


@rule("dflash-sample-from-anchor", "warning")
def _sample_from_anchor_rejected(ctx: LintContext) -> Hit | None:
    cfg = ctx.cfg
    if ctx.alg.vllm.sample_from_anchor == "rejected" and isinstance(cfg, BlockDraftConfig) and cfg.sample_from_anchor:
        return ("sample_from_anchor is true: vLLM's DFlash rejects it (speculators can run it)",
                "sample_from_anchor")
    return None


@rule("dspark-sample-from-anchor-vllm", "info")
def _sample_from_anchor_vllm(ctx: LintContext) -> Hit | None:
    cfg = ctx.cfg
    if ctx.alg.vllm.sample_from_anchor == "supported" and isinstance(cfg, BlockDraftConfig) and cfg.sample_from_anchor:
        return ("DSpark with sample_from_anchor=true needs vLLM >= 0.27 (>= 0.30 maps it to "
                "dspark_bonus_anchor=false); some vLLM forks hard-code the bonus-anchor layout — "
                "pin and test the vLLM version", "sample_from_anchor")
    return None


V_KEY = "speculators_config.verifier.name_or_path"


@rule("verifier-name-missing", "error")
def _verifier_name_missing(ctx: LintContext) -> Hit | None:
    if not ctx.cfg.speculators_config.verifier.name_or_path:
        return ("speculators_config.verifier.name_or_path is empty: vLLM needs it as the target "
                "model and speculators loads the embeddings/head from it", V_KEY)
    return None


@rule("verifier-not-hub-id", "warning")
def _verifier_not_hub(ctx: LintContext) -> Hit | None:
    name, v = ctx.cfg.speculators_config.verifier.name_or_path, ctx.verifier
    if not name:
        return None
    local = v is not None and v.is_local_path and v.name_or_path == name
    if local or not is_hub_repo_id(name):
        return (f"verifier name_or_path {name!r} is a local path or not a valid Hub repo id: vLLM "
                "0.33 `vllm serve <draft_dir>` requires a remote repo id; record the Hub repo id "
                f"instead, or serve with the long form: {serve_hint(ctx)}", V_KEY)
    return None


@rule("verifier-architectures-mismatch", "info", needs=("verifier",))
def _verifier_arch(ctx: LintContext) -> Hit | None:
    rec, v = ctx.cfg.speculators_config.verifier.architectures, ctx.verifier
    if v is not None and v.architectures and rec and list(rec) != list(v.architectures):
        return (f"recorded verifier architectures {rec} differ from the verifier's {v.architectures}",
                "speculators_config.verifier.architectures")
    return None
