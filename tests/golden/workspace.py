"""The scratch workspace of one golden run: shared inputs, the in-process CLI runner, the
"files written" recorder and the output-file reader.

Layout under the root (stable, so the relative paths specconv records are too):
``verifiers/smollm2/`` (symlinks to the real SmolLM2 verifier's files), ``shared/<name>/``
(inputs several cases share: ``verifier-qwen3`` / ``verifier-llama`` from
``tests/conftest.make_tiny_verifier``, speculators-built drafters, the validate set),
``<group>/<case>/`` (one fresh dir per case), ``cwd/`` (the working dir of every call).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from golden.normalise import Normaliser

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
#: fixtures_* modules, `import tests.x` as the suite does, and the test modules whose input builders the
#: cases reuse (the bad-input tests, the tiny validate set)
for _p in (str(REPO), str(TESTS), str(TESTS / "cli"), str(TESTS / "validate")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

#: the verifier name recorded for local tiny verifiers (tests/fixtures_dflash.HUB)
HUB = "org/tiny-qwen3"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
TOKEN = "hf_specconvFAKEtoken0123456789abcdef"
_FLOAT_IN_TEXT = re.compile(r"(?<![\w.])-?\d+\.\d+(?:e[-+]?\d+)?")
_DIGEST_IN_TEXT = re.compile(r"\b(?:[0-9a-f]{64}|[0-9a-f]{40})\b")


class Workspace:
    """Scratch root + lazily built shared inputs + the normaliser for this root."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._shared: dict[str, Any] = {}
        self._double = None
        from specconv.offline import smollm2_verifier_dir

        real = Path(smollm2_verifier_dir())
        self.norm = Normaliser({str(self.root): "<ROOT>", str(REPO): "<REPO>", str(real): "<SMOLLM2>",
                                str(Path.home()): "<HOME>"})
        #: the real verifier, as a dir of symlinks inside the root (recorded paths are relative)
        self.smollm2 = self.root / "verifiers" / "smollm2"
        self.smollm2.mkdir(parents=True, exist_ok=True)
        for f in sorted(real.iterdir()):
            if not (self.smollm2 / f.name).exists():
                os.symlink(f, self.smollm2 / f.name)

    def case_dir(self, group: str, case: str) -> Path:
        """A fresh, empty dir for one case."""
        d = self.root / group / case
        d.mkdir(parents=True, exist_ok=False)
        return d

    def shared(self, name: str, build: Callable[[Path], Any]) -> Any:
        """Build an input shared by several cases once (``build(dir)``), return its result."""
        if name not in self._shared:
            d = self.root / "shared" / name
            d.mkdir(parents=True, exist_ok=True)
            self._shared[name] = build(d)
        return self._shared[name]

    def verifier(self, kind: str = "qwen3") -> Path:
        """Tiny random verifier (tests/conftest.make_tiny_verifier): ``qwen3`` or ``llama``."""
        from conftest import make_tiny_verifier

        return self.shared(f"verifier-{kind}", lambda d: make_tiny_verifier(d / kind, model_type=kind))

    @property
    def double(self):
        """The loopback Hub double (tests/hub_double.py), started on first use."""
        if self._double is None:
            from hub_double import HubDouble

            self._double = HubDouble(token=TOKEN).start()
        return self._double

    def close(self) -> None:
        if self._double is not None:
            self._double.stop()
            self._double = None


@contextlib.contextmanager
def golden_env(ws: Workspace) -> Iterator[pytest.MonkeyPatch]:
    """Offline, one torch thread, no sha256 cache, cwd = ``<root>/cwd``; undone on exit."""
    import torch

    import specconv.writer as writer

    mp = pytest.MonkeyPatch()
    n = torch.get_num_threads()
    try:
        for k, v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "SPECCONV_HASH_CACHE": "0",
                     "HF_HUB_DISABLE_PROGRESS_BARS": "1"}.items():
            mp.setenv(k, v)
        for k in ("HF_ENDPOINT", "HF_TOKEN", "GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY", "GITHUB_ACTIONS"):
            mp.delenv(k, raising=False)
        mp.setattr(writer, "_HASH_CACHE", None)
        (ws.root / "cwd").mkdir(exist_ok=True)
        mp.chdir(ws.root / "cwd")
        torch.set_num_threads(1)
        yield mp
    finally:
        torch.set_num_threads(n)
        mp.undo()


