"""F1b — Muse-Glimmer assistant head (Meta "v1" layout; published ``MuseGlimmerAssistantModel``
configs, DFlash layer of z-lab/dflash ``dflash/model.py``). Every draft layer is run non-causal
(vLLM passes ``causal=False``) despite sliding ``layer_types``.
"""

from __future__ import annotations

from ._dflash import DFlashLayout, plan_dflash_family
from .base import Converter, SourceInfo, register

_RENAMES = {"encoder.fc.": "fc.", "encoder.output_norm_enc.": "hidden_norm."}


def _rename(name: str) -> str:
    for old, new in _RENAMES.items():
        if name.startswith(old):
            return new + name[len(old):]
    return name


@register
class MuseGlimmerDFlash(Converter):
    format_id = "muse_glimmer_dflash"
    algorithm = "dflash"
    title = "Muse-Glimmer assistant head (F1b)"
    detection = ("`architectures == [MuseGlimmerAssistantModel]`, flat `target_layer_ids`/`mask_token_id`, "
                 "tensors `encoder.fc.*`")
    mapping = (
        "`encoder.fc.*` → `fc.*`, `encoder.output_norm_enc.*` → `hidden_norm.*`, other `encoder.*` refused; "
        "ids +1; `sliding_window_non_causal: true` (every layer non-causal); 1+N layout"
    )
    spec_ref = "published `MuseGlimmerAssistantModel` configs; DFlash layer of z-lab/dflash `dflash/model.py`"

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        return "MuseGlimmerAssistantModel" in src.architectures

    def plan(self, src, verifier, opts):
        layout = DFlashLayout(
            ids_key="target_layer_ids",
            ids=src.cfg("target_layer_ids", src.dflash_config.get("target_layer_ids")),
            mask_locations=src.locations("mask_token_id", "dflash_config.mask_token_id"),
            sample_from_anchor=False,
            sample_from_anchor_source="Muse-Glimmer v1 head is 1+N",
            rename=_rename,
            force_non_causal=True,
        )
        return plan_dflash_family(self, src, verifier, opts, layout)
