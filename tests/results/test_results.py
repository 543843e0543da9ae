"""Typed stage results (specconv.results): types, mapping access, rendering, no schema
build on convert's path."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fixtures_dflash import HUB, api_convert, make_source


def test_conversion_result_is_typed_and_validates(tiny_verifier_dir, tmp_path):
    from specconv.results import ConversionResult

    r = api_convert(make_source(tmp_path), tiny_verifier_dir, tmp_path / "out")
    assert isinstance(r, ConversionResult)
    again = ConversionResult.model_validate(r.to_dict())  # the declared types hold
    assert again.to_dict() == r.to_dict()
    assert r["format"] == r.format == "zlab_dflash" and "files" in r and r.get("nope", 7) == 7
    assert sorted(r.files) == sorted(p.name for p in (tmp_path / "out").iterdir())
    with pytest.raises(KeyError):
        r["nope"]
    dry = api_convert(make_source(tmp_path / "b"), tiny_verifier_dir, None, dry_run=True)
    assert "files" not in dry and "files" not in dry.to_dict() and dry.exit_status() == 0


def test_inspect_result_exit_status(tmp_path):
    from specconv.convert import inspect_source
    from specconv.results import InspectResult

    ok = inspect_source(str(make_source(tmp_path)))
    assert isinstance(ok, InspectResult) and ok.exit_status() == 0
    InspectResult.model_validate(ok.to_dict())
    bad = inspect_source(str(make_source(tmp_path / "r", config_updates={"architectures": ["DFlash2DraftModel"]})))
    assert bad.supported is False and bad.exit_status() == 3
    assert "supported: no" in bad.human()


def test_validation_report_exit_status_and_summary():
    from specconv.results import ValidationReport

    rep = ValidationReport.of({"gates": {"structure": True, "parity": False}, "passed": False, "device": {"device": "cpu"},
                               "prompts": {"set": "eval", "n": 2, "ids": ["a", "b"]}, "verifier": HUB})
    assert rep.failed_gates() == ["parity"] and rep.exit_status() == 4
    s = rep.record_summary()
    assert s["device"] == "cpu" and s["prompts"] == {"set": "eval", "n": 2} and s["verifier"] == HUB
    rep["error"] = "gate_failed"
    assert rep.to_dict()["error"] == "gate_failed"
    ValidationReport.model_validate(rep.to_dict())


def test_convert_builds_no_pydantic_schema_for_results_or_record(tiny_verifier_dir, tmp_path):
    """Deferred builds: a whole conversion leaves the result/record schemas unbuilt."""
    src = make_source(tmp_path)
    code = (
        "import json, sys\n"
        "from specconv.convert import convert\n"
        f"r = convert({str(src)!r}, verifier={str(tiny_verifier_dir)!r}, output={str(tmp_path / 'o')!r})\n"
        "from specconv import record, results\n"
        "built = [c.__name__ for c in (results.ConversionResult, record.SpecconvRecord, record.ConversionSection)\n"
        "         if c.__pydantic_complete__]\n"
        "print(json.dumps({'built': built, 'files': r.files}))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["built"] == [] and "specconv.json" in out["files"]
