"""F6 — NVIDIA NeMo Automodel DFlash (``Qwen3DFlashDraftModel``; NVIDIA-NeMo/Automodel
``draft_qwen3.py``, a copy of z-lab/dflash ``dflash/model.py``): z-lab's tensor names (no
``model.`` prefix, no embeddings/LM head); VLM variants' ``visual_fusion.gate`` scalars have no
Speculators equivalent.
"""

from __future__ import annotations

from ._dflash import plan_dflash_family
from .base import Converter, SourceInfo, register
from .zlab_dflash import zlab_layout


@register
class NeMoDFlash(Converter):
    format_id = "nemo_dflash"
    algorithm = "dflash"
    title = "NeMo Automodel DFlash"
    detection = "`architectures[0] == Qwen3DFlashDraftModel` with `dflash_config`"
    mapping = "as z-lab DFlash; `dflash_config.causal: true` (JetSpec) refused; `visual_fusion.*` refused by name"
    spec_ref = "NVIDIA-NeMo/Automodel `draft_qwen3.py` (copy of z-lab/dflash `dflash/model.py`)"

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        return "Qwen3DFlashDraftModel" in src.architectures and isinstance(src.cfg("dflash_config"), dict)

    def plan(self, src, verifier, opts):
        return plan_dflash_family(self, src, verifier, opts, zlab_layout(src, (
            "info", "jetspec-unstamped",
            "older JetSpec (causal) NeMo checkpoints lack the dflash_config.causal stamp; if this draft was trained "
            "block-causal, acceptance will collapse — check with `specconv validate`",
        )))
