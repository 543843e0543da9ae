"""Small helpers shared by the DSpark converter tests (CLI runner, output readers)."""

from __future__ import annotations

import json
from pathlib import Path


def run_cli(*args) -> tuple[int, dict | None, str]:
    """Run ``specconv ARGS --format json`` in-process; return (exit code, JSON stdout, stderr)."""
    from click.testing import CliRunner

    from specconv.cli.main import cli

    res = CliRunner().invoke(cli, [str(a) for a in args] + ["--format", "json"], catch_exceptions=False)
    try:
        data = json.loads(res.stdout) if res.stdout.strip() else None
    except json.JSONDecodeError:
        data = None
    return res.exit_code, data, res.stderr


def convert_cli(src: Path, verifier: Path, out: Path, *flags) -> tuple[int, dict | None, str]:
    return run_cli("convert", src, "--verifier", verifier, "--verifier-name", "org/tiny-qwen3", "-o", out, *flags)


def out_config(out: Path) -> dict:
    return json.loads((Path(out) / "config.json").read_text())


def out_tensors(d: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(d) / "model.safetensors"))


def record(out: Path) -> dict:
    return json.loads((Path(out) / "specconv.json").read_text())["conversion"]


def plan_for(src: Path, verifier: Path, **opts):
    """Detect + plan without writing (returns (converter class, plan))."""
    from specconv.convert import detect
    from specconv.converters import ConvertOptions, SourceInfo
    from specconv.verifier import resolve_verifier

    s = SourceInfo.open(Path(src))
    cls = detect(s)
    return cls, cls().plan(s, resolve_verifier(str(verifier), name="org/tiny-qwen3"), ConvertOptions(**opts))


def detected(src: Path) -> str:
    from specconv.convert import detect
    from specconv.converters import SourceInfo

    return detect(SourceInfo.open(Path(src))).format_id
