"""The lint's ``vllm serve`` hint (format may not import engines) is the card's long form, word for word."""

from __future__ import annotations

import shlex
from types import SimpleNamespace

import pytest

from specconv.engines.vllm.serve_line import long_form_argv, shell_command
from specconv.format.algorithms import ALGORITHMS
from specconv.format.rules.envelope_rules import serve_hint


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
@pytest.mark.parametrize("k", [1, 7])
def test_the_lint_hint_is_the_long_form_the_card_prints(name, k):
    ctx = SimpleNamespace(alg=ALGORITHMS[name], algo=name, cfg=SimpleNamespace(speculative_tokens=k))
    hint = serve_hint(ctx)
    assert hint == shell_command(long_form_argv("<verifier>", "<draft_dir>", name, k), wrap=False)
    assert shlex.split(hint) == long_form_argv("<verifier>", "<draft_dir>", name, k)
