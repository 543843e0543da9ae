"""CLI contract: one JSON object on stdout with ``--format json`` (results and errors),
logs on stderr, exit codes 0 / 2 / 3, ``inspect`` fields, ``formats`` = the registry,
and a torch-free ``--help``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli_runner import CliOutcome, invoke, run_specconv
from fixtures_dflash import HUB, make_source

PY = sys.executable


# ------------------------------------------------------------------------ JSON on stdout
def test_convert_json_stdout_logs_stderr_subprocess(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path)
    p = run_specconv("-v", "convert", src, "--verifier", tiny_verifier_dir, "--verifier-name", HUB,
                     "-o", tmp_path / "out", timeout=120)
    assert p.code == 0, p.stderr
    rep = p.one()
    assert rep["format"] == "zlab_dflash" and rep["output"] == str(tmp_path / "out")
    assert "detected zlab_dflash" in p.stderr  # -v log line goes to stderr, not stdout
    assert "detected" not in p.stdout


def test_convert_error_json_subprocess(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path, block_size=None)
    p = run_specconv("convert", src, "--verifier", tiny_verifier_dir, "-o", tmp_path / "out", timeout=120)
    assert p.code == 3
    err = p.one()
    assert err["error"] == "missing_block_size" and err["exit_code"] == 3 and "block_size" in err["message"]
    assert "error:" in p.stderr


def test_inspect_json(tmp_path):
    src = make_source(tmp_path)
    r = invoke("inspect", src)
    assert r.code == 0
    obj = r.one()
    for k in ("format", "algorithm", "supported", "reason", "findings"):
        assert k in obj, k
    assert (obj["format"], obj["algorithm"], obj["supported"], obj["reason"]) == ("zlab_dflash", "dflash", True, None)
    assert isinstance(obj["findings"], list)


def test_inspect_with_verifier_includes_plan(tmp_path, tiny_verifier_dir):
    r = invoke("inspect", make_source(tmp_path), "--verifier", tiny_verifier_dir, "--verifier-name", HUB)
    assert r.code == 0, r.stderr
    obj = r.one()
    assert obj["plan"]["config"]["aux_hidden_state_layer_ids"] == [1, 3, 5]


def test_inspect_human(tmp_path):
    r = invoke("inspect", make_source(tmp_path), as_json=False)
    assert r.code == 0
    assert "zlab_dflash" in r.stdout and "supported: yes" in r.stdout


def test_inspect_unknown_format_exit3(tmp_path):
    d = tmp_path / "weird"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    from fixtures_dflash import body_tensors, write_source

    write_source(d, None, body_tensors(layers=1))  # weights present: not a "no draft body" refusal
    r = invoke("inspect", d)
    assert r.code == 3
    obj = r.one()
    assert obj["supported"] is False and obj["format"] == "unknown" and "GPT2LMHeadModel" in obj["reason"]


def test_inspect_refused_format_exit3(tmp_path):
    src = make_source(tmp_path, config_updates={"architectures": ["DFlash2BeamDraftModel"]})
    r = invoke("inspect", src)
    assert r.code == 3
    obj = r.one()
    assert obj["supported"] is False and obj["format"] != "zlab_dflash" and obj["reason"]


def test_convert_refused_format_exit3(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path, config_updates={"architectures": ["DFlash2BeamDraftModel"]})
    r = invoke("convert", src, "--verifier", tiny_verifier_dir, "-o", tmp_path / "out")
    assert r.code == 3
    err = r.one()
    assert err["exit_code"] == 3 and err["error"] == "unsupported_format" and "not supported" in err["message"]
    assert not (tmp_path / "out").exists()


def test_convert_unknown_format_exit3(tmp_path, tiny_verifier_dir):
    d = tmp_path / "weird"
    d.mkdir()
    (d / "config.json").write_text("{}")
    r = invoke("convert", d, "--verifier", tiny_verifier_dir, "-o", tmp_path / "out")
    assert r.code == 3 and r.one()["error"] == "unsupported_format"


def test_missing_source_exit3(tmp_path, tiny_verifier_dir):
    r = invoke("convert", tmp_path / "nope", "--verifier", tiny_verifier_dir, "-o", tmp_path / "out")
    assert r.code == 3 and r.one()["exit_code"] == 3


@pytest.mark.parametrize("argv", [
    ["convert", "SRC", "--verifier", "V", "--bogus-flag"],
    ["convert", "SRC"],  # missing --verifier
    ["convert", "SRC", "--verifier", "V", "--dtype", "int8"],
    ["convert", "SRC", "--verifier", "V", "--aux-layer-ids", "a,b"],
])
def test_bad_flags_exit2_with_json_error(argv, tmp_path):
    r = invoke(*argv)
    assert r.code == 2
    err = r.one()
    assert err["exit_code"] == 2 and err["error"] == "usage" and err["message"]
    assert "Usage:" in r.stderr


def test_bad_flag_human_exit2(tmp_path):
    r = invoke("convert", "SRC", "--verifier", "V", "--bogus-flag", as_json=False)
    assert r.code == 2 and r.stdout == "" and "--bogus-flag" in r.stderr


def test_unknown_command_exit2():
    assert invoke("frobnicate", as_json=False).code == 2


def test_convert_human_output(tmp_path, tiny_verifier_dir):
    r = invoke("convert", make_source(tmp_path), "--verifier", tiny_verifier_dir, "--verifier-name", HUB,
               "-o", tmp_path / "out", as_json=False)
    assert r.code == 0, r.stderr
    assert "zlab_dflash" in r.stdout and "[1, 3, 5]" in r.stdout
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.stdout)


# ------------------------------------------------------------------------------- formats
def test_formats_lists_every_converter():
    from specconv.converters import REGISTRY, ordered

    r = invoke("formats")
    assert r.code == 0
    rows = r.one()["formats"]
    assert [x["format"] for x in rows] == [c.format_id for c in ordered()]
    assert {x["format"] for x in rows} == set(REGISTRY)
    for x in rows:
        assert {"format", "algorithm", "supported", "title"} <= set(x)
    dflash = {x["format"] for x in rows if x["supported"] and x["algorithm"] == "dflash"}
    assert {"zlab_dflash", "specforge_dflash", "modelopt_dflash", "nemo_dflash", "muse_glimmer_dflash",
            "deepspec_dflash"} <= dflash
    assert any(not x["supported"] for x in rows)  # refusals are listed too


def test_formats_human():
    r = invoke("formats", as_json=False)
    assert r.code == 0 and "zlab_dflash" in r.stdout and "refused" in r.stdout


# ------------------------------------------------------------------------ torch-free help
@pytest.mark.parametrize("argv", [["--help"], ["convert", "--help"], ["inspect", "--help"], ["formats"]])
def test_help_does_not_import_torch(argv):
    code = (
        "import sys\n"
        "from specconv.cli.main import cli\n"
        "try:\n"
        f"    cli({argv!r}, prog_name='specconv')\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        "bad = sorted(m for m in ('torch', 'transformers', 'safetensors.torch') if m in sys.modules)\n"
        "print('IMPORTED', bad, file=sys.stderr)\n"
    )
    p = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "IMPORTED []" in p.stderr, p.stderr
    if argv == ["--help"]:
        assert "convert" in p.stdout and "Exit codes" in p.stdout


def test_version():
    import specconv

    r = invoke("--version", as_json=False)
    assert r.code == 0 and specconv.__version__ in r.stdout


def test_console_script_installed():
    exe = Path(sys.executable).parent / "specconv"
    if not exe.exists():
        pytest.skip("console script not installed in this environment")
    p = subprocess.run([str(exe), "formats", "--format", "json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and CliOutcome(p.returncode, p.stdout, p.stderr).one()["formats"]


def test_validate_refuses_non_speculators_dir_and_writes_nothing(tmp_path):
    """A z-lab (source) dir given to validate: exit 3 with a hint, DIR untouched."""
    d = tmp_path / "zlab"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["DFlashDraftModel"], "dflash_config": {}}))
    before = sorted(p.name for p in d.iterdir())
    r = invoke("validate", d, "--verifier", tmp_path, catch=True)
    assert r.code == 3
    out = json.loads(r.stdout)
    assert out["error"] == "not_speculators_dir" and "specconv convert" in out["hint"]
    assert sorted(p.name for p in d.iterdir()) == before
