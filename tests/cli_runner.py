"""The suite's one way to run ``specconv``: in-process through click's ``CliRunner``
(:func:`invoke`) or as the real entry point in a subprocess (:func:`run_specconv`), both
answering a :class:`CliOutcome`; :func:`online_env` / :func:`run_online` run it against the
loopback Hub double (``tests/hub_double.py``), :func:`offline_env` without any inherited Hub
setting; :func:`specconv_argv` is the command line for a test that needs the process itself.
The commands' common command lines are shared here too (:func:`convert`, :func:`validate`,
:func:`release_argv`, and :func:`run_in` for a subprocess whose Hub state lives under a test's
``tmp``), so a test module needs no wrapper of its own.

Importable by name from every room (``from cli_runner import invoke``), like
``fixtures_dflash``. tests/golden/ keeps its own recording runner (``workspace.run_cli``).
"""

from __future__ import annotations

import contextlib
import json as _json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: ``python -c`` body that behaves as the installed ``specconv`` console script (prog name included).
_ENTRY = "import sys; from specconv.cli.main import main; sys.argv[0] = 'specconv'; main()"


@dataclass(frozen=True)
class CliOutcome:
    """One ``specconv`` run: exit code, stdout and stderr as text, and (in-process with
    ``catch=True`` only) the exception click caught."""

    code: int
    stdout: str
    stderr: str
    exception: BaseException | None = None

    @property
    def json(self) -> Any:
        """stdout parsed as JSON; ``None`` when stdout is blank (``ValueError`` if not JSON)."""
        return _json.loads(self.stdout) if self.stdout.strip() else None

    @property
    def output(self) -> str:
        """stdout then stderr (for assertion messages)."""
        return self.stdout + self.stderr

    @property
    def code_json(self) -> tuple[int, Any]:
        """``(code, json)``, for ``code, obj = invoke(...).code_json``."""
        return self.code, self.json

    @property
    def code_json_stderr(self) -> tuple[int, Any, str]:
        """``(code, json, stderr)``."""
        return self.code, self.json, self.stderr

    @property
    def code_output(self) -> tuple[int, str]:
        """``(code, stdout + stderr)``, for a run without ``--format json``."""
        return self.code, self.output

    @property
    def code_json_output(self) -> tuple[int, Any, str]:
        """``(code, json, stdout + stderr)``."""
        return self.code, self.json, self.output

    def one(self) -> dict:
        """stdout as exactly one JSON object (``json.loads`` rejects trailing data)."""
        obj = _json.loads(self.stdout)
        assert isinstance(obj, dict), self.stdout
        return obj


def _argv(argv: tuple, as_json: bool) -> list[str]:
    return [str(a) for a in argv] + (["--format", "json"] if as_json else [])


def invoke(*argv: Any, as_json: bool = True, env: dict[str, str] | None = None, catch: bool = False,
           command=None, prog_name: str | None = None, terminal_width: int | None = None) -> CliOutcome:
    """``specconv ARGV`` (+ ``--format json`` when ``as_json``) in-process. ``catch=False``
    lets an unexpected exception propagate (a traceback fails the test); ``command`` runs one
    click command (e.g. ``validate_cmd``) instead of the whole group; ``prog_name`` and
    ``terminal_width`` go to click (``--help`` as a terminal prints it)."""
    from click.testing import CliRunner

    if command is None:
        from specconv.cli.main import cli as command
    extra = {k: v for k, v in (("prog_name", prog_name), ("terminal_width", terminal_width)) if v is not None}
    with validated_results():
        r = CliRunner().invoke(command, _argv(argv, as_json), env=env, catch_exceptions=catch, **extra)
    return CliOutcome(r.exit_code, r.stdout, r.stderr, r.exception)


def check_result(result: Any) -> None:
    """``result`` validates against its own model (``specconv.results``): a stage builds it with
    ``model_construct`` (nothing checked on the command's path), so a producer that puts a wrongly
    typed value in a field, or a nested object of the wrong shape, fails here.

    Raises:
        pydantic.ValidationError: a value does not match the declared type.
    """
    type(result).model_validate(result.to_dict())


@contextlib.contextmanager
def validated_results():
    """While inside, every result the CLI renders (``specconv.cli.common.render``) is first
    checked by :func:`check_result`; a result that does not validate raises out of the command."""
    from specconv.cli import common

    original = common.render

    def render(result: Any, output_format: str) -> None:
        check_result(result)
        original(result, output_format)

    common.render = render
    try:
        yield
    finally:
        common.render = original


def specconv_argv(*argv: Any, as_json: bool = True) -> list[str]:
    """The command line :func:`run_specconv` runs (this interpreter as the ``specconv`` entry
    point), for a test that needs the process itself (``subprocess.Popen``: to kill it, or to
    run two at once)."""
    return [sys.executable, "-c", _ENTRY, *_argv(argv, as_json)]


