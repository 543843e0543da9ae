"""SGLang's layout published as a Hub repo of its own (``push --sglang-repo-id``): the files the
generic separate-repo push (:mod:`specconv.publish.separate_repo`) sends and their card."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import GateFailedError
from . import repo
from .repo import _export, _export_dir, _rows, card_section


def repo_files(d: Path, rec: Any, repo_id: str) -> tuple[Path, dict[str, str]]:
    """The checked export dir of drafter dir ``d`` and its recorded sha256 per file name.

    Raises:
        GateFailedError: ``sglang_not_checked`` (exit 4): :func:`.repo.sglang_problem`.
    """
    problem = repo.sglang_problem(d, rec)
    out = _export_dir(d, rec)
    if problem is not None or out is None:
        raise _not_checked(repo_id, problem)
    return out, dict(_export(rec).files or {})


def _not_checked(repo_id: str, problem: str | None) -> GateFailedError:
    return GateFailedError(f"--sglang-repo-id {repo_id}: {problem}", code="sglang_not_checked",
                           hint="specconv export sglang DIR --check --overwrite, then push again")


def render_card(d: Path, rec: Any, repo_id: str, speculators_repo: str) -> str:
    """The SGLang repo's README.md: a link back to the Speculators repo, the serve line, the check.

    Raises:
        InvalidInputError: the rendered metadata does not parse (``hub.check_card``).
    """
    import jinja2
    import yaml

    from ... import __version__, hub
    from ...format.algorithms import algorithm
    from ...format.schema import read_config
    from ..card import _templates, choose_license, published_verifier

    exp = _export(rec)
    alg = algorithm(exp.algorithm)
    verifier = published_verifier(read_config(d)) or "unknown"
    license_id, license_note = choose_license(d, rec)
    meta: dict[str, Any] = {"license": license_id,
                            "tags": sorted({alg.name, "speculative-decoding", "sglang", "specconv"})}
    if hub.is_hub_id(verifier):
        meta["base_model"] = verifier
    env = " ".join(f"{k}={v}" for k, v in sorted((exp.env or {}).items()))
    section = card_section(d, rec, verifier, repo_id)
    if section is None:  # repo_files refused it already, unless the export changed since
        raise _not_checked(repo_id, repo.sglang_problem(d, rec))
    ctx = dict(metadata_yaml=yaml.safe_dump(meta, sort_keys=True, allow_unicode=True), title=repo_id.split("/")[-1],
               algorithm_name=alg.display_name, speculators_repo=speculators_repo, verifier=verifier,
               verifier_url=f"https://huggingface.co/{verifier}" if hub.is_hub_id(verifier) else None,
               command=section["command"], env=env, check=exp.check,
               rows=_rows(exp), target_supplied=", ".join(f"`{n}`" for n in exp.target_supplied or []),
               files=sorted(exp.files.items()), notes=exp.notes or [],
               specconv_version=rec.specconv_version or __version__, license=license_id, license_note=license_note)
    env_ = jinja2.Environment(loader=jinja2.FileSystemLoader(str(_templates())), keep_trailing_newline=True,
                              undefined=jinja2.StrictUndefined, autoescape=False)
    text = env_.get_template("model_card_sglang.md.j2").render(**ctx)
    hub.check_card(text)
    return text
