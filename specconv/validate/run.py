"""``validate_drafter``: the ``specconv validate`` pipeline as a sequence of steps (``docs/validate.md``)."""

from __future__ import annotations

import datetime as _dt
import logging
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engines import engine_option_defaults
from ..errors import InvalidInputError, SpecconvError, UsageError
from ..prompts import ChatOptions, select_prompts
from .backend import Progress, ValidationRun, backends, get_backend
from .gates import GATE_ORDER, GateResult, skipped
from .torch_backend import PARITY_SEQUENCES, plan_placement  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    from ..format import SpeculatorsDraftConfig
    from ..results import ValidationReport
    from ..verifier import Verifier

log = logging.getLogger("specconv.validate")

#: Default cumulative-confidence threshold for the DSpark truncated-block run.
DSPARK_CONFIDENCE_THRESHOLD = 0.5


@dataclass
class ValidateOptions:
    """Options of one validation run: the CLI flags of the same names (``docs/cli.md``).

    ``drafter_backend``: the runtime loading the drafter in the torch harness (``runtimes()`` key);
    ``runtime`` / ``runtime_path``: a runtime compared with the torch reference (``--onnx`` /
    ``--engine``); ``engine_options``: the engines' plain options, dest → value (``--llama-server``,
    ``--vllm-python``, ...; default: each at its default); ``serve``: engine key → its typed serving
    options (a :class:`specconv.engines.vllm.server.VllmServeOptions`); ``load_checks``: engine
    key → interpreter (None: its default) of each ``--*-load-check``; ``compare``: the engines serving
    the same token ids after the torch loop, each judged against it (``--compare``).
    """

    source: str | None = None
    prompts: str = "eval"
    num_prompts: int | None = 12
    max_new_tokens: int = 64
    temperature: float = 0.0
    device: str = "auto"
    dtype: str = "float32"
    min_tau: float | None = None
    backend: str = "torch"
    drafter_backend: str = "torch"
    attn_implementation: str = "sdpa"
    seed: int = 0
    confidence_threshold: float | None = DSPARK_CONFIDENCE_THRESHOLD
    drafter_cache: bool = True
    runtime: str | None = None
    runtime_path: str | None = None
    engine_options: dict[str, Any] = field(default_factory=engine_option_defaults)
    serve: dict[str, Any] = field(default_factory=dict)
    load_checks: dict[str, str | None] = field(default_factory=dict)
    chat: ChatOptions = field(default_factory=ChatOptions)
    compare: tuple[str, ...] = ()


#: options the report's ``options`` leaves out: a load check is its own result (``vllm_load``),
#: a compared runtime is listed as its CLI flag (``runtime_flags``), the engines' options flat, each
#: engine's serving options redacted under its report key
_OWN_RESULT_OPTIONS = ("load_checks", "runtime", "runtime_path", "engine_options", "serve")


def _source_options(drafter_dir: Path):
    """ConvertOptions recorded in the drafter's ``specconv.json`` (paths relative to the drafter dir)."""
    from specconv.converters import ConvertOptions

    from ..record import read_record

    try:
        conv = read_record(drafter_dir, missing_ok=True).conversion
    except InvalidInputError:
        return ConvertOptions()
    opts = dict(conv.options) if conv is not None else {}
    fields = set(ConvertOptions.__dataclass_fields__)
    kw = {k: v for k, v in opts.items() if k in fields}
    for k in ("vocab_mapping", "draft_config"):
        if kw.get(k):
            kw[k] = drafter_dir / kw[k]  # an absolute (legacy) path stays absolute
    try:
        return ConvertOptions(**kw)
    except TypeError:
        return ConvertOptions()


def prepare_source(source: str, verifier: Verifier, drafter_dir: Path, workdir: Path) -> dict:
    """Make ``--source`` loadable: a Speculators dir as is unless the recorded conversion options
    decide its reading (:meth:`ConvertOptions.decides_reading`), else converted afresh into ``workdir``
    with those options. Returns ``{"kind", "format", "path", "converted"}``."""
    from ..format import speculators_model_type_of

    p = Path(source)
    options = _source_options(drafter_dir)
    if speculators_model_type_of(p) is not None and not options.decides_reading():
        return {"kind": "speculators", "format": "speculators", "path": str(p), "converted": str(p)}
    from ..convert import convert

    out = workdir / "source-converted"
    rep = convert(source, verifier=verifier, output=out, options=options, overwrite=True)
    return {"kind": "converted", "format": rep.format, "path": rep.source or str(p), "converted": str(out)}


