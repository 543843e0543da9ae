"""Golden cases, groups ``commands`` and ``slow``: every other command's ``--format json``.

* ``formats``; ``push --dry-run`` (unvalidated, with ``--detailed-exitcode``, ``--tag``,
  ``--exclude``) against the loopback Hub double with the real huggingface_hub client in one
  online subprocess (:mod:`golden.online`); ``validate`` (1 prompt × 4 tokens on the tiny
  SmolLM2-tokenizer verifier of ``tests/validate/test_validate_cli.py``) then ``push --dry-run`` of
  the validated dir; ``build-engine`` without a graph.
* ``slow``: ``export onnx`` (ORT parity check on) and ``release --dry-run``.

Validate / export / release numbers are CPU-computed: those records are *loose* (floats →
``<float>``; keys, ints, bools and strings exact), see :mod:`golden.normalise`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from golden.workspace import HUB, REPO, TOKEN, Workspace, contents, parse_stdout, run_cli

Runner = Callable[[Workspace, Path], dict[str, Any]]
ONLINE = Path(__file__).resolve().parent / "online.py"
TINY_VALIDATE = ("--num-prompts", "1", "--max-new-tokens", "4", "--device", "cpu")


def hub_requests(ws: Workspace, since: int) -> list[str]:
    """``METHOD path`` of the Hub double's requests after index ``since`` (unique, sorted)."""
    return sorted({f"{r.method} {r.path.split('?')[0]}" for r in ws.double.requests[since:]})


