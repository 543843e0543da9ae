"""Hub-id sources and verifiers read from the *default* Hugging Face cache under ``HOME``.

huggingface_hub fixes its cache path at import (``constants.py``: ``HF_HOME`` defaults to
``$XDG_CACHE_HOME/huggingface`` or ``~/.cache/huggingface``), so these run the CLI as a
subprocess with a temporary ``HOME`` and ``HF_HOME`` / ``HF_HUB_CACHE`` / ``XDG_CACHE_HOME``
unset. The cache has the real layout
(``HOME/.cache/huggingface/hub/models--org--name/{blobs,refs,snapshots}``, snapshot files
being relative symlinks into ``blobs/``). Every path of such a source has a ``.cache``
component, which an absolute-path filter once mistook for a tool cache inside the source.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_hub_paths import COMMIT, INDEX, FakeHub, _shard, _verifier_files, _zlab_files

import fixtures_dflash as fd
from cli_runner import offline_env, run_specconv

VERIFIER = "owner/verifier"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


@pytest.fixture
def home(tmp_path, tiny_verifier_dir):
    home = tmp_path / "home"
    hub = FakeHub(home / ".cache" / "huggingface" / "hub")
    sharded = _shard(tiny_verifier_dir, tmp_path / "sharded")
    hub.add(VERIFIER, _verifier_files(sharded, shards=()))
    (tmp_path / "cwd").mkdir()
    return home, hub, tmp_path


@pytest.mark.slow
def test_hub_source_in_default_cache_converts(home):
    home, hub, tmp = home
    files = _zlab_files(tmp / "src")
    snap = hub.add("z-lab/tiny-dflash", files)
    assert ".cache" in snap.parts and (snap / "model.safetensors").is_symlink()
    out = tmp / "out"
    code, rep, err = run_specconv("convert", "z-lab/tiny-dflash", "--verifier", VERIFIER, "-o", out, cwd=tmp / "cwd",
                                  env=offline_env(HOME=str(home), XDG_CACHE_HOME=None)).code_json_stderr
    assert code == 0, (rep, err)
    assert rep["format"] == "zlab_dflash"
    rec = json.loads((out / "specconv.json").read_text())["conversion"]
    assert sorted(rec["source"]["files"]) == sorted(files)
    assert json.loads((out / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"] == VERIFIER
    # inspect judges it the same way
    code, rep, err = run_specconv("inspect", "z-lab/tiny-dflash", cwd=tmp / "cwd",
                                  env=offline_env(HOME=str(home), XDG_CACHE_HOME=None)).code_json_stderr
    assert code == 0 and (rep["format"], rep["supported"]) == ("zlab_dflash", True), (rep, err)


@pytest.mark.slow
def test_hub_source_subfolder_and_revision_in_default_cache(home):
    home, hub, tmp = home
    snap = hub.add("xiaomi/mimo-like", _zlab_files(tmp / "src", prefix="dflash/"), commit=OTHER)
    # refs/main moved on to a commit whose snapshot lacks the drafter: only --revision finds it
    (hub.repo_dir("xiaomi/mimo-like") / "refs" / "main").write_text(COMMIT)
    (hub.repo_dir("xiaomi/mimo-like") / "snapshots" / COMMIT).mkdir()
    out = tmp / "out"
    code, rep, err = run_specconv("convert", "xiaomi/mimo-like", "--subfolder", "dflash", "--revision", OTHER,
                                  "--verifier", VERIFIER, "-o", out, cwd=tmp / "cwd",
                                  env=offline_env(HOME=str(home), XDG_CACHE_HOME=None)).code_json_stderr
    assert code == 0, (rep, err)
    rec = json.loads((out / "specconv.json").read_text())["conversion"]
    # the absolute snapshot path is in the conversion report; the record names the Hub repo
    assert Path(rep["source"]) == snap / "dflash"
    assert ((rec["source"]["hub_id"], rec["source"]["revision"], rec["source"]["path"])
            == ("xiaomi/mimo-like", OTHER, "dflash"))
    assert "model.safetensors" in rec["source"]["files"]


def test_dot_cache_inside_source_is_still_ignored(tmp_path, tiny_verifier_dir):
    """A tool cache *inside* the source dir (e.g. ``huggingface-cli download --local-dir``
    writes ``.cache/huggingface/``) is not part of the checkpoint."""
    src = fd.make_source(tmp_path / "src", "zlab_dflash")
    junk = src / ".cache" / "huggingface" / "download" / "model.safetensors.metadata"
    junk.parent.mkdir(parents=True)
    junk.write_text("x")
    from specconv.converters.base import SourceInfo

    info = SourceInfo.open(src)
    assert info.files and not any(".cache" in f for f in info.files)
    assert INDEX not in info.files
