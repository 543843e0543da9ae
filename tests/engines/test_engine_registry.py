"""The engine registry: the five built-ins are declared once (``pyproject.toml``'s entry-point
group), each surface name belongs to one engine, and docs/architecture.md's "Adding an engine"
names only what the code has."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest

from specconv.engines import ENTRY_POINT_GROUP, engine, engines, reset
from specconv.engines.base import Engine, Exporter, LoadCheck, OptionSpec, Runtime, Serve, Surface
from specconv.outdir import OutputKind

ROOT = Path(__file__).resolve().parents[2]


def test_the_builtins_are_declared_once_in_pyproject():
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][ENTRY_POINT_GROUP]
    assert set(table) == {"vllm", "onnx", "tensorrt", "sglang", "llamacpp"}
    reset()
    for key, value in table.items():
        e = engine(key)
        assert isinstance(e, Engine) and e.key == key and value == f"specconv.engines.{key}:ENGINE"
    assert [e.key for e in engines()][:5] == sorted(table, key=lambda k: (engine(k).order, k))


def test_every_surface_name_belongs_to_one_engine():
    commands, flags, kinds, record_keys = [], [], [], []
    for e in engines():
        kinds += list(e.output_kinds)
        if e.export is not None:
            commands.append(e.export.surface.command)
            flags += [e.export.surface.flag.name] if e.export.surface.flag else []
            record_keys += [e.export.record_key] if e.export.record_key else []
            assert e.export.kind in e.output_kinds, e.key
            assert type(e.export).run is not Exporter.run or type(e.export).write is not Exporter.write, e.key
    for names in (commands, flags, kinds, record_keys):
        assert len(names) == len(set(names)), names
    assert ("export", "gguf") in commands and ("build-engine",) in commands
    assert {"--export-onnx", "--build-engine", "--export-sglang", "--export-gguf"} <= set(flags)


def test_adding_an_engine_names_what_the_code_has():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc.split("## Adding an engine", 1)[1].split("\n## ", 1)[0]
    names = set(re.findall(r"`([a-z_]+)`", section))
    fields = {f.name for cls in (Engine, OptionSpec, Surface, Runtime, LoadCheck, OutputKind)
              for f in dataclasses.fields(cls)}
    members = {n for cls in (Exporter, Serve) for n in [*dir(cls), *cls.__annotations__] if not n.startswith("_")}
    meta_keys = {"format_version", "ok", "prompt_n"}  # meta file, load-check verdict, served-run key
    commands = {"push", "release", "validate"}  # the commands that reach the capabilities
    assert names - fields - members - meta_keys - commands - {"runtime", "export", "load_check", "serve"} == set()
    assert {"push_verdict", "release_step", "card_rows", "owns"} <= names
    for path in re.findall(r"`(specconv/[a-z_/]+\.py)`", section):
        assert (ROOT / path).is_file(), path


def test_an_export_flag_not_given_refuses_nothing(monkeypatch, tmp_path):
    """``release`` without ``--export-gguf`` needs no llama-server (the preflight ran for every engine
    and refused a release that never asked for a GGUF where no llama-server was built)."""
    from specconv.engines import engine
    from specconv.errors import InvalidInputError

    monkeypatch.setenv("SPECCONV_LLAMA_SERVER", str(tmp_path / "no-llama-server"))
    cap = engine("llamacpp").export
    cap.release_preflight({}, False)
    with pytest.raises(InvalidInputError):
        cap.release_preflight({}, True)
