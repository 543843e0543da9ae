"""SpecForge DSpark HF exports (``DSparkDraftModel``; sgl-project/SpecForge ``specforge/modeling/draft/dspark.py``,
HEAD ``a6b6b023``; docs/formats.md, docs/adding_a_converter.md)."""

from __future__ import annotations

from typing import Any

from specconv.errors import UnsupportedFormatError

from . import _common as common
from ._dflash import DFlashLayout
from ._dspark import DSparkHeads, plan_dspark_family, require_bool, require_int, require_type
from .base import PROJECTOR_DSPARK, Converter, SourceInfo, register

#: Domino's head (SpecForge ``domino.py``): a GRU over the draft prefix + an embedding
#: projection — no Speculators (or vLLM) counterpart.
DOMINO_TENSORS = {
    r"(logit_head\.)?prefix_gru\..*": "Domino prefix GRU (no Speculators equivalent)",
    r"(logit_head\.)?embed_proj\..*": "Domino embedding projection (no Speculators equivalent)",
}


def strip_logit_head(name: str) -> str:
    """``logit_head.markov_head.x`` → ``markov_head.x`` (early SpecForge DSpark checkpoints)."""
    return name[len("logit_head."):] if name.startswith("logit_head.") else name


def hoisted(src: SourceInfo, key: str) -> tuple[Any, str | None]:
    """``dflash_config.<key>`` and/or top-level ``<key>`` (must agree)."""
    return common.one_of(src, src.locations(f"dflash_config.{key}", key), key)


def specforge_heads(src: SourceInfo) -> DSparkHeads:
    """Head fields from ``dflash_config`` (or the top level).

    Raises:
        InvalidInputError: a key is missing (``markov_rank``, ``enable_confidence_head``;
            ``markov_head_type`` when rank > 0; ``confidence_head_with_markov`` when the
            confidence head is enabled) or the two locations disagree.
    """
    where: dict[str, str] = {}
    v, w = hoisted(src, "markov_rank")
    rank = require_int(src, v, "dflash_config.markov_rank")
    where["markov_rank"] = w or "?"
    v, w = hoisted(src, "markov_head_type")
    mtype = require_type(src, v, "dflash_config.markov_head_type", rank)
    where["markov_head_type"] = w or "unused (markov_rank=0)"
    v, w = hoisted(src, "enable_confidence_head")
    enable = require_bool(src, v, "dflash_config.enable_confidence_head", "SpecForge exports write it")
    where["enable_confidence_head"] = w or "?"
    v, w = hoisted(src, "confidence_head_with_markov")
    if enable:
        cwm = require_bool(src, v, "dflash_config.confidence_head_with_markov",
                           "needed when enable_confidence_head is true: it sets the confidence input width")
        where["confidence_head_with_markov"] = w or "?"
    else:
        cwm = False
        where["confidence_head_with_markov"] = "false: confidence head disabled"
    return DSparkHeads(rank, mtype, enable, bool(cwm), where)


def is_modelopt_dspark(src: SourceInfo) -> bool:
    """ModelOpt's DSpark export: head tensors at the top level or ModelOpt key names."""
    dc = src.dflash_config
    if src.projector_type != PROJECTOR_DSPARK:
        return False
    if "use_confidence_head" in dc or "shift_label" in dc:
        return True
    names = set(src.tensor_names())
    return bool(names & {"markov_w1.weight", "markov_w2.weight", "confidence_proj.weight"})


def specforge_layout_sample_from_anchor(src: SourceInfo, opts: Any) -> tuple[bool, str, list[tuple[str, str, str]]]:
    """Block layout: the checkpoint's ``sample_from_anchor`` (or ``shift_label``), else the
    flag (a warning when it asks for anchor-first), else SpecForge's documented 1+N."""
    sample_from_anchor_cfg, sample_from_anchor_where = hoisted(src, "sample_from_anchor")
    if sample_from_anchor_cfg is None:
        shift, shift_where = hoisted(src, "shift_label")
        if isinstance(shift, bool):
            sample_from_anchor_cfg, sample_from_anchor_where = (shift,
                                                                f"{shift_where} (shift_label: true = anchor-first)")
    if isinstance(sample_from_anchor_cfg, bool):
        return sample_from_anchor_cfg, f"checkpoint {sample_from_anchor_where}", []
    if opts.sample_from_anchor is None:
        return False, "SpecForge DSpark exports are 1+N (no sample_from_anchor key)", []
    sample_from_anchor = opts.sample_from_anchor
    extra = [(
        "warning", "layout-from-flag",
        "--sample-from-anchor overrides SpecForge's documented 1+N DSpark layout (the checkpoint records "
        "none); acceptance collapses if the drafter was trained 1+N — check with `specconv validate`",
    )] if sample_from_anchor else []
    return sample_from_anchor, "--sample-from-anchor" if sample_from_anchor else "--no-sample-from-anchor", extra


