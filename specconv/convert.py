"""The conversion pipeline: resolve source → detect → plan → lint → write.

``inspect_source`` and ``convert`` are what the CLI calls; nothing here knows any source
format (that lives in ``converters/``), and nothing here writes outside the writer.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from .errors import InvalidInputError, UnsupportedFormatError, UsageError

log = logging.getLogger("specconv")

_INT = re.compile(r"\d+")
_EPOCH_STEP = re.compile(r"epoch_?(\d+)_step_?(\d+)")
_STEP = re.compile(r"(?:.*[-_])?step_?(\d+)")


def resolve_source(spec: str, *, subfolder: str | None = None, revision: str | None = None) -> Path:
    """A local dir, or a Hub id downloaded with only ``*.json``, safetensors, indexes, text and
    the named side files (vocab maps, ``eagle_meta.pt``, ``mask_embedding.pt``).

    Raises:
        InvalidInputError: neither an existing path nor a reachable Hub repo.
    """
    if not spec or not spec.strip():
        raise UsageError("SRC is empty: give a checkpoint directory or a Hub repo id")
    if subfolder is not None and (not subfolder or Path(subfolder).is_absolute() or ".." in Path(subfolder).parts):
        raise UsageError(f"--subfolder {subfolder!r} must be a relative path inside SRC (no '..', not absolute)")
    p = Path(spec).expanduser()
    if not p.exists():
        from .verifier import is_hub_id

        if not is_hub_id(spec):
            raise InvalidInputError(f"source {spec!r} does not exist (and is not a Hub repo id)", code="source_not_found")
        from huggingface_hub import snapshot_download

        # never pickled weights / training state; but the small side files converters read or
        # detect by name: vocab maps (d2t/t2d .npy/.pt), NeMo eagle_meta.pt, MiMo mask_embedding.pt
        patterns = ["*.json", "*.safetensors", "*.txt", "*.md", "*.npy", "*d2t.pt", "*t2d.pt",
                    "*eagle_meta.pt", "*mask_embedding.pt"]
        if subfolder:
            patterns = [f"{subfolder}/{x}" for x in patterns]
        try:
            p = Path(snapshot_download(spec, revision=revision, allow_patterns=patterns))
        except Exception as e:
            from .verifier import hub_error

            what = f"{subfolder}/ (config, safetensors)" if subfolder else "the checkpoint (config, safetensors)"
            err = hub_error(what, spec, e, code="source_not_found")
            err.message = "source: " + err.message
            raise err from e
    if subfolder:
        p = p / subfolder
        if not p.is_dir():
            raise InvalidInputError(f"--subfolder {subfolder!r} does not exist in {spec}", code="source_not_found")
    if p.is_file():
        p = p.parent
    return p


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
            raise InvalidInputError(f"--checkpoint {choice!r} not found in {path} (have: {', '.join(sorted(kids)) or 'nothing'})")
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


def open_source(spec: str, *, subfolder: str | None = None, checkpoint: str | None = None, revision: str | None = None):
    """Resolve and open a source; returns ``(SourceInfo, selection note)``."""
    from specconv.converters import SourceInfo

    path = resolve_source(spec, subfolder=subfolder, revision=revision)
    path, note = select_checkpoint(path, checkpoint)
    return SourceInfo.open(path), note


def detect(src) -> Any:
    """The matching converter class, or raise UnsupportedFormatError listing what was seen."""
    from specconv.converters import detect as _detect

    cls = _detect(src)
    if cls is None:
        seen = []
        if src.config is None:
            seen.append("no config.json")
        else:
            seen.append(f"architectures={src.architectures}")
            if src.cfg("model_type"):
                seen.append(f"model_type={src.cfg('model_type')!r}")
            keys = sorted(k for k in src.config if k in ("dflash_config", "speculators_model_type", "eagle_config", "draft_vocab_size"))
            if keys:
                seen.append("keys " + ", ".join(keys))
        seen.append(f"{len(src.tensor_names())} tensors")
        raise UnsupportedFormatError(
            f"{src.path}: not a known P-EAGLE / DFlash / DSpark checkpoint ({'; '.join(seen)}). "
            "Run `specconv formats` for the supported sources.",
            format_id="unknown",
        )
    return cls


def inspect_source(spec: str, *, verifier: str | None = None, verifier_name: str | None = None, **kw: Any) -> dict[str, Any]:
    """Detect a source (headers only) and, for Speculators dirs, lint it.

    Returns a dict with ``format`` (registry id), ``algorithm``, ``supported``, ``reason``,
    ``findings`` (lint), plus ``path``, ``title`` and, with a verifier, the dry-run plan.
    """
    from .speculators import lint_dir

    src, note = open_source(spec, subfolder=kw.get("subfolder"), checkpoint=kw.get("checkpoint"), revision=kw.get("revision"))
    out: dict[str, Any] = {"path": str(src.path), "selected": note, "findings": []}
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

        v = resolve_verifier(verifier, name=verifier_name)
    if cls.format_id.startswith("speculators") and cls.supported:
        out["findings"] = [f.to_dict() for f in lint_dir(src.path, v.facts() if v else None)]
    if cls.supported and v is not None:
        from specconv.converters import ConvertOptions

        try:
            plan = cls().plan(src, v, kw.get("options") or ConvertOptions())
            out["plan"] = summarize_plan(plan)
            out["findings"] += [f.to_dict() for f in plan.findings]
        except UnsupportedFormatError as e:
            out.update(supported=False, reason=e.message)
        except InvalidInputError as e:
            out.update(supported=False, reason=e.message)
    return out


def summarize_plan(plan) -> dict[str, Any]:
    from collections import Counter

    from .speculators import config_to_dict

    fates = Counter(t.fate for t in plan.tensors)
    casts = Counter(f"{t.src_dtype}->{t.dtype}" for t in plan.tensors if t.cast)
    return {
        "casts": dict(sorted(casts.items())),
        "format": plan.format_id,
        "algorithm": plan.algorithm,
        "config": config_to_dict(plan.config),
        "tensors": len(plan.tensors),
        "fates": dict(sorted(fates.items())),
        "dropped": [d.to_dict() for d in plan.dropped],
        "layer_ids": plan.layer_ids.to_dict() if plan.layer_ids else None,
        "notes": plan.notes,
        "bytes": sum(_nbytes(t) for t in plan.tensors),
    }


def _nbytes(t) -> int:
    from .tensors import DTYPE_SIZES

    n = DTYPE_SIZES.get(t.dtype, 1)
    for s in t.shape:
        n *= s
    return n


def convert(
    source: str,
    *,
    verifier: str,
    output: Path | None,
    options: Any = None,
    verifier_name: str | None = None,
    subfolder: str | None = None,
    revision: str | None = None,
    max_shard_size: int | None = None,
    overwrite: bool = False,
    dry_run: bool = False,
    allow_nonfinite: bool = False,
) -> dict[str, Any]:
    """Convert ``source`` to a Speculators dir at ``output``.

    Returns the report dict: ``format``, ``algorithm``, ``output``, ``findings`` (lint +
    converter), ``plan`` summary, ``dry_run``. Lint errors fail the conversion.

    Raises:
        UnsupportedFormatError: refused or unknown source (exit 3).
        InvalidInputError: inconsistent checkpoint / flags (exit 3).
    """
    from specconv.converters import ConvertOptions

    from .speculators import lint
    from .verifier import resolve_verifier

    opts = options or ConvertOptions()
    src, note = open_source(source, subfolder=subfolder, checkpoint=opts.checkpoint, revision=revision)
    cls = detect(src)
    # formats whose algorithm is only known after reading (e.g. "dflash|dspark|peagle")
    # check --algorithm in their own plan
    if opts.algorithm and "|" not in cls.algorithm and cls.algorithm != opts.algorithm:
        raise InvalidInputError(
            f"--algorithm {opts.algorithm} given but {src.path} is {cls.title} ({cls.format_id}, algorithm {cls.algorithm})",
            code="algorithm_mismatch",
        )
    if not cls.supported:
        raise UnsupportedFormatError(f"{cls.title} ({cls.format_id}) is not supported: {cls.refusal}", format_id=cls.format_id)
    v = resolve_verifier(verifier, name=verifier_name, revision=None)
    log.info("detected %s (%s); verifier %s", cls.format_id, cls.algorithm, v.name_or_path)
    plan = cls().plan(src, v, opts)
    if note:
        plan.notes.insert(0, f"selected {note}")
    tensors = {t.out: (tuple(t.shape), t.dtype) for t in plan.tensors}
    lint_findings = lint(plan.config, tensors, v.facts())
    plan.findings = _dedupe(plan.findings + lint_findings)
    report: dict[str, Any] = {
        "format": plan.format_id,
        "algorithm": plan.algorithm,
        "source": str(src.path),
        "output": str(output) if output else None,
        "dry_run": dry_run,
        "plan": summarize_plan(plan),
        "findings": [f.to_dict() for f in plan.findings],
    }
    errors = [f for f in plan.findings if f.level == "error"]
    if errors:
        from .errors import InvalidInputError as _E

        raise _E(
            "the converted drafter would not be servable: " + "; ".join(f"[{f.code}] {f.message}" for f in errors),
            code="lint_failed",
        )
    if dry_run:
        if output is not None and Path(output).exists() and not overwrite:
            report["findings"].append({"level": "warning", "code": "output-exists", "key": None,
                                       "message": f"output {output} exists: the real run needs --overwrite"})
        return report
    if output is None:
        raise UsageError("-o/--output is required unless --dry-run")
    record = write_plan(plan, Path(output), source_store=src.store, verifier=v, max_shard_size=max_shard_size, overwrite=overwrite,
                        allow_nonfinite=allow_nonfinite)
    report["files"] = record["output_files"]
    report["findings"] = [f.to_dict() for f in plan.findings]  # + findings of the write (e.g. nonfinite-weights)
    return report


def write_plan(*a: Any, **kw: Any) -> dict[str, Any]:
    from .writer import write_plan as _w

    return _w(*a, **kw)


def _dedupe(findings: list) -> list:
    seen, out = set(), []
    for f in findings:
        key = (f.level, f.code, f.message)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out
