"""``push --sglang-repo-id``: SGLang's layout of a drafter published as a repo of its own (SGLang
loads a whole repo), with its own card; the layout's facts and the bytes gate are
:mod:`specconv.engines.sglang.repo`'s (docs/sglang.md).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ..engines.sglang.repo import _export, _export_dir, _rows, card_section, sglang_problem
from ..errors import GateFailedError, SpecconvError, UsageError
from .payload import Payload, add_manifest, check_links, link_problems


def render_sglang_card(d: Path, rec: Any, repo_id: str, speculators_repo: str) -> str:
    """The SGLang repo's README.md: a link back to the Speculators repo, the serve line, the check.

    Raises:
        InvalidInputError: the rendered metadata does not parse (``hub.check_card``).
    """
    import jinja2
    import yaml

    from .. import __version__, hub
    from ..format.algorithms import algorithm
    from ..format.schema import read_config
    from ..engines.card import _templates, choose_license
    from ..engines.card import published_verifier

    exp = _export(rec)
    alg = algorithm(exp.algorithm)
    verifier = published_verifier(read_config(d)) or "unknown"
    license_id, license_note = choose_license(d, rec)
    meta: dict[str, Any] = {"license": license_id,
                            "tags": sorted({alg.name, "speculative-decoding", "sglang", "specconv"})}
    if hub.is_hub_id(verifier):
        meta["base_model"] = verifier
    env = " ".join(f"{k}={v}" for k, v in sorted((exp.env or {}).items()))
    ctx = dict(metadata_yaml=yaml.safe_dump(meta, sort_keys=True, allow_unicode=True), title=repo_id.split("/")[-1],
               algorithm_name=alg.display_name, speculators_repo=speculators_repo, verifier=verifier,
               verifier_url=f"https://huggingface.co/{verifier}" if hub.is_hub_id(verifier) else None,
               command=card_section(d, rec, verifier, repo_id)["command"], env=env, check=exp.check,
               rows=_rows(exp), target_supplied=", ".join(f"`{n}`" for n in exp.target_supplied or []),
               files=sorted(exp.files.items()), notes=exp.notes or [],
               specconv_version=rec.specconv_version or __version__, license=license_id, license_note=license_note)
    env_ = jinja2.Environment(loader=jinja2.FileSystemLoader(str(_templates())), keep_trailing_newline=True,
                              undefined=jinja2.StrictUndefined, autoescape=False)
    text = env_.get_template("model_card_sglang.md.j2").render(**ctx)
    hub.check_card(text)
    return text


def sglang_payload(d: Path, rec: Any, repo_id: str, speculators_repo: str) -> Payload:
    """The SGLang repo's files: the export dir's (weights, config, its record) plus its card.

    Raises:
        GateFailedError: ``sglang_not_checked`` (exit 4): :func:`sglang_problem`; ``link_outside_dir``
            (exit 4): a file of the export that is a link out of it.
    """
    problem = sglang_problem(d, rec)
    if problem is not None:
        raise GateFailedError(f"--sglang-repo-id {repo_id}: {problem}", code="sglang_not_checked",
                              hint="specconv export sglang DIR --check --overwrite, then push again")
    out, files = _export_dir(d, rec), _export(rec).files
    names = sorted(x for x in out.iterdir() if not x.name.startswith("."))
    check_links(out, link_problems(out, names), "the SGLang export")  # its bytes, never a link's target
    p = Payload()
    for f in (x for x in names if x.is_file()):
        p.add(f.name, f, files.get(f.name))
    p.add("README.md", render_sglang_card(d, rec, repo_id, speculators_repo).encode("utf-8"))
    add_manifest(p)
    return p


def push_with_sglang(d: Path, opts: Any) -> Any:
    """``push DIR --repo-id A --sglang-repo-id B``: both gates first, then A, then B.

    Returns:
        A's :class:`~specconv.publish.push.PushResult` with ``sglang``: B's.

    Raises:
        UsageError: the two repo ids are equal.
        GateFailedError: either gate (nothing pushed).
        SpecconvError: B's push failed after A's succeeded; its ``result`` is A's result
            with B's error under ``sglang``, and the message names A's commit.
    """
    from ..record import read_record
    from .push import _record_publish, build_payload, publish_payload

    if opts.sglang_repo_id == opts.repo_id:
        raise UsageError("--sglang-repo-id must name another repo than --repo-id (SGLang loads a whole repo)")
    rec = read_record(d, missing_ok=True)
    sg = sglang_payload(d, rec, opts.sglang_repo_id, opts.repo_id)
    first = publish_payload(build_payload(d, opts), opts)
    _record_publish(d, first)
    try:
        second = publish_payload(sg, replace(opts, repo_id=opts.sglang_repo_id, include=(), exclude=(),
                                             sglang_repo_id=None))
    except SpecconvError as e:
        done = f"{opts.repo_id}: {first.status}" + (f" (commit {first.commit_oid})" if first.commit_oid else "")
        e.message = f"{done}; then the SGLang repo {opts.sglang_repo_id} failed: {e.message}"
        e.result = type(first).of({**first.to_dict(), "error": e.code, "exit_code": e.exit_code, "message": e.message,
                                   "sglang": {"repo_id": opts.sglang_repo_id, "error": e.code, "message": e.message}})
        raise
    _record_publish(d, second, key="sglang")
    return type(first).of({**first.to_dict(), "sglang": second.to_dict(),
                           "would_change": bool(first.would_change or second.would_change)})
