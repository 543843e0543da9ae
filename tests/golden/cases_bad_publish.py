"""Golden cases, group ``bad_inputs`` (the newer commands): the hostile inputs of
``tests/cli/test_bad_inputs_publish.py`` on push, release, export/build-engine and validate, built
with that module's parameter lists. In-process (each is refused before any Hub request;
``hub_requests`` records that none was sent). Not covered: the relative ``--vllm-python``
resolution (host paths; its own test keeps it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from golden.cases_bad import add, case_id, params
from golden.cases_commands import hub_requests, tiny_conversion
from golden.workspace import REPO, TOKEN, Workspace, run_cli

Runner = Callable[[Workspace, Path], dict[str, Any]]
EXAMPLE = REPO / "examples" / "smollm2-dflash-b8"


def tbn():
    """tests/cli/test_bad_inputs_publish.py (its parameter lists)."""
    import test_bad_inputs_publish

    return test_bad_inputs_publish


def hub_env(ws: Workspace) -> dict[str, str]:
    return {"HF_ENDPOINT": ws.double.url, "HF_TOKEN": TOKEN, "HF_HUB_DISABLE_XET": "1"}


def with_requests(ws: Workspace, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``fn()``'s record plus the Hub requests it sent."""
    n = len(ws.double.requests)
    rec = fn()
    rec["hub_requests"] = hub_requests(ws, n)
    return rec


def push_tag(tag: str) -> Runner:
    def run(ws: Workspace, d: Path) -> dict[str, Any]:
        out, _ = tiny_conversion(ws, d)
        argv = ["push", out, "--repo-id", "specconv-test/tags", "--allow-unvalidated", "--tag", tag]
        return with_requests(ws, lambda: {"push": run_cli(ws, argv, watch=d, env=hub_env(ws))})
    return run


def push_filter(flt: tuple) -> Runner:
    def run(ws: Workspace, d: Path) -> dict[str, Any]:
        out, _ = tiny_conversion(ws, d)
        argv = ["push", out, "--repo-id", "specconv-test/filters", "--allow-unvalidated", "--dry-run", *flt]
        return with_requests(ws, lambda: {"push": run_cli(ws, argv, watch=d, env=hub_env(ws))})
    return run


def release_bad_tag(ws: Workspace, d: Path) -> dict[str, Any]:
    argv = ["release", EXAMPLE, "--verifier", ws.smollm2, "--repo-id", "specconv-test/rel", "--work-dir", d / "work",
            "--tag", "release one"]
    return with_requests(ws, lambda: {"release": run_cli(ws, argv, watch=d, env=hub_env(ws))})


def release_foreign_work_dir(ws: Workspace, d: Path) -> dict[str, Any]:
    keep = d / "work" / "drafter" / "keep.txt"
    keep.parent.mkdir(parents=True)
    keep.write_text("mine\n")
    argv = ["release", EXAMPLE, "--verifier", ws.smollm2, "--repo-id", "specconv-test/rel", "--work-dir", d / "work",
            "--dry-run"]
    return with_requests(ws, lambda: {"release": run_cli(ws, argv, watch=d, env=hub_env(ws))})


def engine_profile(spec: str) -> Runner:
    """test_profile_with_empty_or_repeated_entries_is_a_usage_error (the parser itself)."""
    def run(ws: Workspace, d: Path) -> dict[str, Any]:
        from specconv.engines.tensorrt.build import parse_profile
        from specconv.errors import SpecconvError

        dynamic = {"batch": {"min": 1, "max": 8}, "context": {"min": 1, "max": 64}}
        try:
            return {"parsed": parse_profile(spec, dynamic)}
        except SpecconvError as e:
            return {"raises": type(e).__name__, "error": e.code, "exit_code": e.exit_code,
                    "message": ws.norm.text(str(e))}
    return run


def validate_foreign_onnx(ws: Workspace, d: Path) -> dict[str, Any]:
    out, _ = tiny_conversion(ws, d)
    onnx = d / "onnx"
    (onnx / "fp32").mkdir(parents=True)
    files = {}
    for rel, data in (("fp32/drafter.onnx", b"graph"), ("fp32/drafter.onnx.data", b"weights")):
        (onnx / rel).write_bytes(data)
        files[rel] = hashlib.sha256(data).hexdigest()
    (onnx / "onnx_meta.json").write_text(json.dumps({"files": files, "drafter_files": {"config.json": "0" * 64}}))
    argv = ["validate", out, "--verifier", d / "no-verifier", "--onnx", onnx, "--dtype", "float32",
            "--report-dir", d / "rep"]
    return {"validate": run_cli(ws, argv, watch=d)}


def _cases() -> dict[str, Runner]:
    t = tbn()
    cases: dict[str, Runner] = {"release_bad_tag": release_bad_tag, "validate_foreign_onnx": validate_foreign_onnx,
                                "release_foreign_work_dir": release_foreign_work_dir}
    for tag in params(t.test_push_tag_that_is_not_a_version_is_refused_before_any_request):
        add(cases, case_id("push_tag", tag), push_tag(tag))
    for flt in params(t.test_filters_that_drop_the_drafter_are_refused_even_unvalidated):
        add(cases, case_id("push_filter", *flt), push_filter(flt))
    for spec in params(t.test_profile_with_empty_or_repeated_entries_is_a_usage_error):
        add(cases, case_id("engine_profile", spec), engine_profile(spec))
    return cases


CASES: dict[str, Runner] = _cases()
