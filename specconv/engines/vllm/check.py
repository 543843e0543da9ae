"""vLLM as a real consumer: load Speculators dirs with vLLM's own loader (specconv side).

The job file for ``runner.py`` (this package), run in vLLM's own interpreter, and its result.
Why another interpreter and how it is found, why every dir shares one subprocess, and which
serve facts travel in the job file: ``docs/validate.md`` ("vLLM loader check"). Only stdlib is
imported at module level, so ``specconv --help`` stays torch-free.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import LOADER_ENV as ENV_PYTHON

RUNNER = Path(__file__).with_name("runner.py")
#: The repo-local loader venv (``make vllm-venv``); used when nothing else is named.
DEFAULT_VENV = Path(__file__).resolve().parents[3] / ".venv-vllm"


@dataclass(frozen=True)
class LoadCheck:
    """One dir to load.

    Attributes:
        dir: the Speculators-format drafter dir.
        verifier: local verifier dir or Hub id (the long form's ``--model``).
        short_form: also build ``vllm serve DIR`` (True), never (False), or only when the
            recorded verifier id is in the local Hugging Face cache (``"auto"``).
        speculative_config: the long form's ``--speculative-config`` value, JSON text as a
            user passes it (e.g. copied from the model card); the runner replaces only its
            ``model`` by ``dir``. None: :func:`speculative_config_for` of ``dir``.
    """

    dir: str
    verifier: str
    short_form: bool | str = "auto"
    speculative_config: str | None = None


def speculative_config_for(drafter_dir: str | os.PathLike) -> str:
    """The ``--speculative-config`` text that serves ``drafter_dir`` (what its model card
    prints, :func:`specconv.engines.vllm.serve_line.speculative_config_json`; ``model`` = the dir).

    Raises:
        InvalidInputError: unreadable config.json or an algorithm vLLM has no method for.
    """
    from ...format import load_config
    from .serve_line import speculative_config_json

    d = Path(drafter_dir)
    cfg = load_config(d)
    return speculative_config_json(cfg.speculators_model_type, str(d.resolve()), cfg.speculative_tokens)


def find_vllm_python(explicit: str | os.PathLike | None = None) -> Path:
    """The vLLM interpreter: ``explicit``, else ``$SPECCONV_VLLM_LOADER_PYTHON``, else the repo's
    ``.venv-vllm/bin/python``.

    Raises:
        InvalidInputError: (exit 3) none of them names an existing file.
    """
    from ...offline import find_interpreter

    return find_interpreter(explicit, env=ENV_PYTHON, venv=DEFAULT_VENV, engine="vLLM", flag="--vllm-loader-python",
                            make_target="vllm-venv", code="vllm_python_missing",
                            purpose="--vllm-load-check needs vLLM in a separate venv")


def preflight(drafter_dir: str | os.PathLike, verifier: str, python: str | None = None) -> None:
    """``--vllm-load-check``'s refusal before any gate runs: no vLLM interpreter (:func:`find_vllm_python`)."""
    find_vllm_python(python)


def subprocess_env(extra: dict[str, str | None] | None = None) -> dict[str, str]:
    """The runner's environment: offline, CPU target, one thread
    (:func:`specconv.offline.runner_env`), plus ``extra`` (a None value removes that variable)."""
    from ...offline import runner_env

    return runner_env({"VLLM_TARGET_DEVICE": "cpu", "VLLM_NO_USAGE_STATS": "1", **(extra or {})})


def run_load_checks(
    checks: list[LoadCheck],
    *,
    python: str | os.PathLike | None = None,
    env: dict[str, str | None] | None = None,
    dtype: str = "float32",
    timeout: float = 900.0,
) -> dict:
    """Load every dir of ``checks`` with vLLM in ONE subprocess.

    Args:
        checks: dirs (and their verifiers) to load.
        python: the vLLM interpreter (see :func:`find_vllm_python`).
        env: extra environment for the subprocess (e.g. ``HOME`` of an offline HF cache;
            None unsets a variable).
        dtype: vLLM ``--dtype`` for both configs.
        timeout: seconds before the subprocess is killed.

    Returns:
        ``{"env": {distribution, vllm, torch, transformers, python, stubs, import_seconds},
        "results": [one dict per check: ok, errors, warnings, algorithm, model_class,
        speculative_config (what vLLM was given), vllm_reading (vLLM's own reading of the
        dir), long_form (its ``config``: the method, parallel_drafting, K and draft dir vLLM
        resolved), short_form, weights {loaded, missing, partial, shared}, verifier_facts,
        seconds]}``.

    Raises:
        InvalidInputError: no interpreter, a dir whose config cannot be read (when its
            ``speculative_config`` is not given), or the runner failed before checking
            anything (its stderr tail is in the message).
    """
    from ...offline import run_runner

    py = find_vllm_python(python)
    job = {"dtype": dtype, "checks": [_job_check(check) for check in checks]}
    return run_runner(py, RUNNER, job, env=subprocess_env(env), timeout=timeout, engine="vLLM",
                      code="vllm_check_failed")


def _job_check(check: LoadCheck) -> dict:
    """One check of the runner's job file (every specconv fact it needs is in it): the dir's
    algorithm facts (:func:`job_facts`; None for a dir
    whose ``speculators_model_type`` specconv does not describe). The runner's working directory
    is a temp dir: a local dir or verifier is named by its absolute path (:func:`specconv.offline.job_path`)."""
    from ...format import speculators_model_type_of
    from ...format.algorithms import find_algorithm
    from ...offline import job_path

    alg = find_algorithm(speculators_model_type_of(check.dir))
    return {"dir": str(Path(check.dir).resolve()), "verifier": job_path(check.verifier), "short_form": check.short_form,
            "speculative_config": check.speculative_config or speculative_config_for(check.dir),
            "facts": job_facts(alg) if alg is not None else None}


def job_facts(alg: Any) -> dict[str, Any]:
    """An :class:`~specconv.format.algorithms.Algorithm`'s facts the runner needs, as plain JSON
    (it imports nothing from specconv)."""
    return {"algorithm": alg.name, "display_name": alg.display_name,
            "vllm": {"method": alg.vllm.method, "flags": dict(alg.vllm.flags),
                     "draft_classes": list(alg.vllm.draft_classes), "v2_model_runner": alg.vllm.v2_model_runner}}


def record_payload(result: dict, index: int = 0) -> dict:
    """The ``vllm_load`` of ``validation.json`` and ``--format json`` for one checked dir:
    ``{ok, distribution, version, torch, transformers, stubs, patches, model_class,
    speculative_config, resolved {method, parallel_drafting}, forms, errors, warnings,
    missing, shared}`` (``specconv.json`` keeps ``{distribution, version}`` of a passed
    check: :func:`specconv.validate.report.vllm_summaries`)."""
    env, r = result["env"], result["results"][index]
    w = r.get("weights") or {}
    resolved = (r.get("long_form") or {}).get("config") or {}
    return {
        "ok": r["ok"], "distribution": env.get("distribution"), "version": env.get("vllm"), "torch": env.get("torch"),
        "transformers": env.get("transformers"), "stubs": [s["name"] for s in env.get("stubs", [])],
        "patches": env.get("patches", []),
        "model_class": r.get("model_class"), "speculative_config": r.get("speculative_config"),
        "resolved": {k: resolved.get(k) for k in ("method", "parallel_drafting")},
        "forms": {"long": (r.get("long_form") or {}).get("ok", False),
                  "short": (r.get("short_form") or {}).get("ok"),
                  "short_skipped": (r.get("short_form") or {}).get("skipped")},
        "errors": r.get("errors", []), "warnings": r.get("warnings", []),
        "missing": w.get("missing", []), "shared": sorted(w.get("shared", {})),
    }


def run_load_checks_for_dir(drafter_dir: str | os.PathLike, verifier: str, *, python: str | None = None) -> dict:
    """``specconv validate --vllm-load-check``: check one dir, return its ``vllm_load``
    payload (see :func:`record_payload`; not recorded here).

    Raises:
        InvalidInputError: no vLLM interpreter, or the runner could not start.
    """
    return record_payload(run_load_checks([LoadCheck(str(drafter_dir), verifier)], python=python))


__all__ = ["ENV_PYTHON", "LoadCheck", "find_vllm_python", "preflight", "record_payload", "run_load_checks",
           "run_load_checks_for_dir", "speculative_config_for", "subprocess_env"]
