"""F4 — SpecForge P-EAGLE exports (``architectures ["PEagleDraftModel"]``, SpecForge PR #575).
sgl-project/SpecForge ``specforge/modeling/draft/peagle.py``.

The export is a flat Llama draft config **without** the mask token id (SpecForge resolves it at
train time: explicit → draft config → tokenizer mask → unused slot → pad → eos → unk) and without
the aux ids (a trainer argument). SpecForge initialises ``t2d`` to all-true and ``d2t`` to zeros and
overwrites them only when a vocabulary mapping is loaded (:mod:`._vocab` handles both defaults).
The Speculators trainer's own output also says ``PEagleDraftModel`` but always has
``speculators_model_type`` (``speculators_peagle``).
"""

from __future__ import annotations

from ._peagle import peagle_layout, plan_peagle_family, strip_prefix_rename
from .base import Converter, SourceInfo, register


@register
class SpecForgePEagle(Converter):
    format_id = "specforge_peagle"
    algorithm = "peagle"
    title = "SpecForge P-EAGLE export"
    detection = "`architectures[0] == PEagleDraftModel` without `speculators_model_type`"
    mapping = (
        "`--mask-token-id` required (not in the export); aux ids from `eagle_aux_hidden_state_layer_ids` or "
        "`--aux-layer-ids`; K from `num_depths` or `--speculative-tokens`; identity `d2t`/`t2d` (the all-true "
        "default) dropped when `Vd == V`; tensor names unchanged (`midlayer.*` → `layers.0.*` if present)"
    )
    spec_ref = "sgl-project/SpecForge `specforge/modeling/draft/peagle.py` (SpecForge PR #575)"

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        return (
            src.config is not None
            and "speculators_model_type" not in src.config
            and "PEagleDraftModel" in src.architectures[:1]
        )

    def plan(self, src, verifier, opts):
        layout = peagle_layout(
            src, rename=strip_prefix_rename("draft_model."),
            notes=["SpecForge resolves the mask token at train time and does not export it"]
            if src.cfg("mask_token_id") is None else [],
        )
        plan = plan_peagle_family(self, src, verifier, opts, layout)
        if "training_state.pt" in src.files or any(f.startswith("training_state_rank") for f in src.files):
            plan.notes.append("training_state*.pt (optimizer / RNG pickles) are training artefacts: "
                              "not read, not published")
        return plan
