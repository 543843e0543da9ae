"""F4 — SpecForge DFlash checkpoints in the legacy ``epoch_{E}_step_{S}/`` layout: a
``save_pretrained`` export (z-lab F1 config + ``model.safetensors``), a copy of ``dflash.py`` and
``training_state.pt``. SpecForge's ``--to hf`` export is the z-lab layout (``zlab_dflash``).
sgl-project/SpecForge ``specforge/modeling/draft/dflash.py``.
"""

from __future__ import annotations

import re

from ._dflash import plan_dflash_family
from .base import Converter, SourceInfo, register
from .zlab_dflash import is_dflash_v1, zlab_layout

_EPOCH_DIR = re.compile(r"epoch_\d+_step_\d+")


@register
class SpecForgeDFlash(Converter):
    format_id = "specforge_dflash"
    algorithm = "dflash"
    title = "SpecForge DFlash (legacy epoch_*_step_* training dir)"
    detection = "F1 config in a dir named `epoch_E_step_S` or beside `training_state.pt`"
    mapping = "as z-lab DFlash; `training_state.pt` (optimizer pickle) is never read and not carried"
    spec_ref = ("sgl-project/SpecForge `specforge/modeling/draft/dflash.py` "
                "(legacy `epoch_E_step_S/` save_pretrained dirs)")

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        marker = "training_state.pt" in src.files or bool(_EPOCH_DIR.fullmatch(src.path.name))
        return marker and is_dflash_v1(src, ("DFlashDraftModel",)) and "projector_type" not in src.dflash_config

    def plan(self, src, verifier, opts):
        plan = plan_dflash_family(self, src, verifier, opts, zlab_layout(src))
        plan.notes.append("training_state.pt / dflash.py are training artefacts: not read, not published")
        return plan
