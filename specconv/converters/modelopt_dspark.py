"""NVIDIA ModelOpt DSpark export (``modelopt/torch/export/plugins/hf_spec_export.py``; docs/formats.md): ModelOpt's
DFlash export plus ``dflash_config.{projector_type, shift_label, markov_rank, markov_head_type,
use_confidence_head}``."""

from __future__ import annotations

import re
from typing import Any

from specconv.errors import InvalidInputError

from . import _common as common
from ._dspark import DSparkHeads, plan_dspark_family, require_bool, require_int, require_type
from .base import Converter, SourceInfo, register
from .modelopt_dflash import LAYER_ID_FINDING
from .specforge_dspark import is_modelopt_dspark
from .zlab_dflash import zlab_layout

#: top-level ModelOpt head prefixes → Speculators names (only at the start of a name:
#: ``layers.N.mlp.gate_proj`` is a body tensor and keeps its name).
_HEAD_RENAMES = (
    ("markov_w1.", "markov_head.markov_w1."),
    ("markov_w2.", "markov_head.markov_w2."),
    ("gate_proj.", "markov_head.gate_proj."),
    ("joint_proj.", "markov_head.joint_proj."),
    ("confidence_proj.", "confidence_head.proj."),
)


def modelopt_rename(name: str) -> str:
    for old, new in _HEAD_RENAMES:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def modelopt_heads(src: SourceInfo) -> DSparkHeads:
    """Head fields from ``dflash_config`` (ModelOpt names).

    ``confidence_head_with_markov`` is not a ModelOpt key: ModelOpt's confidence head always
    concatenates the Markov embedding (``hf_spec_export.py``), so it is ``true`` whenever
    the head is enabled (and checked against ``confidence_proj.weight``'s width).
    """
    dc = src.dflash_config
    where: dict[str, str] = {}
    rank = require_int(src, dc.get("markov_rank"), "dflash_config.markov_rank")
    where["markov_rank"] = "dflash_config.markov_rank"
    mtype = require_type(src, dc.get("markov_head_type"), "dflash_config.markov_head_type", rank)
    where["markov_head_type"] = ("dflash_config.markov_head_type" if dc.get("markov_head_type") is not None
                                 else "unused (markov_rank=0)")
    enable = require_bool(src, dc.get("use_confidence_head"), "dflash_config.use_confidence_head",
                          "ModelOpt's name for enable_confidence_head")
    where["enable_confidence_head"] = "dflash_config.use_confidence_head"
    if enable:
        explicit = dc.get("confidence_head_with_markov")
        if explicit is None:
            cwm = True
            where["confidence_head_with_markov"] = ("true: ModelOpt's confidence head always reads "
                                                    "cat(out, markov_w1[prev])")
        else:
            cwm = require_bool(src, explicit, "dflash_config.confidence_head_with_markov", "")
            where["confidence_head_with_markov"] = "dflash_config.confidence_head_with_markov"
    else:
        cwm = False
        where["confidence_head_with_markov"] = "false: confidence head disabled"
    return DSparkHeads(rank, mtype, enable, cwm, where)


def _renamed_heads_note(plan: Any) -> list[str]:
    """The note naming the top-level head tensors that were renamed (none: no note)."""
    renamed = sorted(t.source
                     for t in plan.tensors if t.fate == "renamed" and not re.match(r"layers\.", t.source or ""))
    return [f"ModelOpt top-level head tensors renamed: {', '.join(renamed)}"] if renamed else []


@register
class ModelOptDSpark(Converter):
    format_id = "modelopt_dspark"
    algorithm = "dspark"
    title = "NVIDIA ModelOpt DSpark export"
    detection = (
        "`dflash_config.projector_type == \"dspark\"` with top-level `markov_w1.weight`/`markov_w2.weight`/"
        "`confidence_proj.weight` tensors or ModelOpt keys `dflash_config.use_confidence_head`/`shift_label`"
    )
    mapping = (
        "`markov_w{1,2}`/`gate_proj`/`joint_proj` → `markov_head.*`, `confidence_proj` → `confidence_head.proj`; "
        "`use_confidence_head` → `enable_confidence_head`; `shift_label: true` → anchor-first "
        "(`sample_from_anchor: true`, `speculative_tokens = B`); `confidence_head_with_markov: true`; ids +1 "
        "(z-lab-compatible per ModelOpt — warning)"
    )
    spec_ref = "NVIDIA/Model-Optimizer `modelopt/torch/export/plugins/hf_spec_export.py`"

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        return (
            src.cfg("speculators_model_type") is None
            and isinstance(src.cfg("dflash_config"), dict)
            and is_modelopt_dspark(src)
        )

    def plan(self, src, verifier, opts):
        dc = src.dflash_config
        common.require_layer_types_for_swa(src)
        heads = modelopt_heads(src)
        shift = dc.get("shift_label")
        layout = zlab_layout(src, LAYER_ID_FINDING)
        layout.runtime_ignores_sample_from_anchor = ""  # the layout comes from shift_label, not z-lab's runtime
        if isinstance(shift, bool):
            layout.sample_from_anchor = shift
            layout.sample_from_anchor_source = f"dflash_config.shift_label={str(shift).lower()} (true = anchor-first)"
        elif opts.sample_from_anchor is not None:
            layout.sample_from_anchor = opts.sample_from_anchor
            layout.sample_from_anchor_source = ("--sample-from-anchor" if opts.sample_from_anchor
                                                else "--no-sample-from-anchor")
        else:
            raise InvalidInputError(
                f"{src.path}/config.json has no dflash_config.shift_label; ModelOpt DSpark exports write "
                "shift_label: true (anchor-first) and the block layout is never guessed",
                code="missing_key",
                hint="pass --sample-from-anchor (anchor-first) or --no-sample-from-anchor (1+N)",
            )
        layout.rename = modelopt_rename
        layout.layer_drop = ("projector_type", "shift_label", "use_confidence_head")
        return plan_dspark_family(self, src, verifier, opts, layout, heads, _renamed_heads_note)
