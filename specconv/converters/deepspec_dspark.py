"""DeepSeek DeepSpec native DSpark (``deepseek-ai/dspark_*_block7``, ``Qwen3DSparkModel``; deepseek-ai/DeepSpec
``deepspec/modeling/dspark/qwen3/{config,modeling}.py`` at HEAD ``afdfa7c9``; docs/adding_a_converter.md)."""

from __future__ import annotations

from dataclasses import replace

from specconv.errors import InvalidInputError

from ._dspark import DSparkHeads, plan_dspark_family, require_bool, require_int, require_type
from .base import Converter, SourceInfo, register
from .deepspec_dflash import deepspec_layout

#: What only DeepSpec's own save_pretrained writes: the anchor sampler's budget and the
#: frozen embedding copy. A ``Qwen3DSparkModel`` without them may be an SGLang-normalised
#: SpecForge export (``normalize_dflash_export.py`` rewrites the architecture), which is 1+N.
DEEPSPEC_SIGNATURE = ("config key num_anchors", "tensor embed_tokens.weight")


def deepspec_heads(src: SourceInfo) -> DSparkHeads:
    """Head fields under DeepSpec's semantics (``build_draft_config`` / ``Qwen3DSparkModel``).

    Raises:
        InvalidInputError: ``markov_rank`` or ``enable_confidence_head`` missing;
            ``markov_head_type`` missing while ``markov_rank > 0``;
            ``confidence_head_with_markov`` missing while the confidence head is enabled
            (DeepSpec itself asserts on each of these).
    """
    where: dict[str, str] = {}
    rank = require_int(src, src.cfg("markov_rank"), "markov_rank")
    where["markov_rank"] = "markov_rank"
    mtype = require_type(src, src.cfg("markov_head_type"), "markov_head_type", rank)
    where["markov_head_type"] = ("markov_head_type" if src.cfg("markov_head_type") is not None
                                 else "unused (markov_rank=0)")
    enable = require_bool(src, src.cfg("enable_confidence_head"), "enable_confidence_head", "DeepSpec always writes it")
    where["enable_confidence_head"] = "enable_confidence_head"
    cwm = src.cfg("confidence_head_with_markov")
    if enable:
        cwm = require_bool(
            src, cwm, "confidence_head_with_markov",
            "DeepSpec writes it whenever enable_confidence_head is true and asserts on its absence",
        )
        where["confidence_head_with_markov"] = "confidence_head_with_markov"
    else:
        cwm = False
        where["confidence_head_with_markov"] = "false: confidence head disabled (DeepSpec's model sets it false)"
    return DSparkHeads(rank, mtype, enable, bool(cwm), where)


def deepspec_layout_sample_from_anchor(src: SourceInfo, opts) -> tuple[bool, str, list[tuple[str, str, str]]]:
    """Anchor-first unless the DeepSpec signature is missing; then ``--(no-)sample-from-anchor``."""
    missing = []
    if src.cfg("num_anchors") is None:
        missing.append(DEEPSPEC_SIGNATURE[0])
    if "embed_tokens.weight" not in src.tensor_names():
        missing.append(DEEPSPEC_SIGNATURE[1])
    explicit = src.cfg("sample_from_anchor")
    if isinstance(explicit, bool):
        return explicit, "config sample_from_anchor", []
    if not missing:
        return True, "DeepSpec drafters are anchor-first (every slot drafts)", []
    if opts.sample_from_anchor is None:
        raise InvalidInputError(
            f"{src.path}: Qwen3DSparkModel without DeepSpec's {' and '.join(missing)}: this may be an "
            "SGLang-normalised SpecForge export (trained 1+N) rather than a DeepSpec drafter (anchor-first); "
            "the block layout cannot be told from the checkpoint",
            code="ambiguous_layout",
            hint="pass --sample-from-anchor (DeepSpec, anchor-first) or --no-sample-from-anchor (SpecForge, 1+N)",
        )
    sample_from_anchor = opts.sample_from_anchor
    return sample_from_anchor, "--sample-from-anchor" if sample_from_anchor else "--no-sample-from-anchor", [(
        "warning", "layout-from-flag",
        f"block layout taken from the flag ({'anchor-first' if sample_from_anchor else '1+N'}): the "
        "checkpoint lacks DeepSpec's "
        f"{' and '.join(missing)}",
    )]


@register
class DeepSpecDSpark(Converter):
    format_id = "deepspec_dspark"
    algorithm = "dspark"
    title = "DeepSeek DeepSpec DSpark (Qwen3DSparkModel, markov_rank > 0)"
    detection = (
        "`architectures[0] == Qwen3DSparkModel` and `markov_rank != 0`; flat top-level `target_layer_ids`, "
        "`mask_token_id`, `block_size`, `num_anchors`"
    )
    mapping = (
        "ids: -1 → 0, others +1; anchor-first (`sample_from_anchor: true`, `speculative_tokens = block_size`); "
        "`markov_rank`/`markov_head_type`/`enable_confidence_head`/`confidence_head_with_markov` copied "
        "(the last is false when the confidence head is off, as in DeepSpec's model); head tensors cross-checked; "
        "`embed_tokens`/`lm_head` copies kept"
    )
    spec_ref = "deepseek-ai/DeepSpec `deepspec/modeling/dspark/qwen3/config.py`, `modeling.py`"

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        return "Qwen3DSparkModel" in src.architectures and src.cfg("markov_rank") != 0

    def plan(self, src, verifier, opts):
        heads = deepspec_heads(src)
        sample_from_anchor, sample_from_anchor_source, extra = deepspec_layout_sample_from_anchor(src, opts)
        layout = replace(
            deepspec_layout(src),
            sample_from_anchor=sample_from_anchor,
            sample_from_anchor_source=sample_from_anchor_source,
            layer_drop=("attn_output_gate",),
            extra_findings=extra,
        )
        anchors = src.cfg("num_anchors")
        notes = ([f"num_anchors={anchors} is DeepSpec's training anchor budget (not carried)"]
                 if anchors is not None else [])
        return plan_dspark_family(self, src, verifier, opts, layout, heads, lambda plan: notes)
