"""The ``vllm serve`` command lines of a Speculators drafter, built in one place.

The ``--speculative-config`` keys come from the algorithm's description
(:meth:`.algorithms.VllmFacts.speculative_config`); this module turns them into argv and
into the shell text a user copies. The model card prints :func:`shell_command` of these argvs, ``--backend vllm``
runs :func:`long_form_argv`, the lint's hints quote it, and the tests hand vLLM exactly what
the card's text parses to with ``shlex.split`` (``tests/vllm_check/test_vllm_load.py``,
``tests/validate/test_vllm_serve.py``). Standard library only.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence

from ...format.algorithms import algorithm as describe

__all__ = ["long_form_argv", "shell_command", "short_form_argv", "speculative_config_json"]


def speculative_config_json(algorithm: str, model: str, speculative_tokens: int) -> str:
    """The ``--speculative-config`` value (JSON text, keys in
    :meth:`.algorithms.VllmFacts.speculative_config` order: ``model``, ``method``,
    ``num_speculative_tokens``, the flags) that serves ``model``.

    Raises:
        UnsupportedFormatError: not an algorithm specconv describes.
    """
    return json.dumps(describe(algorithm).vllm.speculative_config(model, speculative_tokens))


def long_form_argv(verifier: str, model: str, algorithm: str, speculative_tokens: int) -> list[str]:
    """``vllm serve VERIFIER --speculative-config JSON``: the form that works for any verifier
    (a Hub id or a local dir).

    Args:
        verifier: the verifier as vLLM is to find it (Hub id or local dir).
        model: the drafter (Hub id or local dir), the JSON's ``model``.
        algorithm: ``speculators_model_type`` of the drafter.
        speculative_tokens: K.

    Raises:
        UnsupportedFormatError: not an algorithm specconv describes.
    """
    return ["vllm", "serve", verifier, "--speculative-config",
            speculative_config_json(algorithm, model, speculative_tokens)]


def short_form_argv(drafter: str) -> list[str]:
    """``vllm serve DRAFTER``: vLLM reads the verifier from the drafter's config (vLLM 0.33
    ``vllm/transformers_utils/config.py``: only when that verifier is a Hub repo id)."""
    return ["vllm", "serve", drafter]


def shell_command(argv: Sequence[str], *, wrap: bool = True) -> str:
    """``argv`` as POSIX shell text: every word quoted where needed (``shlex.quote``), so
    ``shlex.split`` of the text (continuations removed) gives ``argv`` back.

    Args:
        argv: the words.
        wrap: start every ``--option`` on a continuation line (`` \\`` + newline + two spaces).
    """
    lines: list[list[str]] = [[]]
    for word in argv:
        if wrap and word.startswith("--") and lines[-1]:
            lines.append([])
        lines[-1].append(shlex.quote(word))
    return " \\\n  ".join(" ".join(line) for line in lines)
