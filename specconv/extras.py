"""Optional extras: one helper that imports an optional dependency or says how to install it.

The extras are declared once, in ``pyproject.toml`` (``[project.optional-dependencies]``:
``validate``, ``vllm``, ``onnx``, ``tensorrt``, ``trt-rtx``, ``test``). Code that imports an
optional package lazily calls :func:`require` instead of a bare ``import``, so a user who
ran ``pip install specconv`` gets one clear line instead of a ``ModuleNotFoundError``::

    torch = require("torch", "validate", feature="specconv validate")
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import UsageError

__all__ = ["EXTRAS", "MissingExtraError", "install_line", "require"]

#: The extras ``pyproject.toml`` declares (``tests/test_packaging.py`` keeps the two equal).
EXTRAS = ("validate", "vllm", "onnx", "tensorrt", "trt-rtx", "test")


class MissingExtraError(UsageError):
    """A command needs an optional package that is not installed (exit 2).

    The invocation cannot work in this installation; the hint is the ``pip install`` line.
    """

    code = "missing_extra"


def install_line(extra: str) -> str:
    """The shell line that installs ``extra`` (``pip install 'specconv[onnx]'``)."""
    return f"pip install 'specconv[{extra}]'"


def require(module: str, extra: str, *, feature: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` naming the extra that provides it.

    Args:
        module: import name (``"torch"``, ``"onnxruntime"``, ``"tensorrt"``).
        extra: the ``pyproject.toml`` extra that installs it (one of :data:`EXTRAS`).
        feature: what needs it, for the message (``"the reference drafters"``).

    Returns:
        The imported module.

    Raises:
        MissingExtraError: ``module`` (or one of its own imports) is not installed; the
            message and hint carry ``pip install 'specconv[extra]'``.
        ValueError: ``extra`` is not a declared extra (a programming error).
    """
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r} (declared: {', '.join(EXTRAS)})")
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing = getattr(e, "name", None) or module
        raise MissingExtraError(
            f"{feature} needs the Python package {missing!r}, which is not installed: "
            f"{install_line(extra)}",
            hint=install_line(extra),
        ) from e
