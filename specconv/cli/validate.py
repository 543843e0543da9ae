"""``specconv validate DIR --verifier V``: gates G1–G4 and an acceptance report."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import click

from ..validate.backend import backends
from .chat_options import chat_options
from .common import progress_enabled, run_command
from .engine_options import (
    load_check_options,
    pop_load_checks,
    pop_runtime_paths,
    pop_serve_options,
    runtime_options,
    serve_options,
)
from .options import output_format_option, verifier_option

log = logging.getLogger("specconv")


@contextlib.contextmanager
def _progress():
    """Yield a ``progress(phase, done, total)`` callback (rich bar only on a TTY)."""
    if not progress_enabled():
        seen: set[str] = set()

        def cb(phase: str, done: int, total: int) -> None:
            if phase not in seen:
                seen.add(phase)
                log.info("%s ...", phase)

        yield cb
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    tasks: dict[str, TaskID] = {}
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(stderr=True), transient=False,
    ) as bar:

        def cb(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done, total=total)

        yield cb


@click.command("validate")
@click.argument("drafter_dir", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@verifier_option(help="Verifier: local HF dir or Hub id (from the local cache).")
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
@click.option("--backend", type=click.Choice(list(backends())), default="torch", show_default=True,
              help="; ".join(f"{name}: {text}" for name, text in backends().items()) + ".")
@click.option("--compare", "compare", multiple=True, metavar="ENGINE[,ENGINE]",
              help="After the torch loop (the reference), serve the same token ids with each ENGINE "
                   "(" + ", ".join(n for n in backends() if n != "torch") + "; repeatable or comma-separated; "
                   "vllm with --server-url measures that server) and judge each per position: agrees / "
                   "departs / inconclusive (docs/validate.md, \"Comparing engines\"). Greedy only.")
@serve_options
@runtime_options
@click.option("--attn-implementation", type=click.Choice(["sdpa", "eager"]), default="sdpa", show_default=True,
              help="Verifier attention kernels.")
@click.option("--seed", type=int, default=0, show_default=True)
@load_check_options
@click.option("--drafter-cache/--no-drafter-cache", default=True, hidden=True,
              help="Draft through the context-cached session (default) or statelessly.")
@output_format_option
@run_command
@chat_options  # inside run_command: a bad --chat-template-kwargs is exit 2 before DIR is read
def validate_cmd(drafter_dir: Path, verifier: str, source: str | None, prompts: str, num_prompts: int,
                 max_new_tokens: int, temperature: float, device: str, dtype: str, min_tau: float | None,
                 report_dir: Path | None, backend: str, compare: tuple[str, ...], attn_implementation: str, seed: int,
                 drafter_cache: bool, output_format: str, chat=None,
                 **engine_flags):  # chat: chat_options.py; engine_flags: the engines' flags
    """Validate the Speculators drafter in DIR against its verifier.

    Gates, in order: G1 structure (lint, tensor accounting, verifier-supplied tensors),
    G2 parity (with --source), G3 acceptance (τ vs the source's, --min-tau), G4
    losslessness (greedy speculative == plain greedy). Writes validation.json,
    validation.md and acceptance.png and records a summary under "validation" in
    DIR/specconv.json. Exit 4 when a gate fails.
    """
    from specconv.validate.run import ValidateOptions, validate_drafter
    from specconv.validate.runtimes import runtime_from_flags

    compared = tuple(n.strip() for c in compare for n in c.split(",") if n.strip())
    engine_options, serve = pop_serve_options(engine_flags, backend, compared)  # exit 2 before DIR is read
    runtime, runtime_path = runtime_from_flags(pop_runtime_paths(engine_flags), backend)
    opts = ValidateOptions(source=source, prompts=prompts, num_prompts=num_prompts, max_new_tokens=max_new_tokens,
                           temperature=temperature, device=device, dtype=dtype, min_tau=min_tau, backend=backend,
                           engine_options=engine_options, serve=serve,
                           runtime=runtime, runtime_path=runtime_path, attn_implementation=attn_implementation,
                           seed=seed, drafter_cache=drafter_cache,
                           load_checks=pop_load_checks(engine_flags), chat=chat, compare=compared)
    with _progress() as cb:
        report = validate_drafter(drafter_dir, verifier, opts, report_dir=report_dir, progress=cb)
    failure = report.gate_failure()
    if failure is not None:
        raise failure
    return report
