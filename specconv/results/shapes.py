"""The shapes of the JSON objects nested in the results and in ``specconv.json``.

Each is a ``TypedDict``: at run time the value stays the plain dict its producer built (a result is
made with ``model_construct``, so nothing is converted on the command's path), the type checker
reads its keys, and ``Model.model_validate`` checks them (the tests do; ``specconv.record`` on every
read). Every shape keeps keys it does not name (``extra="allow"``), so what is printed or written
is exactly what the producer put there. ``total=False``: a key a producer may leave out.
``dict[str, Any]`` is left only where the value really is open (named so at each use).
"""

from __future__ import annotations

from typing import (
    Any,
    Literal,
    NotRequired,  # pydantic needs typing_extensions' TypedDict before Python 3.12
)

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict

_OPEN = ConfigDict(extra="allow")

#: a finding's level (``specconv.format.findings.Level``; ``results`` imports no other room)
Level = Literal["error", "warning", "info"]


@with_config(_OPEN)
class Finding(TypedDict):
    """A converter, lint or serving finding (``specconv.format.findings.Finding.to_dict``)."""

    level: Level
    code: str
    message: str
    key: str | None


@with_config(_OPEN)
class LayerIds(TypedDict):
    """How the aux hidden-state layer ids were obtained (``specconv.plan.LayerIdConversion``)."""

    source_key: str | None
    source_convention: str
    source_ids: list[int] | None
    speculators_ids: list[int]
    rule: str


@with_config(_OPEN)
class DroppedTensor(TypedDict):
    """A source tensor not carried over (``specconv.plan.DroppedTensor.to_dict``)."""

    name: str
    fate: str
    reason: str


@with_config(_OPEN)
class PlanSummary(TypedDict):
    """A conversion plan as the reports show it (``specconv.convert.summarize_plan``)."""

    casts: dict[str, int]
    format: str
    algorithm: str
    #: the target ``config.json`` (typed per algorithm by ``specconv.format.schema``, which this room may
    #: not import; its keys differ per algorithm and version)
    config: dict[str, Any]
    tensors: int
    fates: dict[str, int]
    dropped: list[DroppedTensor]
    layer_ids: LayerIds | None
    notes: list[str]
    bytes: int


@with_config(_OPEN)
class NonFinite(TypedDict):
    """A tensor holding NaN/Inf (``specconv.tensors.onepass.scan_report``)."""

    tensor: str
    dtype: str
    count: int
    numel: int
    first_index: list[int]


@with_config(_OPEN)
class GateResult(TypedDict):
    """One gate's outcome (``specconv.validate.gates.GateResult.to_dict``)."""

    name: str
    passed: bool | None
    status: Literal["passed", "failed", "skipped"]
    errors: list[str]
    warnings: list[str]
    #: each gate's own measurements (docs/validate.md: one set of keys per gate and backend)
    details: dict[str, Any]
    skipped_reason: str | None


@with_config(_OPEN)
class PerRequest(TypedDict, total=False):
    """One request's counts (``specconv.validate.metrics``)."""

    prompt_id: str
    num_drafts: int
    output_tokens: int
    stopped: bool
    tau: float | None


@with_config(_OPEN)
class AcceptanceMetrics(TypedDict, total=False):
    """Acceptance counters and τ of one drafter's run (``specconv.validate.metrics``; ``source_metrics``)."""

    acceptance_length: float | None
    acceptance_rate: float | None
    acceptance_at_pos: list[float]
    conditional_acceptance_at_pos: list[float]
    convention: str
    k: int
    n_requests: int
    n_output_tokens: int
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    histogram: list[int]
    per_request: list[PerRequest]
    tau_pooled: float | None
    tau_request_mean: float | None
    tau_ci95: list[float] | None
    tau_ci95_half_width: float | None
    draft_ms: float | None
    verify_ms: float | None
    ttft_ms: float | None
    tpot_ms: float | None
    tpot_ar_ms: float | None
    speedup: float | None


