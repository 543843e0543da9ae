"""The nested values of the results and of ``specconv.json`` are typed (``specconv.results.shapes``):
results of real stage runs validate against their models, a wrongly typed or missing value is
rejected, and every result the CLI renders in the suite is checked (``cli_runner.check_result``)."""

from __future__ import annotations

import copy
import json

import pytest
from pydantic import ValidationError

from cli_runner import check_result, invoke
from fixtures_dflash import api_convert, make_source


def _rejected(model, data: dict, change) -> str:
    """``change(copy of data)`` no longer validates; returns the error text."""
    bad = copy.deepcopy(data)
    change(bad)
    with pytest.raises(ValidationError) as e:
        model.model_validate(bad)
    return str(e.value)


def test_a_real_conversion_validates_and_a_wrong_nested_type_is_rejected(tiny_verifier_dir, tmp_path):
    from specconv.record import SpecconvRecord, read_record
    from specconv.results import ConversionResult

    r = api_convert(make_source(tmp_path), tiny_verifier_dir, tmp_path / "out")
    data = r.to_dict()
    again = ConversionResult.model_validate(data)
    assert again.plan["layer_ids"] is not None and again.to_json() == r.to_json()
    assert "plan.fates.copied" in _rejected(ConversionResult, data, lambda d: d["plan"]["fates"].update(copied="all"))
    assert "plan.bytes" in _rejected(ConversionResult, data, lambda d: d["plan"].pop("bytes"))
    assert "plan.layer_ids.speculators_ids" in _rejected(
        ConversionResult, data, lambda d: d["plan"]["layer_ids"].update(speculators_ids="1,2"))
    finding = {"level": "fatal", "code": "x", "message": "m", "key": None}
    assert "findings.0.level" in _rejected(ConversionResult, data, lambda d: d["findings"].append(finding))

    # the record the same run wrote: typed nested sections, the file round-trips unchanged
    text = (tmp_path / "out" / "specconv.json").read_text()
    rec = read_record(tmp_path / "out")
    assert rec.conversion is not None and rec.conversion.layer_ids is not None
    assert rec.to_json() == text
    raw = json.loads(text)
    name = next(iter(raw["conversion"]["tensors"]))
    assert "shape" in _rejected(SpecconvRecord, raw, lambda d: d["conversion"]["tensors"][name].update(shape="4x4"))
    assert "findings" in _rejected(SpecconvRecord, raw, lambda d: d["conversion"]["findings"].append(finding))
    assert "layer_ids" in _rejected(SpecconvRecord, raw, lambda d: d["conversion"]["layer_ids"].pop("rule"))


def test_a_real_inspect_and_formats_validate(tiny_verifier_dir, tmp_path):
    from specconv.cli.formats import formats_table
    from specconv.convert import inspect_source
    from specconv.results import FormatsResult, InspectResult

    ins = inspect_source(str(make_source(tmp_path)), verifier=str(tiny_verifier_dir), scan=True)
    data = ins.to_dict()
    assert data["plan"] is not None and data["nonfinite"] == []
    InspectResult.model_validate(data)
    row = {"tensor": "w", "dtype": "F32", "count": "some", "numel": 4, "first_index": [0]}
    assert "nonfinite.0.count" in _rejected(InspectResult, data, lambda d: d["nonfinite"].append(row))
    fmts = FormatsResult.of({"formats": formats_table()})
    FormatsResult.model_validate(fmts.to_dict())
    assert "formats.0.supported" in _rejected(FormatsResult, fmts.to_dict(),
                                              lambda d: d["formats"][0].update(supported="maybe"))


def test_a_real_validation_report_validates(validate_set_copy, tmp_path):
    from specconv.validate.run import ValidateOptions, validate_drafter

    vs = validate_set_copy
    rep = validate_drafter(vs["spec"], str(vs["verifier"]), ValidateOptions(
        source=str(vs["zlab"]), prompts=str(vs["prompts"]), num_prompts=1, max_new_tokens=4),
        report_dir=tmp_path / "report")
    data = rep.to_dict()
    assert {"gate_results", "device", "prompts", "chat_template", "lossless", "source_metrics"} <= data.keys()
    check_result(rep)
    model = type(rep)
    assert "gate_results.0.status" in _rejected(model, data, lambda d: d["gate_results"][0].update(status="fine"))
    assert "lossless.near_tie" in _rejected(model, data, lambda d: d["lossless"].update(near_tie=[{"at": 1}]))
    assert "prompts.n" in _rejected(model, data, lambda d: d["prompts"].update(n="one"))
    assert "chat_template.source" in _rejected(model, data, lambda d: d["chat_template"].pop("source"))
    assert "source_metrics.num_drafts" in _rejected(model, data,
                                                     lambda d: d["source_metrics"].update(num_drafts=[1]))


def test_unknown_nested_keys_are_kept():
    """``extra="allow"`` on every shape: a key a producer adds is kept, so the JSON is unchanged."""
    from specconv.results import PushResult

    push = PushResult.of({"status": "dry_run", "files": [{"path": "x", "size": 1, "sha256": "0" * 64,
                                                          "action": "add", "lfs": True}]})
    again = PushResult.model_validate(push.to_dict())
    assert again.to_json() == push.to_json() and again.files[0]["lfs"] is True  # type: ignore[typeddict-item]


def test_the_cli_runner_checks_every_rendered_result(monkeypatch):
    """``invoke`` validates what the command renders: a producer's wrong type fails the test."""
    from specconv.cli import formats

    rows = formats.formats_table()
    assert invoke("formats").code == 0
    monkeypatch.setattr(formats, "formats_table", lambda: [{**rows[0], "supported": "maybe"}, *rows[1:]])
    with pytest.raises(ValidationError, match="formats.0.supported"):
        invoke("formats")
