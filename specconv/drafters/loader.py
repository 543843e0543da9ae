"""``load_drafter``: build a reference drafter from a Speculators-format directory.

Reads ``config.json`` through the typed config (:func:`specconv.format.load_config`, the
only parser of a Speculators ``config.json``), hands that typed config to the drafter, and
reads the drafter's safetensors through :func:`specconv.tensors.open_store`; takes
``embed_tokens`` / ``lm_head`` from the :class:`specconv.verifier.Verifier` where the format
lets the drafter omit them (DFlash/DSpark full vocabulary; the LM head falls back to the
verifier's tied embedding, as speculators ``src/speculators/model.py::load_verifier_weights``
does).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..format import SpeculatorsDraftConfig, load_config
from .base import Drafter, check_dtype, open_verifier, read_tensors, refuse_unused
from .layers import WeightTaker

if TYPE_CHECKING:  # pragma: no cover
    from ..verifier import Verifier

__all__ = ["load_drafter", "read_drafter_config"]


def read_drafter_config(speculators_dir: str | Path) -> SpeculatorsDraftConfig:
    """Read and validate ``<dir>/config.json`` as a typed Speculators config.

    Args:
        speculators_dir: a Speculators-format directory.

    Returns:
        :class:`~specconv.format.PEagleConfig`, :class:`~specconv.format.DFlashConfig` or
        :class:`~specconv.format.DSparkConfig`.

    Raises:
        InvalidInputError: missing/invalid JSON, a config without
            ``speculators_model_type``, or a missing/invalid key (named with the file).
        UnsupportedFormatError: an algorithm other than peagle/dflash/dspark.
    """
    return load_config(Path(speculators_dir) / "config.json")


def load_drafter(speculators_dir: str | Path, verifier_dir: Verifier | str | Path | None = None, *,
                 config: SpeculatorsDraftConfig | None = None, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu") -> Drafter:
    """Load a Speculators-format drafter as a reference PyTorch module.

    Args:
        speculators_dir: directory with ``config.json`` + ``model.safetensors`` (or an
            index + shards).
        verifier_dir: the :class:`~specconv.verifier.Verifier`, or its local directory / Hub
            id (resolved with :func:`specconv.verifier.resolve_verifier`); needed when the drafter omits
            ``embed_tokens`` / ``lm_head`` (DFlash/DSpark full vocab) or when P-EAGLE's
            ``eagle_aux_hidden_state_layer_ids`` is null.
        config: the directory's typed config when the caller parsed it already (else read here).
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
    d = Path(speculators_dir)
    typed = config if config is not None else read_drafter_config(d)  # every key as the typed config reads it
    w = WeightTaker(read_tensors(d), source=str(d))
    verifier = open_verifier(verifier_dir)
    algo = typed.speculators_model_type
    if algo == "peagle":
        from .peagle import PEagleDrafter as cls
    elif algo == "dflash":
        from .dflash import DFlashDrafter as cls
    else:
        from .dspark import DSparkDrafter as cls
    model = cls(typed, w, verifier, str(d))
    refuse_unused(w)
    model = model.to(device=device)
    for p in model.parameters():
        if p.is_floating_point():
            p.data = p.data.to(dtype)
    return model.eval()
