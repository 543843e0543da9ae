"""``validate_drafter``: the whole ``specconv validate`` pipeline behind the CLI, as a sequence of
steps (``docs/architecture.md``, "One validation"; ``docs/validate.md``). The backends live in
:mod:`.backend` / :mod:`.torch_backend`.
"""

from __future__ import annotations

import datetime as _dt
import logging
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engines import engine_option_defaults
from ..errors import InvalidInputError, UsageError
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
    """Options of one validation run (the CLI flags).

    Attributes:
        source: ``--source`` checkpoint (any convertible format or a Speculators dir).
        prompts: ``humaneval`` | ``mtbench`` | ``sharegpt`` | ``eval`` | a ``.jsonl`` path.
        num_prompts: prompts used (evenly spaced over the set; None = all).
        max_new_tokens: generated tokens per request (including the prefill token).
        temperature: 0 = greedy; > 0 = rejection sampling.
        device: ``auto`` | ``cpu`` | ``cuda[:i]``.
        dtype: ``float32`` | ``bfloat16`` | ``float16`` for verifier and drafter.
        min_tau: optional τ floor for G3.
        backend: ``torch`` (this harness) | ``vllm`` (a vLLM server) | ``llamacpp`` (the torch
            loop, then ``DIR/gguf`` served by llama-server): a key of
            :func:`specconv.validate.backend.backends`.
        drafter_backend: the runtime that loads the drafter under test in the torch
            harness (a key of :func:`specconv.validate.runtimes.runtimes`; ``torch`` = the
            reference drafters of :mod:`specconv.drafters`).
        attn_implementation: verifier attention (``sdpa`` | ``eager``).
        seed: prompt-independent RNG seed (bootstrap, sampling).
        confidence_threshold: DSpark truncated-run threshold (None disables that run).
        drafter_cache: torch backend — draft through the context-cached session
            (default) or statelessly (``--no-drafter-cache``); same tokens either way.
        runtime: a runtime compared with the torch reference on the same requests (a key
            of :func:`~specconv.validate.runtimes.runtimes`: ``onnx`` for ``--onnx``,
            ``tensorrt`` for ``--engine``; its gate joins the others). runtime_path: the
            exported graph / engine it runs.
        engine_options: the engines' plain options, dest → value (``--llama-server``,
            ``--verifier-gguf``, ``--vllm-python``, ``--vllm-port``; default: each at its default).
        serve: engine key → the serving options its ``serve`` folded (``--backend vllm``'s
            parallel sizes, ``--server-url`` …: :class:`specconv.engines.vllm.server.VllmServeOptions`).
        load_checks: engine key → interpreter (None: its default) of each engine's own loader
            run on the drafter (``--vllm-load-check``, ``--sglang-load-check``: the engines'
            :class:`~specconv.engines.base.LoadCheck`); each payload is its own report key.
        chat: how prompts become token ids (``--chat-template``, ``--chat-template-kwargs``,
            ``--thinking``: :class:`specconv.prompts.ChatOptions`); every backend gets the ids.
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


#: options the report's ``options`` leaves out: a load check is its own result (``vllm_load``),
#: a compared runtime is listed as its CLI flag (``runtime_flags``), the engines' options flat, each
#: engine's serving options redacted under its report key
_OWN_RESULT_OPTIONS = ("load_checks", "runtime", "runtime_path", "engine_options", "serve")


def _source_options(drafter_dir: Path):
    """ConvertOptions recorded in the drafter's ``specconv.json`` ``conversion`` section
    (so the source converts the same way); path options are relative to the drafter dir."""
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


def prepare_source(source: str, verifier: "Verifier", drafter_dir: Path, workdir: Path) -> dict:
    """Make the ``--source`` checkpoint loadable in the harness.

    A Speculators directory is used as is, unless the drafter's conversion recorded options
    that decide a value of its config (``--sample-from-anchor``, ``--sliding-window-non-causal``,
    ``--mask-token-id``, ...: :meth:`ConvertOptions.decides_reading`): read as is, it would be
    read otherwise. Anything else, and such a directory, is converted afresh with the converter
    registry (the options recorded in the drafter's ``specconv.json``) into ``workdir``,
    against the run's own resolved ``verifier``; a z-lab DFlash source additionally gets
    z-lab's own reference forward.

    Returns:
        ``{"kind", "format", "path" (source dir), "converted" (Speculators dir)}``.
    """
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
    """``--source`` must be the checkpoint ``drafter_dir`` was converted from: the sha256 of
    every source file recorded in its ``specconv.json`` (``conversion.source.files``) must
    equal the source's now, else G2 and G3 would compare the drafter with other weights.

    Args:
        drafter_dir: the drafter under validation.
        source: :func:`prepare_source`'s result (a fresh conversion records the source's
            hashes; a Speculators dir used as it is gets the recorded files hashed).

    Returns:
        ``{"matches_record": True, "files": n}``, or ``{"matches_record": None, "why": ...}``
        when the drafter records no source hashes (nothing to compare with).

    Raises:
        InvalidInputError: ``source_changed`` (exit 3), naming each differing file with the
            recorded and the current sha256.
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
            hint="pass the checkpoint the drafter was converted from, or convert this source again and validate that output",
        )
    return {"matches_record": True, "files": len(recorded)}


