"""The algorithm descriptions (``specconv/format/algorithms.py``) are the one owner of
per-algorithm facts: nobody else compares an algorithm's name, and each description's
dotted paths and facts agree with the code they name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from specconv.format.algorithms import ALGORITHMS, algorithm, find_algorithm

REPO = Path(__file__).resolve().parents[2]
OWNER = REPO / "specconv" / "format" / "algorithms.py"

#: file → name constants still compared there. Shrink-only: every entry goes to zero as the
#: switch moves into the description (issue 15 item 1); a stale count fails too.
ALLOWED: dict[str, int] = {}


def _flagged_constants(tree: ast.AST, names: set[str]) -> list[int]:
    """Line numbers of string constants equal to an algorithm name used as a comparison
    operand, a dict key, a ``match`` case or a set / tuple / list element."""
    lines: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            cands = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):
            cands = [k for k in node.keys if k is not None]
        elif isinstance(node, (ast.Set, ast.Tuple, ast.List)):
            cands = list(node.elts)
        elif isinstance(node, ast.match_case):
            cands = [node.pattern.value] if isinstance(node.pattern, ast.MatchValue) else []
        else:
            continue
        lines += [c.lineno for c in cands if isinstance(c, ast.Constant) and c.value in names]
    return lines


def _offenders() -> dict[str, list[int]]:
    names = set(ALGORITHMS)
    out: dict[str, list[int]] = {}
    for path in sorted((REPO / "specconv").rglob("*.py")):
        if path == OWNER:
            continue
        lines = _flagged_constants(ast.parse(path.read_text(encoding="utf-8")), names)
        if lines:
            out[path.relative_to(REPO).as_posix()] = lines
    return out


def test_no_code_outside_the_descriptions_switches_on_an_algorithm_name():
    found = {f: len(v) for f, v in _offenders().items()}
    new = {f: _offenders()[f] for f, n in found.items() if n > ALLOWED.get(f, 0)}
    assert not new, f"algorithm names compared outside specconv/format/algorithms.py (ask the description): {new}"
    stale = {f: (n, found.get(f, 0)) for f, n in ALLOWED.items() if found.get(f, 0) < n}
    assert not stale, f"lower these ALLOWED entries (allowed, found): {stale}"


def test_the_scan_flags_every_switch_shape():
    src = ('a == "dspark"\nx = {"peagle": 1}\ny = ("dflash",)\nmatch v:\n    case "dspark":\n        pass\n'
           'z = x in {"peagle"}\n"""dspark in a docstring"""\nw = "dflash"\n')
    assert sorted(_flagged_constants(ast.parse(src), set(ALGORITHMS))) == [1, 2, 3, 5, 7]


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_description_matches_the_config_class(name):
    alg = algorithm(name)
    cls = alg.config_type()
    assert cls.model_fields["speculators_model_type"].default == name
    assert cls.algorithm == name
    assert alg.architecture and alg.display_name and alg.aux_ids_key
    assert alg.block_drafter != alg.parallel_drafting


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_description_names_a_drafter_of_that_algorithm(name):
    pytest.importorskip("torch")
    assert algorithm(name).drafter_type().algorithm == name


def test_unknown_algorithm_is_refused_by_name():
    from specconv.errors import UnsupportedFormatError

    assert find_algorithm("eagle3") is None and find_algorithm(None) is None
    with pytest.raises(UnsupportedFormatError, match="'eagle3' is not supported"):
        algorithm("eagle3")


def test_job_facts_are_plain_json():
    import json

    from specconv.engines.vllm.check import job_facts

    for alg in ALGORITHMS.values():
        facts = json.loads(json.dumps(job_facts(alg)))
        assert facts["vllm"]["method"] == alg.vllm.method and facts["algorithm"] == alg.name
