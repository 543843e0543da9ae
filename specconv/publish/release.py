"""``specconv release``: convert → validate (gates) → push, for CI.

The stage functions are called directly (``specconv.convert.convert``,
``specconv.validate.run.validate_drafter``, :func:`specconv.publish.push.push`), never
the CLI. The run stops at the first failed step with that step's exit code; the result
records every step with its duration. In GitHub Actions (``GITHUB_OUTPUT`` /
``GITHUB_STEP_SUMMARY`` set) it writes ``commit_oid``, ``commit_url``, ``pr_url`` and a
summary table. ``--export-onnx`` / ``--build-engine`` add the steps of
:mod:`specconv.publish.release_export` between validate and push; ``--export-sglang`` adds
SGLang's layout (checked by SGLang's loader), which ``--sglang-repo-id`` publishes;
``--export-gguf`` adds ``gguf/`` (served by llama-server, pushed in the same repo).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import GateFailedError, SpecconvError
from ..results import PushResult, ReleaseResult
from .push import PushOptions, push


@dataclass
class ReleaseOptions:
    """The release-only flags (push flags are a :class:`PushOptions`)."""

    verifier: str
    verifier_name: str | None = None
    work_dir: Path | None = None
    min_tau: float | None = None
    max_parity_kl: float | None = None
    prompts: str = "eval"
    num_prompts: int = 12
    max_new_tokens: int = 64
    device: str = "auto"
    export_onnx: bool = False
    build_engine: str | None = None  # None | "always" | "if-available"
    export_sglang: bool = False  # export + check DRAFTER/sglang (specconv/export/sglang_dir.py)
    export_gguf: bool = False  # export + check DRAFTER/gguf (specconv/gguf/export.py)
    llama_server: str | None = None  # --llama-server (default: $SPECCONV_LLAMA_SERVER, the make llama-cpp build)
    verifier_gguf: str | None = None  # --verifier-gguf (default: $SPECCONV_VERIFIER_GGUF, SmolLM2's wheel GGUF)


def _step(res: ReleaseResult, name: str, fn: Callable[[], Any]) -> Any:
    """Run one step, record its status and duration; a failure stops the release."""
    t0 = time.perf_counter()
    entry: dict[str, Any] = {"step": name, "status": "running"}
    res.steps.append(entry)
    try:
        out = fn()
    except SpecconvError as e:
        hint = {"hint": e.hint} if e.hint else {}
        entry.update(status="failed", exit_code=e.exit_code, error=e.code, message=e.message, **hint,
                     duration_s=round(time.perf_counter() - t0, 3))
        for k, v in dict(status="failed", failed_step=name, exit_code=e.exit_code, error=e.code, message=e.message,
                         **hint).items():
            setattr(res, k, v)
        e.result = res
        _github(res)
        raise
    entry.update(status="ok", exit_code=0, duration_s=round(time.perf_counter() - t0, 3))
    return out


def _convert(src: str, opts: ReleaseOptions, out: Path, work: Path) -> dict[str, Any]:
    """Re-convert into ``WORK/drafter`` (:func:`specconv.convert.convert`, the card included):
    replaced only when :func:`specconv.outdir.check_replaceable` says it is specconv's own
    conversion (checked before anything there is moved or deleted; ``--export-onnx`` then
    keeps its earlier ``onnx/`` aside for re-use)."""
    from ..convert import convert
    from ..outdir import check_replaceable

    check_replaceable(out, "conversion")
    if opts.export_onnx:
        from .release_export import keep_previous_export

        keep_previous_export(out, work)
    r = convert(src, verifier=opts.verifier, verifier_name=opts.verifier_name, output=out, overwrite=True)
    return {"format": r.format, "algorithm": r.algorithm, "files": list(r.files or [])}


def _validate(src: str, opts: ReleaseOptions, drafter: Path, report_dir: Path) -> dict[str, Any]:
    """:func:`specconv.validate.run.validate_drafter` on the converted drafter (``--source``
    = SRC for parity; the report next to the drafter, the same ``validation`` section as
    ``specconv validate`` records), then release's own gate ``--max-parity-kl`` on it."""
    from ..validate.run import ValidateOptions, validate_drafter

    vo = ValidateOptions(source=src, prompts=opts.prompts, num_prompts=opts.num_prompts,
                         max_new_tokens=opts.max_new_tokens, min_tau=opts.min_tau, device=opts.device)
    report = validate_drafter(drafter, opts.verifier, vo, report_dir=report_dir)
    from ..record import read_record

    section = read_record(drafter).validation
    failed = report.failed_gates()
    kl = section.parity_kl_max
    if opts.max_parity_kl is not None and (kl is None or kl > opts.max_parity_kl):
        failed.append(f"parity (max KL {kl} > --max-parity-kl {opts.max_parity_kl})")
    if failed:
        raise GateFailedError("validation gate(s) failed: " + ", ".join(failed))
    return {"acceptance_length": section.acceptance_length, "tau_ci95": section.tau_ci95, "gates": section.gates,
            "parity_kl_max": kl}