def _source_hashes(source: dict, recorded: dict[str, str]) -> dict[str, str]:
    """sha256 of the source's files now: from the fresh conversion's record, or (a
    Speculators dir used as it is) of the recorded file names that exist in it."""
    from ..record import read_record
    from ..tensors import sha256_file

    if source["kind"] == "converted":
        conv = read_record(source["converted"]).conversion
        return dict(conv.source.files) if conv is not None else {}
    d = Path(source["path"])
    return {n: sha256_file(d / n) for n in recorded if (d / n).is_file()}


def _gate_map(results: list[GateResult]) -> dict[str, bool]:
    return {g.name: bool(g.passed) for g in results if g.passed is not None}


def _finish(report: dict, results: list[GateResult]) -> "ValidationReport":
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
    verifier: "str | Verifier",
    options: ValidateOptions | None = None,
    *,
    report_dir: str | Path | None = None,
    progress: Progress | None = None,
) -> "ValidationReport":
    """Validate a Speculators drafter dir against ``verifier`` and finish the stage: the report
    files, the ``validation`` section of ``DIR/specconv.json``
    (:func:`specconv.validate.report.finish_report`) and ``DIR/README.md``.

    ``config.json`` is parsed once and the verifier resolved once; both are handed to every
    step (the ``--source`` conversion, G1, the drafter loader). A failed gate does not raise:
    ``report.passed`` is false and ``report.gate_failure()`` is the exit-4 error.

    Args:
        drafter_dir: the converted drafter. verifier: local dir or Hub id, or a resolved ``Verifier``.
        options: :class:`ValidateOptions`. progress: ``progress(phase, done, total)``.
        report_dir: where ``validation.json/.md/.png`` go [``./specconv-validation/<DIR name>``].

    Returns: :class:`~specconv.results.ValidationReport` (``gates``, ``passed``, ``report_files``).

    Raises:
        InvalidInputError: not a Speculators dir (``not_speculators_dir``), unreadable
            inputs, models that do not fit, bad prompt sets, no vLLM interpreter.
        UsageError: inconsistent options.
    """
    opts = options or ValidateOptions()
    d = Path(drafter_dir)
    config, config_error = _read_config(d)
    _preflight(opts, d, getattr(verifier, "spec", verifier))
    _check_inputs(d, opts)
    v = _resolved(verifier)  # a local path made absolute: the loader checks run in other working directories
    run = ValidationRun(drafter_dir=d, verifier=v, verifier_spec=v.model_ref, config=config, options=opts,
                        progress=progress or (lambda *_: None))
    report = _run_gates(run, config_error)
    _load_check_step(report, run)
    from .report import finish_report

    finish_report(report, d, Path(report_dir) if report_dir else Path.cwd() / "specconv-validation" / d.resolve().name)
    return report


def _run_gates(run: ValidationRun, config_error: InvalidInputError | None) -> "ValidationReport":
    """Start the report, then [the source] → G1 → prompts → the backend's gates."""
    run.report.update(_start_report(run))
    with tempfile.TemporaryDirectory(prefix="specconv-validate-") as tmp:
        _source_step(run, Path(tmp))
        if _structure_step(run, config_error):
            _prompts_step(run)
            _render_step(run)
            get_backend(run.options.backend).run(run)
    return _finish(run.report, run.results)


def _resolved(verifier: "str | Verifier") -> "Verifier":
    from ..verifier import Verifier, resolve_verifier

    return verifier if isinstance(verifier, Verifier) else resolve_verifier(verifier)


