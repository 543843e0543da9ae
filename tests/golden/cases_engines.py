"""Golden cases, group ``engines``: what every engine path writes and records, captured before the
engines moved into one registry (issue 26) so the move can be shown to change nothing.

All on the bundled SmolLM2 drafter (``examples/smollm2-dflash-b8``) converted against the real
SmolLM2-135M-Instruct verifier, validated on 1 prompt × 4 tokens (the push gates need a passed
validation of the bytes):

* ``export_sglang``: ``export sglang`` (files, ``export.sglang``), push ``--dry-run`` with and
  without the SGLang gate (``--sglang-repo-id`` refused: not checked);
* ``export_gguf_unchecked``: ``export gguf --no-check`` (files, ``export.gguf``), its push gate;
* ``export_onnx_push``: ``export onnx`` then the ``onnx/`` push gate (refused without
  ``--allow-verifier-weights``, planned with it);
* ``build_engine_fake``: ``build-engine --builder tensorrt`` against a stand-in ``tensorrt`` module
  and a stand-in CUDA GPU (``trt/<key>/``, ``build.json``, the manifest) and the ``trt/`` push gate;
* ``sglang_load_check`` (SGLang venv): ``validate --sglang-load-check`` and the checked export's
  push (both repos planned);
* ``gguf_llamacpp`` (llama.cpp build): ``export gguf`` with its llama-server check, ``validate
  --backend llamacpp``, the ``gguf/`` push gate;
* ``vllm_load_check`` (vLLM loader venv): ``validate --vllm-load-check``.

Numbers are CPU-computed: records are *loose* (:mod:`golden.normalise`). The drafted and accepted
counts of a real model (SmolLM2 in fp32, llama.cpp on its Q4_1 GGUF) may differ between CPUs at a near
tie, and the llama.cpp build dir is named by this machine's key: both are masked (:func:`stable`).
"""

from __future__ import annotations

import json
import os
import re
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from golden.cases_commands import online
from golden.workspace import REPO, SMOLLM2_HUB_ID, Workspace, contents, run_cli

Runner = Callable[[Workspace, Path], dict[str, Any]]
BUNDLED = REPO / "examples" / "smollm2-dflash-b8"
TINY = ("--prompts", "eval", "--num-prompts", "1", "--max-new-tokens", "4", "--device", "cpu")
PUSH = ("--repo-id", "specconv-test/golden-engines", "--dry-run")


def _validated(ws: Workspace, d: Path, *extra: Any) -> tuple[Path, dict[str, Any]]:
    """Convert the bundled drafter into ``d/drafter`` and validate it (torch, 1 prompt × 4 tokens)."""
    out = d / "drafter"
    rec = {"convert": run_cli(ws, ["convert", BUNDLED, "--verifier", ws.smollm2, "--verifier-name", SMOLLM2_HUB_ID,
                                   "-o", out], watch=d)}
    rec["validate"] = run_cli(ws, ["validate", out, "--verifier", ws.smollm2, *TINY, "--report-dir", d / "report",
                                   *extra], watch=d, loose=True)
    return out, rec


def _json_only(files: dict[str, Any]) -> dict[str, Any]:
    """A report's JSON (its Markdown restates the counts that :func:`stable` masks)."""
    return {k: v for k, v in files.items() if k.endswith(".json")}


def _record(out: Path, ws: Workspace) -> Any:
    """``out``'s record, normalised; the source path (relative to ``out``) made absolute first, so the checkout
    becomes ``<REPO>`` wherever the checkout and the scratch dir lie (a checkout under /tmp, as the scratch)."""
    rec = json.loads((out / "specconv.json").read_text())
    src = (rec.get("conversion") or {}).get("source") or {}
    if isinstance(src.get("path"), str) and not os.path.isabs(src["path"]):
        src["path"] = os.path.normpath(out / src["path"])
    return ws.norm.with_loose()(rec)


def export_sglang(ws: Workspace, d: Path) -> dict[str, Any]:
    out, rec = _validated(ws, d)
    rec["export"] = run_cli(ws, ["export", "sglang", out, "--verifier", ws.smollm2], watch=d, loose=True)
    rec["sglang"] = contents(out / "sglang", ws.norm.with_loose())
    rec["record"] = _record(out, ws)
    rec["card"] = contents(out, ws.norm.with_loose()).get("README.md")
    rec.update(online(ws, d, {"push": (["push", out, *PUSH], True),
                              "push_sglang_unchecked": (["push", out, *PUSH, "--sglang-repo-id",
                                                         "specconv-test/golden-engines-sglang"], True)}))
    return rec


