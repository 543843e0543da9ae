"""What counts as a JSON integer, for every room that checks a config value (standard library only)."""

from __future__ import annotations

from typing import Any, TypeGuard

__all__ = ["is_int"]


def is_int(value: Any, minimum: int | None = None) -> TypeGuard[int]:
    """Whether ``value`` is an integer (``int``, never ``bool``: JSON ``true`` is no count),
    at least ``minimum`` when given (``minimum=1``: a positive integer)."""
    return isinstance(value, int) and not isinstance(value, bool) and (minimum is None or value >= minimum)
