"""``specconv validate DIR --verifier V``: gates G1–G4 and an acceptance report."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import click

from .common import emit, output_format_option, progress_enabled, run_command

log = logging.getLogger("specconv")


def _human(r: dict) -> str:
    lines = [
        f"drafter:   {r.get('drafter')}  ({r.get('algorithm')}, k={r.get('k')})",
        f"verifier:  {r.get('verifier')}",
        f"backend:   {r.get('backend')}  device={(r.get('device') or {}).get('gpu_name') or (r.get('device') or {}).get('device')}  dtype={r.get('dtype')}",
    ]
    pr = r.get("prompts")
    if pr:
        lines.append(f"prompts:   {pr['set']} × {pr['n']}, max new tokens {r.get('max_new_tokens')}, T={r.get('temperature')}")
    if r.get("acceptance_length") is not None:
        ci = r.get("tau_ci95")
        ci_s = f"  (95% CI {ci[0]:.3f}–{ci[1]:.3f})" if ci else ""
        lines.append(f"τ pooled:  {r['acceptance_length']:.3f}{ci_s}   acceptance rate {r.get('acceptance_rate') or 0:.3f}")
        lines.append("p_i:       " + " ".join(f"{p:.3f}" for p in r.get("acceptance_at_pos") or []))
        if r.get("source_metrics"):
            lines.append(f"τ source:  {r['source_metrics']['acceptance_length']:.3f}")
        if r.get("speedup"):
            lines.append(f"TPOT:      {r['tpot_ms']:.1f} ms spec / {r['tpot_ar_ms']:.1f} ms plain  (speedup {r['speedup']:.2f}×)")
    ox = r.get("onnx")
    if ox:
        lines.append(f"ONNX:      τ {ox['onnx']['acceptance_length']:.3f} (ORT) vs {ox['torch']['acceptance_length']:.3f} (torch); "
                     f"tokens identical {ox['tokens_identical']}; draft mismatches {ox['drafts']['mismatches']} "
                     f"(near-tie {ox['drafts']['near_tie_mismatches']}, near-ties {ox['drafts']['near_ties']})")
    lines.append("gates:")
    for g in r.get("gate_results", []):
        lines.append(f"  {g['name']:<11} {g['status']}")
        for e in g["errors"][:5]:
            lines.append(f"      error:   {e}")
        for w in g["warnings"][:3]:
            lines.append(f"      warning: {w}")
        if g.get("skipped_reason"):
            lines.append(f"      ({g['skipped_reason']})")
    files = r.get("report_files") or {}
    if files:
        lines.append(f"report:    {files.get('json')}")
    return "\n".join(lines)


@contextlib.contextmanager
def _progress():
    """Yield a ``progress(phase, done, total)`` callback (rich bar only on a TTY)."""
    if not progress_enabled():
        seen: set[str] = set()
        try:  # transformers' own tqdm bars ("Loading weights") would also land on stderr
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        except ImportError:  # pragma: no cover
            pass

        def cb(phase: str, done: int, total: int) -> None:
            if phase not in seen:
                seen.add(phase)
                log.info("%s ...", phase)

        yield cb
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    tasks: dict[str, int] = {}
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(stderr=True), transient=False,
    ) as bar:

        def cb(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done, total=total)

        yield cb


def _require_speculators_dir(d: Path) -> None:
    """Refuse (exit 3, nothing written) a DIR that is not a Speculators-format directory."""
    import json

    from specconv.errors import InvalidInputError

    try:
        cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InvalidInputError(f"{d}: cannot read config.json ({e})", code="not_speculators_dir") from e
    if not isinstance(cfg, dict) or "speculators_model_type" not in cfg:
        raise InvalidInputError(
            f"{d} is not a Speculators-format directory (config.json has no speculators_model_type)",
            code="not_speculators_dir",
            hint=f"convert it first: specconv convert {d} --verifier V -o OUT, then validate OUT with --source {d}",
        )


@click.command("validate")
@click.argument("drafter_dir", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@click.option("--verifier", required=True, help="Verifier: local HF dir or Hub id (from the local cache).")
@click.option("--source", help="Source checkpoint DIR was converted from: enables G2 parity and the τ comparison.")
@click.option("--prompts", default="eval", show_default=True, help="humaneval | mtbench | sharegpt | eval | FILE.jsonl")
@click.option("--num-prompts", type=click.IntRange(min=1), default=12, show_default=True,
              help="Prompts used, evenly spaced over the set.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="0 = greedy; > 0 = rejection sampling.")
@click.option("--device", default="auto", show_default=True, help="auto | cpu | cuda[:i] (auto = cuda when present).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
@click.option("--min-tau", type=float, help="Fail G3 when pooled τ is below this.")
@click.option("--report-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where validation.json/.md/.png go [default: ./specconv-validation/<DIR name>].")
@click.option("--backend", type=click.Choice(["torch", "vllm"]), default="torch", show_default=True)
@click.option("--attn-implementation", type=click.Choice(["sdpa", "eager"]), default="sdpa", show_default=True,
              help="Verifier attention kernels.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--onnx", "onnx_path", help="Also run the loop with this exported graph (ONNX Runtime) as the drafter.")
@output_format_option
@run_command
def validate_cmd(
    drafter_dir: Path,
    verifier: str,
    source: str | None,
    prompts: str,
    num_prompts: int,
    max_new_tokens: int,
    temperature: float,
    device: str,
    dtype: str,
    min_tau: float | None,
    report_dir: Path | None,
    backend: str,
    attn_implementation: str,
    seed: int,
    output_format: str,
    onnx_path: str | None = None,
) -> None:
    """Validate the Speculators drafter in DIR against its verifier.

    Gates, in order: G1 structure (lint, tensor accounting, verifier-supplied tensors),
    G2 parity (with --source), G3 acceptance (τ vs the source's, --min-tau), G4
    losslessness (greedy speculative == plain greedy). Writes validation.json,
    validation.md and acceptance.png and records a summary under "validation" in
    DIR/specconv.json. Exit 4 when a gate fails.
    """
    from specconv.errors import EXIT_GATE_FAILED
    from specconv.validate.report import record_in_specconv_json, write_report
    from specconv.validate.run import ValidateOptions, failed_gates, validate_drafter

    _require_speculators_dir(drafter_dir)
    if onnx_path and backend != "torch":
        from specconv.errors import UsageError

        raise UsageError("--onnx runs in the torch harness; it cannot be combined with --backend vllm")
    opts = ValidateOptions(
        onnx=onnx_path,
        source=source,
        prompts=prompts,
        num_prompts=num_prompts,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        device=device,
        dtype=dtype,
        min_tau=min_tau,
        backend=backend,
        attn_implementation=attn_implementation,
        seed=seed,
    )
    with _progress() as cb:
        report = validate_drafter(drafter_dir, verifier, opts, progress=cb)
    out_dir = report_dir or (Path.cwd() / "specconv-validation" / drafter_dir.resolve().name)
    files = write_report(report, out_dir)
    report["report_files"] = files
    summary = {
        "acceptance_length": report.get("acceptance_length"),
        "acceptance_at_pos": report.get("acceptance_at_pos"),
        "tau_ci95": report.get("tau_ci95"),
        "gates": report.get("gates"),
        "passed": report.get("passed"),
        "verifier": report.get("verifier"),
        "backend": report.get("backend"),
        "device": (report.get("device") or {}).get("gpu_name") or (report.get("device") or {}).get("device"),
        "dtype": report.get("dtype"),
        "prompts": {k: (report.get("prompts") or {}).get(k) for k in ("set", "n")},
        "max_new_tokens": report.get("max_new_tokens"),
        "temperature": report.get("temperature"),
        "source_acceptance_length": (report.get("source_metrics") or {}).get("acceptance_length"),
        "specconv_version": report.get("specconv_version"),
        "report": files.get("json"),
    }
    try:
        record_in_specconv_json(drafter_dir, summary)
    except OSError as e:  # read-only drafter dir: the report files still exist
        log.warning("could not record the validation summary in %s/specconv.json: %s", drafter_dir, e)
    failed = failed_gates(report)
    if failed:
        report["error"] = "gate_failed"
        report["exit_code"] = EXIT_GATE_FAILED
        report["message"] = "validation gate(s) failed: " + ", ".join(failed)
    emit(report, output_format, _human)
    if failed:
        click.echo(f"error: {report['message']}", err=True)
        raise SystemExit(EXIT_GATE_FAILED)
