"""specconv.json through specconv.record: schema, round trip, atomic section updates."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest

from specconv.errors import InvalidInputError, UsageError
from specconv.record import SCHEMA_VERSION, SpecconvRecord, ValidationSection, file_hashes, read_record, update_record


def _write(d, data):
    (d / "specconv.json").write_text(json.dumps(data))


def test_unknown_sections_and_keys_round_trip(tmp_path):
    data = {"schema_version": 1, "specconv_version": "0.1.0",
            "conversion": {"format": "zlab_dflash", "source": {"path": "../src", "files": {}}, "future_key": [1]},
            "release": {"tag": "v1"}, "export": {"onnx": {"opset": 20}}}
    _write(tmp_path, data)
    rec = read_record(tmp_path)
    assert rec.schema_version == 1 and rec.conversion.format == "zlab_dflash"
    assert json.loads(rec.to_json()) == data
    update_record(tmp_path, "publish", {"repo_id": "me/drafter", "revision": "abc"})
    after = json.loads((tmp_path / "specconv.json").read_text())
    assert after == {**data, "publish": {"repo_id": "me/drafter", "revision": "abc"}}


def test_export_and_publish_keys_are_typed_and_one_key_update_writes_only_what_was_set(tmp_path):
    from specconv.record import update_section_key
    from specconv.results import GgufExport, SglangExport

    _write(tmp_path, {"export": {"sglang": {"output": "sglang", "launch": None, "files": {"config.json": "ab"}}}})
    update_section_key(tmp_path, "export", "gguf", {"file": "d.gguf", "spec_draft_n_max": 7, "check": {"passed": True}})
    update_section_key(tmp_path, "publish", "sglang", {"repo_id": "me/d-sglang", "status": "published"})
    assert json.loads((tmp_path / "specconv.json").read_text()) == {  # no key nobody set (e.g. "onnx": null)
        "export": {"sglang": {"output": "sglang", "launch": None, "files": {"config.json": "ab"}},
                   "gguf": {"file": "d.gguf", "spec_draft_n_max": 7, "check": {"passed": True}}},
        "publish": {"sglang": {"repo_id": "me/d-sglang", "status": "published"}}}
    rec = read_record(tmp_path)
    assert isinstance(rec.export.gguf, GgufExport) and rec.export.gguf.spec_draft_n_max == 7
    assert isinstance(rec.export.sglang, SglangExport) and rec.export.sglang.files == {"config.json": "ab"}
    assert rec.export.onnx is None and rec.publish.sglang.repo_id == "me/d-sglang" and rec.publish.repo_id is None
    with pytest.raises(InvalidInputError):  # typed: a wrong type is refused, the file left as it was
        update_section_key(tmp_path, "export", "gguf", {"spec_draft_n_max": "seven"})
    assert read_record(tmp_path).export.gguf.spec_draft_n_max == 7


def test_update_replaces_one_section_atomically(tmp_path, monkeypatch):
    fresh = tmp_path / "fresh"  # no record yet: one holding only this section
    fresh.mkdir()
    update_record(fresh, "validation", {"passed": True})
    assert json.loads((fresh / "specconv.json").read_text()) == {"validation": {"passed": True}}
    shutil.rmtree(fresh)
    _write(tmp_path, {"schema_version": 1, "conversion": {"format": "x"}, "validation": {"old": 1}})
    update_record(tmp_path, "validation", ValidationSection(passed=True, gates={"structure": True}))
    after = json.loads((tmp_path / "specconv.json").read_text())
    assert after["validation"] == {"passed": True, "gates": {"structure": True}}
    assert after["conversion"] == {"format": "x"}
    assert [p.name for p in tmp_path.iterdir()] == ["specconv.json"]  # no temp file left

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    before = (tmp_path / "specconv.json").read_text()
    with pytest.raises(OSError):
        update_record(tmp_path, "validation", {"passed": False})
    assert (tmp_path / "specconv.json").read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["specconv.json"]


def test_absolute_paths_are_refused(tmp_path):
    with pytest.raises(InvalidInputError, match="report"):
        update_record(tmp_path, "validation", {"report": str(tmp_path / "validation.json")})
    assert not (tmp_path / "specconv.json").exists()
    _write(tmp_path, {"schema_version": 1, "conversion": {"source": {"path": "/abs/src"}}})
    with pytest.raises(InvalidInputError, match="source.path"):
        read_record(tmp_path)


def test_legacy_flat_record_is_read_as_conversion(tmp_path):
    flat = {"format": "zlab_dflash", "algorithm": "dflash", "source": {"path": "/abs/src", "files": {"a": "0" * 64}},
            "options": {"dtype": "keep"}, "validation": {"x": 1}}
    _write(tmp_path, flat)
    rec = read_record(tmp_path)
    assert rec.schema_version is None and rec.conversion.format == "zlab_dflash"
    assert rec.conversion.source.path == "/abs/src" and rec.conversion.options == {"dtype": "keep"}
    update_record(tmp_path, "validation", {"passed": True})
    assert json.loads((tmp_path / "specconv.json").read_text()) == {**flat, "validation": {"passed": True}}


def test_bad_files_and_section_names(tmp_path):
    with pytest.raises(InvalidInputError):
        read_record(tmp_path)
    assert read_record(tmp_path, missing_ok=True) == SpecconvRecord()
    with pytest.raises(UsageError):
        update_record(tmp_path, "nonsense", {})
    (tmp_path / "specconv.json").write_text("[1]")
    with pytest.raises(InvalidInputError):
        update_record(tmp_path, "validation", {})
    assert (tmp_path / "specconv.json").read_text() == "[1]"
    _write(tmp_path, {"schema_version": 1, "validation": {"gates": {"structure": "maybe"}}})
    with pytest.raises(InvalidInputError, match="gates"):
        read_record(tmp_path)


def test_file_hashes_cover_config_weights_index(tmp_path):
    for name in ("config.json", "model-00001-of-00002.safetensors", "model.safetensors.index.json", "README.md"):
        (tmp_path / name).write_bytes(name.encode())
    h = file_hashes(tmp_path)
    assert sorted(h) == ["config.json", "model-00001-of-00002.safetensors", "model.safetensors.index.json"]
    assert h["config.json"] == hashlib.sha256(b"config.json").hexdigest()


def test_convert_writes_a_versioned_relative_record(tiny_verifier_dir, tmp_path):
    from fixtures_dflash import api_convert, make_source

    src = make_source(tmp_path)
    out = tmp_path / "nested" / "out"
    api_convert(src, tiny_verifier_dir, out)
    raw = json.loads((out / "specconv.json").read_text())
    assert raw["schema_version"] == SCHEMA_VERSION and set(raw) == {"schema_version", "specconv_version", "conversion"}
    rec = read_record(out)
    assert (out / rec.conversion.source.path).resolve() == src.resolve()
    assert not os.path.isabs(rec.conversion.verifier.spec)
    assert (out / rec.conversion.verifier.spec).resolve() == tiny_verifier_dir.resolve()
    assert rec.to_json() == (out / "specconv.json").read_text()
