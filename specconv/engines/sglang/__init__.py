"""SGLang: its layout of a Speculators DFlash / DSpark drafter (``specconv export sglang``, published
as a repo of its own by ``push --sglang-repo-id``) and SGLang 0.5.23's own loader run on it in its
venv (``export sglang --check``, ``validate --sglang-load-check``, ``release --export-sglang``);
docs/sglang.md. This module is the engine's declaration (standard library only).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...outdir import OutputKind, files_listed
from ..base import Engine, Exporter, LoadCheck, OptionSpec, Surface
from ..base import served_algorithms as _served

#: the record of an SGLang export dir, its ``format`` and the one ``format_version`` every reader accepts
META_NAME, FORMAT, FORMAT_VERSION = "sglang_export.json", "specconv-sglang-drafter", 1
#: the SGLang loader's interpreter (``--sglang-loader-python``; default ``.venv-sglang``)
ENV_PYTHON = "SPECCONV_SGLANG_LOADER_PYTHON"


class SglangExporter(Exporter):
    """``specconv export sglang [--check]`` (:func:`specconv.engines.sglang.export.export_sglang_dir`,
    :func:`specconv.engines.sglang.check.export_checked`)."""

    kind = "sglang"
    dir_name = "sglang"
    record_key = "sglang"
    meta_version = FORMAT_VERSION
    release_key = "sglang"
    card_template = "sglang_section.md.j2"
    repo_option = OptionSpec(("--sglang-repo-id",), "sglang_repo_id", "Also publish DIR's SGLang layout (export "
                             "sglang, its check passed on these bytes) as this repo, after the Speculators repo "
                             "(docs/sglang.md).", metavar="ORG/NAME")
    surface = Surface(
        command=("export", "sglang"),
        options=(
            OptionSpec(("--check",), "check", "Load the files with SGLang's own loader (strict, CPU, its own venv) "
                       "before they are moved into place; exit 4 when it refuses them (nothing written).", kind="flag",
                       default=False),
            OptionSpec(("--sglang-loader-python",), "sglang_loader_python",
                       f"SGLang 0.5.23 interpreter for --check [default: ${ENV_PYTHON}, else .venv-sglang].",
                       metavar="PATH"),
        ),
        flag=OptionSpec(("--export-sglang",), "export_sglang", "After validate, write SGLang's layout and check it "
                        "with SGLang's own loader (exit 3 up front without the SGLang venv); --sglang-repo-id "
                        "publishes it.", kind="flag", default=False),
        help=f"""Write SGLang's layout of the Speculators drafter in DIR ({_served("sglang").replace(" / ", ", ")}).

    The weights are copied byte for byte; config.json is rewritten as SGLang 0.5.23 reads it
    (docs/sglang.md). What SGLang would serve wrongly is refused by name (exit 3, nothing
    written): P-EAGLE, a pruned vocabulary, aux ids SGLang cannot capture, another block
    layout. Records the export (and the check) under "export.sglang" in DIR/specconv.json.
    """)

    def run(self, drafter_dir: Path, out: Path | None, **options: Any) -> Any:
        if options.get("check"):
            from .check import export_checked

            return export_checked(drafter_dir, out, verifier=options.get("verifier"),
                                  overwrite=bool(options.get("overwrite")),
                                  python=options.get("sglang_loader_python"))
        from .export import export_sglang_dir

        return export_sglang_dir(drafter_dir, out, verifier=options.get("verifier"),
                                 overwrite=bool(options.get("overwrite")))

    @property
    def result_type(self) -> Any:
        from ...results import ExportSglangResult

        return ExportSglangResult

    def prepare(self, job: Any) -> None:
        from .export import prepare

        prepare(job)

    def write(self, job: Any, tmp: Path) -> dict[str, Any]:
        from .export import write

        return write(job, tmp)

    def check(self, job: Any, tmp: Path, meta: dict[str, Any]) -> dict[str, Any] | None:
        from .export import gate

        gate(job, tmp)
        return None

    def result(self, job: Any, meta: dict[str, Any]) -> dict[str, Any]:
        from .export import result

        return result(job, meta)

    def record_value(self, job: Any, result: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any]:
        from .export import record_value

        return record_value(result, previous)

    def repo_files(self, d: Path, rec: Any, repo_id: str) -> tuple[Path, Mapping[str, str]]:
        from .repo_card import repo_files

        return repo_files(d, rec, repo_id)

    def repo_card(self, d: Path, rec: Any, repo_id: str, speculators_repo: str) -> str:
        from .repo_card import render_card

        return render_card(d, rec, repo_id, speculators_repo)

    def owns(self, d: Path, rec: Any, rel: str) -> bool:
        """``sglang/`` or the recorded export's dir inside ``d`` (published as a repo of its own)."""
        from .repo import is_sglang_file

        return is_sglang_file(d, rec, rel)

    def card_section(self, d: Path, rec: Any, files: Any, draft_repo: str | None, *, verifier: str,
                     separate_repo: str | None = None) -> dict[str, Any] | None:
        """Where SGLang's layout is served from (its repo when pushed, the local export for the
        local card), once its check passed on these bytes (:func:`.repo.card_section`)."""
        from .repo import card_section, local_export_path

        draft = separate_repo if draft_repo is not None else local_export_path(d, rec)
        return card_section(d, rec, verifier, draft) if draft is not None else None

    def release_preflight(self, options: Mapping[str, Any], value: Any) -> None:
        """``--export-sglang`` needs the SGLang loader venv (exit 3); ``--sglang-repo-id`` needs
        ``--export-sglang`` (exit 2)."""
        if options.get("sglang_repo_id") and not value:
            from ...errors import UsageError

            raise UsageError("--sglang-repo-id needs --export-sglang (release publishes the layout it checked)")
        if value:
            from .check import find_sglang_python

            find_sglang_python()

    def release_step(self, drafter: Path, work: Path, options: Mapping[str, Any], value: Any) -> dict[str, Any]:
        from .check import export_checked

        r = export_checked(drafter, verifier=options.get("verifier"))
        check = r.check or {}  # export_checked's gate always records one
        return {k: getattr(r, k) for k in ("speculative_algorithm", "architecture", "files", "env")} | {
            "check": {k: check.get(k) for k in ("ok", "distribution", "version", "class")}}


LOAD_CHECK = LoadCheck(
    flag=OptionSpec(("--sglang-load-check",), "sglang_load_check", "Also export DIR to SGLang's layout in a temp dir "
                    "and load it with SGLang's own loader (strict; separate SGLang venv, see docs/sglang.md); recorded "
                    "under export.sglang, not a gate of validation.passed.", kind="flag", default=False),
    python=OptionSpec(("--sglang-loader-python",), "sglang_loader_python", f"SGLang 0.5.23 interpreter for "
                      f"--sglang-load-check [default: ${ENV_PYTHON}, else .venv-sglang].", metavar="PATH"),
    report_key="sglang_load", runner="specconv.engines.sglang.check:validate_check",
    preflight="specconv.engines.sglang.check:preflight",
)

ENGINE = Engine(
    key="sglang", display="SGLang", extra=None, order=60,
    output_kinds={"sglang": OutputKind("SGLang export", META_NAME, FORMAT, files_listed)},
    export=SglangExporter(), load_check=LOAD_CHECK,
)
