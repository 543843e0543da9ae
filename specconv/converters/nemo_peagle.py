"""F6 — NVIDIA NeMo Automodel P-EAGLE (``LlamaEagle3DraftModel`` + ``parallel_drafting: true``;
NVIDIA-NeMo/Automodel EAGLE-3 recipe, NeMo PR #2447).

Checkpoints live in ``epoch_E_step_S/model/`` or ``model/consolidated/`` (the pipeline's
``select_checkpoint`` descends into them). ``mask_hidden`` is ``[1, A·H]`` in one version and
``[1,1,A·H]`` in another; ``d2t``/``t2d`` are embedded only when ``Vd < V`` since NeMo PR #2447,
older checkpoints kept them in ``eagle_meta.pt``. The mapping: the class attributes
(``docs/formats.md``).
"""

from __future__ import annotations

from pathlib import Path

from specconv.errors import InvalidInputError

from ._peagle import UNKNOWN_AUX_KEYS, peagle_layout, plan_peagle_family, strip_prefix_rename
from ._vocab import read_mapping_file
from .base import Converter, SourceInfo, register

TOP_LEVEL = ("lm_head.weight", "d2t", "t2d", "mask_hidden")
EAGLE_META = "eagle_meta.pt"


def find_eagle_meta(path: Path) -> Path | None:
    """``eagle_meta.pt`` in the checkpoint dir or up to two levels above (``model/consolidated``)."""
    for d in (path, path.parent, path.parent.parent):
        if (d / EAGLE_META).is_file():
            return d / EAGLE_META
    return None


@register
class NeMoPEagle(Converter):
    format_id = "nemo_peagle"
    algorithm = "peagle"
    title = "NeMo Automodel P-EAGLE"
    detection = "`architectures[0] == LlamaEagle3DraftModel` with `parallel_drafting: true`"
    mapping = (
        "strip the `model.` wrapper prefix (`lm_head`, `d2t`, `t2d`, `mask_hidden` are top level); top-level "
        "`mask_token_id`; `num_depths` → `speculative_tokens`; `mask_hidden` `[1,A·H]` → `[1,1,A·H]`; vocab "
        "mapping from `eagle_meta.pt` when the weights lack it; sharded `model/consolidated/` dirs accepted"
    )
    spec_ref = "NVIDIA-NeMo/Automodel EAGLE-3 / P-EAGLE recipe (`LlamaEagle3DraftModel`, NeMo PR #2447)"

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        return (
            src.config is not None
            and "speculators_model_type" not in src.config
            and "LlamaEagle3DraftModel" in src.architectures[:1]
            and src.cfg("parallel_drafting") is True
        )

    def plan(self, src, verifier, opts):
        extra, label, notes = None, "", []
        names = set(src.tensor_names())
        meta = find_eagle_meta(src.path)
        if meta is not None and not ({"d2t", "model.d2t"} & names):
            try:
                extra = read_mapping_file(meta)
            except InvalidInputError as e:
                if e.code == "unsafe_pickle":
                    raise
                notes.append(f"{meta.name} holds no d2t/t2d ({e.message})")
            else:
                label = (str(meta.relative_to(src.path.parent.parent)) if meta.is_relative_to(src.path.parent.parent)
                         else meta.name)
                notes.append(f"vocabulary mapping read from {meta} (torch.load weights_only=True)")
        layout = peagle_layout(
            src, unknown_aux_keys=UNKNOWN_AUX_KEYS + ("eagle_aux_layer_ids",),
            rename=strip_prefix_rename("model."),
            vocab_extra=extra,
            vocab_extra_label=label,
            layer_drop=("parallel_drafting",),
            notes=notes,
        )
        return plan_peagle_family(self, src, verifier, opts, layout)