def check_source_unchanged(drafter_dir: Path, source: dict) -> dict:
    """Check ``--source`` against the sha256s in ``conversion.source.files`` of the drafter's record.

    Returns ``{"matches_record": True, "files": n}``, or ``{"matches_record": None, "why": ...}``
    when none are recorded. Raises InvalidInputError ``source_changed`` (exit 3) naming each file.
    """
    from ..record import read_record

    try:
        conv = read_record(drafter_dir, missing_ok=True).conversion
    except InvalidInputError:
        conv = None
    recorded = dict(conv.source.files) if conv is not None and conv.source else {}
    if not recorded:
        return {"matches_record": None, "why": f"{drafter_dir}/specconv.json records no source sha256"}
    current = _source_hashes(source, recorded)
    diffs = [f"{n}: recorded {recorded.get(n) or 'no such file'}, now {current.get(n) or 'absent'}"
             for n in sorted(set(recorded) | set(current)) if recorded.get(n) != current.get(n)]
    if diffs:
        raise InvalidInputError(
            f"--source {source['path']} is not the checkpoint {drafter_dir} was converted from: "
            f"{len(diffs)} source file(s) differ from the sha256 recorded in its specconv.json "
            f"(conversion.source.files) — {'; '.join(diffs[:4])}{'; …' if len(diffs) > 4 else ''}. "
            "G2 parity and G3 would compare the drafter with other weights",
            code="source_changed",
            hint="pass the checkpoint the drafter was converted from, or convert this source again and "
                 "validate that output",
        )
    return {"matches_record": True, "files": len(recorded)}


def _source_hashes(source: dict, recorded: dict[str, str]) -> dict[str, str]:
    """sha256 of the source's files now: the fresh conversion's record, or the recorded names hashed."""
    from ..record import read_record
    from ..tensors import sha256_file

    if source["kind"] == "converted":
        conv = read_record(source["converted"]).conversion
        return dict(conv.source.files) if conv is not None else {}
    d = Path(source["path"])
    return {n: sha256_file(d / n) for n in recorded if (d / n).is_file()}


def _gate_map(results: list[GateResult]) -> dict[str, bool]:
    return {g.name: bool(g.passed) for g in results if g.passed is not None}


def _finish(report: dict, results: list[GateResult]) -> ValidationReport:
    from ..results import ValidationReport

    by = {g.name: g for g in results}
    ordered = [by.get(n) or skipped(n, "not reached") for n in GATE_ORDER]
    ordered += [g for g in results if g.name not in GATE_ORDER]  # a compared runtime's gate (runtimes.py)
    report["gate_results"] = [g.to_dict() for g in ordered]
    report["gates"] = _gate_map(ordered)
    report["passed"] = all(report["gates"].values())
    return ValidationReport.of(report)


def validate_drafter(
    drafter_dir: str | Path,
    verifier: str | Verifier,
    options: ValidateOptions | None = None,
    *,
    report_dir: str | Path | None = None,
    progress: Progress | None = None,
) -> ValidationReport:
    """Validate a Speculators drafter dir against ``verifier``; write the report files
    [``./specconv-validation/<DIR name>``], ``DIR/specconv.json``'s ``validation`` and ``DIR/README.md``.

    A failed gate does not raise: ``report.passed`` is false, ``report.gate_failure()`` the exit-4 error.
    Raises InvalidInputError (``not_speculators_dir``, unreadable inputs, models that do not fit, bad
    prompt sets, no vLLM interpreter) or UsageError (inconsistent options).
    """
    opts = options or ValidateOptions()
    d = Path(drafter_dir)
    config, config_error = _read_config(d)
    _preflight(opts, d, verifier if isinstance(verifier, str) else verifier.spec)
    _check_inputs(d, opts)
    v = _resolved(verifier)  # a local path made absolute: the loader checks run in other working directories
    run = ValidationRun(drafter_dir=d, verifier=v, verifier_spec=v.model_ref, config=config, options=opts,
                        progress=progress or (lambda *_: None))
    report = _run_gates(run, config_error)
    _load_check_step(report, run)
    from .report import finish_report

    finish_report(report, d, Path(report_dir) if report_dir else Path.cwd() / "specconv-validation" / d.resolve().name)
    return report


def _run_gates(run: ValidationRun, config_error: SpecconvError | None) -> ValidationReport:
    """Start the report, then [the source] → G1 → prompts → the backend's gates."""
    run.report.update(_start_report(run))
    with tempfile.TemporaryDirectory(prefix="specconv-validate-") as tmp:
        _source_step(run, Path(tmp))
        if _structure_step(run, config_error):
            _prompts_step(run)
            _render_step(run)
            get_backend(run.options.backend).run(run)
    return _finish(run.report, run.results)