@with_config(_OPEN)
class Lossless(TypedDict):
    """G4 in brief (``validate.torch_backend``): exact-match rate, requests, first divergence and
    whether it was a near-tie, per divergent request."""

    exact_match: float | None
    n: int | None
    first_div: list[int | None]
    near_tie: list[bool]


@with_config(_OPEN)
class Device(TypedDict, total=False):
    """Where a validation ran (``specconv.validate.report.device_info``; a served run: the engine)."""

    device: str
    torch: str
    cpu: str
    cpu_count: int | None
    gpu_name: str
    compute_capability: str
    gpu_memory_total_bytes: int
    gpu_memory_free_bytes_at_start: int
    gpu_count: int
    cuda_version: str | None
    cudnn_version: int | None
    driver_version: str | None
    vllm_python: str | None


@with_config(_OPEN)
class Prompts(TypedDict, total=False):
    """The prompts a validation ran (``specconv.validate.run``: selected, then rendered)."""

    set: str
    n: int
    ids: list[str]
    selection: str
    token_counts: list[int]
    rendered_sha256: str


@with_config(_OPEN)
class ChatTemplate(TypedDict):
    """How the prompts were rendered (``specconv.prompts.TemplateFacts.as_dict``)."""

    source: str
    path: str | None
    sha256: str | None
    #: the ``--chat-template-kwargs`` object: whatever variables the template reads
    kwargs: dict[str, Any]
    thinking: str | None
    thinking_option: str
    add_generation_prompt: bool | None


@with_config(_OPEN)
class LoadForms(TypedDict, total=False):
    """Which ``vllm serve`` forms loaded the drafter (``specconv.engines.vllm.check.record_payload``)."""

    long: bool
    short: bool | None
    short_skipped: str | None


@with_config(_OPEN)
class VllmLoad(TypedDict, total=False):
    """vLLM's own loader on the drafter (``specconv.engines.vllm.check.record_payload``)."""

    ok: bool
    distribution: str | None
    version: str | None
    torch: str | None
    transformers: str | None
    stubs: list[str]
    patches: list[str]
    model_class: str | None
    #: vLLM's ``speculative_config`` as its runner built it (vLLM's own keys)
    speculative_config: dict[str, Any] | None
    resolved: dict[str, Any]
    forms: LoadForms
    errors: list[str]
    warnings: list[str]
    missing: list[str]
    shared: list[str]


@with_config(_OPEN)
class VllmServe(TypedDict, total=False):
    """The vLLM server that served ``--backend vllm`` (``specconv.engines.vllm.serve.serve_summary``
    plus ``serving_facts`` and the served-engine checks)."""

    distribution: str | None
    version: str | None
    tau: float | None
    mode: str
    tensor_parallel_size: int | None
    pipeline_parallel_size: int | None
    data_parallel_size: int | None
    executor_backend: str | None
    engine_args: list[str] | None
    concurrency: int
    other_traffic: dict[str, float] | None
    url: str | None
    runner: str
    draft_sample_method: str | None
    rejection_sample_method: str | None
    prompt_tokens: str | None
    #: the server's launch facts (argv, log, versions: ``specconv.engines.vllm.server``)
    server: dict[str, Any]


@with_config(_OPEN)
class SglangResolved(TypedDict, total=False):
    """What SGLang resolved from an export (``expected``: what it must resolve)."""

    architecture: str | None
    block_size: int
    block_size_in_config: int | None
    block_slots: int
    capture_layer_inputs: list[int]
    captured_layer_ids: list[int]
    draft_rows: list[int]
    drafts_per_block: int
    layer_causal: list[bool]
    mask_token: str | None
    mask_token_id: int | None
    num_target_layers: int
    sample_from_anchor: bool
    sliding_window_left: list[int]
    verifier_layers: int
    markov_rank: int | None
    markov_head_type: str | None
    confidence_head: bool
    gamma: int
    target_layer_ids: list[int] | None


#: ``class`` is a keyword: this part of :class:`SglangLoad` is spelt functionally
_SglangClass = TypedDict("_SglangClass", {"class": str | None}, total=False)


