"""Building a typed Speculators config from parts (:func:`make_config`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from ..errors import InvalidInputError
from .algorithms import algorithm as describe
from .facts import speculative_tokens_for, speculators_envelope
from .schema import SpeculatorsDraftConfig, config_class, validation_message

__all__ = ["make_config"]

_LIST_KEYS = ("aux_hidden_state_layer_ids", "eagle_aux_hidden_state_layer_ids", "architectures")


def _default_speculative_tokens(algorithm: str, cls: type[SpeculatorsDraftConfig], data: Mapping[str, Any]) -> int:
    if not describe(algorithm).block_drafter:  # only the K rule of a block drafter derives K
        raise InvalidInputError(
            f"make_config: speculative_tokens is required for {algorithm} "
            "(it must not exceed the number of depths trained; it cannot be derived)"
        )
    block = data.get("block_size", cls.model_fields["block_size"].default)
    sample_from_anchor = data.get("sample_from_anchor", cls.model_fields["sample_from_anchor"].default)
    return speculative_tokens_for(block, sample_from_anchor)


def _fields(layer_config: Mapping[str, Any], fields: Mapping[str, Any], algorithm: str) -> dict[str, Any]:
    data: dict[str, Any] = {"speculators_model_type": algorithm, "transformer_layer_config": dict(layer_config),
                            **fields}
    data.setdefault("draft_vocab_size", layer_config.get("vocab_size"))
    for key in _LIST_KEYS:
        if isinstance(data.get(key), tuple):
            data[key] = list(data[key])
    return data


def make_config(algorithm: str, *, transformer_layer_config: Mapping[str, Any],
                verifier_name_or_path: str | None = None,
                verifier_architectures: list[str] | tuple[str, ...] | None = None,
                speculative_tokens: int | None = None, **fields: Any) -> SpeculatorsDraftConfig:
    """A validated config for ``algorithm`` with the speculators defaults filled in, every field explicit.

    ``draft_vocab_size`` defaults to the layer ``vocab_size``; ``speculators_config`` is built from the
    ``verifier_*`` arguments and ``speculative_tokens`` (DFlash/DSpark default: the K rule) unless in
    ``fields`` (other top-level keys; unknown ones kept as extras).

    Raises:
        InvalidInputError: a value is invalid, or P-EAGLE without ``speculative_tokens``.
        UnsupportedFormatError: unknown algorithm.
    """
    cls = config_class(algorithm)
    data = _fields(transformer_layer_config, fields, algorithm)
    if "speculators_config" not in data:
        k = speculative_tokens if speculative_tokens is not None else _default_speculative_tokens(algorithm, cls, data)
        data["speculators_config"] = speculators_envelope(algorithm, k, verifier_name_or_path, verifier_architectures)
    try:
        cfg = cls.model_validate(data)
    except ValidationError as err:
        text, key = validation_message(err)
        raise InvalidInputError(f"make_config({algorithm}): {text}", hint=f"fix key {key!r}" if key else None) from None
    # everything is written by dump_config, so nothing is "implicit"
    object.__setattr__(cfg, "__pydantic_fields_set__", set(type(cfg).model_fields))
    return cfg
