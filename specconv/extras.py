"""Optional extras: import an optional dependency or say how to install it (exit 2); the rule
of who calls :func:`require` is docs/architecture.md's ("Optional extras")::

    torch = require("torch", "validate", feature="specconv validate")

Every command and every library path that loads a model calls :func:`quiet_library_bars`
first, so the libraries' tqdm bars show only on a terminal.
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

#: Top-level import name -> the extra whose ``pyproject.toml`` list installs it, for every
#: optional package specconv's own interpreter imports (``tests/structure/test_packaging.py`` checks
#: each against pyproject.toml and the installed distributions).
OPTIONAL_MODULES = {
    "torch": "validate", "transformers": "validate", "accelerate": "validate", "matplotlib": "validate",
    "onnx": "onnx", "onnxscript": "onnx", "onnx_ir": "onnx", "onnxruntime": "onnx", "ml_dtypes": "onnx",
    "tensorrt": "tensorrt", "tensorrt_rtx": "trt-rtx", "gguf": "gguf",
}


class MissingExtraError(UsageError):
    """A command needs an optional package that is not installed (exit 2).

    The invocation cannot work in this installation; the hint is the ``pip install`` line.
    """

    code = "missing_extra"


#: Extras whose packages come from another index too (the TensorRT libraries are not on PyPI).
EXTRA_INDEX = {"tensorrt": "https://pypi.nvidia.com"}


def install_line(extra: str) -> str:
    """The shell line that installs ``extra`` (``pip install 'specconv[onnx]'``; for
    ``tensorrt`` with NVIDIA's ``--extra-index-url``)."""
    index = f" --extra-index-url {EXTRA_INDEX[extra]}" if extra in EXTRA_INDEX else ""
    return f"pip install 'specconv[{extra}]'{index}"


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
        raise _missing(getattr(e, "name", None) or module, extra, feature) from e


def require_extra(extra: str, *, feature: str) -> None:
    """Check that every module :data:`OPTIONAL_MODULES` maps to ``extra`` (``onnx``: onnx,
    onnxscript, onnx_ir, onnxruntime, ml_dtypes) is installed, before a command starts work
    that wraps library errors (a missing module would otherwise surface as that command's
    own error). Found without importing (``importlib.util.find_spec``): a preflight must not
    pay the imports nor their side effects (ONNX Runtime writes a device id under ``$HOME``).

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
    """The :class:`MissingExtraError` for a ``ModuleNotFoundError`` of a top-level module of
    :data:`OPTIONAL_MODULES` (``No module named 'torch'`` -> ``specconv[validate]``), or None
    for any other error (another module, or a package that is there but broken: the caller
    re-raises it).

    Args:
        e: the error (its ``name`` is the module that could not be found).
        feature: what needed it, for the message (``"specconv export onnx"``).
    """
    name = getattr(e, "name", None)
    if not isinstance(e, ModuleNotFoundError) or name not in OPTIONAL_MODULES:
        return None
    return _missing(name, OPTIONAL_MODULES[name], feature)


def quiet_library_bars() -> None:
    """Turn the libraries' tqdm progress bars off unless stderr is a terminal.

    tqdm reads ``TQDM_DISABLE`` when it is first imported: set here, for this process and the
    runners it starts. A tqdm already imported gets ``disable=True`` as its default instead
    (transformers' ``Loading weights`` and the GGUF reader's ``Converting and de-quantizing``
    bars subclass it; huggingface_hub passes ``disable=None``, tqdm's own TTY check). A
    caller's explicit ``disable=`` still wins. Idempotent; a no-op on a TTY.
    """
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