@with_config(_OPEN)
class SglangLoad(_SglangClass, total=False):
    """SGLang's strict load of an export (``specconv.engines.sglang.check.judge``)."""

    ok: bool
    distribution: str | None
    version: str | None
    torch: str | None
    transformers: str | None
    python: str | None
    stubs: list[str]
    env: dict[str, str]
    resolved: SglangResolved
    mismatches: list[str]
    errors: list[str]
    files: dict[str, str]
    unfilled_params: list[str]
    unconsumed_tensors: list[str]
    target_supplied_skipped: list[str]
    checkpoint_tensors: int
    #: SGLang's serve arguments as its runner read them (SGLang's own keys)
    serve_args: dict[str, Any]


@with_config(_OPEN)
class ConverterRow(TypedDict):
    """One source format (``specconv.converters.base.Converter.describe``)."""

    format: str
    algorithm: str
    title: str
    supported: bool
    detection: str
    mapping: str | None
    spec_ref: str | None


@with_config(_OPEN)
class ParityTolerance(TypedDict, total=False):
    """What a parity check allowed (``specconv.engines.onnx.parity``): ``max_abs`` (None: no bound),
    the near-tie margin, and the top-1 rule in words (``100%`` / ``100% outside near-ties``)."""

    max_abs: float | None
    near_tie_margin: float
    top1: str


@with_config(_OPEN)
class ParityCheck(TypedDict, total=False):
    """One graph's ONNX Runtime parity check (``specconv.engines.onnx.parity``), or ``{skipped}``."""

    passed: bool | None
    runtime: str
    dtype: str
    top1: float
    max_abs: float
    tolerance: ParityTolerance
    #: one entry per checked shape (``shape``, ``n``, ``top1``, ``max_abs`` per output, mismatches)
    cases: list[dict[str, Any]]
    skipped: str


@with_config(_OPEN)
class PushFile(TypedDict):
    """One file of a push plan (``specconv.publish.push.plan``)."""

    path: str
    size: int
    sha256: str
    action: Literal["add", "update", "unchanged", "delete"]


@with_config(_OPEN)
class ReleaseStep(TypedDict, total=False):
    """One step of a release (``specconv.publish.release._step``)."""

    step: str
    status: str
    exit_code: int
    duration_s: float
    error: str
    message: str
    hint: str
    reason: str


@with_config(_OPEN)
class ReleaseConvert(TypedDict):
    """Release's ``convert`` step (``specconv.publish.release._convert``)."""

    format: str
    algorithm: str
    files: list[str]


@with_config(_OPEN)
class EngineVerdictRow(TypedDict, total=False):
    """One engine's row of the record (``specconv.record.EngineSummary``, ``None`` fields left out)."""

    engine: str
    version: str
    runner: str
    tau: float
    tau_ci: list[float]
    verdict: Literal["agrees", "departs", "inconclusive"]
    position: int
    direction: str
    cause: str


@with_config(_OPEN)
class ReleaseValidate(TypedDict):
    """Release's ``validate`` step (``specconv.publish.release._validate``; its ``compare`` step adds
    ``engines``, the record's rows)."""

    acceptance_length: float | None
    tau_ci95: list[float] | None
    gates: dict[str, bool] | None
    parity_kl_max: float | None
    engines: NotRequired[list[EngineVerdictRow]]


@with_config(_OPEN)
class ReleaseExport(TypedDict, total=False):
    """Release's ONNX step (``specconv.engines.onnx.reuse.export_step``)."""

    reused: bool
    contains_verifier_weights: bool
    parity_passed: bool | None
    reuse_refused: str
    skipped: str


@with_config(_OPEN)
class ReleaseEngine(TypedDict, total=False):
    """Release's TensorRT step (``specconv.engines.tensorrt.release.engine_step``)."""

    path: str | None
    skipped: str


