"""``load_drafter``: build a reference drafter from a Speculators-format directory. A verifier-supplied
LM head falls back to its tied embedding (speculators ``src/speculators/model.py::load_verifier_weights``).
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
    """Load a Speculators-format drafter as a reference PyTorch module in eval mode.

    ``verifier`` (a Verifier, dir or Hub id) is needed when the drafter omits ``embed_tokens`` /
    ``lm_head`` or P-EAGLE's aux ids are null. ``dtype``: float32 | bfloat16 | float16 for every float
    weight and the forward (RMSNorm variance, softmax and DSpark's confidence head in fp32).

    Raises:
        InvalidInputError: malformed config, missing/misshaped tensors, missing verifier.
        UnsupportedFormatError: unsupported variants (rnn Markov head, gated attention, rope type,
            unexpected tensors, other algorithms).
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