def run_specconv(*argv: Any, as_json: bool = True, cwd: Path | None = None, env: dict[str, str] | None = None,
                 timeout: int = 300) -> CliOutcome:
    """``specconv ARGV`` (+ ``--format json`` when ``as_json``) as the real entry point in a
    subprocess of this interpreter. ``env`` replaces the environment; default: this one,
    offline, one OpenMP thread. ``cwd`` is created when missing."""
    if env is None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    if cwd is not None:
        Path(cwd).mkdir(parents=True, exist_ok=True)
    p = subprocess.run(specconv_argv(*argv, as_json=as_json), cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=timeout)
    return CliOutcome(p.returncode, p.stdout, p.stderr)


def run_online(endpoint: str, hf_home: Path, *argv: Any, token: str | None = None, as_json: bool = True,
               cwd: Path | None = None, timeout: int = 300, **extra: str) -> CliOutcome:
    """:func:`run_specconv` with :func:`online_env` (``endpoint``: the loopback Hub double's URL;
    ``extra``: more variables on top)."""
    return run_specconv(*argv, as_json=as_json, cwd=cwd, env=online_env(endpoint, hf_home, token, **extra),
                        timeout=timeout)


def offline_env(**extra: str | None) -> dict[str, str]:
    """This environment without any ``HF_*`` / ``HUGGINGFACE_*`` / ``GITHUB_*`` variable, then
    huggingface_hub offline, one OpenMP thread, and ``extra`` on top (e.g. ``HF_HOME``, ``HOME``;
    a ``None`` value unsets the variable)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "GITHUB_"))}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def online_env(endpoint: str, hf_home: Path, token: str | None = None, **extra: str) -> dict[str, str]:
    """This environment without any ``HF_*`` / ``HUGGINGFACE_*`` / ``GITHUB_*`` / proxy
    variable, then huggingface_hub online against ``endpoint`` (no Xet, no telemetry, no
    progress bars, loopback unproxied) with a fresh ``HF_HOME``, ``token`` as ``HF_TOKEN``,
    one OpenMP thread, and ``extra`` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "GITHUB_"))
           and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    env.update(HF_HUB_OFFLINE="0", HF_ENDPOINT=endpoint, HF_HUB_DISABLE_XET="1", HF_HOME=str(hf_home),
               HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1", NO_PROXY="127.0.0.1,localhost",
               OMP_NUM_THREADS="1")
    if token is not None:
        env["HF_TOKEN"] = token
    env.update(extra)
    return env


def run_in(tmp: Path, *argv: Any, endpoint: str | None = None, token: str | None = None, cwd: Path | None = None,
           as_json: bool = True, timeout: int = 600, **extra: str) -> CliOutcome:
    """:func:`run_specconv` with its Hub state under ``tmp``: ``HF_HOME`` ``tmp/hf-home``, run in
    ``cwd`` (default ``tmp/cwd``); online against ``endpoint`` (the loopback Hub double's URL,
    :func:`online_env`, ``token`` as ``HF_TOKEN``) or, without one, offline (:func:`offline_env`);
    ``extra``: more variables on top."""
    cwd = tmp / "cwd" if cwd is None else cwd
    if endpoint is None:
        env = offline_env(HF_HOME=str(tmp / "hf-home"), **extra)
    else:
        env = online_env(endpoint, tmp / "hf-home", token, **extra)
    return run_specconv(*argv, as_json=as_json, cwd=cwd, env=env, timeout=timeout)


#: The name the suite records for the real SmolLM2 verifier (``--verifier-name``).
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def convert_argv(src: Any, verifier: Any, out: Any = None, *extra: Any, name: str | None = None) -> list[Any]:
    """``convert SRC --verifier V [--verifier-name NAME] [-o OUT] EXTRA``."""
    argv = ["convert", src, "--verifier", verifier]
    if name:
        argv += ["--verifier-name", name]
    if out is not None:
        argv += ["-o", out]
    return [*argv, *extra]


def convert(src: Any, verifier: Any, out: Any = None, *extra: Any, name: str | None = None, **kw: Any) -> CliOutcome:
    """:func:`invoke` of :func:`convert_argv` (``kw``: :func:`invoke`'s options)."""
    return invoke(*convert_argv(src, verifier, out, *extra, name=name), **kw)


def validate(d: Any, verifier: Any, *extra: Any, **kw: Any) -> CliOutcome:
    """``specconv validate D --verifier V EXTRA`` in-process (``kw``: :func:`invoke`'s options)."""
    return invoke("validate", d, "--verifier", verifier, *extra, **kw)


def release_argv(src: Any, verifier: Any, repo_id: str, work_dir: Any, *extra: Any,
                 name: str | None = SMOLLM2_HUB_ID) -> list[Any]:
    """``release SRC --verifier V [--verifier-name NAME] --repo-id R --work-dir W EXTRA``."""
    argv = ["release", src, "--verifier", verifier]
    if name:
        argv += ["--verifier-name", name]
    return [*argv, "--repo-id", repo_id, "--work-dir", work_dir, *extra]
