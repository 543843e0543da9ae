"""``load_drafter``: build a reference drafter from a Speculators-format directory.

Reads ``config.json`` into the typed config (:func:`specconv.speculators.parse_config`) and
the drafter's safetensors through :func:`specconv.tensors.open_store`; takes ``embed_tokens``
/ ``lm_head`` from the :class:`specconv.verifier.Verifier` where the format lets the drafter
omit them (DFlash/DSpark full vocab, as speculators ``src/speculators/model.py::
load_verifier_weights`` does; the LM head falls back to the verifier's tied embedding).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import InvalidInputError, UnsupportedFormatError
from .base import Drafter, check_dtype, open_verifier, read_tensors, refuse_unused, typed_config
from .layers import WeightTaker

__all__ = ["load_drafter", "read_drafter_config"]


def read_drafter_config(speculators_dir: str | Path) -> dict:
    """Parse ``<dir>/config.json`` and check the Speculators envelope.

    Raises:
        InvalidInputError: missing/invalid JSON, a top-level ``model_type``-only config
            without ``speculators_model_type``.
        UnsupportedFormatError: an algorithm other than peagle/dflash/dspark.
    """
    p = Path(speculators_dir) / "config.json"
    if not p.is_file():
        raise InvalidInputError(f"{p}: not found (expected a Speculators-format directory)")
    try:
        cfg = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise InvalidInputError(f"{p}: invalid JSON ({e})") from e
    if not isinstance(cfg, dict):
        raise InvalidInputError(f"{p}: expected a JSON object")
    algo = cfg.get("speculators_model_type")
    if algo is None:
        raise InvalidInputError(f"{p}: 'speculators_model_type' is missing (not a Speculators "
                                "config)", code="config_key")
    if algo not in ("peagle", "dflash", "dspark"):
        raise UnsupportedFormatError(
            f"{p}: speculators_model_type {algo!r} has no reference drafter "
            "(peagle, dflash, dspark)", format_id=f"speculators-{algo}")
    return cfg


def load_drafter(speculators_dir: str | Path, verifier_dir: str | Path | None = None, *,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
                 ) -> Drafter:
    """Load a Speculators-format drafter as a reference PyTorch module.

    Args:
        speculators_dir: directory with ``config.json`` + ``model.safetensors`` (or an
            index + shards).
        verifier_dir: the verifier's local HF directory; needed when the drafter omits
            ``embed_tokens`` / ``lm_head`` (DFlash/DSpark full vocab) or when P-EAGLE's
            ``eagle_aux_hidden_state_layer_ids`` is null.
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
    cfg = read_drafter_config(d)
    w = WeightTaker(read_tensors(d), source=str(d))
    verifier = open_verifier(verifier_dir)
    algo = cfg["speculators_model_type"]
    if algo == "peagle":
        from .peagle import PEagleDrafter as cls
    elif algo == "dflash":
        from .dflash import DFlashDrafter as cls
    else:
        from .dspark import DSparkDrafter as cls
    model = cls(typed_config(cfg, str(d)), w, verifier, str(d))
    refuse_unused(w)
    model = model.to(device=device)
    for p in model.parameters():
        if p.is_floating_point():
            p.data = p.data.to(dtype)
    return model.eval()
