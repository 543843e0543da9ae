"""The real huggingface_hub client and real specconv run against the loopback Hub double
(``tests/hub_double.py``): headers-only ``inspect`` of a Hub id, a full-download ``convert``,
and the Hub's own error answers mapped to exit codes.

huggingface_hub reads ``HF_HUB_OFFLINE``, ``HF_ENDPOINT`` and ``HF_HUB_DISABLE_XET`` at import
and the suite runs offline, so every specconv run here is a subprocess with
``HF_HUB_OFFLINE=0``, ``HF_ENDPOINT`` = the double and a fresh ``HF_HOME`` / ``SPECCONV_CACHE``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fixtures_dflash as fd
from cli_runner import online_env, run_specconv
from hub_double import HubDouble

REPO = "z-lab/tiny-dflash"


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    # float32 and 8 layers: ~1.3 MB of weights, so a headers-only read is visibly smaller
    return fd.make_source(tmp_path_factory.mktemp("src") / "zlab", "zlab_dflash", layers=8, dtype="float32")


@pytest.fixture
def double(source):
    d = HubDouble().start()
    d.add_dir(REPO, source)
    yield d
    d.stop()


def _env(tmp: Path, double: HubDouble) -> dict[str, str]:
    return online_env(double.url, tmp / "hf-home", SPECCONV_CACHE=str(tmp / "specconv-cache"))


def _cli(tmp: Path, double: HubDouble, *argv, env: dict[str, str] | None = None) -> tuple[int, dict | None, str]:
    return run_specconv(*argv, cwd=tmp / "cwd", env=env or _env(tmp, double)).code_json_stderr


def _weights(double: HubDouble) -> list:
    return [r for r in double.requests if r.path.endswith("/model.safetensors") and r.method == "GET"]


@pytest.mark.slow
def test_inspect_hub_id_reads_headers_only(double, source, tmp_path):
    weights = (source / "model.safetensors").stat().st_size
    code, rep, err = _cli(tmp_path, double, "inspect", REPO)
    assert code == 0, (rep, err)
    assert (rep["format"], rep["supported"]) == ("zlab_dflash", True)
    gets = _weights(double)
    assert gets and all(r.range for r in gets), [(r.method, r.range) for r in gets]  # range reads only
    assert all(r.status == 206 for r in gets)
    assert 0 < rep["bytes_downloaded"] < weights / 4, (rep["bytes_downloaded"], weights)
    assert rep["bytes_downloaded"] == double.bytes_sent  # the client's count is what the server sent
    # a second inspect of the same commit re-uses the header view: no data request at all
    n = len(double.requests)
    code, rep2, err = _cli(tmp_path, double, "inspect", REPO)
    assert code == 0 and rep2["format"] == "zlab_dflash", (rep2, err)
    assert not [r for r in double.requests[n:] if "/resolve/" in r.path]
    assert rep2["bytes_downloaded"] < rep["bytes_downloaded"]


@pytest.mark.slow
def test_convert_hub_id_downloads_the_weights(double, source, tmp_path, tiny_verifier_dir):
    import torch

    from specconv.tensors import TensorStore

    out = tmp_path / "out"
    code, rep, err = _cli(tmp_path, double, "convert", REPO, "--verifier", tiny_verifier_dir, "-o", out)
    assert code == 0, (rep, err)
    assert [r for r in _weights(double) if r.range is None and r.status == 200]  # the whole file, once
    src, dst = TensorStore.open(source), TensorStore.open(out)
    for name in ("fc.weight", "hidden_norm.weight", "norm.weight"):
        assert torch.equal(src.read_tensor(name), dst.read_tensor(name))


@pytest.mark.slow
@pytest.mark.parametrize("argv, code_slug", [
    (("inspect", "nobody/absent"), "hub_repo_not_found"),
    (("convert", REPO, "--revision", "v9", "-o", "out"), "hub_revision_not_found"),
], ids=["repo", "revision"])
def test_hub_answers_map_to_exit_codes(double, tmp_path, tiny_verifier_dir, argv, code_slug):
    extra = ("--verifier", tiny_verifier_dir) if argv[0] == "convert" else ()
    code, rep, err = _cli(tmp_path, double, *argv, *extra)
    assert code == 9, (rep, err)
    assert rep["error"] == code_slug and argv[1] in rep["message"] and rep.get("hint")
    assert "Traceback" not in err and not (tmp_path / "cwd" / "out").exists()


def test_double_serves_ranges_like_the_hub(double, source):
    """The double's own contract, with the library's client (HEAD metadata, ranges, 404 codes)."""
    import httpx2

    base = f"{double.url}/{REPO}/resolve/main/model.safetensors"
    data = (source / "model.safetensors").read_bytes()
    with httpx2.Client() as c:
        h = c.head(base)
        assert h.status_code == 200 and int(h.headers["content-length"]) == len(data)
        assert h.headers["x-repo-commit"] and h.headers["x-linked-etag"].strip('"') == double.repos[REPO].oid(
            "model.safetensors")
        r = c.get(base, headers={"Range": "bytes=0-7"})
        assert r.status_code == 206 and r.content == data[:8]
        assert r.headers["content-range"] == f"bytes 0-7/{len(data)}"
        assert c.get(base, headers={"Range": f"bytes={len(data)}-"}).status_code == 416
        miss = c.head(f"{double.url}/{REPO}/resolve/main/nope.json")
        assert miss.status_code == 404 and miss.headers["x-error-code"] == "EntryNotFound"
        assert c.get(f"{double.url}/api/models/nobody/absent/revision/main").headers["x-error-code"] == "RepoNotFound"
        assert c.get(f"{double.url}/api/models/{REPO}/revision/v9").headers["x-error-code"] == "RevisionNotFound"
        assert c.get(f"{double.url}/api/models/bad--id/x/revision/main").status_code == 400


@pytest.mark.slow
def test_hub_verifier_names_come_from_a_header_range_read(double, tmp_path, tiny_verifier_dir):
    """A single-file Hub verifier: its tensor names (for the name check and the converter) are read
    from the safetensors header by range requests; z-lab DFlash needs none of its tensor data."""
    double.add_repo("owner/verifier", {n: (tiny_verifier_dir / n).read_bytes()
                                       for n in ("config.json", "model.safetensors")})
    out = tmp_path / "out"
    code, rep, err = _cli(tmp_path, double, "convert", REPO, "--verifier", "owner/verifier", "-o", out)
    assert code == 0, (rep, err)
    v_gets = [r for r in double.requests if r.path.startswith("/owner/verifier/resolve/") and r.method == "GET"]
    weights = [r for r in v_gets if r.path.endswith("model.safetensors")]
    assert weights and all(r.range and r.status == 206 for r in weights), [(r.path, r.range) for r in v_gets]
    assert any(r.path.endswith("/config.json") for r in v_gets)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "owner/verifier"


@pytest.mark.slow
def test_endpoint_option_without_hf_endpoint(double, tmp_path, tiny_verifier_dir):
    """``--endpoint`` on inspect and convert reaches the source and the Hub verifier with HF_ENDPOINT unset."""
    double.add_repo("owner/verifier", {n: (tiny_verifier_dir / n).read_bytes()
                                       for n in ("config.json", "model.safetensors")})
    env = _env(tmp_path, double)
    del env["HF_ENDPOINT"]
    code, rep, err = _cli(tmp_path, double, "inspect", REPO, "--endpoint", double.url, env=env)
    assert code == 0, (rep, err)
    assert (rep["format"], rep["supported"]) == ("zlab_dflash", True) and rep["bytes_downloaded"] > 0
    n = len(double.requests)
    out = tmp_path / "out"
    code, rep, err = _cli(tmp_path, double, "convert", REPO, "--verifier", "owner/verifier", "--endpoint", double.url,
                          "-o", out, env=env)
    assert code == 0, (rep, err)
    assert any(r.path.startswith("/owner/verifier/") for r in double.requests[n:])
    assert json.loads((out / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"] == \
        "owner/verifier"
    # without --endpoint and HF_ENDPOINT the default endpoint is used: the offline double sees nothing new
    n = len(double.requests)
    env["HF_HUB_OFFLINE"] = "1"
    code, rep, err = _cli(tmp_path, double, "inspect", "other/absent", env=env)
    assert code != 0 and len(double.requests) == n
