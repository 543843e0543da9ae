"""specconv.format: target facts in one place, the finding-code registry, the rule registry.

The structural tests read the source with ``ast`` (no import side effects): every finding
code any module of specconv or its converters writes is registered with the level it is
written at, lint rules are one function each of at most 40 lines, and the package keeps
the size limits (functions <= 50 lines, modules <= 800 lines).
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from specconv.format import (
    CODES,
    LINT_RULES,
    legacy_sample_from_anchor,
    speculative_tokens_for,
    speculators_envelope,
)
from specconv.format.rules import RULES

ROOT = Path(__file__).resolve().parents[2]
KEBAB = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)+$")
LEVELS = {"error", "warning", "info"}


def _sources() -> list[Path]:
    return sorted((ROOT / "specconv").rglob("*.py"))


def _str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _written_codes() -> list[tuple[str, str, str]]:
    """(level, code, where) of every ``Finding("level", "code", ...)`` call and every
    ``("level", "code", "message")`` tuple literal in the sources."""
    out = []
    for path in _sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            args: list[ast.AST] = []
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Finding":
                args = list(node.args[:2])
            elif isinstance(node, ast.Tuple) and len(node.elts) == 3 and _str(node.elts[2]) not in LEVELS:
                args = list(node.elts[:2])
            if len(args) == 2 and _str(args[0]) in LEVELS and _str(args[1]) is not None:
                out.append((_str(args[0]), _str(args[1]), f"{path.relative_to(ROOT)}:{node.lineno}"))
    return out


def test_every_written_code_is_registered_at_its_level():
    written = _written_codes()
    assert len(written) > 20  # the scan sees the converters' findings
    wrong = [(lvl, code, where, CODES.get(code)) for lvl, code, where in written
             if code not in CODES or CODES[code].level != lvl]
    assert not wrong, wrong


def test_registry_codes_are_kebab_case_with_a_doc():
    for code, info in CODES.items():
        assert KEBAB.match(code), code
        assert info.level in LEVELS and info.doc and info.origin in ("lint", "dir", "converter", "validate")
    assert set(LINT_RULES) == {c for c, i in CODES.items() if i.origin in ("lint", "dir")}


def test_every_lint_code_has_a_rule():
    ruled = {r.code for r in RULES}
    lint_codes = {c for c, i in CODES.items() if i.origin == "lint"}
    assert ruled == lint_codes, (lint_codes - ruled, ruled - lint_codes)
    for r in RULES:
        assert CODES[r.code].level == r.level


def test_rule_decorator_refuses_a_level_the_registry_does_not_say():
    from specconv.format.rules.registry import rule

    with pytest.raises(ValueError, match="registry"):
        rule("speculative-tokens-mismatch", "warning")
    with pytest.raises(ValueError, match="registry"):
        rule("no-such-code", "error")


def test_rules_are_short_functions():
    long = []
    for r in RULES:
        if r.fn.__name__ == "<lambda>":  # the per-code tensor presence registrations
            continue
        n = len(inspect.getsource(r.fn).splitlines())
        if n > 40:
            long.append((r.code, n))
    assert not long, long


def test_format_package_size_limits():
    for path in sorted((ROOT / "specconv" / "format").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert len(text.splitlines()) <= 800, path
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                assert n <= 50, f"{path.name}:{node.name} has {n} lines"


def test_no_citations_of_files_outside_the_repo():
    files = [*(ROOT / "specconv" / "format").rglob("*.py"), ROOT / "specconv" / "drafters" / "loader.py"]
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert "speculators_format.md" not in text and "§" not in text, path


# ---------------------------------------------------------------- the K rule, written once


@pytest.mark.parametrize("block,sfa,k", [(8, False, 7), (8, True, 8), (16, False, 15), (2, False, 1)])
def test_k_rule(block, sfa, k):
    assert speculative_tokens_for(block, sfa) == k
    assert legacy_sample_from_anchor(block, k) is sfa


@pytest.mark.parametrize("k", [6, 9, 0, None, "7", True, 7.0])
def test_legacy_rule_undecidable(k):
    assert legacy_sample_from_anchor(8, k) is None


def test_k_rule_is_not_restated():
    """No module writes ``block if sfa else block - 1`` by hand any more."""
    pat = re.compile(r"\b(\w+) if (\w+) else \1 - 1\b")
    hits = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in _sources() if p.name != "facts.py"
            for m in pat.finditer(p.read_text(encoding="utf-8"))]
    assert not hits, hits


def test_envelope_is_what_make_config_writes():
    from specconv.format import config_to_dict, make_config

    tlc = {"model_type": "qwen3", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    cfg = make_config("dflash", transformer_layer_config=tlc, verifier_name_or_path="org/v",
                      verifier_architectures=["Qwen3ForCausalLM"], block_size=6, aux_hidden_state_layer_ids=[1])
    assert config_to_dict(cfg)["speculators_config"] == speculators_envelope("dflash", 5, "org/v", ["Qwen3ForCausalLM"])


def test_one_reader_for_config_json(tmp_path):
    import json

    from specconv.errors import InvalidInputError
    from specconv.format import read_config, speculators_model_type_of

    assert speculators_model_type_of(tmp_path) is None  # no config.json
    (tmp_path / "config.json").write_text("{not json")
    assert speculators_model_type_of(tmp_path) is None
    with pytest.raises(InvalidInputError, match="JSON"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps([1]))
    with pytest.raises(InvalidInputError, match="object"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert speculators_model_type_of(tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    assert speculators_model_type_of(tmp_path / "config.json") == "eagle3"
    assert read_config(tmp_path) == {"speculators_model_type": "eagle3"}


def test_docs_findings_md_is_the_registry():
    from specconv.format.findings import codes_markdown

    doc = (ROOT / "docs" / "findings.md").read_text(encoding="utf-8")
    assert doc == codes_markdown(), "regenerate docs/findings.md (see codes_markdown's docstring)"


@pytest.mark.parametrize("algo", ["peagle", "dflash", "dspark"])
def test_expected_tensor_names_are_the_names_converters_accept(algo):
    """One description of the target's tensor names: every tensor ``expected_tensors``
    lists for a config matches the patterns the converters accept for that algorithm
    (``specconv/format/names.py``)."""
    import re

    from test_schema import EXAMPLES

    from specconv.format import expected_tensors, parse_config
    from specconv.format.algorithms import ALGORITHMS

    pats = ALGORITHMS[algo].tensor_patterns
    names = list(expected_tensors(parse_config(EXAMPLES[algo])))
    assert names and all(any(re.fullmatch(p, n) for p in pats) for n in names), names



def test_format_package_loads_names_on_first_use():
    """The converter registry imports the tensor-name patterns without pydantic."""
    import subprocess
    import sys

    code = "import sys, specconv.converters, specconv.format.names; print('pydantic' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"
