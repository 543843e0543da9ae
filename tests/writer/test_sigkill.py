"""Atomicity under SIGKILL: a killed `specconv convert` never leaves a half-written output,
never loses the previous one, and the next run cleans up after it (specconv/outdir.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures_dflash import HUB, make_source, sha_tree
from specconv.outdir import clean_stale
from specconv.tensors import open_store

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]

# A run of the real CLI in a child process; the hook (``HOOK``) only slows or kills it at a
# chosen point, the code path is the shipped one.
_RUN = """
import os, signal, sys, time
HOOK = sys.argv.pop(1)
if HOOK == "slow-copy":  # a slow disk: every chunk's write takes 20 ms more
    import specconv.tensors.onepass as op
    real_write = op._write_job
    def slow(*a):
        time.sleep(0.02)
        return real_write(*a)
    op._write_job = slow
elif HOOK in ("kill-before-exchange", "kill-after-exchange"):
    import specconv.outdir as od
    real_x = od.exchange
    def x(a, b):
        if HOOK == "kill-before-exchange":
            os.kill(os.getpid(), signal.SIGKILL)
        ok = real_x(a, b)
        os.kill(os.getpid(), signal.SIGKILL)
        return ok
    od.exchange = x
elif HOOK == "kill-between-renames":  # the fallback for filesystems without RENAME_EXCHANGE
    import specconv.outdir as od
    od.exchange = lambda a, b: False
    real_rename = os.rename
    def rename(a, b, *r, **k):
        if os.path.basename(str(a)).startswith(".") and ".tmp-" in str(a):
            os.kill(os.getpid(), signal.SIGKILL)
        return real_rename(a, b, *r, **k)
    os.rename = rename
from specconv.cli.main import main
sys.argv[0] = "specconv"
main()
"""


def _cmd(hook: str, src: Path, verifier: Path, out: Path, *extra: str) -> list[str]:
    return [PY, "-c", _RUN, hook, "convert", str(src), "--verifier", str(verifier), "--verifier-name", HUB,
            "-o", str(out), "--format", "json", *extra]


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "SPECCONV_CACHE": str(cache), "OMP_NUM_THREADS": "1"}


def _hidden(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A 282 MB z-lab DFlash drafter (9 layers, hidden 1024, bf16) and a matching verifier,
    generated with benchmarks/convert_vs_cp.py's writers at smaller shapes."""
    spec = importlib.util.spec_from_file_location("convert_vs_cp", ROOT / "benchmarks" / "convert_vs_cp.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for k, v in dict(HIDDEN=1024, INTERMEDIATE=4096, N_HEADS=8, N_KV_HEADS=2, VOCAB=4096, MASK_TOKEN_ID=4000).items():
        setattr(bench, k, v)
    d = tmp_path_factory.mktemp("big")
    n = bench.make_drafter(d / "drafter", 9)
    bench.make_verifier(d / "verifier", "1GB")
    assert n >= 256 * 2**20
    return d / "drafter", d / "verifier"


def _wait_mid_copy(proc: subprocess.Popen, parent: Path, name: str, at_least: int) -> Path:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        for t in parent.glob(f".{name}.tmp-*/model.safetensors.tmp"):
            try:
                if t.stat().st_blocks * 512 >= at_least:
                    return t
            except FileNotFoundError:
                pass
        time.sleep(0.005)
    raise AssertionError(f"never saw the copy in progress (rc {proc.poll()})")


@pytest.mark.slow
def test_sigkill_mid_copy_then_next_run_cleans_and_succeeds(big, tmp_path):
    drafter, verifier = big
    out = tmp_path / "out"
    proc = subprocess.Popen(_cmd("slow-copy", drafter, verifier, out), env=_env(tmp_path / "cache"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        part = _wait_mid_copy(proc, tmp_path, "out", 32 * 2**20)
        # a live conversion's temp dir is never cleaned by another run
        assert clean_stale(out) == [] and part.parent.is_dir()
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not out.exists()  # no half-written output under the real name
    assert part.parent.name in _hidden(tmp_path)  # the dead run's temp dir, now unlocked
    p = subprocess.run(_cmd("none", drafter, verifier, out), env=_env(tmp_path / "cache"),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert _hidden(tmp_path) == []  # stale temp dir and lock removed
    src, dst = open_store(drafter), open_store(out)
    assert src.names() == [n for n in dst.names() if n in src] and all(
        src.read_bytes(n) == dst.read_bytes(n) for n in src.names())


@pytest.mark.slow
@pytest.mark.parametrize("hook", ["kill-before-exchange", "kill-after-exchange", "kill-between-renames"])
def test_sigkill_during_overwrite_swap(hook, tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path / "src")
    out = tmp_path / "outs" / "out"
    out.parent.mkdir()
    earlier = subprocess.run(_cmd("none", make_source(tmp_path / "earlier", seed=1), tiny_verifier_dir, out),
                             env=_env(tmp_path / "cache"), capture_output=True, text=True, timeout=120)
    assert earlier.returncode == 0, earlier.stderr  # the previous output: specconv's own (what --overwrite replaces)
    before = sha_tree(out)
    p = subprocess.run(_cmd(hook, src, tiny_verifier_dir, out, "--overwrite"), env=_env(tmp_path / "cache"),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr
    parent = out.parent
    if hook == "kill-before-exchange":
        assert sha_tree(out) == before  # the previous output, untouched
    elif hook == "kill-after-exchange":
        assert (out / "specconv.json").is_file() and sha_tree(out) != before  # complete new one
        old = [parent / n for n in _hidden(parent) if not n.endswith(".lock")]
        assert len(old) == 1 and sha_tree(old[0]) == before  # previous one in the dead run's temp dir
    else:  # two renames, killed between them: the previous output waits in .old-, restored first
        assert not out.exists() and any(".old-" in n for n in _hidden(parent))
        assert any(".old-" in n for n in clean_stale(out))
        assert sha_tree(out) == before
    p = subprocess.run(_cmd("none", src, tiny_verifier_dir, out, "--overwrite"), env=_env(tmp_path / "cache"),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["output"] == str(out) and (out / "specconv.json").is_file()
    assert _hidden(parent) == []


def test_clean_stale_rules(tmp_path):
    from specconv.outdir import OutputTemp

    out = tmp_path / "out"
    live = OutputTemp(out)  # held lock: a concurrent conversion (flock conflicts across open files)
    dead = tmp_path / ".out.tmp-999999999-abcd1234"  # no such pid, no lock file: stale
    dead.mkdir()
    legacy = tmp_path / ".out.tmp-k3j4h5g6"  # an older specconv's name, no pid: kept while recent
    legacy.mkdir()
    orphan = tmp_path / ".out.tmp-999999998-ffff.lock"  # lock file whose dir is gone
    orphan.write_text("")
    old = tmp_path / ".out.old-999999997-0000"  # a previous output parked by a killed fallback swap
    old.mkdir()
    (old / "notes.txt").write_text("previous\n")
    removed = clean_stale(out)
    assert sorted(removed) == [old.name, dead.name]
    assert (out / "notes.txt").read_text() == "previous\n"  # restored, since out was missing
    assert live.path.is_dir() and live.lock.exists() and legacy.is_dir() and not orphan.exists()
    live.release()
    assert not live.path.exists() and not live.lock.exists()
    assert clean_stale(out) == [] and legacy.is_dir()
