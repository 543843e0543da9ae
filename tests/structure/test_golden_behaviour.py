"""Behaviour is unchanged: every case of ``tests/golden/capture.py`` recomputed and compared
with its committed golden file ``tests/golden/data/<group>/<case>.json``.

A case = one fixture conversion (every supported source format, option variants, the
bundled example), one refusal trigger, one bad input, or one other command (formats, push
``--dry-run`` against the loopback Hub double, validate; ``slow``: export onnx, release
``--dry-run``). Compared: exit codes, the ``--format json`` stdout key for key (error slug,
findings, messages), uncaught exceptions, files added / changed / removed, and the full
``config.json`` / ``specconv.json`` / card of every conversion (tensor files by sha256),
after the one normaliser ``tests/golden/normalise.py`` (paths, timestamps, durations,
library versions; floats only in the CPU-computed validate/export/release records).

On a failure the message names the case and each differing key path, golden vs now.

Regenerating — ONLY after an intended behaviour change, as a deliberate, reviewed act::

    PYTHONPATH=. .venv/bin/python tests/golden/capture.py [--group G] [--case C]
    git diff tests/golden/data      # review every changed line, commit with the change

``capture.py --check`` runs the same comparison outside pytest.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("speculators")  # the P-EAGLE / trainer fixtures are built by speculators 0.9.0
pytest.importorskip("dflash")  # the validate fixture's drafter is written by z-lab dflash
pytest.importorskip("onnxscript")

from golden import capture  # noqa: E402
from golden.normalise import Normaliser  # noqa: E402
from golden.workspace import Workspace  # noqa: E402
from specconv.converters import REGISTRY  # noqa: E402


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    w = Workspace(tmp_path_factory.mktemp("golden"))
    yield w
    w.close()


#: cases of a fast group that take more than ~1 s on a busy 2-core machine (a real validate run,
#: a push subprocess): ``slow`` in pytest only; capture.py and the golden files are unchanged.
SLOW_CASES = {"commands/validate", "commands/push_dry_run"}


def _cases():
    for group, g in capture.GROUPS.items():
        for case in capture.all_ids(group):
            markers, why_not = g.needs.get(case, ((), None))
            marks = [pytest.mark.slow] if g.slow or f"{group}/{case}" in SLOW_CASES else []
            marks += [getattr(pytest.mark, m) for m in markers]
            reason = why_not() if why_not is not None else None
            marks += [pytest.mark.skip(reason=reason)] if reason else []
            yield pytest.param(group, case, id=f"{group}/{case}", marks=marks)


@pytest.mark.parametrize("group, case", list(_cases()))
def test_behaviour_matches_golden(ws, group, case):
    problems = capture.check_case(ws, group, case)
    assert not problems, ("behaviour differs from the golden file (regenerate only for an intended change: "
                          "tests/golden/capture.py, then review git diff):\n  " + "\n  ".join(problems))


# ------------------------------------------------------------------- coverage of the goldens
def _goldens(group: str) -> dict[str, dict]:
    return {c: json.loads(capture.golden_path(group, c).read_text()) for c in capture.golden_ids(group)}


def _calls(rec) -> list[dict]:
    """Every CLI-call record (a dict with ``argv`` and ``exit_code``) inside a golden."""
    if isinstance(rec, dict):
        own = [rec] if "argv" in rec and "exit_code" in rec else []
        return own + [c for v in rec.values() for c in _calls(v)]
    return [c for v in rec for c in _calls(v)] if isinstance(rec, list) else []


def test_every_supported_format_has_a_conversion_golden():
    converted = {rec["convert"]["stdout"].get("format") for rec in _goldens("convert").values()
                 if rec["convert"]["exit_code"] == 0}
    missing = sorted(fid for fid, cls in REGISTRY.items() if cls.supported and fid not in converted)
    assert not missing, f"supported formats without a golden conversion (golden/cases_convert.py): {missing}"


def test_every_refused_format_has_a_refusal_golden():
    refused = {rec["inspect"]["stdout"].get("format") for rec in _goldens("refusals").values()
               if rec["inspect"]["exit_code"] == 3}
    missing = sorted(fid for fid, cls in REGISTRY.items() if not cls.supported and fid not in refused)
    assert not missing, f"refused formats without a refusal golden: {missing}"


def test_every_command_is_covered():
    from specconv.cli.main import cli

    seen = {" ".join(c["argv"][:2]) if c["argv"][0] == "export" else c["argv"][0]
            for g in capture.GROUPS for rec in _goldens(g).values() for c in _calls(rec)}
    commands = {f"export {sub}" if name == "export" else name
                for name, cmd in cli.commands.items() for sub in (getattr(cmd, "commands", None) or [None])}
    assert commands - seen == set(), f"commands no golden runs: {sorted(commands - seen)}"


# ------------------------------------------------------------------------- the harness itself
def test_diff_names_each_changed_key():
    golden = {"exit_code": 3, "stdout": {"error": "x", "findings": [{"code": "a"}]}, "gone": 1}
    now = {"exit_code": 3, "stdout": {"error": "y", "findings": [{"code": "a"}, {"code": "b"}]}, "new": 2}
    lines = capture.diff(golden, now)
    assert '.stdout.error: golden "x" ≠ now "y"' in lines
    assert any(ln.startswith(".stdout.findings: 1 items in golden, 2 now") for ln in lines)
    assert ".gone: missing now (golden 1)" in lines and ".new: new key (now 2)" in lines
    assert capture.diff({"a": 1}, {"a": 1.0}) == ['.a: golden 1 ≠ now 1.0']  # types count
    assert capture.diff(golden, json.loads(json.dumps(golden))) == []
    card = capture.diff({"md": ["# t", "| a | 1 |", "end"]}, {"md": ["# t", "| a | 2 |", "end"]})
    assert ".md: -| a | 1 |" in card and ".md: +| a | 2 |" in card  # a card diffs as text, line by line


def test_normaliser_replaces_only_run_specific_values(tmp_path):
    n = Normaliser({str(tmp_path): "<ROOT>"})
    rec = {"output": f"{tmp_path}/out", "duration_s": 1.5, "tpot_ms": 3.0, "created": "2026-01-02T03:04:05+00:00",
           "versions": {"torch": "2.13.0", "specconv": "0.1.0"}, "msg": f"see {tmp_path}/.o.tmp-123-ab_cd3fg",
           "tau": 1.25, "sha256": "0" * 64, "size": 10}
    assert n(rec) == {"output": "<ROOT>/out", "duration_s": "<volatile>", "tpot_ms": "<volatile>",
                      "created": "<volatile>", "versions": {"specconv": "0.1.0", "torch": "<version>"},
                      "msg": "see <ROOT>/.o.tmp-<pid>-<rand>", "tau": 1.25, "sha256": "0" * 64, "size": 10}
    loose = n.with_loose()(rec)
    assert (loose["tau"], loose["sha256"], loose["size"], loose["output"]) == ("<float>", "<digest>", "<size>",
                                                                             "<ROOT>/out")
