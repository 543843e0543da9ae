"""Hostile / careless inputs on the newer commands (push, release, export, build-engine):
each must end with one JSON error object on stdout, a stable exit code, no Hub write and
nothing half-written. Conversions only (no validation runs): fast."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")

from cli_runner import invoke, run_online
from hub_double import HubDouble

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2-dflash-b8"
TOKEN = "hf_specconvFAKEtoken0123456789abcdef"


@pytest.fixture(scope="module")
def double():
    d = HubDouble(token=TOKEN).start()
    yield d
    d.stop()


@pytest.fixture
def converted(bundled_drafter) -> Path:
    """conftest's shared conversion of the bundled drafter (push dry runs and refusals only read it)."""
    return bundled_drafter


def _hub_env(double) -> dict:
    return {"HF_ENDPOINT": double.url, "HF_TOKEN": TOKEN, "HF_HUB_DISABLE_XET": "1"}


@pytest.mark.parametrize("tag", ["bad tag", "../x", "notaversion", "v", " v1.0"])
def test_push_tag_that_is_not_a_version_is_refused_before_any_request(converted, double, tag):
    n = len(double.requests)
    code, out = invoke("push", converted, "--repo-id", "specconv-test/tags", "--allow-unvalidated",
                       "--tag", tag, env=_hub_env(double)).code_json
    assert code == 2 and out["error"] == "usage" and "not a version" in out["message"], out
    assert len(double.requests) == n


def test_release_with_a_bad_tag_converts_nothing(double, tmp_path, smollm2_dir):
    work = tmp_path / "work"
    code, out = invoke("release", EXAMPLE, "--verifier", smollm2_dir, "--repo-id", "specconv-test/rel",
                       "--work-dir", work, "--tag", "release one", env=_hub_env(double)).code_json
    assert code == 2 and out["error"] == "usage", out
    assert not work.exists()


def test_push_accepts_a_version_tag_in_a_dry_run(converted, double, tmp_path):
    code, out = run_online(double.url, tmp_path / "hf-home", "push", converted, "--repo-id", "specconv-test/tags-ok",
                           "--allow-unvalidated", "--tag", "v1.2.3", "--dry-run", token=TOKEN).code_json
    assert code == 0 and out["status"] == "dry_run" and out["tag"] == "v1.2.3", out


@pytest.mark.slow
def test_push_dry_run_offline_is_exit_3_with_a_hint_for_a_push(converted, double, tmp_path):
    """``HF_HUB_OFFLINE=1`` (the Makefile's default): a push reads the remote state even for
    ``--dry-run``; the hint says to go online, not to fill a download cache."""
    code, out = run_online(double.url, tmp_path / "hf-home", "push", converted, "--repo-id", "specconv-test/offline",
                           "--allow-unvalidated", "--dry-run", token=TOKEN, HF_HUB_OFFLINE="1").code_json
    assert code == 3 and "HF_HUB_OFFLINE" in out["hint"], out
    assert "cache" not in out["hint"] and "hf download" not in out["hint"], out


@pytest.mark.parametrize("flt", [("--exclude", "*"), ("--include", "nomatch*"), ("--exclude", "*.safetensors")])
def test_filters_that_drop_the_drafter_are_refused_even_unvalidated(converted, double, flt):
    n = len(double.requests)
    code, out = invoke("push", converted, "--repo-id", "specconv-test/filters", "--allow-unvalidated",
                       "--dry-run", *flt, env=_hub_env(double)).code_json
    assert code == 2 and out["error"] == "filter_drops_drafter", out
    assert "model.safetensors" in out["message"]
    assert len(double.requests) == n


def test_filters_that_drop_only_extra_files_still_plan(converted, double, tmp_path):
    d = tmp_path / "d"
    shutil.copytree(converted, d)
    (d / "notes.txt").write_text("scratch\n")
    code, out = run_online(double.url, tmp_path / "hf-home", "push", d, "--repo-id", "specconv-test/filters-ok",
                           "--allow-unvalidated", "--dry-run", "--exclude", "notes.txt", token=TOKEN).code_json
    assert code == 0, out
    paths = {f["path"] for f in out["files"]}
    assert "model.safetensors" in paths and "config.json" in paths and "notes.txt" not in paths


