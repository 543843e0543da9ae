"""F5 — NVIDIA ModelOpt DFlash export (``export_hf_checkpoint.py``, "z-lab compatible").

``dflash_config.projector_type: "dflash"``, top-level ``block_size``, optional SWA via
``sliding_window`` + ``dflash_config.{use_swa, swa_window_size, causal}``; rotary buffers
are skipped by the exporter. NVIDIA/Model-Optimizer
``modelopt/torch/export/plugins/hf_spec_export.py``.
"""

from __future__ import annotations

from . import _common as common
from ._dflash import plan_dflash_family
from .base import PROJECTOR_DFLASH, Converter, SourceInfo, register
from .zlab_dflash import zlab_layout

#: ModelOpt's layer-id convention as documented, not confirmed (its DFlash and DSpark exports).
LAYER_ID_FINDING = (
    "warning", "modelopt-layer-id-convention",
    "ModelOpt documents target_layer_ids as z-lab-compatible (0-based outputs, +1 applied); one review calls "
    "them one-based — confirm acceptance with `specconv validate --source`",
)


@register
class ModelOptDFlash(Converter):
    format_id = "modelopt_dflash"
    algorithm = "dflash"
    title = "NVIDIA ModelOpt DFlash export"
    detection = "F1 config with `dflash_config.projector_type == \"dflash\"`"
    mapping = (
        "as z-lab DFlash (ids +1, documented as z-lab-compatible — reported as a warning to verify with "
        "`specconv validate`); `dflash_config.causal: false` → `sliding_window_non_causal: true`; "
        "`use_swa` without `layer_types` is refused"
    )
    spec_ref = "NVIDIA/Model-Optimizer `modelopt/torch/export/plugins/hf_spec_export.py`"

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        return isinstance(src.cfg("dflash_config"), dict) and src.projector_type == PROJECTOR_DFLASH and (
            "DFlashDraftModel" in src.architectures or not src.architectures
        )

    def plan(self, src, verifier, opts):
        common.require_layer_types_for_swa(src)
        return plan_dflash_family(self, src, verifier, opts, zlab_layout(src, LAYER_ID_FINDING))