def _export_notes(src: SourceInfo, plan: Any, heads: Any) -> list[str]:
    """Notes on the early ``logit_head.`` layout and the training-only alpha; a finding when
    the export names a Markov head type SpecForge does not implement."""
    from specconv.format import Finding

    notes = []
    if any(t.source and t.source.startswith("logit_head.") for t in plan.tensors):
        notes.append("early SpecForge layout: logit_head. prefix stripped from the head tensors")
    alpha, alpha_where = hoisted(src, "confidence_head_alpha")
    if alpha is not None:
        notes.append(f"{alpha_where}={alpha} is a training loss weight (not carried)")
    if heads.markov_head_type != "vanilla":
        plan.findings.append(Finding(
            "info", "specforge-markov-type",
            f"SpecForge implements only the vanilla Markov head; this export says {heads.markov_head_type!r}",
            "markov_head_type",
        ))
    return notes


@register
class SpecForgeDSpark(Converter):
    format_id = "specforge_dspark"
    algorithm = "dspark"
    title = "SpecForge DSpark export (DSparkDraftModel)"
    detection = (
        "`architectures[0] == DSparkDraftModel` or `dflash_config.projector_type == \"dspark\"` without ModelOpt's "
        "top-level head tensors; no `speculators_model_type`"
    )
    mapping = (
        "`dflash_config` head fields (`markov_rank`, `markov_head_type`, `enable_confidence_head`, "
        "`confidence_head_with_markov`, `mask_token_id`, `target_layer_ids`) hoisted; ids +1; 1+N layout "
        "(`sample_from_anchor: false`, `speculative_tokens = B−1`) unless the checkpoint says otherwise; "
        "`logit_head.` prefix stripped; Domino `prefix_gru`/`embed_proj` refused; `attention_mode: mla` refused; "
        "`confidence_head_alpha` (training only) noted"
    )
    spec_ref = "sgl-project/SpecForge `specforge/modeling/draft/dspark.py`"

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        if src.cfg("speculators_model_type") is not None:
            return False
        if "DSparkDraftModel" in src.architectures:
            return not is_modelopt_dspark(src)
        return (isinstance(src.cfg("dflash_config"), dict) and src.projector_type == PROJECTOR_DSPARK
                and not is_modelopt_dspark(src))

    def plan(self, src, verifier, opts):
        mode, where = hoisted(src, "attention_mode")
        if mode is not None and str(mode).lower() not in ("gqa", "mha"):
            raise UnsupportedFormatError(
                f"{src.path}/config.json: {where}={mode!r}: only GQA/MHA DSpark bodies map to the Speculators "
                "DSpark (Qwen3) layer; MLA bodies have no Speculators equivalent",
                format_id="mla_dspark",
            )
        heads = specforge_heads(src)
        ids, ids_key = hoisted(src, "target_layer_ids")
        sample_from_anchor, sample_from_anchor_source, extra_findings = specforge_layout_sample_from_anchor(src, opts)
        layout = DFlashLayout(
            ids_key=ids_key or "dflash_config.target_layer_ids",
            ids=ids,
            mask_locations=src.locations("dflash_config.mask_token_id", "mask_token_id"),
            sample_from_anchor=sample_from_anchor,
            sample_from_anchor_source=sample_from_anchor_source,
            rename=strip_logit_head,
            refuse=dict(DOMINO_TENSORS),
            layer_drop=("confidence_head_alpha", "attention_mode", "projector_type", "shift_label"),
            extra_findings=extra_findings,
        )
        return plan_dspark_family(self, src, verifier, opts, layout, heads,
                                  lambda plan: _export_notes(src, plan, heads))