def export_gguf_unchecked(ws: Workspace, d: Path) -> dict[str, Any]:
    out, rec = _validated(ws, d)
    rec["export"] = run_cli(ws, ["export", "gguf", out, "--verifier", ws.smollm2, "--no-check"], watch=d, loose=True)
    rec["gguf"] = contents(out / "gguf", ws.norm.with_loose())
    rec["record"] = _record(out, ws)
    rec.update(online(ws, d, {"push": (["push", out, *PUSH], True),
                              "push_allow": (["push", out, *PUSH, "--allow-verifier-weights"], True),
                              "push_unvalidated": (["push", out, *PUSH, "--allow-unvalidated",
                                                    "--allow-verifier-weights"], True)}))
    return rec


def export_onnx_push(ws: Workspace, d: Path) -> dict[str, Any]:
    out, rec = _validated(ws, d)
    rec["export"] = run_cli(ws, ["export", "onnx", out, "--verifier", ws.smollm2, "--max-batch", "2",
                                 "--max-context", "64"], watch=d, loose=True)
    rec["onnx"] = contents(out / "onnx", ws.norm.with_loose())
    rec["record"] = _record(out, ws)
    rec["card"] = contents(out, ws.norm.with_loose()).get("README.md")
    rec.update(online(ws, d, {"push": (["push", out, *PUSH], True),
                              "push_allow": (["push", out, *PUSH, "--allow-verifier-weights"], True)}))
    return rec


