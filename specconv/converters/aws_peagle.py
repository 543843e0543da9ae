"""F9 — AWS P-EAGLE releases (``amazon/*-p-eagle``) and any checkpoint in vLLM's
"eagle3 + parallel drafting" layout (vLLM ``vllm/model_executor/models/llama_eagle3.py``,
``_init_parallel_drafting_params``). The exact AWS key names were not seen in a download, so every
alternative vLLM reads is accepted and contradictions are errors. Aux ids are never defaulted: vLLM
would otherwise use the *target's* default aux layers, which is not recorded anywhere. The mapping:
the class attributes (``docs/formats.md``).
"""

from __future__ import annotations

from ._peagle import EAGLE_AUX_KEYS, peagle_layout, plan_peagle_family, strip_prefix_rename
from .base import Converter, SourceInfo, register

MASK_KEYS = ("pard_token", "ptd_token_id", "mask_token_id")


@register
class AWSPEagle(Converter):
    format_id = "aws_peagle"
    algorithm = "peagle"
    title = "AWS P-EAGLE / vLLM eagle3 + parallel-drafting layout"
    detection = (
        "no `speculators_model_type`/`dflash_config`; a `mask_hidden` tensor, or "
        "`pard_token`/`ptd_token_id` in config.json"
    )
    mapping = (
        "mask id from `pard_token`/`ptd_token_id`/`mask_token_id` (must agree); `midlayer.*` → `layers.0.*`; "
        "`mask_hidden` → `[1,1,A·H]`; `t2d` rebuilt from `d2t` when absent; aux ids from "
        "`eagle_config.eagle_aux_hidden_state_layer_ids` or `--aux-layer-ids` (never defaulted); K from `num_depths` "
        "or `--speculative-tokens`; `norm_before_residual` from config or flag; llama unless q/k norms (→ qwen3)"
    )
    spec_ref = ("vLLM `vllm/model_executor/models/llama_eagle3.py` (parallel drafting, vLLM PR #32887); "
                "amazon/*-p-eagle model cards")

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        if src.config is None or "speculators_model_type" in src.config or "dflash_config" in src.config:
            return False
        if any(k in src.config for k in ("pard_token", "ptd_token_id")):
            return True
        names = src.tensor_names()
        return "mask_hidden" in names or "model.mask_hidden" in names

    def plan(self, src, verifier, opts):
        layout = peagle_layout(
            src, mask_keys=MASK_KEYS, aux_keys=EAGLE_AUX_KEYS[::-1],  # eagle_config first: the key vLLM reads
            rename=strip_prefix_rename("model.", keep_top_level=()),
            layer_drop=("parallel_drafting",),
            findings=[(
                "info", "aws-layout-unverified",
                "the AWS P-EAGLE key names are known only from vLLM's loader (llama_eagle3.py), not from a download; "
                "check the converted drafter with `specconv validate`",
            )],
        )
        return plan_peagle_family(self, src, verifier, opts, layout)