def _resolved(verifier: str | Verifier) -> Verifier:
    from ..verifier import Verifier, resolve_verifier

    return verifier if isinstance(verifier, Verifier) else resolve_verifier(verifier)


def _read_config(d: Path) -> tuple[SpeculatorsDraftConfig | None, SpecconvError | None]:
    """``(typed config, None)``, or ``(None, error)`` for an invalid value (G1 reports it, exit 4).

    Raises (exit 3, nothing written) InvalidInputError ``not_speculators_dir`` / ``dangling_link`` /
    ``broken_hub_cache``, or UnsupportedFormatError (:func:`_refuse_unsupported`).
    """
    from ..fileio import check_no_dangling_links
    from ..format import parse_config, read_config

    check_no_dangling_links(d, "drafter dir")
    try:
        raw = read_config(d)
    except InvalidInputError as e:
        raise InvalidInputError(f"{d}: cannot read config.json ({e.message})", code="not_speculators_dir") from e
    if not isinstance(raw.get("speculators_model_type"), str):
        raise InvalidInputError(
            f"{d} is not a Speculators-format directory (config.json has no speculators_model_type)",
            code="not_speculators_dir",
            hint=f"convert it first: specconv convert {d} --verifier V -o OUT, then validate OUT with --source {d}")
    _refuse_unsupported(d, raw["speculators_model_type"])
    try:
        return parse_config(raw, source=str(d / "config.json")), None
    except SpecconvError as e:
        return None, e


def _refuse_unsupported(d: Path, model_type: str) -> None:
    """UnsupportedFormatError (exit 3) for a dir the converter registry's detection refuses
    (``speculators_other``, ``quantized_drafter``), naming format, type and reason."""
    from ..converters import SourceInfo, detect
    from ..errors import UnsupportedFormatError

    cls = detect(SourceInfo.open(d))
    if cls is not None and not cls.supported:
        raise UnsupportedFormatError(
            f"{d}: {cls.title} ({cls.format_id}, speculators_model_type {model_type!r}): {cls.refusal}",
            format_id=cls.format_id)


def _preflight(opts: ValidateOptions, d: Path, verifier_spec: str) -> None:
    """Refusals (exit 3) before any model loads: each load check's, then the backend's ``preflight``."""
    from ..engines import engines
    from .compare_run import check_compare, preflight_compare

    check_compare(opts.compare, opts.backend, opts.temperature)  # exit 2 before any engine's refusal
    for e in engines():
        if e.load_check is not None and e.key in opts.load_checks:
            e.load_check.refuse(d, verifier_spec, opts.load_checks[e.key])
    backend = get_backend(opts.backend)
    if hasattr(backend, "preflight"):  # --backend llamacpp: DIR/gguf, llama-server, a verifier GGUF
        backend.preflight(d, opts)
    preflight_compare(d, opts)  # each compared engine's refusals, before the torch loop runs


def _load_check_step(report: ValidationReport, run: ValidationRun) -> None:
    """Run each asked-for engine load check into the report's ``report_key`` (``gates_validation``:
    a failure fails ``passed``)."""
    from ..engines import engines

    for e in engines():
        if e.load_check is None or e.key not in run.options.load_checks:
            continue
        lc = e.load_check
        payload = lc.run(run.drafter_dir, run.verifier_spec, run.options.load_checks[e.key])
        setattr(report, lc.report_key, payload)
        if lc.gates_validation:
            report.passed = bool(report.passed) and bool(payload["ok"])


def _check_inputs(drafter_dir: str | Path, opts: ValidateOptions) -> Path:
    """Options that cannot work, and missing extras: refused before anything is read."""
    from ..engines import serves
    from ..extras import require
    from .runtimes import check_one_runtime, check_runtime, get_runtime
    from .verifier_runner import torch_dtype

    require("torch", "validate", feature="specconv validate")  # G1 reads tensors with torch (every backend)
    require("transformers", "validate", feature="specconv validate")  # the tokenizer renders for every backend
    d = Path(drafter_dir)
    if not d.is_dir():
        raise InvalidInputError(f"drafter dir {d} does not exist")
    if opts.temperature < 0:
        raise UsageError("--temperature must be >= 0")
    if opts.backend not in backends():
        raise UsageError(f"unknown backend {opts.backend!r}")
    get_runtime(opts.drafter_backend, "drafter backend")
    torch_dtype(opts.dtype)
    for key, serve in serves():  # exit 2 before anything starts (--vllm-python: the CLI)
        serves_here = key in opts.compare or serve.backend in opts.compare
        serve.check_options(serve.backend if serves_here else opts.backend, opts.serve.get(key))
    opts.chat.template_kwargs()  # exit 2: --chat-template none with kwargs, a contradicting --thinking
    check_one_runtime(opts.backend, [opts.runtime] if opts.runtime else [])
    check_runtime(opts.runtime, opts.runtime_path, d, opts.dtype)  # a runtime's refusals, before any model
    return d


