"""The conversion pipeline: resolve source → detect → plan → lint → write (docs/architecture.md,
"One conversion")."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InvalidInputError, UnsupportedFormatError, UsageError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from specconv.converters import Converter, ConvertOptions, SourceInfo

    from .outdir import OutputKind
    from .plan import ConversionPlan
    from .results import ConversionResult, InspectResult
    from .verifier import Verifier

log = logging.getLogger("specconv")

_INT = re.compile(r"\d+")
_EPOCH_STEP = re.compile(r"epoch_?(\d+)_step_?(\d+)")
_STEP = re.compile(r"(?:.*[-_])?step_?(\d+)")


def resolve_source(spec: str, *, subfolder: str | None = None, revision: str | None = None,
                   headers_only: bool = False, endpoint: str | None = None) -> Path:
    """A local dir, or a Hub id's snapshot of config, safetensors, text and the named side files
    (``headers_only`` while online: :func:`specconv.hub.header_snapshot`, for detection only).

    Raises:
        UsageError: empty ``spec``, bad ``--subfolder``. InvalidInputError: neither an existing
            path nor a reachable Hub repo; the Hub's errors (:mod:`specconv.hub`).
    """
    if not spec or not spec.strip():
        raise UsageError("SRC is empty: give a checkpoint directory or a Hub repo id")
    if subfolder is not None and (not subfolder or Path(subfolder).is_absolute() or ".." in Path(subfolder).parts):
        raise UsageError(f"--subfolder {subfolder!r} must be a relative path inside SRC (no '..', not absolute)")
    p = Path(spec).expanduser()
    if not p.exists():
        p = _hub_source(spec, subfolder, revision, headers_only, endpoint)
    if subfolder:
        p = p / subfolder
        if not p.is_dir():
            raise InvalidInputError(f"--subfolder {subfolder!r} does not exist in {spec}", code="source_not_found")
    if p.is_file():
        p = p.parent
    return p


def _hub_source(spec: str, subfolder: str | None, revision: str | None, headers_only: bool,
                endpoint: str | None) -> Path:
    """The Hub snapshot (or headers-only view) of ``spec`` for :func:`resolve_source`."""
    from . import hub

    if not hub.is_hub_id(spec):
        raise InvalidInputError(f"source {spec!r} does not exist (and is not a Hub repo id)", code="source_not_found")
    # never pickled weights / training state; but the small side files converters read or
    # detect by name: vocab maps (d2t/t2d .npy/.pt), NeMo eagle_meta.pt, MiMo mask_embedding.pt
    patterns = ["*.json", "*.safetensors", "*.txt", "*.md", "*.npy", "*d2t.pt", "*t2d.pt",
                "*eagle_meta.pt", "*mask_embedding.pt"]
    if subfolder:
        patterns = [f"{subfolder}/{x}" for x in patterns]
    wanted = hub.Wanted(f"{subfolder}/ (config, safetensors)" if subfolder else "the checkpoint (config, safetensors)",
                        code="source_not_found", role="source",
                        hint=None if "/" in spec else f"no local path {spec!r} exists either")
    fetch = hub.header_snapshot if headers_only and not hub.is_offline() else hub.download_snapshot
    return fetch(spec, revision=revision, allow_patterns=patterns, endpoint_url=endpoint, wanted=wanted)


def select_checkpoint(path: Path, choice: str | None = None) -> tuple[Path, str | None]:
    """Pick the checkpoint dir inside a trainer's save dir.

    A dir with ``config.json`` (or a SpecForge ``training_state.pt``) is used as is.
    Otherwise children are considered: ``checkpoint_best`` (symlink) when ``choice`` is
    ``best`` or unset, else the latest integer epoch dir (speculators), ``epoch_E_step_S``
    (SpecForge legacy / NeMo), ``step_N`` / ``*-stepN`` (DeepSpec / SpecForge).
    ``interrupted/`` is only used when named. ``choice`` may also be a child name.

    Returns:
        (dir, note) — note says what was picked and why (``None`` when nothing was picked).
    """
    path = _descend(path)
    if (path / "config.json").is_file() or (path / "training_state.pt").is_file():
        if choice and choice not in ("best", "latest"):
            raise UsageError(f"--checkpoint {choice!r} given but {path} is itself a checkpoint dir")
        return path, None
    kids = {c.name: c for c in path.iterdir() if c.is_dir()} if path.is_dir() else {}
    if choice and choice not in ("best", "latest"):
        if choice not in kids:
            raise InvalidInputError(f"--checkpoint {choice!r} not found in {path} (have: "
                                    f"{', '.join(sorted(kids)) or 'nothing'})")
        return _descend(kids[choice]), f"--checkpoint {choice}"
    if choice in (None, "best") and "checkpoint_best" in kids:
        target = kids["checkpoint_best"].resolve()
        return _descend(target), f"checkpoint_best → {target.name}"
    if choice == "best":
        raise InvalidInputError(f"--checkpoint best: {path} has no checkpoint_best")
    ranked: list[tuple[tuple[int, ...], str]] = []
    for name in kids:
        if name == "interrupted" or kids[name].is_symlink():
            continue
        if _INT.fullmatch(name):
            ranked.append(((int(name),), name))
        elif m := _EPOCH_STEP.fullmatch(name):
            ranked.append(((int(m.group(1)), int(m.group(2))), name))
        elif m := _STEP.fullmatch(name):
            ranked.append(((int(m.group(1)),), name))
    if not ranked:
        return path, None
    ranked.sort()
    best = ranked[-1][1]
    return _descend(kids[best]), f"latest checkpoint {best} (of {len(ranked)})"


def _descend(p: Path) -> Path:
    """NeMo keeps the HF dir under ``model/`` or ``model/consolidated/``."""
    for sub in ("model/consolidated", "model"):
        if (p / sub / "config.json").is_file() and not (p / "config.json").is_file():
            return p / sub
    return p


def open_source(spec: str, *, subfolder: str | None = None, checkpoint: str | None = None, revision: str | None = None,
                headers_only: bool = False, endpoint: str | None = None):
    """Resolve and open a source; returns ``(SourceInfo, selection note)``."""
    from specconv.converters import SourceInfo

    path = resolve_source(spec, subfolder=subfolder, revision=revision, headers_only=headers_only, endpoint=endpoint)
    path, note = select_checkpoint(path, checkpoint)
    return SourceInfo.open(path), note


def detect(src: SourceInfo) -> type[Converter]:
    """The matching converter class, or raise UnsupportedFormatError listing what was seen."""
    from specconv.converters import detect as _detect

    cls = _detect(src)
    if cls is None:
        from .format.algorithms import display_names

        seen = []
        if src.config is None:
            seen.append("no config.json")
        else:
            seen.append(f"architectures={src.architectures}")
            if src.cfg("model_type"):
                seen.append(f"model_type={src.cfg('model_type')!r}")
            keys = sorted(k for k in src.config
                          if k in ("dflash_config", "speculators_model_type", "eagle_config", "draft_vocab_size"))
            if keys:
                seen.append("keys " + ", ".join(keys))
        seen.append(f"{len(src.tensor_names())} tensors")
        raise UnsupportedFormatError(
            f"{src.path}: not a known {display_names()} checkpoint ({'; '.join(seen)}). "
            "Run `specconv formats` for the supported sources.",
            format_id="unknown",
        )
    return cls


def inspect_source(spec: str, *, verifier: str | None = None, verifier_name: str | None = None, scan: bool = False,
                   **kw: Any) -> InspectResult:
    """Detect a source (headers only), lint a Speculators dir; with a verifier dry-run the plan too,
    with ``scan`` report NaN/Inf. ``kw``: subfolder, checkpoint, revision, endpoint, options."""
    from .results import InspectResult

    result = InspectResult.of(_inspect(spec, verifier, verifier_name, kw))
    if scan:
        from .tensors import open_store
        from .tensors.onepass import scan_report

        result.nonfinite = scan_report(open_store(result.path))
    return result


def _inspect(spec: str, verifier: str | None, verifier_name: str | None, kw: dict[str, Any]) -> dict[str, Any]:
    from . import hub
    from .format import lint_dir

    before = hub.bytes_downloaded()
    # without a verifier nothing reads tensor data: a Hub source is read headers-only
    src, note = open_source(spec, subfolder=kw.get("subfolder"), checkpoint=kw.get("checkpoint"),
                            revision=kw.get("revision"),
                            headers_only=not verifier, endpoint=kw.get("endpoint"))
    out: dict[str, Any] = {"path": str(src.path), "selected": note, "findings": [],
                           "bytes_downloaded": hub.bytes_downloaded() - before}
    try:
        cls = detect(src)
    except UnsupportedFormatError as e:
        out.update(format=e.format_id or "unknown", algorithm=None, supported=False, reason=e.message, title=None)
        return out
    out.update(format=cls.format_id, algorithm=cls.algorithm, title=cls.title, supported=cls.supported,
               reason=cls.refusal or None)
    if cls.supported and src.has_weights():
        src.tensor_names()  # headers only; a corrupt / truncated / unsafe weight file is recorded
        if src._store_error is not None:
            out.update(supported=False, reason=getattr(src._store_error, "message", str(src._store_error)))
            return out
    v = None
    if verifier:
        from .verifier import resolve_verifier

        v = resolve_verifier(verifier, name=verifier_name, endpoint=kw.get("endpoint"))
    if cls.format_id.startswith("speculators") and cls.supported:
        out["findings"] = [f.to_dict() for f in lint_dir(src.path, v.facts() if v else None)]
    if cls.supported and v is not None:
        from specconv.converters import ConvertOptions

        try:
            plan = cls().plan(src, v, kw.get("options") or ConvertOptions())
            lint_plan(plan, v)  # the lint convert (and its --dry-run) runs: the same findings
            out["plan"] = summarize_plan(plan)
            out["findings"] = _dedupe(out["findings"] + [f.to_dict() for f in plan.findings])
        except InvalidInputError as e:  # UnsupportedFormatError included
            out.update(supported=False, reason=e.message)
    return out


def summarize_plan(plan: ConversionPlan) -> dict[str, Any]:
    """The plan as the conversion report shows it."""
    from collections import Counter

    from .format import config_to_dict

    fates = Counter(t.fate for t in plan.tensors)
    casts = Counter(f"{t.src_dtype}->{t.dtype}" for t in plan.tensors if t.cast)
    return {"casts": dict(sorted(casts.items())), "format": plan.format_id, "algorithm": plan.algorithm,
            "config": config_to_dict(plan.config), "tensors": len(plan.tensors), "fates": dict(sorted(fates.items())),
            "dropped": [d.to_dict() for d in plan.dropped],
            "layer_ids": plan.layer_ids.to_dict() if plan.layer_ids else None, "notes": plan.notes,
            "bytes": sum(_nbytes(t) for t in plan.tensors)}


def _nbytes(t) -> int:
    from .tensors import DTYPE_SIZES

    n = DTYPE_SIZES.get(t.dtype, 1)
    for s in t.shape:
        n *= s
    return n


def convert(source: str, *, verifier: str | Verifier, output: Path | None, options: ConvertOptions | None = None,
            verifier_name: str | None = None, subfolder: str | None = None, revision: str | None = None,
            max_shard_size: int | None = None, overwrite: bool = False, dry_run: bool = False,
            allow_nonfinite: bool = False, endpoint: str | None = None) -> ConversionResult:
    """Convert ``source`` to a Speculators dir at ``output``; ``verifier``: a local dir or Hub id, or a
    resolved :class:`~specconv.verifier.Verifier`. Raises UnsupportedFormatError, InvalidInputError
    (lint errors included): exit 3."""
    from specconv.converters import ConvertOptions

    from .results import ConversionResult

    opts = options or ConvertOptions()
    src, note = open_source(source, subfolder=subfolder, checkpoint=opts.checkpoint, revision=revision,
                            endpoint=endpoint)
    cls = _supported_converter(src, opts)
    v = _resolved_verifier(verifier, verifier_name, endpoint)
    log.info("detected %s (%s); verifier %s", cls.format_id, cls.algorithm, v.name_or_path)
    plan = _linted_plan(cls, src, v, opts, note)
    result = ConversionResult.of(dict(format=plan.format_id, algorithm=plan.algorithm, source=str(src.path),
                                      output=str(output) if output else None, dry_run=dry_run,
                                      plan=summarize_plan(plan), findings=[f.to_dict() for f in plan.findings]))
    if dry_run:
        return _dry_run_warning(result, output, overwrite)
    if output is None:
        raise UsageError("-o/--output is required unless --dry-run")
    ref = source_ref(source, src.path, subfolder=subfolder, revision=revision)
    record = write_plan(plan, Path(output), source_store=src.store, verifier=v, max_shard_size=max_shard_size,
                        overwrite=overwrite, source_ref=ref, allow_nonfinite=allow_nonfinite, card=_card(output))
    _written(result, record, plan, v)
    return result


def _resolved_verifier(verifier: str | Verifier, name: str | None, endpoint: str | None) -> Verifier:
    """``verifier`` as is when already resolved, else :func:`specconv.verifier.resolve_verifier`."""
    from .verifier import Verifier, resolve_verifier

    return verifier if isinstance(verifier, Verifier) else resolve_verifier(verifier, name=name, endpoint=endpoint)


def _card(output: Path):
    """The writer's card hook (jinja2 imported only when the card renders)."""
    from .engines.card import conversion_card

    return conversion_card(Path(output).name)


