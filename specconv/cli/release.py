"""``specconv release SRC --verifier V --repo-id ORG/NAME``: convert → validate → push."""

from __future__ import annotations

from pathlib import Path

import click

from .chat_options import chat_options
from .common import run_command
from .engine_options import release_flags
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
@click.option("--compare", "compare", multiple=True, metavar="ENGINE[,ENGINE]",
              help="After the exports, validate again with each ENGINE serving the same token ids "
                   "(validate --compare); push refuses an engine that departs unless --allow-departing names it.")
@release_flags
@push_options
@output_format_option
@run_command
@chat_options  # inside run_command: a bad --chat-template-kwargs is exit 2 before anything is converted
def release_cmd(src: str, verifier: str, verifier_name, work_dir, min_tau, max_parity_kl, prompts, num_prompts,
                max_new_tokens, device, compare, output_format: str, chat=None, **kw):
    """Convert SRC, validate it against the verifier (gates), then push it.

    Stops at the first failed step with its exit code; prints a record of every step
    (with durations). In GitHub Actions writes commit_oid / commit_url / pr_url to
    $GITHUB_OUTPUT and a summary to $GITHUB_STEP_SUMMARY.
    """
    from specconv.publish.release import ReleaseOptions, release

    from .engine_options import pop_release_flags

    exports, engine_options = pop_release_flags(kw)
    opts = ReleaseOptions(verifier=verifier, verifier_name=verifier_name, work_dir=work_dir, min_tau=min_tau,
                          max_parity_kl=max_parity_kl, prompts=prompts, num_prompts=num_prompts,
                          max_new_tokens=max_new_tokens, device=device, exports=exports,
                          engine_options=engine_options, chat=chat,
                          compare=tuple(n.strip() for c in compare for n in c.split(",") if n.strip()))
    return release(src, opts, make_options(kw))
