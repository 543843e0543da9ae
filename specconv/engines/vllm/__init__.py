"""vLLM: the Speculators dir itself is what ``vllm serve DIR`` loads. ``validate --backend vllm``
serves it (:mod:`.serve`, :mod:`.server`; ``--server-url``: :mod:`.remote`), ``--vllm-load-check`` runs
vLLM's own loader in its venv (:mod:`.check`, :mod:`.runner`), and the card's serve lines are built
by :mod:`.serve_line`; docs/validate.md. This module is the engine's declaration (standard library only).
"""

from __future__ import annotations

from ..base import Engine

ENGINE = Engine(key="vllm", display="vLLM", extra="validate", order=10)