@with_config(_OPEN)
class ReleaseSglang(TypedDict, total=False):
    """Release's SGLang step (``specconv.engines.sglang.SglangExporter.release_step``)."""

    speculative_algorithm: str | None
    architecture: str | None
    files: dict[str, str]
    env: dict[str, str] | None
    #: the check in brief: ``ok``, ``distribution``, ``version``, ``class``
    check: SglangLoad
    skipped: str


@with_config(_OPEN)
class VerifierGguf(TypedDict, total=False):
    """The verifier GGUF a GGUF drafter was checked with (``specconv.engines.llamacpp``)."""

    name: str
    sha256: str
    quantisation: str | None
    repo: str | None


@with_config(_OPEN)
class GgufCheck(TypedDict, total=False):
    """llama-server's check of a GGUF drafter (``specconv.engines.llamacpp.check``), or ``{skipped}``;
    the record keeps it in brief (``llama_server`` for ``server``)."""

    passed: bool
    lossless: bool
    drafts_accepted: bool
    tau: float | None
    exact_match: float | None
    n: int
    n_predict: int
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    acceptance_at_pos: list[float] | None
    #: one per differing prompt (``prompt_id``, ``first_divergence``, ``margin``, ``near_tie``)
    divergences: list[dict[str, Any]]
    prompts: list[str]
    spec_type: str
    spec_draft_n_max: int
    #: the two llama-server runs (binary, commit, version, each run's argv, log, start-up time)
    server: dict[str, Any]
    llama_server: dict[str, Any]
    skipped: str


@with_config(_OPEN)
class ReleaseGguf(TypedDict, total=False):
    """Release's GGUF step (``specconv.engines.llamacpp.release.gguf_step``)."""

    file: str | None
    sha256: str | None
    spec_type: str | None
    spec_draft_n_max: int | None
    verifier_gguf: VerifierGguf | None
    check: GgufCheck
    skipped: str


@with_config(_OPEN)
class TensorFate(TypedDict, total=False):
    """What happened to one tensor (``specconv.plan.ConversionPlan.tensor_fates``): an output tensor's
    ``fate``, ``origin``, ``source``, ``shape``, ``dtype`` (``cast_from``, ``note``), or a dropped source
    tensor's ``name``, ``fate`` and ``reason``."""

    fate: str
    origin: str
    source: str | None
    shape: list[int]
    dtype: str
    cast_from: str
    note: str
    name: str
    reason: str


@with_config(_OPEN)
class EngineRow(TypedDict, total=False):
    """One engine against the reference (``specconv.validate.compare.EngineVerdict.as_dict`` plus the
    facts of ``specconv.validate.compare_run``): verdict, where and why it departs, its τ with the CI,
    per-position c_i and the intervals of Δc_i and Δτ, the version and runner that served it."""

    engine: str
    verdict: Literal["agrees", "departs", "inconclusive"]
    position: int | None
    direction: str | None
    cause: str | None
    tau: float
    tau_ci: list[float]
    c: list[float | None]
    delta_c: list[float | None]
    delta_c_ci: list[list[float] | None]
    delta_tau: float
    delta_tau_ci: list[float]
    judged: list[int]
    reason: str
    n_prompts: int
    num_drafts: int
    margins: dict[str, float]
    version: str | None
    runner: str | None
    lossless: bool
    lossless_reference: str
    token_agreement: float
    exact_match: float
    paired_prompts: list[str]
    counts_match_reported: bool
    #: a ``--server-url`` vLLM's tokens drafted per step, measured on the warm-up request
    draft_tokens_per_step: float


@with_config(_OPEN)
class EngineReference(TypedDict, total=False):
    """The reference of an engine comparison: specconv's loop, its τ (with the CI) and c_i."""

    engine: str
    tau: float | None
    tau_ci95: list[float] | None
    c: list[float] | None


@with_config(_OPEN)
class EngineComparison(TypedDict, total=False):
    """``validate --compare``'s report section (``specconv.validate.compare_run.compare_step``)."""

    reference: EngineReference
    rows: list[EngineRow]
    method: str
    notes: list[str]
    counts_file: str