# ------------------------------------------------------------------------ files written
def snapshot(d: Path | None) -> dict[str, tuple[int, int]]:
    """``{relative path: (size, mtime_ns)}`` of every file and symlink under ``d`` (links not followed)."""
    if d is None or not Path(d).exists():
        return {}
    out = {}
    for top, dirs, files in os.walk(d):
        for name in files + [x for x in dirs if os.path.islink(os.path.join(top, x))]:
            p = os.path.join(top, name)
            st = os.lstat(p)
            out[os.path.relpath(p, d)] = (st.st_size, st.st_mtime_ns)
    return out


def written(before: dict, after: dict) -> dict[str, list[str]]:
    """Files added / changed / removed between two :func:`snapshot` calls (empty lists left out)."""
    diff = {
        "added": sorted(set(after) - set(before)),
        "changed": sorted(k for k in set(after) & set(before) if after[k] != before[k]),
        "removed": sorted(set(before) - set(after)),
    }
    return {k: v for k, v in diff.items() if v}


# ------------------------------------------------------------------------------ the CLI
def parse_stdout(text: str) -> Any:
    """The one JSON object on stdout, or ``{"<not json>": text}`` when it is not one."""
    try:
        return json.loads(text)
    except ValueError:
        return {"<not json>": text}


def run_cli(ws: Workspace, argv: list[Any], *, watch: Path | None = None, env: dict | None = None,
            loose: bool = False, json_flag: bool = True) -> dict[str, Any]:
    """Run ``specconv ARGV --format json`` in-process (click's CliRunner); return the record:
    normalised argv, exit code, parsed stdout, uncaught exception type, whether stderr
    holds a traceback, and the files written under ``watch``."""
    from cli_runner import invoke

    before = snapshot(watch)
    r = invoke(*argv, as_json=json_flag, env=env, catch=True)
    rec: dict[str, Any] = {"argv": ws.norm.argv(argv), "exit_code": r.code,
                           "stdout": ws.norm.with_loose(loose)(parse_stdout(r.stdout))}
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        rec["exception"] = type(r.exception).__name__
    rec["traceback_on_stderr"] = "Traceback (most recent call last)" in r.stderr
    if watch is not None:
        rec["written"] = written(before, snapshot(watch))
    return rec


# ------------------------------------------------------------------------- output files
def json_layout(raw: str) -> dict[str, Any]:
    """How a JSON file is laid out, as the ``json.dumps`` arguments that reproduce its bytes
    exactly from its content (so equal content + equal layout = byte-identical files, the
    normalised values aside); the file's sha256 when no such arguments exist."""
    obj = json.loads(raw)
    for indent in (2, 1, 4, None):
        for ensure_ascii in (False, True):
            text = json.dumps(obj, sort_keys=True, indent=indent, ensure_ascii=ensure_ascii)
            for newline in ("\n", ""):
                if raw == text + newline:
                    return {"indent": indent, "sort_keys": True, "ensure_ascii": ensure_ascii,
                            "trailing_newline": bool(newline)}
    return {"sha256": hashlib.sha256(raw.encode()).hexdigest()}


def file_record(p: Path, norm: Normaliser) -> Any:
    """JSON → its normalised ``content`` and its byte ``layout`` (:func:`json_layout`);
    Markdown → normalised lines; else sha256 + size (loose, for files holding CPU-computed
    numbers: ``{"binary": true}``; floats and digests in Markdown lines replaced)."""
    if p.suffix == ".json":
        raw = p.read_text()
        layout = json_layout(raw)
        if norm.loose and "sha256" in layout:
            layout = {"sha256": "<digest>"}
        return {"content": norm(json.loads(raw)), "layout": layout}
    if p.suffix == ".md":
        lines = norm.text(p.read_text()).splitlines()
        if norm.loose:
            lines = [_FLOAT_IN_TEXT.sub("<float>", _DIGEST_IN_TEXT.sub("<digest>", ln)) for ln in lines]
        return lines
    if norm.loose:
        return {"binary": True}
    return {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}


def contents(d: Path, norm: Normaliser) -> dict[str, Any]:
    """:func:`file_record` of every file under ``d`` (relative paths, sorted); {} if absent."""
    d = Path(d)
    if not d.is_dir():
        return {}
    return {str(p.relative_to(d)): file_record(p, norm) for p in sorted(d.rglob("*")) if p.is_file()}