def _fake_tensorrt() -> types.ModuleType:
    """A stand-in ``tensorrt`` module whose builder returns fixed plan bytes (what
    tests/export/test_build_engine.py's ``fake_trt`` does, without recording calls)."""
    mod = types.ModuleType("tensorrt")

    class Enum:
        def __init__(self, *names: str) -> None:
            for i, n in enumerate(names):
                setattr(self, n, i)

    class Anything:
        def __init__(self, *a: Any, **k: Any) -> None:
            self.num_errors = 0

        def __getattr__(self, name: str) -> Callable[..., Any]:
            return lambda *a, **k: None

        def __setattr__(self, name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

    class Cache(Anything):
        def serialize(self) -> bytes:
            return b"CACHE"

    class Config(Anything):
        def create_timing_cache(self, b: bytes) -> Cache:
            return Cache()

    class Parser(Anything):
        def parse(self, model: bytes, path: str | None = None) -> bool:
            return True

    class Builder(Anything):
        def create_network(self, flags: int) -> object:
            return object()

        def create_builder_config(self) -> Config:
            return Config()

        def create_optimization_profile(self) -> Anything:
            return Anything()

        def build_serialized_network(self, network: object, config: object) -> bytes:
            return b"PLAN-BYTES"

    mod.__version__ = "11.4.0"
    mod.ILogger, mod.Builder, mod.OnnxParser = Anything, Builder, Parser
    mod.NetworkDefinitionCreationFlag = Enum("STRONGLY_TYPED")
    mod.MemoryPoolType = Enum("WORKSPACE")
    mod.BuilderFlag = Enum("TF32", "VERSION_COMPATIBLE")
    mod.HardwareCompatibilityLevel = Enum("NONE", "AMPERE_PLUS")
    return mod


def build_engine_fake(ws: Workspace, d: Path) -> dict[str, Any]:
    """build-engine against a stand-in TensorRT and a stand-in GPU (torch.cuda patched: the
    seams stay where they are whatever module builds the engine)."""
    import pytest
    import torch

    out, rec = _validated(ws, d)
    rec["export"] = run_cli(ws, ["export", "onnx", out, "--verifier", ws.smollm2, "--max-batch", "2",
                                 "--max-context", "64", "--dtype", "float32"], watch=d, loose=True)
    mp = pytest.MonkeyPatch()
    try:
        mp.setitem(sys.modules, "tensorrt", _fake_tensorrt())
        mp.setattr(torch.cuda, "is_available", lambda: True)
        mp.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
        mp.setattr(torch.cuda, "get_device_name", lambda i=0: "Fake H100")
        mp.setattr(torch.version, "cuda", "13.0")
        rec["build_engine"] = run_cli(ws, ["build-engine", out, "--builder", "tensorrt"], watch=d, loose=True)
    finally:
        mp.undo()
    rec["trt"] = {k: v for k, v in contents(out / "trt", ws.norm.with_loose()).items()
                  if k.endswith((".json", ".plan"))}
    rec["record"] = _record(out, ws)
    rec.update(online(ws, d, {"push": (["push", out, *PUSH], True),
                              "push_allow": (["push", out, *PUSH, "--allow-verifier-weights"], True)}))
    return rec


def sglang_load_check(ws: Workspace, d: Path) -> dict[str, Any]:
    out, rec = _validated(ws, d)
    rec["export"] = run_cli(ws, ["export", "sglang", out, "--verifier", ws.smollm2], watch=d, loose=True)
    rec["validate_check"] = run_cli(ws, ["validate", out, "--verifier", ws.smollm2, *TINY, "--report-dir",
                                         d / "report2", "--sglang-load-check"], watch=d, loose=True)
    rec["record"] = _record(out, ws)
    rec["card"] = contents(out, ws.norm.with_loose()).get("README.md")
    rec.update(online(ws, d, {"push_sglang": (["push", out, *PUSH, "--sglang-repo-id",
                                               "specconv-test/golden-engines-sglang"], True)}))
    return rec


def gguf_llamacpp(ws: Workspace, d: Path) -> dict[str, Any]:
    out, rec = _validated(ws, d)
    rec["export"] = run_cli(ws, ["export", "gguf", out, "--verifier", ws.smollm2], watch=d, loose=True)
    rec["validate_llamacpp"] = run_cli(ws, ["validate", out, "--verifier", ws.smollm2, *TINY, "--report-dir",
                                            d / "report2", "--backend", "llamacpp"], watch=d, loose=True)
    rec["report"] = _json_only(contents(d / "report2", ws.norm.with_loose()))
    rec["record"] = _record(out, ws)
    rec["card"] = contents(out, ws.norm.with_loose()).get("README.md")
    rec.update(online(ws, d, {"push": (["push", out, *PUSH], True),
                              "push_allow": (["push", out, *PUSH, "--allow-verifier-weights"], True)}))
    return rec


def vllm_load_check(ws: Workspace, d: Path) -> dict[str, Any]:
    out, rec = _validated(ws, d, "--vllm-load-check")
    rec["report"] = _json_only(contents(d / "report", ws.norm.with_loose()))
    rec["record"] = _record(out, ws)
    rec["card"] = contents(out, ws.norm.with_loose()).get("README.md")
    return rec


#: counts a real model's run may change from one CPU to another (near ties): masked as ``<count>``
COUNT_KEYS = frozenset({"histogram", "num_drafts", "num_draft_tokens", "num_accepted_tokens", "n_exact",
                        "n_output_tokens", "output_tokens", "mismatches", "near_tie_mismatches", "accepted_per_pos",
                        "tokens", "first_divergence", "completion_tokens", "draft_n", "draft_n_accepted"})
_PORT = "<port>"  # a free loopback port, a new one each run
_LLAMA_KEY = re.compile(r"/llama\.cpp/[0-9.]+-[0-9a-f]{16}/")
#: the climb from the scratch dir to the checkout (``conversion.source.path`` of the bundled
#: example), as deep as the scratch dir is: the path is kept from the checkout on
_UP_TO_REPO = re.compile(r"^(?:\.\./)*\.\.(?=<REPO>)")


def stable(obj: Any, key: str | None = None) -> Any:
    """``obj`` with :data:`COUNT_KEYS` values masked, the llama.cpp build key and argv ports replaced
    and a relative path to the checkout kept from the checkout on."""
    if key in COUNT_KEYS and not isinstance(obj, (dict, str, bool)) and obj is not None:
        return "<count>"
    if isinstance(obj, dict):
        return {k: stable(v, k) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_PORT if i and obj[i - 1] == "--port" else stable(v, key if isinstance(v, list) else None)
                for i, v in enumerate(obj)]
    if isinstance(obj, str):
        return _UP_TO_REPO.sub("", _LLAMA_KEY.sub("/llama.cpp/<key>/", obj))
    return obj


def _stable(fn: Runner) -> Runner:
    return lambda ws, d: stable(json.loads(json.dumps(fn(ws, d))))


CASES: dict[str, Runner] = {name: _stable(fn) for name, fn in {
    "export_sglang": export_sglang, "export_gguf_unchecked": export_gguf_unchecked,
    "export_onnx_push": export_onnx_push, "build_engine_fake": build_engine_fake,
    "sglang_load_check": sglang_load_check, "gguf_llamacpp": gguf_llamacpp, "vllm_load_check": vllm_load_check,
}.items()}


def _sglang_venv() -> str | None:
    return None if (REPO / ".venv-sglang" / "bin" / "python").is_file() else "no .venv-sglang (make sglang-venv)"


def _llama_build() -> str | None:
    from specconv.engines.llamacpp.server import resolve_server

    try:
        return None if resolve_server(None) is not None else "no llama.cpp build (make llama-cpp)"
    except Exception as e:  # noqa: BLE001 - a reason to skip, shown as is
        return f"no llama.cpp build ({e})"


def _vllm_venv() -> str | None:
    from specconv.engines.vllm.check import find_vllm_python
    from specconv.errors import InvalidInputError

    try:
        find_vllm_python()
        return None
    except InvalidInputError:
        return "no vLLM loader venv (make vllm-venv)"


#: case → (pytest markers, a check returning why the case cannot run here, or None)
NEEDS: dict[str, tuple[tuple[str, ...], Callable[[], str | None] | None]] = {
    "sglang_load_check": (("sglang",), _sglang_venv),
    "gguf_llamacpp": (("llamacpp", "server"), _llama_build),
    "vllm_load_check": (("vllm",), _vllm_venv),
}