def output_kinds() -> Mapping[str, OutputKind]:
    """Every kind of output dir (:func:`specconv.engines.exportdir.output_kinds`), looked up lazily."""
    from .engines.exportdir import output_kinds as kinds

    return kinds()


def _dry_run_warning(result: ConversionResult, output: Path | None, overwrite: bool) -> ConversionResult:
    """A dry run's result, warned (``output-exists``) when the real run would need ``--overwrite``
    or refuse ``output`` even with it (:func:`specconv.outdir.check_replaceable`)."""
    if output is None or not (Path(output).exists() or Path(output).is_symlink()):
        return result
    from .outdir import check_replaceable

    try:
        check_replaceable(output, "conversion", output_kinds)
    except InvalidInputError as e:
        message = f"the real run would refuse it, with or without --overwrite: {e}"
    else:
        if overwrite:
            return result
        message = f"output {output} exists: the real run needs --overwrite"
    result.findings.append({"level": "warning", "code": "output-exists", "key": None, "message": message})
    return result


def _written(result: ConversionResult, record: Any, plan: ConversionPlan, v: Verifier) -> None:
    """Fill in what the write did: files, findings (+ the write's) and the verifier bytes read / needed."""
    from .writer import verifier_bytes_needed

    result.files = record.conversion.output_files
    result.findings = [f.to_dict() for f in plan.findings]
    result.verifier_bytes_read, result.verifier_bytes_needed = v.bytes_read, verifier_bytes_needed(plan)


