"""A Hugging Face cache snapshot whose blob was deleted is a broken cache, not a checkpoint
without config or weights (issue 24 item 4): ``convert`` / ``inspect`` of the source,
``validate`` of a drafter dir and a ``--verifier`` dir in such a snapshot exit 3
(``broken_hub_cache``) naming each dangling file, and the hint is the ``hf download`` line that
restores exactly those files, which the test then runs.

The cache is written by huggingface_hub itself (``snapshot_download`` from the loopback Hub
double, ``tests/hub_double.py``: ``blobs/`` + relative snapshot symlinks), then one blob is
deleted as a user's cache cleanup would.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import fixtures_dflash as fd
from cli_runner import invoke, online_env, run_specconv
from hub_double import HubDouble

SOURCE = "z-lab/tiny-dflash"


@pytest.fixture(scope="module")
def double():
    d = HubDouble().start()
    yield d
    d.stop()


def _download(double: HubDouble, repo: str, cache: Path, tmp: Path) -> Path:
    """``snapshot_download`` of ``repo`` into ``cache`` by the real client; the snapshot dir."""
    code = ("import sys; from huggingface_hub import snapshot_download; "
            "print(snapshot_download(sys.argv[1], cache_dir=sys.argv[2]))")
    p = subprocess.run([sys.executable, "-c", code, repo, str(cache)], env=online_env(double.url, tmp / "hf-home"),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    snap = Path(p.stdout.strip().splitlines()[-1])
    assert snap.parent.name == "snapshots" and all(f.is_symlink() for f in snap.iterdir())
    return snap


def _delete_blob(link: Path) -> None:
    blob = Path(os.path.realpath(link))
    assert blob.parent.name == "blobs"
    blob.unlink()


def _broken(out: dict, snap: Path, files: list[str]) -> str:
    """Assert ``out`` is the broken-cache error naming ``files``; return the hint's command."""
    assert out["error"] == "broken_hub_cache", out
    repo = snap.parts[-3][len("models--"):].replace("--", "/")
    assert f"a broken Hugging Face cache snapshot of {repo} (revision {snap.name})" in out["message"]
    assert all(f"{f} -> ../../blobs/" in out["message"] for f in files), out["message"]
    cmd = out["hint"].split(": ", 1)[1]
    assert shlex.split(cmd) == ["hf", "download", repo, *files, "--revision", snap.name, "--cache-dir",
                                str(snap.parents[2])]
    return cmd


@pytest.mark.slow
def test_a_deleted_blob_in_a_source_snapshot_is_diagnosed_and_the_hint_restores_it(double, tmp_path,
                                                                                      tiny_verifier_dir):
    double.add_dir(SOURCE, fd.make_source(tmp_path / "src", "zlab_dflash", verifier_dir=tiny_verifier_dir))
    cache = tmp_path / "cache"
    snap = _download(double, SOURCE, cache, tmp_path)
    _delete_blob(snap / "model.safetensors")  # was: "no draft-body tensors"
    out = tmp_path / "out"
    r = invoke("convert", snap, "--verifier", tiny_verifier_dir, "-o", out, catch=True)
    assert r.code == 3 and not out.exists(), r.output
    cmd = _broken(r.json, snap, ["model.safetensors"])
    assert invoke("inspect", snap, catch=True).json["error"] == "broken_hub_cache"
    # given as the Hub id, offline, huggingface_hub 2.4 itself finds the snapshot incomplete
    # (IncompleteSnapshotError) and the hint names `hf download` too
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    r = run_specconv("convert", SOURCE, "--verifier", tiny_verifier_dir, "-o", out, env=env)
    assert r.code == 3 and "model.safetensors" in r.json["message"] and "hf download" in r.json["hint"], r.output
    _delete_blob(snap / "config.json")  # was: "no config.json"
    r = invoke("convert", snap, "--verifier", tiny_verifier_dir, "-o", out, catch=True)
    cmd = _broken(r.json, snap, ["config.json", "model.safetensors"])
    # the printed fix, run as printed (huggingface_hub's own `hf` CLI), restores the snapshot
    hf = Path(sys.executable).parent / "hf"
    p = subprocess.run([str(hf), *shlex.split(cmd)[1:]], env=online_env(double.url, tmp_path / "hf-home"),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    r = invoke("convert", snap, "--verifier", tiny_verifier_dir, "-o", out, catch=True)
    assert r.code == 0, r.output


@pytest.mark.slow
def test_a_drafter_or_verifier_snapshot_with_a_deleted_blob_is_diagnosed(double, tmp_path, tiny_verifier_dir):
    src = fd.make_source(tmp_path / "src", "zlab_dflash", verifier_dir=tiny_verifier_dir)
    fd.api_convert(src, tiny_verifier_dir, tmp_path / "drafter")
    double.add_dir("org/tiny-drafter", tmp_path / "drafter")
    double.add_dir("org/tiny-verifier", tiny_verifier_dir)
    drafter = _download(double, "org/tiny-drafter", tmp_path / "cache", tmp_path)
    verifier = _download(double, "org/tiny-verifier", tmp_path / "cache", tmp_path)
    _delete_blob(drafter / "model.safetensors")
    before = sorted(p.name for p in drafter.iterdir())
    r = invoke("validate", drafter, "--verifier", tiny_verifier_dir, "--report-dir", tmp_path / "rep", catch=True)
    assert r.code == 3 and not (tmp_path / "rep").exists(), r.output
    _broken(r.json, drafter, ["model.safetensors"])
    assert sorted(p.name for p in drafter.iterdir()) == before  # no specconv.json written into the cache
    _delete_blob(verifier / "config.json")  # was: "verifier dir … has no config.json"
    r = invoke("convert", src, "--verifier", verifier, "-o", tmp_path / "out", catch=True)
    assert r.code == 3 and "verifier " in r.json["message"], r.output
    _broken(r.json, verifier, ["config.json"])


def test_a_dangling_link_outside_a_cache_names_the_link(tmp_path, tiny_verifier_dir):
    """Outside a cache only a link named like a file a reader opens is refused (a stale link
    elsewhere, or a loop, stays ignored: ``test_symlink_loops_in_the_checkpoint_dir``)."""
    src = fd.make_source(tmp_path / "src", "zlab_dflash", verifier_dir=tiny_verifier_dir)
    (src / "latest").symlink_to("checkpoint-999")
    (src / "model.safetensors").rename(tmp_path / "moved.safetensors")
    (src / "model.safetensors").symlink_to(tmp_path / "gone.safetensors")
    r = invoke("convert", src, "--verifier", tiny_verifier_dir, "-o", tmp_path / "out", catch=True)
    assert r.code == 3 and r.json["error"] == "dangling_link", r.output
    assert f"model.safetensors -> {tmp_path / 'gone.safetensors'}" in r.json["message"]
    assert "1 link(s)" in r.json["message"] and "latest" not in r.json["message"]
    assert json.dumps(r.json).count("hf download") == 0