def test_release_never_replaces_a_foreign_work_dir_drafter(double, tmp_path, smollm2_dir, converted):
    from specconv.outdir import check_replaceable

    keep = tmp_path / "work" / "drafter" / "keep.txt"
    keep.parent.mkdir(parents=True)
    keep.write_text("mine\n")
    code, out = invoke("release", EXAMPLE, "--verifier", smollm2_dir, "--verifier-name",
                       "HuggingFaceTB/SmolLM2-135M-Instruct", "--repo-id", "specconv-test/rel",
                       "--work-dir", tmp_path / "work", "--dry-run", env=_hub_env(double)).code_json
    assert code == 3 and out["error"] == "output_exists" and out["failed_step"] == "convert", out
    assert keep.read_text() == "mine\n" and sorted(p.name for p in keep.parent.iterdir()) == ["keep.txt"]
    check_replaceable(converted, "conversion")  # an earlier conversion is replaced (CI re-runs into one work dir)


@pytest.mark.parametrize("spec", [",", "batch=1:2:8,", "batch=1:1:1,batch=1:2:2", "context=1:8:64,,batch=1:1:1"])
def test_profile_with_empty_or_repeated_entries_is_a_usage_error(spec):
    from specconv.engines.tensorrt.build import parse_profile
    from specconv.errors import UsageError

    dynamic = {"batch": {"min": 1, "max": 8}, "context": {"min": 1, "max": 64}}
    with pytest.raises(UsageError):
        parse_profile(spec, dynamic)
    assert parse_profile("", dynamic) == parse_profile(None, dynamic) == {"batch": (1, 4, 8), "context": (1, 64, 64)}


def test_relative_vllm_interpreters_resolve_to_absolute_paths(tmp_path, monkeypatch):
    """A bare relative --vllm-python / --vllm-loader-python was looked up on PATH by the
    subprocess ("No such file or directory" for an existing file)."""
    from specconv.engines.vllm.check import find_vllm_python
    from specconv.engines.vllm.serve import resolve_vllm_python
    from specconv.errors import InvalidInputError

    monkeypatch.chdir(tmp_path)
    py = tmp_path / "mypython"
    py.write_text("#!/bin/sh\n")
    py.chmod(0o755)
    with pytest.raises(InvalidInputError, match="does not exist"):
        find_vllm_python("nopython")
    assert resolve_vllm_python("mypython") == str(py)
    assert find_vllm_python("mypython") == py


def test_validate_refuses_a_foreign_onnx_graph_before_anything_runs(converted, tmp_path):
    """The graph's drafter check ran only after the whole torch loop (minutes with the
    default prompts); it now runs first — here before the (absent) verifier is even resolved."""
    import hashlib

    onnx = tmp_path / "onnx"
    (onnx / "fp32").mkdir(parents=True)
    files = {}
    for rel, data in (("fp32/drafter.onnx", b"graph"), ("fp32/drafter.onnx.data", b"weights")):
        (onnx / rel).write_bytes(data)
        files[rel] = hashlib.sha256(data).hexdigest()
    (onnx / "onnx_meta.json").write_text(json.dumps({"format": "specconv-onnx-drafter", "format_version": 2,
                                                     "graphs": {"fp32/drafter.onnx": {"dtype": "float32"}},
                                                     "files": files, "drafter_files": {"config.json": "0" * 64}}))
    code, out = invoke("validate", converted, "--verifier", tmp_path / "no-verifier", "--onnx", onnx,
                       "--dtype", "float32", "--report-dir", tmp_path / "rep").code_json
    assert code == 3 and out["error"] == "onnx_other_drafter", out
    assert not (tmp_path / "rep").exists()
