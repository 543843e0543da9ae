"""``specconv release``: convert → validate (gates) → each asked-for engine's step → push, for CI
(docs/cli.md, "release"; docs/ci.md). Stops at the first failed step with its exit code.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from ..errors import GateFailedError, InvalidInputError, SpecconvError
from ..prompts import ChatOptions
from ..results import PushResult, ReleaseResult
from ..results.shapes import EngineVerdictRow, ReleaseStep, ReleaseValidate
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
    #: engine key → its release flag's value (``--export-onnx``: ``{"onnx": True}``; ``--build-engine``:
    #: ``{"tensorrt": "always"}``), the steps run after validate in registry order
    exports: dict[str, Any] = field(default_factory=dict)
    #: the engines' own options (``--llama-server``, ``--verifier-gguf``), by ``dest``
    engine_options: dict[str, Any] = field(default_factory=dict)
    chat: ChatOptions | None = None  # --chat-template, --chat-template-kwargs, --thinking (None: the defaults)
    #: engines served and judged against specconv's loop after the engine steps (``--compare``)
    compare: tuple[str, ...] = ()


def _step(res: ReleaseResult, name: str, fn: Callable[[], Any]) -> Any:
    """Run one step, record its status and duration; a failure stops the release."""
    t0 = time.perf_counter()
    entry: ReleaseStep = {"step": name, "status": "running"}
    res.steps.append(entry)
    try:
        out = fn()
    except SpecconvError as e:
        hint = {"hint": e.hint} if e.hint else {}
        entry.update({"status": "failed", "exit_code": e.exit_code, "error": e.code, "message": e.message})
        if e.hint:
            entry["hint"] = e.hint
        entry["duration_s"] = round(time.perf_counter() - t0, 3)
        for k, v in dict(status="failed", failed_step=name, exit_code=e.exit_code, error=e.code, message=e.message,
                         **hint).items():
            setattr(res, k, v)
        e.result = res
        _github(res)
        raise
    entry.update({"status": "ok", "exit_code": 0, "duration_s": round(time.perf_counter() - t0, 3)})
    return out


def _convert(src: str, opts: ReleaseOptions, out: Path, work: Path) -> dict[str, Any]:
    """Re-convert into ``WORK/drafter`` (:func:`specconv.convert.convert`, the card included):
    replaced only when :func:`specconv.outdir.check_replaceable` says it is specconv's own
    conversion (checked before anything there is moved or deleted; each asked-for engine may then
    keep its earlier export aside for re-use)."""
    from ..convert import convert
    from ..engines.exportdir import output_kinds
    from ..outdir import check_replaceable

    check_replaceable(out, "conversion", output_kinds)
    for cap in _exporters():
        if opts.exports.get(cap.engine.key):
            cap.before_reconvert(out, work)
    r = convert(src, verifier=opts.verifier, verifier_name=opts.verifier_name, output=out, overwrite=True)
    return {"format": r.format, "algorithm": r.algorithm, "files": list(r.files or [])}


def _validate(src: str, opts: ReleaseOptions, drafter: Path, report_dir: Path,
              compare: tuple[str, ...] = ()) -> ReleaseValidate:
    """:func:`specconv.validate.run.validate_drafter` on the converted drafter (``--source``
    = SRC for parity; the report next to the drafter, the same ``validation`` section as
    ``specconv validate`` records), then release's own gate ``--max-parity-kl`` on it."""
    from ..validate.run import ValidateOptions, validate_drafter

    vo = ValidateOptions(source=src, prompts=opts.prompts, num_prompts=opts.num_prompts,
                         max_new_tokens=opts.max_new_tokens, min_tau=opts.min_tau, device=opts.device,
                         chat=opts.chat or ChatOptions(), compare=compare,
                         engine_options={**ValidateOptions().engine_options, **opts.engine_options})
    report = validate_drafter(drafter, opts.verifier, vo, report_dir=report_dir)
    from ..record import read_record

    section = read_record(drafter).validation
    if section is None:  # validate_drafter records it; gone only when the record changed meanwhile
        raise InvalidInputError(f"{drafter}/specconv.json has no validation section after validating it")
    failed = report.failed_gates()
    kl = section.parity_kl_max
    if opts.max_parity_kl is not None and (kl is None or kl > opts.max_parity_kl):
        failed.append(f"parity (max KL {kl} > --max-parity-kl {opts.max_parity_kl})")
    if failed:
        raise GateFailedError("validation gate(s) failed: " + ", ".join(failed))
    out: ReleaseValidate = {"acceptance_length": section.acceptance_length, "tau_ci95": section.tau_ci95,
                            "gates": section.gates, "parity_kl_max": kl}
    if compare:  # one row per engine: push refuses a departing one unless --allow-departing names it
        out["engines"] = [cast(EngineVerdictRow, e.model_dump(exclude_none=True)) for e in section.engines or []]
    return out


