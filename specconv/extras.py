"""Optional extras: import an optional dependency or say how to install it (exit 2;
docs/architecture.md, "Optional extras"). Every command and model-loading path calls
:func:`quiet_library_bars` first.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

from .errors import UsageError

__all__ = ["EXTRAS", "OPTIONAL_MODULES", "MissingExtraError", "install_line", "missing_extra_error",
           "quiet_library_bars", "require", "require_extra"]

#: The extras ``pyproject.toml`` declares (``tests/structure/test_packaging.py`` keeps the two equal).
EXTRAS = ("validate", "vllm", "onnx", "tensorrt", "trt-rtx", "gguf", "test")

#: Top-level import name -> the extra installing it, for every optional package specconv imports
#: (``tests/structure/test_packaging.py`` checks them).
OPTIONAL_MODULES = {
    "torch": "validate", "transformers": "validate", "accelerate": "validate", "matplotlib": "validate",
    "onnx": "onnx", "onnxscript": "onnx", "onnx_ir": "onnx", "onnxruntime": "onnx", "ml_dtypes": "onnx",
    "tensorrt": "tensorrt", "tensorrt_rtx": "trt-rtx", "gguf": "gguf",
}


class MissingExtraError(UsageError):
    """A command needs an optional package that is not installed (exit 2; the hint: the install line)."""

    code = "missing_extra"


#: Extras whose packages come from another index too (the TensorRT libraries are not on PyPI).
EXTRA_INDEX = {"tensorrt": "https://pypi.nvidia.com"}


def install_line(extra: str) -> str:
    """The shell line that installs ``extra`` (``pip install 'specconv[onnx]'``; for
    ``tensorrt`` with NVIDIA's ``--extra-index-url``)."""
    index = f" --extra-index-url {EXTRA_INDEX[extra]}" if extra in EXTRA_INDEX else ""
    return f"pip install 'specconv[{extra}]'{index}"


def require(module: str, extra: str, *, feature: str) -> ModuleType:
    """Import ``module`` (``feature``: what needs it, for the message).

    Raises:
        MissingExtraError: it (or one of its imports) is missing; the hint installs ``extra``.
        ValueError: ``extra`` is not one of :data:`EXTRAS`.
    """
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r} (declared: {', '.join(EXTRAS)})")
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise _missing(getattr(e, "name", None) or module, extra, feature) from e


def require_extra(extra: str, *, feature: str) -> None:
    """Check every module of ``extra`` (:data:`OPTIONAL_MODULES`) is installed, without importing it (ONNX
    Runtime's import writes a device id under ``$HOME``), before work that wraps library errors.

    Raises:
        MissingExtraError: one of them is not installed (exit 2).
        ValueError: ``extra`` is not a declared extra, or no module maps to it.
    """
    modules = [m for m, e in OPTIONAL_MODULES.items() if e == extra]
    if not modules:
        raise ValueError(f"no module of OPTIONAL_MODULES belongs to extra {extra!r}")
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r} (declared: {', '.join(EXTRAS)})")
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise _missing(module, extra, feature)


def _missing(module: str, extra: str, feature: str) -> MissingExtraError:
    return MissingExtraError(
        f"{feature} needs the Python package {module!r}, which is not installed: {install_line(extra)}",
        hint=install_line(extra),
    )


def missing_extra_error(e: ImportError, *, feature: str) -> MissingExtraError | None:
    """The :class:`MissingExtraError` for a ``ModuleNotFoundError`` of a module of :data:`OPTIONAL_MODULES`,
    or None for any other error (the caller re-raises it)."""
    name = getattr(e, "name", None)
    if not isinstance(e, ModuleNotFoundError) or name not in OPTIONAL_MODULES:
        return None
    return _missing(name, OPTIONAL_MODULES[name], feature)


def quiet_library_bars() -> None:
    """Turn the libraries' tqdm bars off unless stderr is a terminal: ``TQDM_DISABLE`` (read at tqdm's
    import, inherited by runners), or, tqdm already imported, ``disable=True`` as its default (an
    explicit ``disable=`` wins). Idempotent."""
    if sys.stderr.isatty():
        return
    os.environ["TQDM_DISABLE"] = "1"
    std = sys.modules.get("tqdm.std")
    if std is None or getattr(std.tqdm.__init__, "_specconv_quiet", False):
        return
    init = std.tqdm.__init__

    def quiet_init(self, *args, **kwargs) -> None:
        kwargs.setdefault("disable", True)
        init(self, *args, **kwargs)

    quiet_init._specconv_quiet = True  # type: ignore[attr-defined]
    std.tqdm.__init__ = quiet_init
