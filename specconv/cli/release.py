"""``specconv release SRC --verifier V --repo-id ORG/NAME``: convert → validate → push."""

from __future__ import annotations

from pathlib import Path

import click

from .common import run_command
from .llamacpp_options import llama_server_option, verifier_gguf_option
from .options import output_format_option, verifier_name_option, verifier_option
from .push import make_options, push_options


@click.command("release")
@click.argument("src")
@verifier_option()
@verifier_name_option()
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where the converted drafter and the report go [default: a new temp dir].")
@click.option("--min-tau", type=float, help="Fail the acceptance gate when τ is below this.")
@click.option("--max-parity-kl", type=float, help="Fail when the converted-vs-source max KL exceeds this.")
@click.option("--prompts", default="eval", show_default=True, help="Validation prompt set.")
@click.option("--num-prompts", type=click.IntRange(min=1), default=12, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--device", default="auto", show_default=True)
@click.option("--export-onnx", is_flag=True, help="After validate, export onnx/ (re-used when the drafter bytes are unchanged).")
@click.option("--build-engine", type=click.Choice(["always", "if-available"]), is_flag=False, flag_value="always",
              default=None, help="With --export-onnx: build a --builder rtx engine, on a GPU machine only (exit 3 up "
              "front without a CUDA GPU); --build-engine=if-available records the skip instead.")
@click.option("--export-sglang", is_flag=True, help="After validate, write SGLang's layout and check it with SGLang's "
              "own loader (exit 3 up front without the SGLang venv); --sglang-repo-id publishes it.")
@click.option("--export-gguf", is_flag=True, help="After validate, write gguf/ and serve it with llama-server (exit 3 "
              "up front without a llama-server); pushed in the same repo (docs/llamacpp.md).")
@llama_server_option
@verifier_gguf_option
@push_options
@output_format_option
@run_command
def release_cmd(src: str, verifier: str, verifier_name, work_dir, min_tau, max_parity_kl, prompts, num_prompts,
                max_new_tokens, device, export_onnx, build_engine, export_sglang, export_gguf, llama_server,
                verifier_gguf, output_format: str, **kw):
    """Convert SRC, validate it against the verifier (gates), then push it.

    Stops at the first failed step with its exit code; prints a record of every step
    (with durations). In GitHub Actions writes commit_oid / commit_url / pr_url to
    $GITHUB_OUTPUT and a summary to $GITHUB_STEP_SUMMARY.
    """
    from specconv.publish.release import ReleaseOptions, release

    opts = ReleaseOptions(verifier=verifier, verifier_name=verifier_name, work_dir=work_dir, min_tau=min_tau,
                          max_parity_kl=max_parity_kl, prompts=prompts, num_prompts=num_prompts,
                          max_new_tokens=max_new_tokens, device=device, export_onnx=export_onnx,
                          build_engine=build_engine, export_sglang=export_sglang, export_gguf=export_gguf,
                          llama_server=llama_server, verifier_gguf=verifier_gguf)
    return release(src, opts, make_options(kw))
