"""SGLang 0.5.23 as a real consumer: SGLang exports loaded by SGLang's own loader (``runner.py`` in
``.venv-sglang``) and judged against the export's ``expected`` (docs/sglang.md, "The check").
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import InvalidInputError
from . import ENV_PYTHON

if TYPE_CHECKING:
    from ...results import ExportSglangResult

__all__ = ["ENV_PYTHON", "check_sglang_dirs", "export_job", "find_sglang_python", "judge", "preflight", "run_checks",
           "validate_check"]

RUNNER = Path(__file__).with_name("runner.py")
#: The repo-local loader venv (``make sglang-venv``); used when nothing else is named.
DEFAULT_VENV = Path(__file__).resolve().parents[3] / ".venv-sglang"


def find_sglang_python(explicit: str | os.PathLike | None = None) -> Path:
    """The SGLang interpreter: ``explicit``, else ``$SPECCONV_SGLANG_LOADER_PYTHON``, else ``.venv-sglang``.

    Raises:
        InvalidInputError: (exit 3) none of them names an existing file.
    """
    from ...offline import find_interpreter

    return find_interpreter(explicit, env=ENV_PYTHON, venv=DEFAULT_VENV, engine="SGLang", flag="--sglang-loader-python",
                            make_target="sglang-venv", code="sglang_python_missing",
                            purpose="the SGLang loader check needs SGLang 0.5.23 in a separate venv")


#: The runner's environment beyond :func:`specconv.offline.runner_env`: no GPU, no ``SGLANG_RAGGED_VERIFY_MODE``.
_ENV_OVERRIDES: dict[str, str | None] = {"CUDA_VISIBLE_DEVICES": "", "SGLANG_RAGGED_VERIFY_MODE": None}


def run_checks(checks: list[dict[str, Any]], *, python: str | os.PathLike | None = None, dtype: str = "float32",
               timeout: float = 1800.0) -> dict[str, Any]:
    """Run the runner once over ``checks`` (its job entries): its ``{"env", "results"}`` plus ``log_tail``.

    Raises:
        InvalidInputError: no interpreter, a timeout, or SGLang could not be imported.
    """
    from ...offline import run_runner, runner_env

    return run_runner(find_sglang_python(python), RUNNER, {"dtype": dtype, "checks": checks},
                      env=runner_env(_ENV_OVERRIDES), timeout=timeout, engine="SGLang", code="sglang_check_failed")


def judge(env: dict[str, Any], r: dict[str, Any], expected: dict[str, Any], files: dict[str, str]) -> dict[str, Any]:
    """The check payload of one export (``export.sglang.check``): SGLang's strict load plus its
    resolved values against ``expected``; ``ok`` needs no error and no mismatch."""
    resolved = r.get("resolved") or {}
    seen = {**resolved, "architecture": r.get("architecture")}
    mismatches = [f"{k}: SGLang resolved {seen.get(k)!r}, the Speculators dir says {v!r}"
                  for k, v in sorted(expected.items()) if seen.get(k) != v] if r.get("resolved") else []
    serve = r.get("serve_args") or {}
    if serve and not serve.get("ragged_verify_mode_known"):
        mismatches.append(f"SGLANG_RAGGED_VERIFY_MODE {serve.get('ragged_verify_mode')!r} is no mode SGLang knows")
    out = {"ok": bool(r.get("ok")) and not mismatches, "distribution": env.get("distribution"),
           "version": env.get("sglang"), "torch": env.get("torch"), "transformers": env.get("transformers"),
           "python": env.get("python"), "stubs": [s["name"] for s in env.get("stubs", []) if s.get("used")],
           "class": r.get("class"), "env": r.get("env") or {}, "resolved": resolved, "mismatches": mismatches,
           "errors": list(r.get("errors", [])), "files": files}
    for key in ("unfilled_params", "unconsumed_tensors", "target_supplied_skipped", "checkpoint_tensors",
                "serve_args"):
        if key in r:
            out[key] = r[key]
    return out


def _meta(d: Path) -> dict[str, Any]:
    from ...fileio import read_json_object
    from .export import FORMAT, META_NAME

    p = d / META_NAME
    meta = read_json_object(p, code="not_sglang_export",
                            unreadable="{path}: not an SGLang export written by specconv ({error})")
    if meta.get("format") != FORMAT:
        raise InvalidInputError(f"{p}: format is not {FORMAT!r}", code="not_sglang_export")
    return meta


def export_job(d: str | os.PathLike, verifier_dir: str | os.PathLike,
               serve_argv: list[str] | None = None) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """The runner's job entry for SGLang export ``d``, its ``sglang_export.json`` and the sha256
    of the files the runner will load (taken before the load).

    Raises:
        InvalidInputError: ``d`` is no specconv SGLang export.
    """
    from .export import layout_files

    meta = _meta(Path(d))
    job = {"dir": str(Path(d).resolve()), "verifier": str(verifier_dir), "env": meta.get("env") or {},
           "target_supplied": meta.get("target_supplied") or []}
    if serve_argv is not None:
        job["serve_argv"] = list(serve_argv)
    return job, meta, layout_files(Path(d))


def check_sglang_dirs(dirs: list[Path], verifier: str, *, python: str | os.PathLike | None = None,
                      serve_argv: list[list[str] | None] | None = None) -> list[dict[str, Any]]:
    """Load every SGLang export of ``dirs`` with SGLang's own loader in ONE subprocess; one
    :func:`judge` payload per dir (``serve_argv``: per dir, a serve line's words after
    ``python -m sglang.launch_server`` to parse with SGLang's parser, or None).

    Raises:
        InvalidInputError: a dir is no specconv SGLang export, or the runner could not run.
    """
    from ...verifier import resolve_verifier

    vdir = resolve_verifier(verifier).local_dir.resolve()
    argvs = list(serve_argv or []) + [None] * (len(dirs) - len(serve_argv or []))
    entries = [export_job(d, vdir, argv) for d, argv in zip(dirs, argvs, strict=True)]
    result = run_checks([job for job, _, _ in entries], python=python)
    return [judge(result["env"], r, meta.get("expected") or {}, files)
            for r, (_, meta, files) in zip(result["results"], entries, strict=True)]


def validate_check(drafter_dir: str | Path, verifier: str, *, python: str | None = None) -> dict[str, Any]:
    """``specconv validate --sglang-load-check``: export DIR to a temp dir, load it with SGLang, record
    the payload (:func:`judge`) under ``export.sglang.check`` (never in the validation section).

    Raises:
        InvalidInputError: a refusal by name (exit 3) or the runner could not run.
    """
    from .export import export_sglang_dir, record_sglang_check

    with tempfile.TemporaryDirectory(prefix="specconv-sglang-export-") as tmp:
        export = export_sglang_dir(drafter_dir, Path(tmp) / "sglang", verifier=verifier, record=False)
        payload = check_sglang_dirs([Path(tmp) / "sglang"], verifier, python=python)[0]
    record_sglang_check(drafter_dir, export, payload)
    return payload


def preflight(drafter_dir: str | Path, verifier: str, python: str | None = None) -> None:
    """``--sglang-load-check`` refusals before any gate runs: no SGLang interpreter, or a
    drafter SGLang would serve wrongly (:func:`specconv.engines.sglang.export.plan_sglang`).

    Raises:
        InvalidInputError: exit 3.
    """
    from .export import plan_sglang

    find_sglang_python(python)
    plan_sglang(drafter_dir, verifier)


def export_checked(drafter_dir: str | Path, out: str | Path | None = None, *,
                   verifier: str | None = None, overwrite: bool = False, python: str | None = None,
                   record: bool = True) -> ExportSglangResult:
    """``specconv export sglang --check``: the export with SGLang's own loader run on the written
    files before they are moved into place (``check``: the :func:`judge` payload).

    Raises:
        InvalidInputError: no SGLang interpreter (before anything is written), a refusal (exit 3).
        GateFailedError: SGLang's loader refused the files (exit 4, nothing written).
    """
    from ...errors import GateFailedError
    from .export import export_sglang_dir

    find_sglang_python(python)  # before anything is written

    def gate(files_dir: Path, spec: str) -> dict[str, Any]:
        payload = check_sglang_dirs([files_dir], spec, python=python)[0]
        if not payload["ok"]:
            raise GateFailedError(f"SGLang's loader refused the export of {drafter_dir}: "
                                  + "; ".join(payload["errors"] + payload["mismatches"])[:1500],
                                  code="sglang_check_failed", result={"sglang_load": payload})
        return payload

    return export_sglang_dir(drafter_dir, out, verifier=verifier, overwrite=overwrite, check=gate, record=record)
