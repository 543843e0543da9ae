"""``specconv push DIR --repo-id ORG/NAME``: publish a validated drafter to the Hugging Face Hub."""

from __future__ import annotations

from pathlib import Path

import click

from .common import run_command
from .engine_options import Decorator, click_option, repo_option_specs
from .options import endpoint_option, output_format_option


def push_options(f):
    """The publish flags shared by ``push`` and ``release``."""
    opts: list[Decorator] = [
        click.option("--repo-id", required=True, help="Target Hub repo ORG/NAME (created when missing)."),
        endpoint_option,
        click.option("--private/--public", "private", default=None,
                     help="Visibility; an existing repo of the other kind is a conflict (exit 6)."),
        click.option("--branch", help="Target branch (created from main when missing)."),
        click.option("--create-pr", is_flag=True, help="Commit to a pull request (an open specconv PR is reused)."),
        click.option("--tag", help="Tag the published commit (vX.Y.Z); never moved without --force-tag."),
        click.option("--force-tag", is_flag=True, help="Move an existing tag."),
        click.option("--commit-message", help="Commit title."),
        click.option("--include", multiple=True, help="Only push files matching this glob (repeatable)."),
        click.option("--exclude", multiple=True, help="Do not push files matching this glob (repeatable)."),
        click.option("--delete-stale", is_flag=True,
                     help="Delete remote files specconv published before that are gone locally."),
        click.option("--max-retries", type=click.IntRange(min=0), default=3, show_default=True,
                     help="Retries after a 412 (re-plan) or a transient 5xx/429 (backoff: "
                          "SPECCONV_HUB_RETRY_DELAY s, doubling)."),
        click.option("--dry-run", is_flag=True, help="Print the plan; send no write request."),
        click.option("--detailed-exitcode", is_flag=True,
                     help="With --dry-run: exit 10 when something would change, 0 when not."),
        click.option("--verify/--no-verify", default=True, show_default=True,
                     help="Check the remote checksums after the commit (exit 8)."),
        click.option("--allow-unvalidated", is_flag=True,
                     help="Push files no passed validation covers (recorded in the card)."),
        click.option("--allow-departing", multiple=True, metavar="ENGINE",
                     help="Publish although `validate --compare` found ENGINE departing from specconv's loop "
                          "(repeatable; the card says so)."),
        click.option("--allow-verifier-weights", is_flag=True, help="Push onnx/, trt/ and gguf/ files that embed the "
                     "verifier's weights (its embedding / LM head)."),
    ]
    opts += [click_option(spec) for spec in repo_option_specs().values()]
    for o in reversed(opts):
        f = o(f)
    return f


def _check_tag_is_version(tag: str) -> None:
    """``--tag`` must be a version (``vX.Y.Z``, PEP 440 after an optional ``v``), checked before
    anything is converted or committed: a tag the Hub refuses after the commit would leave a
    published but untagged release."""
    from packaging.version import InvalidVersion, Version

    from specconv.errors import UsageError

    try:
        Version(tag[1:] if tag[:1] in "vV" else tag)
    except InvalidVersion:
        raise UsageError(f"--tag {tag!r} is not a version (e.g. v1.2.3)") from None
    if tag != tag.strip() or not tag[-1:].isalnum():
        raise UsageError(f"--tag {tag!r} is not a version (e.g. v1.2.3)")


def make_options(kw: dict):
    """``PushOptions`` from the click parameters (consumes the push keys of ``kw``)."""
    from specconv.errors import UsageError
    from specconv.publish.push import PushOptions

    o = PushOptions(**{k: kw.pop(k) for k in list(kw) if k in PushOptions.__dataclass_fields__})
    o.separate_repos = {key: repo for key, spec in repo_option_specs().items() if (repo := kw.pop(spec.dest, None))}
    o.include, o.exclude, o.allow_departing = tuple(o.include), tuple(o.exclude), tuple(o.allow_departing)
    if o.detailed_exitcode and not o.dry_run:
        raise UsageError("--detailed-exitcode needs --dry-run")
    if o.force_tag and not o.tag:
        raise UsageError("--force-tag needs --tag")
    if o.tag is not None:
        _check_tag_is_version(o.tag)
    if o.create_pr and o.branch:
        raise UsageError("--create-pr opens a pull request against main; drop --branch")
    return o


@click.command("push")
@click.argument("drafter_dir", metavar="DIR", type=click.Path(file_okay=False, exists=True, path_type=Path))
@push_options
@output_format_option
@run_command
def push_cmd(drafter_dir: Path, output_format: str, **kw):
    """Publish the validated drafter in DIR to the Hub as one atomic commit.

    Refused (exit 4) unless DIR/specconv.json holds a passed validation of exactly these
    files. README.md (the model card), specconv.json and acceptance.png are regenerated.
    A re-run with the same bytes makes no commit (status "unchanged").
    """
    from specconv.publish.push import push

    return push(drafter_dir, make_options(kw))
