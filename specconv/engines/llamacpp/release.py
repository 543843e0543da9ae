"""``release --export-gguf``: ``gguf/`` in the drafter dir, served by llama-server before it is moved
into place and pushed in the same repo (docs/llamacpp.md)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import InvalidInputError
from . import LLAMA_SERVER_ENV


def preflight(options: Mapping[str, Any], value: Any) -> None:
    """``--export-gguf`` (``value``) needs the ``gguf`` extra (exit 2) and a llama-server (exit 3,
    ``llama_server_missing``): push takes ``gguf/`` only with a passed llama-server check."""
    from ...extras import require_extra
    from .server import resolve_server

    if not value:
        return
    require_extra("gguf", feature="specconv release --export-gguf")
    if resolve_server(options.get("llama_server")) is None:  # a named binary that does not exist raises here
        raise InvalidInputError("--export-gguf: no llama-server to check the GGUF with", code="llama_server_missing",
                                hint=f"pass --llama-server PATH, set ${LLAMA_SERVER_ENV}, or run `make llama-cpp`")


def gguf_step(drafter: Path, work: Path, options: Mapping[str, Any], value: Any) -> dict[str, Any]:
    """``export gguf`` into ``DRAFTER/gguf`` with its llama-server check; a skipped check (no
    verifier GGUF) is exit 3, as push would refuse the unchecked ``gguf/``."""
    from .export import export_gguf_dir

    r = export_gguf_dir(drafter, verifier=options.get("verifier"), llama_server=options.get("llama_server"),
                        verifier_gguf=options.get("verifier_gguf"))
    check = r.check or {}
    if not check.get("passed"):
        raise InvalidInputError(f"--export-gguf: the GGUF was not checked ({check.get('skipped')})",
                                code="gguf_unchecked", hint="pass --verifier-gguf PATH (the verifier as a GGUF)")
    return {k: getattr(r, k) for k in ("file", "sha256", "spec_type", "spec_draft_n_max", "verifier_gguf")} | {
        "check": {k: check.get(k) for k in ("passed", "lossless", "tau")}}