def release(src: str, opts: ReleaseOptions, push_opts: PushOptions) -> ReleaseResult:
    """Convert ``src``, validate it against ``opts.verifier``, push it; every step's status and
    duration in the result.

    Raises:
        SpecconvError: the first failed step's error (its ``result`` is the release record).
    """
    import tempfile

    res = ReleaseResult.of(dict(schema="specconv.release/v1", status="running", steps=[], repo_id=push_opts.repo_id,
                                dry_run=push_opts.dry_run, exit_code=0))
    _step(res, "preflight", lambda: _preflight(opts, push_opts))  # exit 2/3/4, nothing written
    work = Path(opts.work_dir) if opts.work_dir else Path(tempfile.mkdtemp(prefix="specconv-release-"))
    work.mkdir(parents=True, exist_ok=True)
    drafter = work / "drafter"
    res.convert = _step(res, "convert", lambda: _convert(src, opts, drafter, work))
    res.validate_ = _step(res, "validate", lambda: _validate(src, opts, drafter, work / "report"))
    _engine_steps(res, opts, push_opts, drafter, work)
    if opts.compare:  # after the exports (llama.cpp serves DIR/gguf): the same prompts, each engine judged
        res.compare = _step(res, "compare", lambda: _validate(src, opts, drafter, work / "report", opts.compare))
    _local_card(drafter, push_opts)
    pushed: PushResult = _step(res, "push", lambda: push(drafter, push_opts))
    res.push = pushed
    res.status, res.exit_code = pushed.status, pushed.exit_status()
    res.commit_oid, res.commit_url, res.pr_url = pushed.commit_oid, pushed.commit_url, pushed.pr_url
    _github(res)
    return res


def _preflight(opts: ReleaseOptions, push_opts: PushOptions | None = None) -> None:
    """Refuse, before anything is converted or written: a verifier the conversion would not
    record by a Hub id (exit 4; push would refuse the drafter), then each engine's refusals for its
    release flag (a missing extra: exit 2; an engine venv, binary or GPU missing here: exit 3)."""
    from .payload import check_verifier_hub_id

    check_verifier_hub_id(opts.verifier_name or opts.verifier, "--verifier-name / --verifier",
                          "pass --verifier-name ORG/NAME, the verifier's Hub id (a local --verifier is recorded "
                          "by its path otherwise)")
    options = _engine_options(opts, push_opts)
    for cap in _exporters():
        cap.release_preflight(options, opts.exports.get(cap.engine.key))


def _exporters() -> list[Any]:
    """The export capabilities that have a release step, in registry order."""
    from ..engines import with_capability

    return [e.export for e in with_capability("export") if e.export.surface.flag is not None]


def _engine_options(opts: ReleaseOptions, push_opts: PushOptions | None) -> dict[str, Any]:
    """What an engine's release hooks read: the engines' options, ``verifier``, every release flag
    (``exports``: engine key → value) and the push's repo options."""
    repos = push_opts.separate_repos if push_opts is not None else {}
    return {**opts.engine_options, "verifier": opts.verifier, "exports": dict(opts.exports),
            **{cap.repo_option.dest: repos.get(cap.engine.key) for cap in _exporters() if cap.repo_option is not None}}


def _engine_steps(res: ReleaseResult, opts: ReleaseOptions, push_opts: PushOptions, drafter: Path,
                  work: Path) -> None:
    """Each asked-for engine's step, in registry order; a skipped one is recorded as such."""
    options = _engine_options(opts, push_opts)
    for cap in _exporters():
        value = opts.exports.get(cap.engine.key)
        if not value:
            continue
        summary = _step(res, cap.release_key, functools.partial(cap.release_step, drafter, work, options, value))
        setattr(res, cap.release_key, summary)
        if isinstance(summary, dict) and summary.get("skipped"):
            res.steps[-1].update({"status": "skipped", "reason": summary["skipped"]})


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
