"""Findings and the one finding-code registry :data:`CODES` (``docs/cli.md``, "Finding codes")."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

__all__ = ["CODES", "CONVERT_FLAGS", "LEVEL_ORDER", "LINT_RULES", "CodeInfo", "Finding", "Level", "codes_markdown",
           "finding", "has_errors", "sort_findings"]

Level = Literal["error", "warning", "info"]

#: Sort order of levels (errors first).
LEVEL_ORDER: dict[str, int] = {"error": 0, "warning": 1, "info": 2}


class CodeInfo(NamedTuple):
    """Registry entry of one finding code; ``origin``: ``lint``, ``dir`` (:func:`specconv.format.lint_dir`),
    ``converter`` or ``validate`` (what a serving engine did)."""

    level: Level
    doc: str
    origin: str


def _reg(origin: str, table: dict[str, tuple[Level, str]]) -> dict[str, CodeInfo]:
    return {code: CodeInfo(level, doc, origin) for code, (level, doc) in table.items()}


_LINT: dict[str, tuple[Level, str]] = {
    # envelope
    "top-level-model-type": ("error", "a top-level model_type hides speculators_config from vLLM"),
    "auto-map": ("info", "auto_map/config.py is a save_pretrained artifact nobody reads"),
    "tie-word-embeddings": ("warning", "speculators drafts never tie embeddings"),
    "algorithm-mismatch": ("warning", "speculators_config.algorithm differs from speculators_model_type"),
    "architectures-unexpected": ("info", "architectures is not the speculators draft class name"),
    "multiple-proposal-methods": ("info", "vLLM only uses proposal_methods[0]"),
    "target-hidden-size": ("warning", "target_hidden_size should stay null"),
    "implicit-key": ("warning", "a meaning-bearing key is absent and consumers disagree on its default"),
    "implicit-key-agreed": ("info", "a meaning-bearing key is absent; consumers agree on its default"),
    "serve-method-mismatch": ("error", "the vLLM speculative method does not serve this algorithm"),
    # mask token
    "mask-token-missing": ("error", "mask_token_id is required by vLLM"),
    "mask-token-out-of-range": ("error", "mask_token_id must be a target-vocab id"),
    "mask-token-special": ("warning", "mask_token_id equals a verifier special or added special token"),
    # speculative tokens / block layout
    "speculative-tokens-invalid": ("error", "speculative_tokens must be >= 1"),
    "speculative-tokens-mismatch": ("error", "speculative_tokens disagrees with block_size/sample_from_anchor"),
    "peagle-depths-exceeded": ("warning", "speculative_tokens exceeds the recorded trained depths"),
    "block-size-invalid": ("error", "block_size too small for any draft"),
    "sample-from-anchor-legacy": ("info", "sample_from_anchor absent; told from K by the legacy rule"),
    "sample-from-anchor-disputed": ("error", "sample_from_anchor absent; the K rule and speculators' default disagree"),
    "dflash-sample-from-anchor": ("warning", "vLLM's DFlash rejects sample_from_anchor=true"),
    "dspark-sample-from-anchor-vllm": ("info", "DSpark sample_from_anchor needs a recent vLLM"),
    # verifier reference
    "verifier-name-missing": ("error", "speculators_config.verifier.name_or_path is null"),
    "verifier-not-hub-id": ("warning", "vLLM >= 0.33 `vllm serve <dir>` needs a Hub repo id"),
    "verifier-architectures-mismatch": ("info", "recorded verifier architectures differ from the verifier's"),
    # attention layout
    "layer-model-type-unsupported": ("error", "transformer_layer_config.model_type not supported"),
    "layer-model-type-not-qwen3": ("warning", "DFlash/DSpark always build Qwen3-style layers"),
    "layer-types-length": ("error", "layer_types length differs from num_hidden_layers"),
    "layer-types-unknown": ("error", "unknown layer_types entry"),
    "layer-types-implicit": ("info", "layer_types absent; derived from the HF default rule"),
    "swa-disabled": ("warning", "Qwen3 sliding layers with use_sliding_window=false run as full attention"),
    "swa-window-missing": ("warning", "sliding layers without a sliding_window"),
    "swa-window-anchoring": ("info", "speculators' anchor-relative SWA window differs from vLLM's"),
    "dflash-causal-full-attention": ("error", "all-full-attention DFlash needs sliding_window_non_causal=true"),
    "dflash-swa-non-causal": ("warning", "SWA layers run bidirectional in the block; trainer default is causal"),
    "dflash-mixed-attention": ("warning", "mixed full+SWA DFlash is not faithfully servable in vLLM >= 0.27"),
    "dflash-vllm-version": ("info", "causal SWA DFlash needs vLLM >= 0.27"),
    "dspark-swa-non-causal-ignored": ("warning", "vLLM ignores sliding_window_non_causal for DSpark"),
    "gqa-heads": ("error", "num_attention_heads not a multiple of num_key_value_heads"),
    # DSpark heads
    "dspark-markov-head-type": ("warning", "vLLM implements the vanilla Markov head only"),
    "dspark-markov-rank-zero": ("warning", "markov_rank 0 disables the head in speculators; vLLM builds it"),
    "dspark-confidence-markov-rank-zero": ("error", "confidence_head_with_markov needs markov_rank > 0"),
    "markov-rank-invalid": ("error", "markov_rank must be >= 0"),
    # P-EAGLE
    "peagle-fc-norm": ("warning", "vLLM's peagle updater does not forward fc_norm"),
    "norm-flags-exclusive": ("error", "norm_before_fc and fc_norm are mutually exclusive"),
    "peagle-llama-aux-count": ("warning", "Llama P-EAGLE with A != 3 needs num_aux_hidden_states"),
    "peagle-llama-aux-count-mismatch": ("error", "num_aux_hidden_states differs from the number of aux ids"),
    "peagle-aux-count": ("warning", "P-EAGLE with A != 3 aux layers: older vLLM sizes mask_hidden as 3*H"),
    # aux ids
    "aux-ids-missing": ("error", "aux hidden-state layer ids are required"),
    "aux-ids-implicit": ("warning", "P-EAGLE aux ids null: resolved from the verifier at load time"),
    "aux-ids-duplicate": ("error", "aux layer ids must be distinct"),
    "aux-ids-order": ("warning", "aux layer ids not ascending: vLLM reads them sorted, llama.cpp as written"),
    "aux-ids-out-of-range": ("error", "aux layer ids must lie in [0, verifier num_hidden_layers]"),
    "aux-ids-final-hidden-state": ("warning", "an aux id captures the verifier's final hidden state"),
    # verifier compatibility
    "hidden-size-mismatch": ("error", "draft hidden_size differs from the verifier's"),
    "vocab-size-mismatch": ("error", "draft vocab_size differs from the verifier's"),
    # vocabulary
    "draft-vocab-invalid": ("error", "draft_vocab_size must be positive"),
    "draft-vocab-padded": ("warning", "draft vocab larger than the target without embed_tokens"),
    "draft-vocab-larger": ("info", "draft vocab larger than the target"),
    "vocab-map-unneeded": ("warning", "d2t/t2d present for a full-vocab draft"),
    # tensors
    "tensor-missing": ("error", "a required tensor is absent"),
    "tensor-recommended-missing": ("warning", "a tensor that should be shipped is absent"),
    "lm-head-missing": ("error", "pruned / padded draft without lm_head.weight"),
    "d2t-missing": ("error", "pruned draft without d2t"),
    "t2d-missing": ("error", "pruned draft without t2d (speculators refuses to load)"),
    "mask-hidden-missing": ("error", "P-EAGLE without mask_hidden (vLLM raises)"),
    "embed-tokens-missing": ("error", "P-EAGLE without its trained embed_tokens"),
    "markov-head-missing": ("error", "DSpark Markov head tensors absent"),
    "mask-hidden-present": ("error", "DFlash/DSpark must not ship mask_hidden (vLLM asserts)"),
    "verifier-tensor": ("error", "verifier_* tensors are training-only"),
    "fused-tensor": ("error", "fused qkv/gate_up tensors; speculators stores them separately"),
    "fc-shape": ("error", "fc.weight must be [H, A*H]"),
    "tensor-shape": ("error", "tensor shape disagrees with the config"),
    "tensor-dtype": ("error", "tensor dtype disagrees with the format"),
    "layer-count": ("error", "layers.N.* indices disagree with num_hidden_layers"),
    "unexpected-tensor": ("warning", "tensors the format does not define"),
    "prefixed-tensor-names": ("error", "tensor names carry a 'model.' prefix (vLLM/HF layout)"),
    "mixed-float-dtypes": ("warning", "float tensors use more than one dtype"),
    "dtype-mismatch": ("warning", "config dtype differs from the tensors' dtype"),
}

_DIR: dict[str, tuple[Level, str]] = {
    "weights-missing": ("error", "no weights file in the directory"),
    "training-leftovers": ("warning", "optimizer/scheduler/training files should not be published"),
}

_CONVERTER: dict[str, tuple[Level, str]] = {
    "aux-ids-override": ("warning", "--aux-layer-ids replaced the ids the source records"),
    "aws-layout-unverified": ("info", "the AWS P-EAGLE key names are known only from vLLM's loader"),
    "d2t-absolute-ids": ("warning", "the source d2t looks like absolute target ids, not offsets"),
    "d2t-form-unconfirmed": ("info", "the d2t form (offsets or ids) could not be confirmed"),
    "dspark-markov-misaligned": ("warning", "an anchor-first DSpark may predate the Markov alignment fix"),
    "dspark-vocab-pruned": ("warning", "--vocab-mapping prunes a DSpark trained with the full vocabulary"),
    "early-peagle-low-confidence": ("info", "an early speculators P-EAGLE layout, read with low confidence"),
    "embed-from-verifier": ("info", "embed_tokens taken from the verifier"),
    "jetspec-unstamped": ("info", "a NeMo DFlash without the JetSpec dflash_config.causal stamp"),
    "layout-from-flag": ("warning", "the block layout comes from a flag; the checkpoint lacks its keys"),
    "lm-head-from-verifier": ("warning", "lm_head taken from the verifier"),
    "mixed-attention-layers": ("warning", "the source mixes full and sliding-window layers"),
    "modelopt-layer-id-convention": ("warning", "ModelOpt target_layer_ids read as z-lab 0-based ids (disputed)"),
    "nonfinite-weights": ("warning", "a tensor holds NaN/Inf; converted only because of --allow-nonfinite"),
    "output-exists": ("warning", "dry run: the output exists; the real run needs --overwrite, or refuses it"),
    "peagle-model-type-from-tensors": ("info", "the P-EAGLE layer model_type was told from the tensors"),
    "sample-from-anchor-filled": ("info", "sample_from_anchor was absent and filled by the legacy rule"),
    "sample-from-anchor-ignored": ("warning", "the source sets sample_from_anchor but its runtime never reads it"),
    "sliding-window-non-causal-from-flag": ("info",
                                            "sliding_window_non_causal set true by --sliding-window-non-causal"),
    "specforge-markov-type": ("info", "a SpecForge export names a Markov head type other than vanilla"),
    "speculative-tokens-fixed": ("warning", "speculative_tokens rewritten to the block layout's K"),
    "t2d-default-all-true": ("warning", "an all-true t2d with a pruned vocabulary; rebuilt from d2t"),
    "top-level-model-type-removed": ("warning", "a top-level model_type was removed"),
    "vocab-padded": ("info", "draft vocab larger than the target: padded, identity mapping"),
    # specconv/converters/* (issue 8 item 4)
    "dspark-head-from-tensors": ("info", "an absent DSpark head key was told from the head tensors"),
    "kv-page-size-mismatch": ("warning", "drafter and verifier KV widths vLLM cannot page together"),
    "layer-config-filled": ("info", "absent decoder keys filled from the tensors or transformers' class defaults"),
    "lm-head-frozen": ("info", "the source's trainer freezes lm_head: it must equal the verifier's rows"),
    "lm-head-trainable": ("info", "the source may train lm_head: vLLM uses the file's, speculators may reload"),
    "mrope-stripped": ("warning", "M-RoPE keys removed: vLLM's drafters use 1-D RoPE"),
    "norm-before-residual-from-flag": ("info", "norm_before_residual was absent; taken from the flag"),
    "peagle-norm-flag-from-tensors": ("info", "an absent norm_before_fc / fc_norm was told from the tensors"),
    "verifier-vocab-padded": ("info", "the draft vocab equals the verifier's padded embedding rows"),
    "vocab-logical-identity": ("info", "the draft vocab covers the verifier's logical vocab: identity map"),
}

_VALIDATE: dict[str, tuple[Level, str]] = {
    "sequential-drafting-runner": ("warning", "a parallel-drafting drafter served on a model runner that drafts it "
                                              "one token at a time"),
}

#: Lint codes a ``specconv convert`` flag resolves → the flag: the hint of convert's
#: ``lint_failed`` refusal names it (``specconv/convert.py``).
CONVERT_FLAGS: dict[str, str] = {
    "dflash-causal-full-attention": "--sliding-window-non-causal",
    "sample-from-anchor-disputed": "--sample-from-anchor or --no-sample-from-anchor",
}

#: The finding-code registry: code → :class:`CodeInfo` (level, description, origin).
CODES: dict[str, CodeInfo] = {**_reg("lint", _LINT), **_reg("dir", _DIR), **_reg("converter", _CONVERTER),
                              **_reg("validate", _VALIDATE)}

#: Lint and directory codes → description (the servability lint's rule list).
LINT_RULES: dict[str, str] = {c: i.doc for c, i in CODES.items() if i.origin in ("lint", "dir")}


@dataclass(frozen=True)
class Finding:
    """One converter or lint result.

    Attributes:
        level: ``"error"`` (not servable / not loadable), ``"warning"`` (servable but
            likely wrong or lossy), ``"info"``.
        code: stable kebab-case slug, a key of :data:`CODES`.
        message: human explanation naming the key/tensor and the fix.
        key: the config key (dotted) or tensor name at fault, if any.
    """

    level: Level
    code: str
    message: str
    key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with keys level, code, message, key."""
        return {"level": self.level, "code": self.code, "message": self.message, "key": self.key}


