"""A plug-in engine needs no product edit (issue 26): ``tests/engines/plugin_engine.py`` is
registered through the entry-point group by a ``*.dist-info`` on ``PYTHONPATH``, and the real
``specconv`` entry point (a subprocess) then offers ``export dummy`` and ``release --export-dummy``,
push publishes its checked files and the card lists them."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("jinja2")

from cli_runner import run_in  # noqa: E402
from hub_double import HubDouble  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "examples" / "smollm2-dflash-b8"
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
TINY = ("--prompts", "eval", "--num-prompts", "1", "--max-new-tokens", "4", "--device", "cpu")
TOKEN = "hf_specconvFAKEtoken0123456789abcdef"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> str:
    """A site dir holding the plug-in's dist-info (entry point ``dummy``), then ``tests/engines``
    (its module) and the checkout (this specconv)."""
    site = tmp_path_factory.mktemp("plugin-site")
    info = site / "specconv_dummy_engine-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: specconv-dummy-engine\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[specconv.engines]\ndummy = plugin_engine:ENGINE\n")
    return ":".join([str(site), str(Path(__file__).parent), str(REPO_ROOT)])


@pytest.fixture(scope="module")
def double():
    d = HubDouble(token=TOKEN).start()
    yield d
    d.stop()


@pytest.mark.slow
def test_a_plugin_engine_exports_pushes_and_releases(tmp_path, double, plugin_path, smollm2_dir):
    d = tmp_path / "drafter"
    run = partial(run_in, tmp_path, endpoint=double.url, token=TOKEN, PYTHONPATH=plugin_path)
    code, out, text = run("convert", EXAMPLE, "--verifier", smollm2_dir, "--verifier-name", SMOLLM2,
                          "-o", d).code_json_output
    assert code == 0, text[-2000:]
    code, out, text = run("validate", d, "--verifier", smollm2_dir, *TINY, "--dummy-load-check").code_json_output
    assert code == 0 and out["dummy_load"]["ok"] and out["dummy_load"]["model_type"] == "dflash", text[-2000:]
    code, out, text = run("validate", d, "--verifier", smollm2_dir, *TINY, "--dummy-load-check",
                          "--dummy-loader-python", tmp_path / "no-python").code_json_output
    assert code == 3 and out["error"] == "dummy_python_missing", text[-2000:]
    code, out, text = run("validate", d, "--verifier", smollm2_dir, *TINY, "--backend", "dummy",
                          "--report-dir", tmp_path / "served").code_json_output
    assert code == 0 and out["backend"] == "dummy", text[-2000:]
    assert out["dummy_serve"]["tau"] == pytest.approx(3.0) and out["acceptance_length"] == pytest.approx(3.0)
    gates = {g["name"]: g for g in out["gate_results"]}
    assert gates["acceptance"]["status"] == "passed" and gates["parity"]["status"] == "skipped"
    assert gates["lossless"]["status"] == "passed" and gates["lossless"]["details"]["reference"] == "dummy_plain"
    code, out, text = run("export", "dummy", d, "--greeting", "hi").code_json_output
    assert code == 0 and out["check"] == {"passed": True}, text[-2000:]
    assert (d / "dummy" / "layout.txt").read_text() == "hi dflash\n"
    code, out, text = run("push", d, "--repo-id", "specconv-test/plugin", "--dry-run").code_json_output
    assert code == 0 and out["status"] == "dry_run", text[-2000:]
    planned = {f["path"] for f in out["files"]}
    assert {"dummy/layout.txt", "dummy/dummy_meta.json"} <= planned
    (d / "dummy" / "layout.txt").write_text("changed after its check\n")
    code, out, text = run("push", d, "--repo-id", "specconv-test/plugin", "--dry-run").code_json_output
    assert code == 4 and out["error"] == "ungated_file" and "dummy/layout.txt" in out["message"], text[-2000:]

    work = tmp_path / "work"
    code, out, text = run("release", EXAMPLE, "--verifier", smollm2_dir, "--verifier-name", SMOLLM2,
                          "--repo-id", "specconv-test/plugin-release", "--dry-run", "--work-dir", work,
                          "--export-dummy", *TINY).code_json_output
    assert code == 0, text[-3000:]
    assert [s["step"] for s in out["steps"]] == ["preflight", "convert", "validate", "dummy", "push"]
    assert out["dummy"] == {"algorithm": "dflash", "check": {"passed": True}}
    card = (work / "drafter" / "README.md").read_text()
    assert "dummy/layout.txt" in card and "Dummy layout" in card


@pytest.mark.slow
def test_the_plugin_is_listed_without_it_nothing_is(tmp_path, double, plugin_path):
    run = partial(run_in, tmp_path, endpoint=double.url, token=TOKEN, as_json=False)
    code, text = run("export", "--help", PYTHONPATH=plugin_path).code_output
    assert code == 0 and "dummy" in text
    code, text = run("validate", "--help", PYTHONPATH=plugin_path).code_output
    assert code == 0 and "--dummy-load-check" in text and "--dummy-loader-python" in text
    assert "dummy: the dummy engine's loopback stub server" in " ".join(text.split())
    code, text = run("export", "--help", PYTHONPATH=REPO_ROOT.as_posix()).code_output
    assert code == 0 and "dummy" not in text and "gguf" in text


def test_a_failed_load_check_fails_the_exit_status_by_its_report_key():
    """A plug-in's load check is judged by its report key (``<name>_load``), as the built-ins' are."""
    from specconv.results import ValidationReport

    rep = ValidationReport.of({"gates": {"structure": True}, "passed": True, "dummy_load": {"ok": False}})
    assert rep.failed_gates() == ["dummy_load"] and rep.exit_status() == 4