def _supported_converter(src: SourceInfo, opts: ConvertOptions) -> type[Converter]:
    """The converter for ``src``; refused when unsupported or not the ``--algorithm`` asked for
    (``a|b`` algorithms check it in their own plan)."""
    cls = detect(src)
    if opts.algorithm and "|" not in cls.algorithm and cls.algorithm != opts.algorithm:
        raise InvalidInputError(
            f"--algorithm {opts.algorithm} given but {src.path} is {cls.title} ({cls.format_id}, "
            f"algorithm {cls.algorithm})",
            code="algorithm_mismatch",
        )
    if not cls.supported:
        raise UnsupportedFormatError(f"{cls.title} ({cls.format_id}) is not supported: {cls.refusal}",
                                     format_id=cls.format_id)
    return cls


def _linted_plan(cls: type[Converter], src: SourceInfo, v: Verifier, opts: ConvertOptions,
                 note: str | None) -> ConversionPlan:
    """Plan the conversion and lint the planned config + tensors; lint errors refuse it."""
    plan = cls().plan(src, v, opts)
    if note:
        plan.notes.insert(0, f"selected {note}")
    lint_plan(plan, v)
    errors = [f for f in plan.findings if f.level == "error"]
    if errors:
        from .format.findings import CONVERT_FLAGS

        flags = list(dict.fromkeys(CONVERT_FLAGS[f.code] for f in errors if f.code in CONVERT_FLAGS))
        raise InvalidInputError(
            "the converted drafter would not be servable: " + "; ".join(f"[{f.code}] {f.message}" for f in errors),
            code="lint_failed", hint=f"pass {'; '.join(flags)} (see the message)" if flags else None,
        )
    return plan


