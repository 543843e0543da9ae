"""The shared low-level helpers, one each: ``specconv.fileio`` (atomic file write, reading a
JSON object) and ``specconv.values`` (the integer check), and the scan that keeps the atomic
write from being written out again."""

from __future__ import annotations

import ast
import json
import os
import stat
from pathlib import Path

import pytest

from specconv.errors import InvalidInputError
from specconv.fileio import atomic_write, read_json_object
from specconv.values import is_int

ROOT = Path(__file__).resolve().parents[2]


def test_atomic_write_text_bytes_mode_and_parents(tmp_path):
    target = tmp_path / "new" / "dir" / "f.json"
    atomic_write(target, "ü\n")
    assert target.read_bytes() == "ü\n".encode()
    atomic_write(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask  # what a plain open(..., "w") gives
    assert [p.name for p in target.parent.iterdir()] == ["f.json"]  # no temp file left


def test_atomic_write_keeps_the_old_file_when_the_replace_fails(tmp_path, monkeypatch):
    target = tmp_path / "f.txt"
    target.write_text("old")

    def refuse(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, "new")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_read_json_object_reads_an_object(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"a": [1, 2], "b": None}))
    assert read_json_object(p) == {"a": [1, 2], "b": None}


@pytest.mark.parametrize("content, template", [
    (b"[1, 2]", "not_object"),
    (b'"text"', "not_object"),
    (b"{not json", "unreadable"),
    (b'{"a": "\xf4\x80"}', "unreadable"),  # not UTF-8
    (b"[" * 100_000 + b"]" * 100_000, "unreadable"),  # nested too deeply for the decoder
    (None, "unreadable"),  # no such file
])
def test_read_json_object_refuses_naming_the_file(tmp_path, content, template):
    p = tmp_path / "c.json"
    if content is not None:
        p.write_bytes(content)
    templates = {"unreadable": "R {path} ({error})", "not_object": "N {path}"}
    with pytest.raises(InvalidInputError) as e:
        read_json_object(p, code="some_code", **templates)
    assert e.value.code == "some_code" and e.value.exit_code == 3
    assert e.value.message.startswith(templates[template].split()[0] + f" {p}")
    with pytest.raises(InvalidInputError) as e:  # the default wording and slug
        read_json_object(p)
    assert e.value.code == "invalid_input" and e.value.message.startswith(f"{p}: ")


@pytest.mark.parametrize("value, minimum, ok", [
    (1, None, True), (0, None, True), (-3, None, True), (True, None, False), (False, None, False),
    (1.0, None, False), ("1", None, False), (None, None, False),
    (1, 1, True), (0, 1, False), (True, 1, False), (2, 2, True), (1, 2, False), (0, 0, True), (-1, 0, False),
])
def test_is_int(value, minimum, ok):
    assert is_int(value, minimum) is ok


def _hand_written_atomic_writes(path: Path) -> list[str]:
    """Functions of ``path`` that ``os.replace`` / ``os.rename`` a file they wrote themselves
    (a temp file: ``mkstemp``, ``write_text`` / ``write_bytes``, ``open`` / ``fdopen``); a
    directory swap (``mkdtemp``) is not a file write."""
    out = []
    for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        calls = [n.func for n in ast.walk(fn) if isinstance(n, ast.Call)]
        names = {f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "") for f in calls}
        renames = any(isinstance(f, ast.Attribute) and f.attr in ("replace", "rename") and isinstance(f.value, ast.Name)
                      and f.value.id == "os" for f in calls)
        if renames and names & {"mkstemp", "write_text", "write_bytes", "open", "fdopen"} and "mkdtemp" not in names:
            out.append(fn.name)
    return out


#: Exempt, with the reason: the one helper itself; the safetensors shard writer, which streams
#: tensor bytes through the one-pass engine into its file descriptor (no bytes to hand over);
#: the vLLM and SGLang loader checks' runners, which run in those engines' interpreters and import
#: nothing from specconv.
EXEMPT = {"specconv/fileio.py": ["atomic_write"], "specconv/tensors/write.py": ["_write_one"],
          "specconv/engines/vllm/runner.py": ["_write"], "specconv/engines/sglang/runner.py": ["_write"]}


@pytest.mark.slow
def test_the_atomic_file_write_is_written_once():
    """Everything else calls ``specconv.fileio.atomic_write`` (issue 15 item 7: it was written
    four times: record.py, export/engine.py's manifest, tensors/write.py's index, writer.py's
    hash cache)."""
    found = {str(p.relative_to(ROOT)): fns for p in sorted((ROOT / "specconv").rglob("*.py"))
             if (fns := _hand_written_atomic_writes(p))}
    assert found == EXEMPT
