"""CLI contract: one JSON object on stdout with ``--format json`` (results and errors),
logs on stderr, exit codes 0 / 2 / 3, ``inspect`` fields, ``formats`` = the registry,
and a torch-free ``--help``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures_dflash import HUB, make_source

PY = sys.executable


def invoke(*args):
    from specconv.cli.main import cli

    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def one_json(stdout: str) -> dict:
    """stdout must be exactly one JSON object (json.loads rejects trailing data)."""
    obj = json.loads(stdout)
    assert isinstance(obj, dict)
    return obj


def run_cli(*args, timeout=120):
    """The real ``specconv`` entry point in a subprocess (stdout and stderr separate)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    code = "import sys; from specconv.cli.main import main; sys.argv[0] = 'specconv'; main()"
    return subprocess.run([PY, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)


# ------------------------------------------------------------------------ JSON on stdout
def test_convert_json_stdout_logs_stderr_subprocess(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path)
    p = run_cli("-v", "convert", src, "--verifier", tiny_verifier_dir, "--verifier-name", HUB,
                "-o", tmp_path / "out", "--format", "json")
    assert p.returncode == 0, p.stderr
    rep = one_json(p.stdout)
    assert rep["format"] == "zlab_dflash" and rep["output"] == str(tmp_path / "out")
    assert "detected zlab_dflash" in p.stderr  # -v log line goes to stderr, not stdout
    assert "detected" not in p.stdout


def test_convert_error_json_subprocess(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path, block_size=None)
    p = run_cli("convert", src, "--verifier", tiny_verifier_dir, "-o", tmp_path / "out", "--format", "json")
    assert p.returncode == 3
    err = one_json(p.stdout)
    assert err["error"] == "missing_block_size" and err["exit_code"] == 3 and "block_size" in err["message"]
    assert "error:" in p.stderr


def test_inspect_json(tmp_path):
    src = make_source(tmp_path)
    r = invoke("inspect", src, "--format", "json")
    assert r.exit_code == 0
    obj = one_json(r.stdout)
    for k in ("format", "algorithm", "supported", "reason", "findings"):
        assert k in obj, k
    assert (obj["format"], obj["algorithm"], obj["supported"], obj["reason"]) == ("zlab_dflash", "dflash", True, None)
    assert isinstance(obj["findings"], list)


def test_inspect_with_verifier_includes_plan(tmp_path, tiny_verifier_dir):
    r = invoke("inspect", make_source(tmp_path), "--verifier", tiny_verifier_dir, "--verifier-name", HUB,
               "--format", "json")
    assert r.exit_code == 0, r.stderr
    obj = one_json(r.stdout)
    assert obj["plan"]["config"]["aux_hidden_state_layer_ids"] == [1, 3, 5]


def test_inspect_human(tmp_path):
    r = invoke("inspect", make_source(tmp_path))
    assert r.exit_code == 0
    assert "zlab_dflash" in r.stdout and "supported: yes" in r.stdout


def test_inspect_unknown_format_exit3(tmp_path):
    d = tmp_path / "weird"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    from fixtures_dflash import body_tensors, write_source

    write_source(d, None, body_tensors(layers=1))  # weights present: not a "no draft body" refusal
    r = invoke("inspect", d, "--format", "json")
    assert r.exit_code == 3
    obj = one_json(r.stdout)
    assert obj["supported"] is False and obj["format"] == "unknown" and "GPT2LMHeadModel" in obj["reason"]


def test_inspect_refused_format_exit3(tmp_path):
    src = make_source(tmp_path, config_updates={"architectures": ["DFlash2DraftModel"]})
    r = invoke("inspect", src, "--format", "json")
    assert r.exit_code == 3
    obj = one_json(r.stdout)
    assert obj["supported"] is False and obj["format"] != "zlab_dflash" and obj["reason"]


def test_convert_refused_format_exit3(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path, config_updates={"architectures": ["DFlash2DraftModel"]})
    r = invoke("convert", src, "--verifier", tiny_verifier_dir, "-o", tmp_path / "out", "--format", "json")
    assert r.exit_code == 3
    err = one_json(r.stdout)
    assert err["exit_code"] == 3 and err["error"] == "unsupported_format" and "not supported" in err["message"]
    assert not (tmp_path / "out").exists()


def test_convert_unknown_format_exit3(tmp_path, tiny_verifier_dir):
    d = tmp_path / "weird"
    d.mkdir()
    (d / "config.json").write_text("{}")
    r = invoke("convert", d, "--verifier", tiny_verifier_dir, "-o", tmp_path / "out", "--format", "json")
    assert r.exit_code == 3 and one_json(r.stdout)["error"] == "unsupported_format"


def test_missing_source_exit3(tmp_path, tiny_verifier_dir):
    r = invoke("convert", tmp_path / "nope", "--verifier", tiny_verifier_dir, "-o", tmp_path / "out", "--format", "json")
    assert r.exit_code == 3 and one_json(r.stdout)["exit_code"] == 3


@pytest.mark.parametrize("argv", [
    ["convert", "SRC", "--verifier", "V", "--bogus-flag"],
    ["convert", "SRC"],  # missing --verifier
    ["convert", "SRC", "--verifier", "V", "--dtype", "int8"],
    ["convert", "SRC", "--verifier", "V", "--aux-layer-ids", "a,b"],
])
def test_bad_flags_exit2_with_json_error(argv, tmp_path):
    r = invoke(*argv, "--format", "json")
    assert r.exit_code == 2
    err = one_json(r.stdout)
    assert err["exit_code"] == 2 and err["error"] == "usage" and err["message"]
    assert "Usage:" in r.stderr


def test_bad_flag_human_exit2(tmp_path):
    r = invoke("convert", "SRC", "--verifier", "V", "--bogus-flag")
    assert r.exit_code == 2 and r.stdout == "" and "--bogus-flag" in r.stderr


def test_unknown_command_exit2():
    assert invoke("frobnicate").exit_code == 2


def test_convert_human_output(tmp_path, tiny_verifier_dir):
    r = invoke("convert", make_source(tmp_path), "--verifier", tiny_verifier_dir, "--verifier-name", HUB,
               "-o", tmp_path / "out")
    assert r.exit_code == 0, r.stderr
    assert "zlab_dflash" in r.stdout and "[1, 3, 5]" in r.stdout
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.stdout)