def lint_plan(plan: ConversionPlan, v: Verifier) -> None:
    """Add the lint of the planned config and tensors against the verifier's facts to ``plan.findings``
    (deduplicated): the one lint convert, its dry run and ``inspect --verifier`` run. Raises nothing."""
    from .format import lint

    tensors = {t.out: (tuple(t.shape), t.dtype) for t in plan.tensors}
    plan.findings = _dedupe(plan.findings + lint(plan.config, tensors, v.facts()))


def source_ref(spec: str, path: Path, *, subfolder: str | None, revision: str | None) -> dict[str, Any] | None:
    """How ``specconv.json`` names a Hub source (None: a local dir): Hub id, the snapshot's commit (its
    dir under ``snapshots/``), ``--subfolder`` and the checkpoint's path inside the snapshot."""
    if Path(spec).expanduser().exists():
        return None
    parts = Path(path).parts
    ref: dict[str, Any] = {"hub_id": spec, "revision": revision, "subfolder": subfolder}
    if "snapshots" in parts and parts.index("snapshots") + 1 < len(parts):
        i = parts.index("snapshots")
        ref["revision"] = parts[i + 1]
        ref["path"] = Path(*parts[i + 2:]).as_posix() if len(parts) > i + 2 else "."
    return ref


def write_plan(*a: Any, **kw: Any):
    """:func:`specconv.writer.write_plan` judging an existing output with :func:`output_kinds`."""
    from .writer import write_plan as _w

    kw.setdefault("kinds", output_kinds)
    return _w(*a, **kw)


def _dedupe(findings: list) -> list:
    """Findings (objects or dicts) in order, each (level, code, message) once."""
    seen, out = set(), []
    for f in findings:
        d = f if isinstance(f, dict) else {"level": f.level, "code": f.code, "message": f.message}
        key = (d["level"], d["code"], d["message"])
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out