def _start_report(run: ValidationRun) -> dict[str, Any]:
    """The report keys known before any gate ran (what, with what, which versions)."""
    from .. import __version__
    from .report import library_versions
    from .runtimes import runtime_flags

    opts, v = run.options, run.verifier
    return {
        "specconv_version": __version__,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "drafter": str(run.drafter_dir),
        "verifier": v.name_or_path,
        "verifier_dir": str(v.local_dir),
        "backend": opts.backend,
        "dtype": opts.dtype,
        "temperature": opts.temperature,
        "max_new_tokens": opts.max_new_tokens,
        "seed": opts.seed,
        "options": {**{k: val for k, val in asdict(opts).items() if k not in _OWN_RESULT_OPTIONS},
                    **runtime_flags(opts.runtime, opts.runtime_path),  # as the CLI flags: onnx, engine
                    **opts.engine_options,
                    **{o.report_key: o.recorded() for o in opts.serve.values() if o is not None}},  # URLs redacted
        "versions": library_versions(),
    }


def _source_step(run: ValidationRun, workdir: Path) -> None:
    """``--source``: make it loadable (convert afresh) and parse its typed config."""
    if not run.options.source:
        return
    from ..format import load_config

    run.progress("converting source", 0, 1)
    run.source = prepare_source(run.options.source, run.verifier, run.drafter_dir, workdir)
    run.source["record_check"] = check_source_unchanged(run.drafter_dir, run.source)
    run.source_config = load_config(run.source["converted"])
    run.report["source"] = run.source


def _structure_step(run: ValidationRun, config_error: SpecconvError | None) -> bool:
    """G1; on failure the other gates are recorded as skipped. Returns whether it passed."""
    from .gates import gate_structure

    run.progress("structure", 0, 1)
    if config_error is not None:
        g1 = GateResult(name="structure", passed=False,
                        errors=[f"cannot read {run.drafter_dir}: {config_error.message}"])
    else:
        g1 = gate_structure(run.drafter_dir, run.verifier, config=run.config, source_config=run.source_config)
    run.results.append(g1)
    run.report["algorithm"] = g1.details.get("algorithm")
    run.report["aux_layer_ids"] = g1.details.get("aux_layer_ids")
    if g1.passed:
        return True
    run.results += [skipped(n, "G1 structure failed") for n in GATE_ORDER[1:]]
    run.report["device"] = {"device": run.options.device}
    return False


def _prompts_step(run: ValidationRun) -> None:
    """Select the prompts (evenly spaced over the set) and record which."""
    opts = run.options
    run.prompts = select_prompts(opts.prompts, opts.num_prompts)
    run.report["prompts"] = {
        "set": opts.prompts,
        "n": len(run.prompts),
        "ids": [p.id for p in run.prompts],
        "selection": "evenly spaced over the set" if opts.num_prompts else "all",
    }


def rendered_digest(rendered: list[tuple[str, list[int]]]) -> str:
    """sha256 of the rendered prompts (``[[id, [token ids]], …]`` as compact JSON)."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps([[pid, list(ids)] for pid, ids in rendered],
                                     separators=(",", ":")).encode()).hexdigest()


def _render_step(run: ValidationRun) -> None:
    """Render every prompt once with the verifier's tokenizer; every backend gets these token ids."""
    from ..prompts import chat_renderer

    run.progress("rendering prompts", 0, 1)
    renderer = chat_renderer(_tokenizer(run.verifier), run.options.chat)
    run.rendered = renderer.render_all(run.prompts)
    run.chat = renderer.facts
    run.report["chat_template"] = renderer.facts.as_dict()
    run.report["prompts"].update(token_counts=[len(ids) for _, ids in run.rendered],
                                 rendered_sha256=rendered_digest(run.rendered))


def _tokenizer(verifier: Verifier) -> Any:
    """The verifier's tokenizer (local cache only); InvalidInputError ``verifier_tokenizer`` if none loads."""
    from transformers import AutoTokenizer

    where = str(verifier.hub_id or verifier.local_dir)
    try:
        return AutoTokenizer.from_pretrained(where, local_files_only=True)
    except (OSError, ValueError) as e:
        raise InvalidInputError(f"the verifier {where} has no loadable tokenizer ({e}): prompts cannot be rendered",
                                code="verifier_tokenizer") from e
