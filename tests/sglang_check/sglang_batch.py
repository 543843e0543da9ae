"""The SGLang room's loader checks in ONE runner subprocess (SGLang's import costs 20–150 s).

Each module of this room that loads dirs with SGLang defines
``sglang_jobs(root, smollm2_dir, tiny_verifier_dir) -> (checks, finish)``: the runner's job
entries and ``finish(result)``, which turns the runner's ``{"env", "results"}`` for those
entries (in order) into what its tests read. Its module fixture calls :func:`share`: the first
call builds the jobs of every such module this session runs (``-k`` and single-file runs build
only theirs), runs them with :func:`specconv.engines.sglang.check.run_checks` once and keeps each
module's share on the session; later calls take theirs. (A plain module, not a room
``conftest.py``: that name would shadow ``tests/conftest.py`` for ``from conftest import``.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
_SHARES = pytest.StashKey[dict]()


def _modules(session) -> list:
    """This room's modules with ``sglang_jobs`` among the session's (selected) tests."""
    mods = {getattr(item, "module", None) for item in session.items}
    return sorted((m for m in mods if m is not None and hasattr(m, "sglang_jobs")
                   and Path(m.__file__).resolve().parent == HERE), key=lambda m: m.__name__)


def _run(session, tmp_path_factory, smollm2_dir, tiny_verifier_dir) -> dict:
    """``{module name: finish(its part of the run)}`` for every module of :func:`_modules`."""
    from specconv.engines.sglang.check import run_checks

    planned = []
    for mod in _modules(session):
        checks, finish = mod.sglang_jobs(tmp_path_factory.mktemp(mod.__name__), smollm2_dir, tiny_verifier_dir)
        planned.append((mod.__name__, checks, finish))
    result = run_checks([c for _, checks, _ in planned for c in checks])
    assert len(result["results"]) == sum(len(checks) for _, checks, _ in planned)
    out, start = {}, 0
    for name, checks, finish in planned:
        out[name] = finish({"env": result["env"], "results": result["results"][start:start + len(checks)]})
        start += len(checks)
    return out


def share(request, module: str) -> object:
    """What ``module``'s ``finish`` made of its part of the room's one runner run (the run
    happens on the first call of the session)."""
    stash = request.session.stash
    if _SHARES not in stash:
        stash[_SHARES] = _run(request.session, request.getfixturevalue("tmp_path_factory"),
                              request.getfixturevalue("smollm2_dir"), request.getfixturevalue("tiny_verifier_dir"))
    return stash[_SHARES][module]
