"""Small helpers shared by the DSpark converter tests (output readers, detect / plan); the CLI
runners are ``cli_runner.invoke`` and ``fixtures_dflash.cli_convert``."""

from __future__ import annotations

import json
from pathlib import Path


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