def finding(code: str, message: str, key: str | None = None) -> Finding:
    """Build a :class:`Finding` whose level comes from the registry.

    Raises:
        KeyError: ``code`` is not registered (a programming error, not user input).
    """
    try:
        info = CODES[code]
    except KeyError:
        raise KeyError(f"unregistered finding code {code!r}") from None
    return Finding(info.level, code, message, key)


def has_errors(findings: Iterable[Finding]) -> bool:
    """True when any finding has level ``error``."""
    return any(f.level == "error" for f in findings)


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Findings sorted by level (errors first), stable inside a level."""
    return sorted(findings, key=lambda f: LEVEL_ORDER[f.level])


_ORIGIN_TITLES = {
    "lint": "Lint (servability of a Speculators dir: `convert`, `inspect`, `validate`)",
    "dir": "Directory checks (`inspect`, `validate`)",
    "converter": "Converter (`convert`, `inspect --verifier`)",
    "validate": "Serving engines (`validate --backend vllm|llamacpp`)",
}


def codes_markdown() -> str:
    """``docs/findings.md``: the registry as Markdown tables, one per origin.

    Regenerate with ``python -c "from specconv.format.findings import codes_markdown;
    print(codes_markdown(), end='')" > docs/findings.md``.
    """
    lines = ["# Finding codes", "",
             "Generated from `specconv/format/findings.py` (`CODES`); do not edit by hand. Every finding",
             "has one of these kebab-case codes and always the level given here; `docs/cli.md`",
             "(\"Finding codes\") lists renamed codes.", ""]
    for origin, title in _ORIGIN_TITLES.items():
        lines += [f"## {title}", "", "| code | level | meaning |", "|---|---|---|"]
        lines += [f"| `{c}` | {i.level} | {i.doc} |" for c, i in sorted(CODES.items()) if i.origin == origin]
        lines.append("")
    return "\n".join(lines)
