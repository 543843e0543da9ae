"""Issue 24 item 1: a relative ``--verifier`` (``v/qwen3``, ``./v/qwen3``) is resolved once, at the
boundary (:func:`specconv.verifier.resolve_verifier`), before any runner, server or temp dir sees
it; what is recorded stays as documented (the verifier relative to DIR, or a Hub id).

The loader checks' runners work in a temp dir (:func:`specconv.offline.run_runner`): here the
runner is replaced by one that reads the job file from such a dir, so the paths it is handed are
checked where the real runner would use them (the real vLLM and SGLang runs with a relative
``--verifier`` are in ``tests/vllm_check/test_vllm_load.py`` and
``tests/sglang_check/test_sglang_load.py``; ``--backend vllm``'s in ``tests/validate/test_vllm_serve.py``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from cli_runner import invoke


def _runner_double(seen: list[dict]):
    """A ``run_runner`` that checks its job from a temp working directory, as the runner script
    does, and answers a passing load."""
    def run_runner(python, runner, job, *, env, timeout, engine, code):
        seen.append({"engine": engine, "job": job})
        here = os.getcwd()
        with tempfile.TemporaryDirectory() as tmp:
            os.chdir(tmp)
            try:
                for c in job["checks"]:
                    for key in ("dir", "verifier"):
                        assert os.path.isabs(c[key]), f"{engine} job {key} {c[key]!r} depends on the working directory"
                        assert (Path(c[key]) / "config.json").is_file(), c[key]
            finally:
                os.chdir(here)
        env_ = {"distribution": engine.lower(), "vllm": "0", "sglang": "0"}
        return {"env": env_, "results": [{"ok": True, "weights": {}} for _ in job["checks"]], "log_tail": ""}
    return run_runner


@pytest.mark.parametrize("form", ["{name}", "./{name}"])
def test_resolve_verifier_makes_a_relative_local_path_absolute_once(tiny_verifier_dir, monkeypatch, form):
    from specconv.verifier import resolve_verifier

    monkeypatch.chdir(tiny_verifier_dir.parent)
    v = resolve_verifier(form.format(name=tiny_verifier_dir.name))
    real = tiny_verifier_dir.resolve()
    assert os.path.isabs(v.spec) and Path(v.spec).resolve() == real and v.local_dir.is_absolute()
    assert v.model_ref == str(v.local_dir) and v.local_dir.resolve() == real and v.hub_id is None
    monkeypatch.chdir(tempfile.gettempdir())  # nothing of it depends on the working directory any more
    assert (v.local_dir / "config.json").is_file()


@pytest.mark.slow
def test_validate_load_checks_get_absolute_paths_and_record_as_documented(validate_set_copy, tmp_path, monkeypatch):
    """``validate ./DIR --verifier ./V --vllm-load-check --sglang-load-check`` from DIR's parent:
    both runners' job files name the verifier and the drafter by absolute paths; the record
    names the verifier relative to DIR, as it does for an absolute ``--verifier``."""
    pytest.importorskip("torch")
    import specconv.offline as offline
    from specconv.record import read_record

    b = validate_set_copy
    seen: list[dict] = []
    monkeypatch.setattr(offline, "run_runner", _runner_double(seen))
    monkeypatch.chdir(b["spec"].parent)
    rel = f"./{b['verifier'].name}"
    r = invoke("validate", f"./{b['spec'].name}", "--verifier", rel, "--prompts", b["prompts"].name,
               "--num-prompts", "1", "--max-new-tokens", "4", "--device", "cpu", "--report-dir", tmp_path / "rep",
               "--vllm-load-check", "--vllm-loader-python", sys.executable,
               "--sglang-load-check", "--sglang-loader-python", sys.executable)
    assert r.code == 0, r.output[-3000:]
    assert sorted(s["engine"] for s in seen) == ["SGLang", "vLLM"]
    for s in seen:
        assert [Path(c["verifier"]).resolve() for c in s["job"]["checks"]] == [b["verifier"].resolve()], s
    out = r.one()
    assert out["vllm_load"]["ok"] and out["sglang_load"]["ok"]
    report = json.loads((tmp_path / "rep" / "validation.json").read_text())
    assert Path(report["verifier_dir"]).resolve() == b["verifier"].resolve() and os.path.isabs(report["verifier_dir"])
    rec = read_record(b["spec"])
    assert rec.validation.verifier == "../verifier" and rec.conversion.verifier.spec == "../verifier"


def test_backend_vllm_serves_the_verifier_by_its_absolute_dir(bundled_drafter, smollm2_dir, monkeypatch):
    """``--backend vllm``: the server's ``--model`` is the verifier's absolute dir, however
    ``--verifier`` was typed (vLLM resolves what is not a local path on the Hub)."""
    from specconv.engines.vllm import serve as vb
    from specconv.engines.vllm.server import VllmServeOptions
    from specconv.verifier import resolve_verifier

    monkeypatch.chdir(smollm2_dir.parent)
    opts = SimpleNamespace(dtype="float32", seed=0, engine_options={"vllm_python": sys.executable, "vllm_port": None},
                           serve={"vllm": VllmServeOptions()})
    for given in (smollm2_dir.name, f"./{smollm2_dir.name}"):
        srv = vb.owned_server(bundled_drafter, resolve_verifier(given), opts)
        model = srv.argv[srv.argv.index("--model") + 1]
        assert os.path.isabs(model) and Path(model).resolve() == smollm2_dir.resolve(), srv.argv


@pytest.mark.parametrize("form", ["rel", "home"])
def test_convert_records_a_relative_or_home_verifier_relative_to_dir(tiny_verifier_dir, tmp_path, monkeypatch, form):
    """The record names a local verifier relative to DIR however it was typed (``~/V`` was
    recorded as the literal ``~/V``, a path relative to nothing)."""
    from fixtures_dflash import api_convert, make_source
    from specconv.record import read_record

    src = make_source(tmp_path / "src")
    out = tmp_path / "work" / "out"
    out.parent.mkdir()
    if form == "rel":
        monkeypatch.chdir(tiny_verifier_dir.parent)
        given = f"./{tiny_verifier_dir.name}"
    else:
        monkeypatch.setenv("HOME", str(tiny_verifier_dir.parent))
        given = f"~/{tiny_verifier_dir.name}"
    api_convert(src, given, out)
    spec = read_record(out).conversion.verifier.spec
    assert spec == os.path.relpath(tiny_verifier_dir, out) and (out / spec).resolve() == tiny_verifier_dir.resolve()
