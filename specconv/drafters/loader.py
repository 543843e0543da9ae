"""``load_drafter``: build a reference drafter from a Speculators-format directory (the drafter
class the algorithm's description names). A verifier-supplied LM head falls back to the
verifier's tied embedding, as speculators ``src/speculators/model.py::load_verifier_weights`` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..format import SpeculatorsDraftConfig, load_config
from ..format.algorithms import algorithm
from ..tensors import open_store
from .base import Drafter, check_dtype, open_verifier, refuse_unused
from .layers import WeightTaker

if TYPE_CHECKING:  # pragma: no cover
    from ..verifier import Verifier

__all__ = ["load_drafter"]


def load_drafter(drafter_dir: str | Path, verifier: Verifier | str | Path | None = None, *,
                 config: SpeculatorsDraftConfig | None = None, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu") -> Drafter:
    """Load a Speculators-format drafter as a reference PyTorch module.

    Args:
        drafter_dir: directory with ``config.json`` + ``model.safetensors`` (or an
            index + shards).
        verifier: the run's :class:`~specconv.verifier.Verifier` (or, for a one-off load,
            its local directory / Hub id, resolved once here); needed when the drafter
            omits ``embed_tokens`` / ``lm_head`` (DFlash/DSpark full vocab) or when
            P-EAGLE's ``eagle_aux_hidden_state_layer_ids`` is null.
        config: the typed config of ``drafter_dir/config.json`` when the caller parsed it
            already (not parsed again); None reads it.
        dtype: ``torch.float32`` | ``torch.bfloat16`` | ``torch.float16``; every float
            weight is cast to it and the forward computes in it (RMSNorm variance and
            softmax in fp32, as transformers; DSpark confidence head in fp32, as vLLM).
        device: torch device.

    Returns:
        :class:`~specconv.drafters.PEagleDrafter`, :class:`~specconv.drafters.DFlashDrafter`
        or :class:`~specconv.drafters.DSparkDrafter` in eval mode.

    Raises:
        InvalidInputError: malformed config, missing/misshaped tensors, missing verifier.
        UnsupportedFormatError: unsupported variants (rnn Markov head, gated attention,
            unknown rope type, unexpected tensors, other algorithms).
        UsageError: unsupported dtype.
    """
    check_dtype(dtype)
    d = Path(drafter_dir)
    typed = config if config is not None else load_config(d)
    store = open_store(d)
    w = WeightTaker({n: store.read_tensor(n) for n in store.names()}, source=str(d))
    model = algorithm(typed.speculators_model_type).drafter_type()(typed, w, open_verifier(verifier), str(d))
    refuse_unused(w)
    model = model.to(device=device)
    for p in model.parameters():
        if p.is_floating_point():
            p.data = p.data.to(dtype)
    model.tie_head()
    return model.eval()
