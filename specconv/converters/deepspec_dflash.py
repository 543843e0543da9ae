"""F7 — DeepSeek DeepSpec DFlash release (``deepseek-ai/dflash_*_block7``): a ``Qwen3DSparkModel``
with ``markov_rank: 0``, anchor-first (mapping it 1+N shifts every position — sglang-jax PR #1619).
deepseek-ai/DeepSpec ``deepspec/modeling/dspark/qwen3/{config,modeling}.py``.
"""

from __future__ import annotations

from ._dflash import DFlashLayout, plan_dflash_family
from .base import Converter, SourceInfo, register


def deepspec_layout(src: SourceInfo) -> DFlashLayout:
    return DFlashLayout(
        ids_key="target_layer_ids",
        ids=src.cfg("target_layer_ids"),
        allow_minus_one=True,
        mask_locations=src.locations("mask_token_id"),
        block_nested={},
        sample_from_anchor=True,
        sample_from_anchor_source="DeepSpec drafts are anchor-first",
    )


@register
class DeepSpecDFlash(Converter):
    format_id = "deepspec_dflash"
    algorithm = "dflash"
    title = "DeepSeek DeepSpec DFlash release (Qwen3DSparkModel, markov_rank 0)"
    detection = "`architectures[0] == Qwen3DSparkModel` and `markov_rank == 0`"
    mapping = (
        "ids: -1 → 0, others +1; anchor-first (`sample_from_anchor: true`, `speculative_tokens = block_size`); "
        "`embed_tokens`/`lm_head` copies kept; confidence-head tensors refused (no DFlash equivalent)"
    )
    spec_ref = "deepseek-ai/DeepSpec `deepspec/modeling/dspark/qwen3/config.py`, `modeling.py`"

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        return "Qwen3DSparkModel" in src.architectures and src.cfg("markov_rank") == 0

    def plan(self, src, verifier, opts):
        layout = deepspec_layout(src)
        layout.refuse = {
            r"confidence_head\..*": "DeepSpec DFlash with a confidence head has no Speculators dflash equivalent",
            r"markov_head\..*": "markov_rank is 0 but Markov-head tensors are present",
        }
        return plan_dflash_family(self, src, verifier, opts, layout)
