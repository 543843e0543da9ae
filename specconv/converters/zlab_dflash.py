"""F1 — z-lab DFlash v1 (``z-lab/*-DFlash*``) and trainers that copy its layout verbatim
(SpecForge ``--to hf`` exports). Reference model code
``dflash/model.py`` (``DFlashDraftModel``, z-lab ``dflash`` 0.1.0).
"""

from __future__ import annotations

from ._dflash import DFlashLayout, plan_dflash_family
from .base import PROJECTOR_DFLASH, Converter, SourceInfo, register

#: Why a ``sample_from_anchor`` in a z-lab-layout config means nothing: z-lab ``dflash`` 0.1.0
#: ``dflash/model.py`` (``dflash_generate``) always drafts block slots 1..B-1 and no code reads the key.
ZLAB_RUNTIME_LAYOUT = "z-lab dflash 0.1.0 `dflash/model.py` drafts slots 1..B-1 and never reads the key"


def zlab_layout(src: SourceInfo, *findings: tuple[str, str, str]) -> DFlashLayout:
    """The z-lab layout of ``src`` (also ModelOpt's, NeMo's and SpecForge's DFlash), with a
    source's own ``(level, code, message)`` findings."""
    dc = src.dflash_config
    return DFlashLayout(
        ids_key="dflash_config.target_layer_ids",
        ids=dc.get("target_layer_ids"),
        mask_locations=src.locations("dflash_config.mask_token_id", "mask_token_id"),
        sample_from_anchor=False,
        sample_from_anchor_source="z-lab DFlash is 1+N: slot 0 holds the bonus token",
        runtime_ignores_sample_from_anchor=ZLAB_RUNTIME_LAYOUT,
        extra_findings=list(findings),
    )


def is_dflash_v1(src: SourceInfo, archs: tuple[str, ...]) -> bool:
    return (
        bool(src.cfg("dflash_config") is not None and isinstance(src.cfg("dflash_config"), dict))
        and any(a in archs for a in src.architectures)
        and src.projector_type in (None, PROJECTOR_DFLASH)
    )


@register
class ZlabDFlash(Converter):
    format_id = "zlab_dflash"
    algorithm = "dflash"
    title = "z-lab DFlash v1 (also SpecForge --to hf DFlash exports)"
    detection = "`dflash_config` object, `architectures[0] == DFlashDraftModel`, no `projector_type` (or `dflash`)"
    mapping = (
        "`dflash_config.target_layer_ids` +1 → `aux_hidden_state_layer_ids` (last layer kept); `block_size` top-level "
        "or nested (must agree); mask token nested or top-level; 1+N layout (`sample_from_anchor: false`, "
        "`speculative_tokens = B−1`; a `dflash_config.sample_from_anchor: true` z-lab's runtime ignores is "
        "written false with the warning `sample-from-anchor-ignored`); tensor names unchanged"
    )
    spec_ref = "z-lab/dflash `dflash/model.py` (`DFlashDraftModel`)"
    reference_model = "dflash.model:DFlashDraftModel"

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        return is_dflash_v1(src, ("DFlashDraftModel",)) and "projector_type" not in src.dflash_config

    def plan(self, src, verifier, opts):
        return plan_dflash_family(self, src, verifier, opts, zlab_layout(src))
