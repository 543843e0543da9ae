"""Typed stage results (specconv.results): types, attribute access only (no mapping API),
rendering, no schema build on convert's path."""

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
    assert r.format == "zlab_dflash" and "files" in r.to_dict() and r.extra("nope", 7) == 7
    assert sorted(r.files) == sorted(p.name for p in (tmp_path / "out").iterdir())
    assert "README.md" in r.files  # the card is written by convert itself, inside its temp dir
    for mapping in ("__getitem__", "__setitem__", "__contains__", "get", "keys"):
        assert not hasattr(r, mapping), mapping  # one shape: a result is read by attribute
    with pytest.raises(TypeError):
        r["format"]
    dry = api_convert(make_source(tmp_path / "b"), tiny_verifier_dir, None, dry_run=True)
    assert "files" not in dry and "files" not in dry.to_dict() and dry.exit_status() == 0


def test_inspect_result_exit_status(tmp_path):
    from specconv.convert import inspect_source
    from specconv.results import InspectResult

    ok = inspect_source(str(make_source(tmp_path)))
    assert isinstance(ok, InspectResult) and ok.exit_status() == 0
    InspectResult.model_validate(ok.to_dict())
    bad = inspect_source(str(make_source(tmp_path / "r", config_updates={"architectures": ["DFlash2BeamDraftModel"]})))
    assert bad.supported is False and bad.exit_status() == 3
    assert "supported: no" in bad.human()


def test_validation_report_exit_status_and_section(tmp_path):
    from specconv.record import ValidationSection
    from specconv.results import ValidationReport
    from specconv.validate.report import validation_section

    (tmp_path / "config.json").write_text("{}")
    rep = ValidationReport.of({"gates": {"structure": True, "parity": False}, "passed": False,
                               "device": {"device": "cpu"},
                               "prompts": {"set": "eval", "n": 2, "ids": ["a", "b"]}, "verifier": HUB,
                               "gate_results": [{"name": "parity", "passed": False, "status": "failed", "errors": [],
                                                 "warnings": [], "details": {"kl_max": 0.25}, "skipped_reason": None}],
                               "lossless": {"exact_match": 1.0, "n": 2, "first_div": [], "near_tie": []},
                               "versions": {"torch": "2.0"}})
    assert rep.failed_gates() == ["parity"] and rep.exit_status() == 4
    s = validation_section(rep, tmp_path)
    assert isinstance(s, ValidationSection)
    assert s.device == "cpu" and s.prompts.model_dump() == {"set": "eval", "n": 2,
                                                            "rendered_sha256": None} and s.verifier == HUB
    assert (s.parity_kl_max, s.lossless_exact_match, s.versions) == (0.25, 1.0, {"torch": "2.0"})
    assert set(s.files) == {"config.json"} and s.report is None
    err = rep.gate_failure()
    assert err.exit_code == 4 and err.result is rep and "parity" in err.message
    assert rep.to_dict()["error"] == "gate_failed" and rep.exit_code == 4
    ValidationReport.model_validate(rep.to_dict())
    ok = ValidationReport.of({"gates": {"structure": True}, "passed": True})
    assert ok.gate_failure() is None and "error" not in ok.to_dict()
    load_failed = ValidationReport.of({"gates": {"structure": True}, "passed": False, "vllm_load": {"ok": False}})
    assert load_failed.failed_gates() == ["vllm_load"] and load_failed.exit_status() == 4


def test_every_command_result_renders_json_and_human():
    """The results of build-engine, export onnx, push and release are typed too (one shape:
    ``to_json`` for ``--format json``, ``human`` for ``--format human``; aliased fields
    print under their JSON names)."""
    from specconv.results import BuildEngineResult, ExportOnnxResult, PushResult, ReleaseResult

    push = PushResult.of({"schema": "specconv.publish/v1", "status": "dry_run", "repo_id": "a/b", "revision": "main",
                          "files": [{"action": "add", "path": "x"}], "would_change": True, "detailed_exitcode": True})
    assert json.loads(push.to_json())["schema"] == "specconv.publish/v1" and push.exit_status() == 10
    assert "add       x" in push.human()
    rel = ReleaseResult.of({"schema": "specconv.release/v1", "status": "running", "steps": [], "exit_code": 0})
    rel.validate_ = {"acceptance_length": 2.5, "tau_ci95": None, "gates": {}, "parity_kl_max": 0.01}
    assert set(json.loads(rel.to_json())) == {"schema", "status", "steps", "exit_code", "validate"}
    ReleaseResult.model_validate(rel.to_dict())
    eng = BuildEngineResult.of({"path": "/d/trt/k", "plan_bytes": 3, "builder": "rtx", "trt_version": "1", "dtype": "f",
                                "manifest": "/d/trt/manifest.json", "variants": ["k"], "extra_key": 1})
    assert "1 variant(s)" in eng.human() and json.loads(eng.to_json())["extra_key"] == 1
    exp = ExportOnnxResult.of({"output": "/d/onnx", "algorithm": "dflash", "dtype": "float16", "opset": 23,
                               "block_size": 4, "dynamic": {"batch": {"max": 2}, "context": {"max": 16}},
                               "contains_verifier_weights": True, "parity": None, "checked": False})
    assert "not checked (--no-check)" in exp.human()


@pytest.mark.slow
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


def test_export_gguf_human_names_the_llama_server_commit_and_accepted_tokens():
    """``export gguf``'s check line names the llama-server commit the check ran (the command's
    check keeps it under ``server``, the record's brief under ``llama_server``) and counts
    accepted draft *tokens* (``num_accepted_tokens``), as docs/llamacpp.md does."""
    from specconv.results import ExportGgufResult

    check = {"passed": True, "lossless": True, "tau": 1.391, "num_drafts": 87, "num_accepted_tokens": 34}
    for srv in ({"server": {"binary": "/x/llama-server", "commit": "0c1e570"}},
                {"llama_server": {"commit": "0c1e570"}}):
        line = ExportGgufResult.of({"output": "/d/gguf", "file": "drafter-bf16.gguf",
                                    "check": {**check, **srv}}).human()
        assert "llama-server 0c1e570:" in line and "34 draft tokens accepted" in line, line


def test_validation_human_onnx_line_says_what_its_counts_are():
    from specconv.results import ValidationReport

    ox = {"onnx": {"acceptance_length": 1.5}, "torch": {"acceptance_length": 1.5}, "tokens_identical": True,
          "drafts": {"mismatches": 2, "near_tie_mismatches": 1, "near_ties": 3}}
    text = ValidationReport.of({"gates": {}, "passed": True, "onnx": ox}).human()
    assert "draft mismatches 2 (1 of them at a near-tie; 3 near-ties in all)" in text


def test_validation_human_has_the_served_engines_line():
    """``--backend llamacpp``: the served τ against the torch loop's, the band and G4 on one line."""
    from specconv.results import ValidationReport

    sec = {"tau": 1.70, "tau_torch": 1.76, "band": 0.05, "lossless": True, "delta": -0.06}
    text = ValidationReport.of({"gates": {}, "passed": False, "llamacpp_serve": sec}).human()
    assert "llamacpp:  τ 1.700 (served) vs 1.760 (torch), OUTSIDE ±0.050; lossless True" in text, text
    sec["tau"] = 1.75
    text = ValidationReport.of({"gates": {}, "passed": True, "llamacpp_serve": sec}).human()
    assert "vs 1.760 (torch), within ±0.050" in text, text