def release(src: str, opts: ReleaseOptions, push_opts: PushOptions) -> ReleaseResult:
    """Convert ``src``, validate it against ``opts.verifier``, push it.

    Args:
        src: source checkpoint (any convertible format).
        opts: :class:`ReleaseOptions`.
        push_opts: :class:`PushOptions` (``dry_run`` plans the push without writing).

    Returns:
        :class:`ReleaseResult` with every step's status and duration and the push result.

    Raises:
        SpecconvError: the first failed step's error (its ``result`` is the release record).
    """
    import tempfile

    res = ReleaseResult.of(dict(schema="specconv.release/v1", status="running", steps=[], repo_id=push_opts.repo_id,
                                dry_run=push_opts.dry_run, exit_code=0))
    _step(res, "preflight", lambda: (_preflight(opts), _sglang_preflight(opts, push_opts),  # exit 2/3/4,
                                     _gguf_preflight(opts)))  # nothing written
    work = Path(opts.work_dir) if opts.work_dir else Path(tempfile.mkdtemp(prefix="specconv-release-"))
    work.mkdir(parents=True, exist_ok=True)
    drafter = work / "drafter"
    res.convert = _step(res, "convert", lambda: _convert(src, opts, drafter, work))
    res.validate_ = _step(res, "validate", lambda: _validate(src, opts, drafter, work / "report"))
    _engines(res, opts, drafter, work)
    if opts.export_sglang:  # SGLang's layout, checked by SGLang's own loader before it is moved into place
        res.sglang = _step(res, "sglang", lambda: _sglang(drafter, opts))
    if opts.export_gguf:  # gguf/ in the drafter dir, served by llama-server before it is moved into place
        res.gguf = _step(res, "gguf", lambda: _gguf(drafter, opts))
    _local_card(drafter, push_opts)
    pushed: PushResult = _step(res, "push", lambda: push(drafter, push_opts))
    res.push = pushed.to_dict()
    res.status, res.exit_code = pushed.status, pushed.exit_status()
    res.commit_oid, res.commit_url, res.pr_url = pushed.commit_oid, pushed.commit_url, pushed.pr_url
    _github(res)
    return res


def _preflight(opts: ReleaseOptions) -> None:
    """Refuse, before anything is converted or written: a verifier the conversion would not
    record by a Hub id (exit 4; push would refuse the drafter), an ONNX export without the
    ``onnx`` extra (exit 2) and an engine that cannot be built here (exit 3)."""
    from ..errors import UsageError
    from ..extras import require_extra
    from .payload import check_verifier_hub_id

    check_verifier_hub_id(opts.verifier_name or opts.verifier, "--verifier-name / --verifier",
                          "pass --verifier-name ORG/NAME, the verifier's Hub id (a local --verifier is recorded "
                          "by its path otherwise)")

    if opts.build_engine and not opts.export_onnx:
        raise UsageError("--build-engine needs --export-onnx (the engine is built from onnx/)")
    if opts.export_onnx:
        require_extra("onnx", feature="specconv release --export-onnx")
    if opts.build_engine == "always":
        from ..errors import InvalidInputError
        from ..export.engine import import_builder
        from .release_export import RELEASE_BUILDER, engine_unavailable

        import_builder(RELEASE_BUILDER, feature="specconv release --build-engine")  # not installed: exit 2
        reason = engine_unavailable()
        if reason is not None:
            raise InvalidInputError(f"--build-engine: {reason}", code="engine_unavailable",
                                    hint="--build-engine=if-available records the skip and releases without it")


def _sglang_preflight(opts: ReleaseOptions, push_opts: PushOptions) -> None:
    """``--export-sglang`` needs the SGLang loader venv (exit 3); ``--sglang-repo-id`` needs
    ``--export-sglang`` (exit 2)."""
    if push_opts.sglang_repo_id and not opts.export_sglang:
        from ..errors import UsageError

        raise UsageError("--sglang-repo-id needs --export-sglang (release publishes the layout it checked)")
    if opts.export_sglang:
        from ..sglang_check import find_sglang_python

        find_sglang_python()


