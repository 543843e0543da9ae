"""SGLang as a real consumer: load drafter dirs with SGLang 0.5.23's own loader.

``runner.py`` runs inside the SGLang interpreter (``.venv-sglang``, ``make sglang-venv``)
and imports nothing from specconv; see docs/engines.md ("SGLang loader venv").
"""