# ------------------------------------------------------------------------------- formats
def test_formats_lists_every_converter():
    from specconv.converters import REGISTRY, ordered

    r = invoke("formats", "--format", "json")
    assert r.exit_code == 0
    rows = one_json(r.stdout)["formats"]
    assert [x["format"] for x in rows] == [c.format_id for c in ordered()]
    assert {x["format"] for x in rows} == set(REGISTRY)
    for x in rows:
        assert {"format", "algorithm", "supported", "title"} <= set(x)
    dflash = {x["format"] for x in rows if x["supported"] and x["algorithm"] == "dflash"}
    assert {"zlab_dflash", "specforge_dflash", "modelopt_dflash", "nemo_dflash", "muse_glimmer_dflash",
            "deepspec_dflash"} <= dflash
    assert any(not x["supported"] for x in rows)  # refusals are listed too


def test_formats_human():
    r = invoke("formats")
    assert r.exit_code == 0 and "zlab_dflash" in r.stdout and "refused" in r.stdout


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

    r = invoke("--version")
    assert r.exit_code == 0 and specconv.__version__ in r.stdout


def test_console_script_installed():
    exe = Path(sys.executable).parent / "specconv"
    if not exe.exists():
        pytest.skip("console script not installed in this environment")
    p = subprocess.run([str(exe), "formats", "--format", "json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and one_json(p.stdout)["formats"]


def test_validate_refuses_non_speculators_dir_and_writes_nothing(tmp_path):
    """A z-lab (source) dir given to validate: exit 3 with a hint, DIR untouched."""
    import json as _json

    from click.testing import CliRunner

    from specconv.cli.main import cli

    d = tmp_path / "zlab"
    d.mkdir()
    (d / "config.json").write_text(_json.dumps({"architectures": ["DFlashDraftModel"], "dflash_config": {}}))
    before = sorted(p.name for p in d.iterdir())
    r = CliRunner().invoke(cli, ["validate", str(d), "--verifier", str(tmp_path), "--format", "json"])
    assert r.exit_code == 3
    out = _json.loads(r.stdout)
    assert out["error"] == "not_speculators_dir" and "specconv convert" in out["hint"]
    assert sorted(p.name for p in d.iterdir()) == before