def _read_config(d: Path) -> "tuple[SpeculatorsDraftConfig | None, InvalidInputError | None]":
    """The drafter's ``config.json``, read once: ``(typed config, None)``, or ``(None, the
    error)`` when it is a Speculators config with an invalid value (G1 reports it, exit 4).

    Raises:
        InvalidInputError: ``not_speculators_dir`` (exit 3, nothing written): no readable
            ``config.json``, or one without ``speculators_model_type``; ``broken_hub_cache`` /
            ``dangling_link``: links to nothing (:func:`specconv.fileio.check_no_dangling_links`).
        UnsupportedFormatError: a Speculators dir specconv does not describe (exit 3, nothing
            written): :func:`_refuse_unsupported`.
    """
    from ..errors import SpecconvError
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
    """Refuse a Speculators dir the converter registry refuses by name (exit 3, before anything
    is written): a ``speculators_model_type`` no description in :mod:`specconv.format.algorithms`
    names (``speculators_other``), or quantized weights (``quantized_drafter``). The registry's
    own detection decides, so a type gains validation when its description is added.

    Raises:
        UnsupportedFormatError: naming the format, the type and the registry's reason.
    """
    from ..converters import SourceInfo, detect
    from ..errors import UnsupportedFormatError

    cls = detect(SourceInfo.open(d))
    if cls is not None and not cls.supported:
        raise UnsupportedFormatError(
            f"{d}: {cls.title} ({cls.format_id}, speculators_model_type {model_type!r}): {cls.refusal}",
            format_id=cls.format_id)


def _preflight(opts: ValidateOptions, d: Path, verifier_spec: str) -> None:
    """Refusals (exit 3) before any model is loaded: each load check's (no interpreter, a drafter
    the engine would serve wrongly), the backend's own (``--backend llamacpp``: ``preflight``;
    ``--temperature`` > 0 is exit 2) (a runtime's refusals are
    :func:`specconv.validate.runtimes.check_runtime`'s, in ``_check_inputs``)."""
    from ..engines import engines

    for e in engines():
        if e.load_check is not None and e.key in opts.load_checks:
            e.load_check.refuse(d, verifier_spec, opts.load_checks[e.key])
    backend = get_backend(opts.backend)
    if hasattr(backend, "preflight"):  # --backend llamacpp: DIR/gguf, llama-server, a verifier GGUF
        backend.preflight(d, opts)


def _load_check_step(report: "ValidationReport", run: ValidationRun) -> None:
    """Each engine's own loader asked for, in its own interpreter, in registry order; its payload
    becomes the report's ``report_key``; a failed load fails the exit status, and ``passed`` too
    when the check ``gates_validation``."""
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
    from ..extras import require
    from .runtimes import check_one_runtime, check_runtime, get_runtime
    from .verifier_runner import torch_dtype
    from ..engines import with_capability

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
    for e in with_capability("serve"):  # exit 2 before anything starts (--vllm-python: the CLI)
        e.serve.check_options(opts.backend, opts.serve.get(e.key))
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
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
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


def _structure_step(run: ValidationRun, config_error: "InvalidInputError | None") -> bool:
    """G1 (``config_error``: why ``config.json`` did not parse); on failure the other gates
    are recorded as skipped. Returns whether it passed."""
    from .gates import gate_structure

    run.progress("structure", 0, 1)
    if config_error is not None:
        g1 = GateResult(name="structure", passed=False, errors=[f"cannot read {run.drafter_dir}: {config_error.message}"])
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
    """sha256 of the rendered prompts (``[[id, [token ids]], …]`` as compact JSON): two runs with
    the same digest gave their engines the same token ids."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps([[pid, list(ids)] for pid, ids in rendered], separators=(",", ":")).encode()).hexdigest()


def _render_step(run: ValidationRun) -> None:
    """Render every prompt once with the verifier's tokenizer (:func:`specconv.prompts.chat_renderer`):
    every backend gets these token ids; the template's facts go into the report."""
    from ..prompts import chat_renderer

    run.progress("rendering prompts", 0, 1)
    renderer = chat_renderer(_tokenizer(run.verifier), run.options.chat)
    run.rendered = renderer.render_all(run.prompts)
    run.chat = renderer.facts
    run.report["chat_template"] = renderer.facts.as_dict()
    run.report["prompts"].update(token_counts=[len(ids) for _, ids in run.rendered],
                                 rendered_sha256=rendered_digest(run.rendered))


def _tokenizer(verifier: "Verifier") -> Any:
    """The verifier's tokenizer (transformers; a Hub id from the local cache, as the torch runner loads it).

    Raises:
        InvalidInputError: ``verifier_tokenizer`` — no loadable tokenizer there.
    """
    from transformers import AutoTokenizer

    where = str(verifier.hub_id or verifier.local_dir)
    try:
        return AutoTokenizer.from_pretrained(where, local_files_only=True)
    except (OSError, ValueError) as e:
        raise InvalidInputError(f"the verifier {where} has no loadable tokenizer ({e}): prompts cannot be rendered",
                                code="verifier_tokenizer") from e
