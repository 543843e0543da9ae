"""F2 — z-lab DFlash2 (``z-lab/*-DFlash2``; z-lab ``dflash`` 0.1.0 ``DFlash2DraftModel.save_pretrained``) and
NeMo's ``Qwen3DFlash2DraftModel`` exports that keep its layout: DFlash plus per-layer convolutions and a candidate
selector (``../shared/reference/dflash2.md`` §2.1, §2.3).
"""

from __future__ import annotations

from typing import Any

from specconv.errors import InvalidInputError

from ._common import one_of
from ._dflash import plan_dflash_family
from .base import Converter, SourceInfo, register
from .zlab_dflash import is_dflash_v1, zlab_layout

#: The four keys z-lab reads with ``_draft_value`` (``dflash_config``, else top level) and has no default for
#: (``dflash/model.py`` ``DFlash2DraftModel.__init__``, ``CandidateSelector.__init__``).
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
_CODEBOOK_SUFFIX = ("candidate_selector.predecessor_codebook.weight", "candidate_selector.successor_codebook.weight")


def bare_codebooks(name: str) -> str:
    """z-lab ``save_pretrained`` writes the codebooks as ``nn.Embedding`` (``….codebook.weight``); speculators,
    vLLM and SGLang hold bare ``nn.Parameter`` names (vLLM raises on the suffix, SGLang drops it silently)."""
    return name.removesuffix(".weight") if name in _CODEBOOK_SUFFIX else name


def dflash2_keys(src: SourceInfo) -> dict[str, int]:
    """The four convolution / selector keys of a z-lab-layout source, each from ``dflash_config`` or the top
    level (both present: must agree).

    Raises:
        InvalidInputError: a key absent (``dflash2_key_missing``: z-lab cannot build the model either, and the
            readers' defaults differ: speculators 2/16/256/16, SGLang 0 = off), not a positive integer, or two
            locations disagree (``conflicting_keys``).
    """
    out: dict[str, int] = {}
    for key in DFLASH2_KEYS:
        value, _ = one_of(src, [(f"dflash_config.{key}", src.dflash_config.get(key)), (key, src.cfg(key))], key)
        if value is None:
            raise InvalidInputError(
                f"{src.path}/config.json: DFlash2 needs {key} (in dflash_config or at the top level); its readers "
                "default it differently (speculators 2/16/256/16, SGLang 0 = no convolution / selector), so "
                "specconv does not guess it", code="dflash2_key_missing")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInputError(f"{src.path}/config.json: {key} must be a positive integer, got {value!r}",
                                    code="config_key")
        out[key] = value
    return out


@register
class ZlabDFlash2(Converter):
    format_id = "zlab_dflash2"
    algorithm = "dflash2"
    title = "z-lab DFlash2 (DFlash + convolutions + candidate selector)"
    detection = ("`dflash_config` object, `architectures[0]` ∈ {`DFlash2DraftModel`, `Qwen3DFlash2DraftModel`}, "
                 "no `projector_type` (or `dflash`)")
    mapping = (
        "as z-lab DFlash (`target_layer_ids` +1 → `aux_hidden_state_layer_ids`, 1+N layout); `conv_kernel_size`, "
        "`conv_group_size`, `selector_rank`, `selector_top_k` from `dflash_config` or the top level (must agree; "
        "absent: refused) written at the top level; `is_causal` → `sliding_window_non_causal`; the codebooks "
        "`candidate_selector.{predecessor,successor}_codebook.weight` (z-lab `save_pretrained`) renamed to the "
        "bare names; `output_multiplier` / `input_embedding_scale` / `final_logit_softcapping` refused"
    )
    spec_ref = "z-lab/dflash `dflash/model.py` (`DFlash2DraftModel`, `GroupedDynamicCausalConv`, `CandidateSelector`)"
    reference_model = "dflash.model:DFlash2DraftModel"

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        return (is_dflash_v1(src, ("DFlash2DraftModel", "Qwen3DFlash2DraftModel"))
                and "projector_type" not in src.dflash_config)

    def plan(self, src: SourceInfo, verifier: Any, opts: Any) -> Any:
        from specconv.format import names

        keys = dflash2_keys(src)
        layout = zlab_layout(src)
        layout.rename, layout.extra_accept, layout.layer_drop = bare_codebooks, names.DFLASH2_PATTERNS, DFLASH2_KEYS
        return plan_dflash_family(self, src, verifier, opts, layout, algorithm="dflash2", extra_fields=keys)
