"""The test tiers (tests/tiers.py, docs/ci.md "Test tiers"): the engine markers are where
``make test-fast`` expects them, and a test that starts an engine process without its marker
fails instead of running it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import tiers

REPO = tiers.REPO


def _llama(name: str = "llama-server") -> str:
    return str(tiers._llamacpp_root() / "somekey" / "bin" / name)


@pytest.mark.parametrize("argv, need", [
    ([sys.executable, "-c", "pass"], set()),
    ([str(REPO / ".venv-vllm" / "bin" / "python"), "runner.py"], {"engine_venv"}),
    ([str(REPO / ".venv-sglang" / "bin" / "python"), "-m", "sglang.launch_server"], {"engine_venv", "server"}),
    ([str(REPO / ".venv-vllm-cpu" / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", "m"],
     {"engine_venv", "server"}),
    ([_llama(), "-m", "t.gguf", "--port", "1"], {"llamacpp", "server"}),
    ([_llama(), "--version"], {"llamacpp"}),
    ([sys.executable, str(tiers._llamacpp_root() / "k" / "convert" / "convert_hf_to_gguf.py"), "src"], {"llamacpp"}),
    (["/tmp/fake/bin/llama-server", "-m", "x"], set()),  # a double is no engine
    ("echo hi", set()),
])
def test_what_an_argv_needs(argv, need):
    assert tiers.needs_of(argv) == need


def test_an_engine_python_named_by_its_variable_needs_engine_venv(monkeypatch, tmp_path):
    py = str(tmp_path / "elsewhere" / "python")
    monkeypatch.setenv("SPECCONV_VLLM_LOADER_PYTHON", py)
    assert tiers.needs_of([py, "job.json"]) == {"engine_venv"}


def test_implied_marks():
    assert tiers.implied_marks(set(), ["tmp_path", "llamacpp_build"]) == {"llamacpp"}
    assert tiers.implied_marks({"vllm_serve"}, []) == {"server", "engine_venv"}
    assert tiers.implied_marks({"sglang", "engine_venv"}, []) == set()


def test_every_collected_test_carries_the_markers_of_its_fixtures_and_engines(request):
    """Over this session's collection (``tests/conftest.py`` applies :func:`tiers.implied_marks`):
    a test using a fixture of ``FIXTURE_MARKS`` or marked vllm/sglang/vllm_serve has the markers
    that ``make test-fast`` leaves out."""
    bad = [(it.nodeid, sorted(miss)) for it in request.session.items
           if (miss := tiers.implied_marks({m.name for m in it.iter_markers()}, it.fixturenames))]
    assert not bad, bad


def test_the_engine_markers_are_registered_and_left_out_by_test_fast():
    text = (REPO / "pyproject.toml").read_text()
    make = (REPO / "Makefile").read_text()
    fast = next(line for line in make.splitlines() if "pytest" in line and "-m" in line and "not slow" in line)
    for m in tiers.ENGINE_MARKS:
        assert f'"{m}: ' in text, m
        assert f"not {m}" in fast, (m, fast)


def _item(*marks: str, path: str = "tests/x/test_x.py"):
    return SimpleNamespace(nodeid=f"{path}::t", path=Path(path),
                           iter_markers=lambda: [SimpleNamespace(name=m) for m in marks])


def test_the_guard_refuses_an_unmarked_engine_process_before_it_starts(tmp_path):
    """A Popen of an engine venv's Python from a test without ``engine_venv`` raises (nothing
    runs: the marker file is never written) and is recorded for the report."""
    guard = tiers.Guard()
    guard.item = _item("peer")
    marker = tmp_path / "ran"
    guard.install()
    try:
        with pytest.raises(pytest.fail.Exception, match="engine_venv"):
            subprocess.Popen([str(REPO / ".venv-vllm" / "bin" / "python"), "-c",
                              f"open({str(marker)!r}, 'w')"])
    finally:
        guard.uninstall()
    assert not marker.exists()
    assert "tests/x/test_x.py::t" in guard.refused


def test_the_guard_lets_a_marked_test_and_a_background_thread_of_its_file_through():
    import threading

    guard = tiers.Guard()
    guard.item = _item("server", "llamacpp")
    guard.check([_llama(), "-m", "t.gguf"])  # marked: allowed
    guard.item = _item()  # a later, unmarked test of the same file
    with pytest.raises(pytest.fail.Exception, match="llamacpp, server"):
        guard.check([_llama(), "-m", "t.gguf"])
    errors = []
    t = threading.Thread(target=lambda: errors.append(guard.check([_llama(), "-m", "t.gguf"])))
    t.start()
    t.join()
    assert errors == [None]  # started by a module fixture of the earlier, marked test


def test_servers_first_orders_files_by_their_longest_server_and_keeps_each_file_together():
    from types import SimpleNamespace

    import tiers

    def item(path, *marks):
        return SimpleNamespace(path=path, name=f"{path}-{marks}",
                               get_closest_marker=lambda m, marks=marks: m if m in marks else None)

    items = [item("a"), item("b", "server"), item("a"), item("c"), item("c", "vllm_serve", "server"), item("b")]
    tiers.servers_first(items)
    assert [i.path for i in items] == ["c", "c", "b", "b", "a", "a"]
    assert [i.name for i in items][:2] == ["c-()", "c-('vllm_serve', 'server')"]  # a file's own order kept