def _online_env(ws: Workspace, hf_home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGINGFACE_", "GITHUB_")) and k.lower() not in ("http_proxy", "https_proxy")}
    env.update(HF_HUB_OFFLINE="0", HF_ENDPOINT=ws.double.url, HF_HUB_DISABLE_XET="1", HF_HOME=str(hf_home),
               HF_TOKEN=TOKEN, HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1",
               SPECCONV_HUB_RETRY_DELAY="0.001", SPECCONV_HASH_CACHE="0", NO_PROXY="127.0.0.1,localhost",
               OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return env


def online(ws: Workspace, d: Path, calls: dict[str, tuple[list, bool]]) -> dict[str, dict[str, Any]]:
    """Run ``calls`` (``name → (argv, loose)``) in one online subprocess against the Hub
    double; return ``name →`` the same record :func:`golden.workspace.run_cli` builds
    (plus ``hub_requests``). Files written are watched under ``d``."""
    io = ws.root / "online" / d.name
    io.mkdir(parents=True)
    spec = [{"argv": [*map(str, argv), "--format", "json"], "cwd": str(ws.root / "cwd"), "watch": str(d)}
            for argv, _ in calls.values()]
    (io / "calls.json").write_text(json.dumps(spec))
    n = len(ws.double.requests)
    p = subprocess.run([sys.executable, str(ONLINE), str(io / "calls.json"), str(io / "results.json")],
                       env=_online_env(ws, io / "hf-home"), capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"online driver failed ({p.returncode}):\n{p.stderr[-4000:]}")
    out = {}
    for (name, (argv, loose)), r in zip(calls.items(), json.loads((io / "results.json").read_text()), strict=True):
        rec = {"argv": ws.norm.argv(argv), "exit_code": r["exit_code"],
               "stdout": ws.norm.with_loose(loose)(parse_stdout(r["stdout"]))}
        if r["exception"]:
            rec["exception"] = r["exception"]
        rec.update(traceback_on_stderr=r["traceback_on_stderr"], written=r["written"])
        out[name] = rec
    out["hub_requests"] = hub_requests(ws, n)
    return out


def tiny_conversion(ws: Workspace, d: Path, name: str = "drafter") -> tuple[Path, dict[str, Any]]:
    """Convert the default tiny z-lab DFlash source into ``d/name`` (the record of the call)."""
    from fixtures_dflash import make_source

    src = make_source(d / "src")
    out = d / name
    return out, run_cli(ws, ["convert", src, "--verifier", ws.verifier("qwen3"), "--verifier-name", HUB, "-o", out],
                        watch=d)


def validate_set(ws: Workspace) -> dict[str, Path]:
    """conftest.make_validate_set: tiny Llama verifier with SmolLM2's tokenizer, a random
    z-lab DFlash drafter (written by the dflash package), its conversion, a 2-prompt file."""
    from conftest import make_validate_set

    return ws.shared("validate-tiny", lambda d: make_validate_set(d, ws.smollm2))


# --------------------------------------------------------------------------- commands
def formats(ws: Workspace, d: Path) -> dict[str, Any]:
    return {"formats": run_cli(ws, ["formats"], watch=d)}


def push_dry_run(ws: Workspace, d: Path) -> dict[str, Any]:
    out, conv = tiny_conversion(ws, d)
    extra = d / "with-notes"
    shutil.copytree(out, extra)
    (extra / "notes.txt").write_text("scratch\n")
    base = ["--repo-id", "specconv-test/golden", "--allow-unvalidated", "--dry-run"]
    rec = {"convert": conv}
    rec.update(online(ws, d, {
        "push": (["push", out, *base], False),
        "push_detailed_exitcode": (["push", out, *base, "--detailed-exitcode"], False),
        "push_tag": (["push", out, *base, "--tag", "v1.2.3"], False),
        "push_exclude": (["push", extra, *base, "--exclude", "notes.txt"], False),
    }))
    return rec


def validate(ws: Workspace, d: Path) -> dict[str, Any]:
    """convert + validate (all four gates) the tiny validate set, then push --dry-run the result."""
    b = validate_set(ws)
    spec = d / "spec"
    conv = ["convert", b["zlab"], "--verifier", b["verifier"], "--verifier-name", "org/tiny-llama", "-o", spec]
    rec = {"convert": run_cli(ws, conv, watch=d)}
    rec["validate"] = run_cli(ws, ["validate", spec, "--verifier", b["verifier"], "--source", b["zlab"], "--prompts",
                                    b["prompts"], *TINY_VALIDATE, "--report-dir", d / "report"], watch=d, loose=True)
    rec["report"] = contents(d / "report", ws.norm.with_loose())
    rec["drafter"] = contents(spec, ws.norm.with_loose())
    rec.update(online(ws, d, {"push": (["push", spec, "--repo-id", "specconv-test/golden-validated", "--dry-run"],
                                       True)}))
    return rec


def build_engine_without_graph(ws: Workspace, d: Path) -> dict[str, Any]:
    out, conv = tiny_conversion(ws, d)
    return {"convert": conv, "build_engine": run_cli(ws, ["build-engine", out, "--builder", "rtx"], watch=d)}


CASES: dict[str, Runner] = {
    "formats": formats, "push_dry_run": push_dry_run, "validate": validate,
    "build_engine_without_graph": build_engine_without_graph,
}


# ------------------------------------------------------------------------------- slow
def export_onnx(ws: Workspace, d: Path) -> dict[str, Any]:
    """export onnx of the tiny z-lab conversion (smallest graph: batch ≤ 2, context ≤ 16)."""
    out, conv = tiny_conversion(ws, d)
    rec = {"convert": conv,
           "export": run_cli(ws, ["export", "onnx", out, "--verifier", ws.verifier("qwen3"), "--max-batch", "2",
                                  "--max-context", "16"], watch=d, loose=True)}
    rec["onnx"] = contents(out / "onnx", ws.norm.with_loose())
    rec["record"] = ws.norm.with_loose()(json.loads((out / "specconv.json").read_text()))
    return rec


def release_dry_run(ws: Workspace, d: Path) -> dict[str, Any]:
    """release --dry-run (convert → validate → push plan) of the tiny validate set's source."""
    b = validate_set(ws)
    argv = ["release", b["zlab"], "--verifier", b["verifier"], "--verifier-name", "org/tiny-llama", "--repo-id",
            "specconv-test/golden-release", "--work-dir", d / "work", "--prompts", b["prompts"], *TINY_VALIDATE,
            "--dry-run"]
    rec = online(ws, d, {"release": (argv, True)})
    rec["work"] = sorted(str(p.relative_to(d / "work")) for p in (d / "work").rglob("*") if p.is_file())
    return rec


SLOW: dict[str, Runner] = {"export_onnx": export_onnx, "release_dry_run": release_dry_run}
