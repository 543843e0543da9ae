"""Compatibility shim: the Speculators target format now lives in :mod:`specconv.format`.

Imports only; new code imports from :mod:`specconv.format` (or its submodules).
"""

from __future__ import annotations

from .format import *  # noqa: F403
from .format import __all__ as _format_all
from .format.facts import MAX_DRAFT_LAYERS  # noqa: F401
from .format.findings import LEVEL_ORDER as _LEVEL_ORDER  # noqa: F401
from .format.schema import effective_window as _effective_window  # noqa: F401
from .format.schema import rope_theta_of as _rope_theta_of  # noqa: F401
from .format.schema import validation_message as _validation_message  # noqa: F401

__all__ = list(_format_all)