def _sglang(drafter: Path, opts: ReleaseOptions) -> dict[str, Any]:
    from ..sglang_check import export_checked

    r = export_checked(drafter, verifier=opts.verifier)
    return {k: getattr(r, k) for k in ("speculative_algorithm", "architecture", "files", "env")} | {
        "check": {k: r.check.get(k) for k in ("ok", "distribution", "version", "class")}}


def _gguf_preflight(opts: ReleaseOptions) -> None:
    """``--export-gguf`` needs the ``gguf`` extra (exit 2) and a llama-server (exit 3,
    ``llama_server_missing``): push takes ``gguf/`` only with a passed llama-server check."""
    if not opts.export_gguf:
        return
    from ..errors import InvalidInputError
    from ..extras import require_extra
    from ..gguf.server import LLAMA_SERVER_ENV, resolve_server

    require_extra("gguf", feature="specconv release --export-gguf")
    if resolve_server(opts.llama_server) is None:  # a named binary that does not exist raises here
        raise InvalidInputError("--export-gguf: no llama-server to check the GGUF with", code="llama_server_missing",
                                hint=f"pass --llama-server PATH, set ${LLAMA_SERVER_ENV}, or run `make llama-cpp`")


def _gguf(drafter: Path, opts: ReleaseOptions) -> dict[str, Any]:
    """``export gguf`` into ``DRAFTER/gguf`` with its llama-server check; a skipped check (no
    verifier GGUF) is exit 3, as push would refuse the unchecked ``gguf/``."""
    from ..errors import InvalidInputError
    from ..gguf.export import export_gguf_dir

    r = export_gguf_dir(drafter, verifier=opts.verifier, llama_server=opts.llama_server,
                        verifier_gguf=opts.verifier_gguf)
    check = r.check or {}
    if not check.get("passed"):
        raise InvalidInputError(f"--export-gguf: the GGUF was not checked ({check.get('skipped')})",
                                code="gguf_unchecked", hint="pass --verifier-gguf PATH (the verifier as a GGUF)")
    return {k: getattr(r, k) for k in ("file", "sha256", "spec_type", "spec_draft_n_max", "verifier_gguf")} | {
        "check": {k: check.get(k) for k in ("passed", "lossless", "tau")}}


def _engines(res: ReleaseResult, opts: ReleaseOptions, drafter: Path, work: Path) -> None:
    """The ``export`` and ``engine`` steps when asked; a skipped engine is recorded as such."""
    from .release_export import engine_step, export_step

    if opts.export_onnx:
        res.export = _step(res, "export", lambda: export_step(drafter, work, opts.verifier))
    if opts.build_engine:
        res.engine = _step(res, "engine", lambda: engine_step(drafter, opts.build_engine))
        if res.engine.get("skipped"):
            res.steps[-1].update(status="skipped", reason=res.engine["skipped"])


def _local_card(drafter: Path, push_opts: PushOptions) -> None:
    """Refresh the drafter dir's own ``README.md`` with the validated card (push regenerates
    it anyway; ``README.md`` is a derived file, exempt from the gates)."""
    from ..fileio import atomic_write
    from .push import build_payload

    try:
        atomic_write(drafter / "README.md", bytes(build_payload(drafter, push_opts).files["README.md"]))
    except SpecconvError as e:  # e.g. an ungated extra file: the push step reports it with its exit code
        del e


def _github(res: ReleaseResult) -> None:
    """Append outputs to ``$GITHUB_OUTPUT`` and a table to ``$GITHUB_STEP_SUMMARY`` when set."""
    out, summary = os.environ.get("GITHUB_OUTPUT"), os.environ.get("GITHUB_STEP_SUMMARY")
    if out:
        with open(out, "a", encoding="utf-8") as f:
            for k in ("commit_oid", "commit_url", "pr_url"):
                f.write(f"{k}={getattr(res, k) or ''}\n")
    if summary:
        lines = [f"### specconv release `{res.repo_id}`: {res.status}", "", "| step | status | seconds |",
                 "|---|---|---|"]
        lines += [f"| {s['step']} | {s['status']} | {s.get('duration_s', 0):.1f} |" for s in res.steps]
        if res.commit_url:
            lines += ["", f"commit: {res.commit_url}"]
        with open(summary, "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
