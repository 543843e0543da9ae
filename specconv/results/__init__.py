"""Typed results of the library stages, rendered by the CLI.

Every command's library function returns one of these models (each class names its
function); :func:`specconv.cli.common.render` prints it: ``--format json`` as
:meth:`StageResult.to_json` (the keys that were set, nothing added), ``--format human`` as
:meth:`StageResult.human`. Fields are read as attributes; an undeclared detail is kept as an
extra key and read with :meth:`StageResult.extra`. A stage builds its result with
:meth:`StageResult.of` (``model_construct``) and prints it with :func:`plain`, so no schema is
built on ``specconv convert``'s path; ``Model.model_validate(result.to_dict())`` checks types.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..errors import EXIT_GATE_FAILED, EXIT_INVALID_INPUT, EXIT_WOULD_CHANGE, GateFailedError
from .shapes import (
    AcceptanceMetrics,
    ChatTemplate,
    ConverterRow,
    Device,
    EngineComparison,
    Finding,
    GateResult,
    GgufCheck,
    LayerIds,
    Lossless,
    NonFinite,
    ParityCheck,
    PlanSummary,
    Prompts,
    PushFile,
    ReleaseConvert,
    ReleaseEngine,
    ReleaseExport,
    ReleaseGguf,
    ReleaseSglang,
    ReleaseStep,
    ReleaseValidate,
    SglangLoad,
    SglangResolved,
    VerifierGguf,
    VllmLoad,
    VllmServe,
)


def plain(obj: Any) -> Any:
    """A model (recursively) as plain Python data: only the fields that were set (by alias:
    ``schema``, ``validate``), plus the unknown (extra) keys — what ``model_dump(exclude_unset=True)`` gives, without
    building the pydantic serializer (so a result made with ``model_construct`` costs
    no schema build on the command's path)."""
    if isinstance(obj, BaseModel):
        fields, extra = type(obj).model_fields, obj.__pydantic_extra__ or {}
        out = {(fields[k].alias or k): plain(getattr(obj, k)) for k in obj.model_fields_set if k not in extra}
        out.update({k: plain(v) for k, v in extra.items()})
        return out
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [plain(v) for v in obj]
    return obj


def jsonable(o: Any) -> Any:
    """``json.dumps(default=...)`` for results: paths as strings, objects with
    ``to_dict`` (results, findings) as their dict, sets and tuples as lists.

    Raises:
        TypeError: anything else (a bug: a value no stage should put in a result).
    """
    from pathlib import Path

    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


class StageResult(BaseModel):
    """Base class: JSON dict / text, human text, exit status."""

    model_config = ConfigDict(extra="allow", defer_build=True, arbitrary_types_allowed=True)

    @classmethod
    def of(cls, data: dict[str, Any]):
        """A result from the values a library stage computed (trusted: not re-validated, so
        no schema is built on the command's path; ``model_validate`` checks the types —
        the tests do)."""
        return cls.model_construct(**data)

    def extra(self, key: str, default: Any = None) -> Any:
        """An undeclared detail the stage added (``extra="allow"``), or ``default``."""
        return (self.__pydantic_extra__ or {}).get(key, default)

    def to_dict(self) -> dict[str, Any]:
        """The keys that were set, as plain Python objects."""
        return plain(self)

    def to_json(self) -> str:
        """The one JSON object ``--format json`` prints (sorted keys, 2-space indent)."""
        import json

        return json.dumps(self.to_dict(), sort_keys=True, default=jsonable, indent=2)

    def human(self) -> str:  # pragma: no cover - overridden
        """Short human summary (``--format human``)."""
        raise NotImplementedError

    def exit_status(self) -> int:
        """Process exit status the CLI uses after printing this result."""
        return 0


def _fates(fates: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in fates.items())


def _k_of(cfg: dict[str, Any]) -> Any:  # the config.json: open (PlanSummary.config)
    return cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"]


def _layer_ids(li: LayerIds) -> str:
    return f"{li['source_ids']} ({li['source_convention']}) → {li['speculators_ids']}"


def _finding_lines(findings: list[Finding]) -> list[str]:
    return [f"  {f['level']:7} [{f['code']}] {f['message']}" for f in findings]


class ConversionResult(StageResult):
    """What :func:`specconv.convert.convert` did (or, with ``dry_run``, would do).

    Attributes:
        format: source format id (registry). algorithm: target ``speculators_model_type``.
        source: the source checkpoint directory as resolved (absolute; a Hub snapshot path).
        output: output directory (None for a dry run without ``-o``).
        dry_run: nothing was written.
        plan: the plan summary (``specconv.convert.summarize_plan``).
        findings: converter + lint findings (``{level, code, key, message}``).
        files: files written (set only when written).
        verifier_bytes_read: tensor-data bytes read from the verifier's weight files
            (``Verifier.bytes_read``; headers not counted; set only when written).
        verifier_bytes_needed: bytes of verifier tensors the output holds (embedding,
            LM head or its ``t2d`` rows, final norm), in the verifier's dtype.
    """

    format: str
    algorithm: str
    source: str
    output: str | None = None
    dry_run: bool = False
    plan: PlanSummary
    findings: list[Finding] = Field(default_factory=list)
    files: list[str] | None = None
    verifier_bytes_read: int | None = None
    verifier_bytes_needed: int | None = None

    def human(self) -> str:
        p = self.plan
        lines = [
            f"{'planned' if self.dry_run else 'converted'} {self.source} ({self.format}, {self.algorithm})"
            + ("" if self.dry_run else f" → {self.output}"),
            f"  tensors: {p['tensors']} ({_fates(p['fates'])}), {p['bytes'] / 1e6:.1f} MB",
        ]
        if p.get("casts"):
            lines.append("  cast: " + ", ".join(f"{k} ×{v}" for k, v in p["casts"].items()))
        if li := p.get("layer_ids"):
            lines.append(f"  aux layer ids: {_layer_ids(li)}")
        cfg = p["config"]
        extra = f", block_size {cfg['block_size']}" if "block_size" in cfg else ""
        lines.append(f"  mask_token_id {cfg.get('mask_token_id')}{extra}, speculative_tokens {_k_of(cfg)}")
        lines += [f"  dropped {d['name']}: {d['reason']}" for d in p["dropped"]]
        lines += [f"  note: {n}" for n in p["notes"]]
        lines += _finding_lines(self.findings)
        return "\n".join(lines)


class InspectResult(StageResult):
    """What :func:`specconv.convert.inspect_source` found (headers only).

    Attributes:
        path: the source directory inspected; selected: the trainer checkpoint picked.
        format / algorithm / title: the detected format (``unknown`` when none matched).
        supported: convertible (and readable); reason: why not.
        findings: lint (Speculators dirs) and, with a verifier, the plan's findings.
        plan: the dry-run plan summary (with a verifier).
    """

    path: str
    selected: str | None = None
    findings: list[Finding] = Field(default_factory=list)
    format: str | None = None
    algorithm: str | None = None
    supported: bool = False
    reason: str | None = None
    title: str | None = None
    plan: PlanSummary | None = None
    nonfinite: list[NonFinite] | None = None

    def exit_status(self) -> int:
        """3 when the source is not supported, lint reports an error or ``--scan`` found
        NaN/Inf, else 0."""
        bad = not self.supported or any(f["level"] == "error" for f in self.findings) or bool(self.nonfinite)
        return EXIT_INVALID_INPUT if bad else 0

    def human(self) -> str:
        lines = [
            f"path:      {self.path}" + (f"  (selected {self.selected})" if self.selected else ""),
            f"format:    {self.format}" + (f"  — {self.title}" if self.title else ""),
            f"algorithm: {self.algorithm}",
            f"supported: {'yes' if self.supported else 'no'}",
        ]
        if self.reason:
            lines.append(f"reason:    {self.reason}")
        plan = self.plan
        if plan:
            cfg = plan["config"]
            lines.append(f"plan:      {plan['tensors']} tensors ({_fates(plan['fates'])}), "
                         f"{plan['bytes'] / 1e6:.1f} MB; speculative_tokens {_k_of(cfg)}, "
                         f"mask_token_id {cfg.get('mask_token_id')}")
            if li := plan.get("layer_ids"):
                lines.append(f"           aux layer ids {_layer_ids(li)}")
        errors = sum(f["level"] == "error" for f in self.findings)
        if self.findings:
            lines.append(f"lint:      {errors} error(s), {len(self.findings) - errors} other finding(s)")
        lines += _finding_lines(self.findings)
        if self.nonfinite is not None:
            lines.append(f"scan:      {len(self.nonfinite)} tensor(s) with NaN/Inf")
            lines += [f"  {n['tensor']}: {n['count']} of {n['numel']}, first at {n['first_index']}"
                      for n in self.nonfinite]
        return "\n".join(lines)


#: the suffix of a load check's report key (``vllm_load``: :class:`specconv.engines.base.LoadCheck`)
LOAD_SUFFIX = "_load"


class ValidationReport(StageResult):
    """The report of :func:`specconv.validate.run.validate_drafter` (``validation.json``).

    The acceptance counters keep the names of vLLM's spec-decode metrics
    (``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens``) and speculators'
    ``acceptance_length`` / ``acceptance_at_pos`` at the top level (see
    ``docs/validate.md``); every other detail (``metrics``, ``source_metrics``,
    ``lossless``, ``dspark``, ``placement``, ...) is kept as an extra key.

    Attributes:
        drafter / verifier: what was validated (drafter dir, verifier Hub id or path).
        backend: ``torch`` | ``vllm``; dtype, temperature, max_new_tokens, seed: the run.
        algorithm, k (drafts per step), aux_layer_ids: read from the drafter.
        gate_results: one dict per gate in order (``name``, ``passed``, ``status``,
            ``errors``, ``warnings``, ``details``, ``skipped_reason``).
        gates: gate name → passed, for the gates that ran; passed: their conjunction.
        acceptance_length: pooled τ = 1 + accepted / drafts (None when nothing ran).
        acceptance_at_pos: ``p_i``, fraction of drafts whose first ``i`` tokens were
            accepted, i = 1…k.
        tau_ci95: bootstrap 95% interval of τ (None with too few requests).
        source_metrics: the ``--source`` drafter's acceptance metrics; lossless: G4's
            ``{exact_match, n, first_div, near_tie}``; device, prompts, versions: the run.
        vllm_load: the ``--vllm-load-check`` result (``specconv.engines.vllm.check.record_payload``);
            vllm_serve: the server that served ``--backend vllm``; engines: ``--compare``'s rows.
        chat_template: how the prompts were rendered (``specconv.prompts.TemplateFacts``);
            findings: what a serving engine did that changes what τ means.
        report_files: files written by ``validate.report.write_report``; plot: the PNG's name.
        error / exit_code / message: set by :meth:`gate_failure` (exit 4).
    """

    specconv_version: str | None = None
    created: str | None = None
    drafter: str | None = None
    verifier: str | None = None
    backend: str | None = None
    dtype: str | None = None
    temperature: float | None = None
    max_new_tokens: int | None = None
    seed: int | None = None
    algorithm: str | None = None
    k: int | None = None
    aux_layer_ids: list[int] | None = None
    gate_results: list[GateResult] = Field(default_factory=list)
    gates: dict[str, bool] = Field(default_factory=dict)
    passed: bool | None = None
    acceptance_length: float | None = None
    acceptance_at_pos: list[float] | None = None
    tau_ci95: list[float] | None = None
    source_metrics: AcceptanceMetrics | None = None
    lossless: Lossless | None = None
    device: Device | None = None
    prompts: Prompts | None = None
    chat_template: ChatTemplate | None = None
    findings: list[Finding] | None = None
    versions: dict[str, str | None] | None = None
    vllm_load: VllmLoad | None = None
    vllm_serve: VllmServe | None = None
    sglang_load: SglangLoad | None = None
    engines: EngineComparison | None = None
    report_files: dict[str, str | None] | None = None
    plot: str | None = None
    error: str | None = None
    exit_code: int | None = None
    message: str | None = None

    def failed_gates(self) -> list[str]:
        """Names of the gates that ran and failed, then the report keys of the engines' load
        checks that failed (a load check's payload is ``<name>_load``, ``ok`` its verdict:
        ``specconv.engines.base.LoadCheck``)."""
        failed = [k for k, v in self.gates.items() if v is False]
        loads = {**{k: getattr(self, k) for k in type(self).model_fields}, **(self.__pydantic_extra__ or {})}
        return failed + [k for k, v in loads.items()
                         if k.endswith(LOAD_SUFFIX) and isinstance(v, dict) and not v.get("ok")]

    def exit_status(self) -> int:
        """4 when a gate that ran (or the vLLM load check) failed, else 0."""
        return EXIT_GATE_FAILED if self.failed_gates() else 0

    def gate_failure(self):
        """The :class:`~specconv.errors.GateFailedError` (exit 4, carrying this report, its
        ``error`` / ``exit_code`` / ``message`` set) when a gate failed, else None."""
        failed = self.failed_gates()
        if not failed:
            return None
        self.error, self.exit_code = "gate_failed", EXIT_GATE_FAILED
        self.message = "validation gate(s) failed: " + ", ".join(failed)
        return GateFailedError(self.message, result=self)

    def human(self) -> str:
        r = self.to_dict()
        dev = r.get("device") or {}
        lines = [
            f"drafter:   {r.get('drafter')}  ({r.get('algorithm')}, k={r.get('k')})",
            f"verifier:  {r.get('verifier')}",
            f"backend:   {r.get('backend')}  device={dev.get('gpu_name') or dev.get('device')}  dtype={r.get('dtype')}",
        ]
        pr = r.get("prompts")
        if pr:
            lines.append(f"prompts:   {pr['set']} × {pr['n']}, max new tokens {r.get('max_new_tokens')}, "
                         f"T={r.get('temperature')}")
        ct = r.get("chat_template")
        if ct:
            lines.append(f"template:  {ct['source']}" + (f" sha256 {ct['sha256'][:12]}…" if ct.get("sha256") else "")
                         + f", kwargs {json.dumps(ct.get('kwargs') or {}, sort_keys=True)}, thinking "
                         f"{ct.get('thinking') or 'n/a'} (--thinking {ct.get('thinking_option')})")
        if r.get("acceptance_length") is not None:
            lines += _tau_lines(r)
        lines += [_runtime_line(key, sec) for key, sec in r.items()
                  if isinstance(sec, dict) and {"torch", "drafts"} <= sec.keys()]
        lines += [_served_line(key, sec) for key, sec in r.items()
                  if isinstance(sec, dict) and {"tau", "tau_torch", "band"} <= sec.keys()]
        lines += _engine_lines(r.get("engines") or {})
        lines.append("gates:")
        for g in r.get("gate_results", []):
            lines.append(f"  {g['name']:<11} {g['status']}")
            lines += [f"      error:   {e}" for e in g["errors"][:5]]
            lines += [f"      warning: {w}" for w in g["warnings"][:3]]
            if g.get("skipped_reason"):
                lines.append(f"      ({g['skipped_reason']})")
        vl = r.get("vllm_load")
        if vl:
            lines.append(f"vllm load: {'ok' if vl['ok'] else 'FAILED'}  ({vl.get('distribution')} {vl.get('version')}, "
                         f"{vl.get('model_class')})" + "".join(f"\n      error:   {e}" for e in vl["errors"][:5]))
        files = r.get("report_files") or {}
        if files:
            lines.append(f"report:    {files.get('json')}")
        return "\n".join(lines)


def _engine_lines(sec: dict[str, Any]) -> list[str]:
    """``validate --compare``: one line per engine (τ with its CI, verdict), then the notes."""
    lines = []
    for row in sec.get("rows") or []:
        lo, hi = row.get("tau_ci") or (float("nan"), float("nan"))
        departs = row["verdict"] == "departs"
        where = f" at {row['position'] or 'τ'} ({row['direction']}; {row['cause']})" if departs else ""
        lines.append(f"{row['engine'] + ':':<11}τ {row['tau']:.3f} [{lo:.3f}, {hi:.3f}] vs torch "
                     f"{sec['reference'].get('tau') or float('nan'):.3f}: {row['verdict']}{where}")
    return lines + [f"      note:    {n}" for n in sec.get("notes") or []]


def _served_line(key: str, sec: dict[str, Any]) -> str:
    """The line of an engine served after the torch loop on its token ids (``--backend llamacpp``: the
    report's ``key`` section with ``tau``, ``tau_torch``, ``band``, ``lossless``)."""
    inside = abs(sec["tau"] - sec["tau_torch"]) <= sec["band"]
    return (f"{key.removesuffix('_serve') + ':':<11}τ {sec['tau']:.3f} (served) vs {sec['tau_torch']:.3f} (torch), "
            f"{'within' if inside else 'OUTSIDE'} ±{sec['band']:.3f}; lossless {sec.get('lossless')}")


def _runtime_line(key: str, sec: dict[str, Any]) -> str:
    """The line of a runtime compared with torch (``validate --onnx`` / ``--engine``: the report's
    ``key`` section, its runtime's side the one other entry with a τ)."""
    side = next(k for k, v in sec.items() if k != "torch" and isinstance(v, dict) and "acceptance_length" in v)
    d, same = sec["drafts"], sec.get("tokens_identical")
    return (f"{key.upper() + ':':<11}τ {sec[side]['acceptance_length']:.3f} ({side}) vs "
            f"{sec['torch']['acceptance_length']:.3f} (torch); "
            + (f"tokens identical {same}; " if same is not None else "")
            + f"draft mismatches {d['mismatches']} ({d['near_tie_mismatches']} of them at a near-tie; "
            f"{d['near_ties']} near-ties in all)")


def _tau_lines(r: dict[str, Any]) -> list[str]:
    ci = r.get("tau_ci95")
    ci_s = f"  (95% CI {ci[0]:.3f}–{ci[1]:.3f})" if ci else ""
    lines = [
        f"τ pooled:  {r['acceptance_length']:.3f}{ci_s}   acceptance rate {r.get('acceptance_rate') or 0:.3f}",
        "p_i:       " + " ".join(f"{p:.3f}" for p in r.get("acceptance_at_pos") or []),
    ]
    if r.get("source_metrics"):
        lines.append(f"τ source:  {r['source_metrics']['acceptance_length']:.3f}")
    if r.get("speedup"):
        lines.append(f"TPOT:      {r['tpot_ms']:.1f} ms spec / {r['tpot_ar_ms']:.1f} ms plain  "
                     f"(speedup {r['speedup']:.2f}×)")
    return lines


class FormatsResult(StageResult):
    """``specconv formats``: every registered source format, in detection order.

    Attributes:
        formats: one ``describe()`` dict per converter (``format``, ``algorithm``,
            ``supported``, ``title``, ``detection``, ``mapping``, ...).
    """

    formats: list[ConverterRow] = Field(default_factory=list)

    def human(self) -> str:
        lines = [f"{'format':28} {'algorithm':9} {'supported':9} source"]
        for r in self.formats:
            lines.append(f"{r['format']:28} {r['algorithm']:9} "
                         f"{('yes' if r['supported'] else 'refused'):9} {r['title']}")
        return "\n".join(lines)


class OnnxExport(BaseModel):
    """What ``specconv export onnx`` wrote into ``DIR/onnx`` (``export.onnx``; the command's
    result has the same fields, with ``output`` absolute).

    Attributes:
        output: the export dir (relative to the drafter dir in the record).
        algorithm / dtype / opset / ir_version / block_size: the main graph.
        dynamic: ``{batch: {min, max}, context: {min, max}}`` the graph accepts.
        census: ONNX op type → count in the main graph.
        contains_verifier_weights: a graph embeds verifier tensors (embedding / LM head).
        parity: graph path → its ONNX Runtime parity check (None with ``--no-check``);
            parity_passed: every check that ran passed; checked: parity ran.
        created: UTC timestamp. files: the files written, relative to ``output``.
    """

    model_config = ConfigDict(extra="allow", defer_build=True)

    output: str | None = None
    algorithm: str | None = None
    dtype: str | None = None
    opset: int | None = None
    ir_version: int | None = None
    contains_verifier_weights: bool | None = None
    dynamic: dict[str, dict[str, int]] | None = None
    block_size: int | None = None
    census: dict[str, int] | None = None
    parity: dict[str, ParityCheck | None] | None = None
    parity_passed: bool | None = None
    checked: bool | None = None
    created: str | None = None
    files: list[str] | None = None


class ExportOnnxResult(StageResult, OnnxExport):
    """``specconv export onnx``: the fields of :class:`OnnxExport` (what the record's
    ``export.onnx`` section holds, there with ``output`` relative), ``output`` absolute."""

    def human(self) -> str:
        dyn = self.dynamic or {}
        lines = [f"exported:  {self.output}  ({self.algorithm}, {self.dtype}, opset {self.opset}, "
                 f"block {self.block_size})",
                 f"dynamic:   batch 1..{dyn['batch']['max']}, context 1..{dyn['context']['max']}",
                 f"verifier weights baked in: {'yes' if self.contains_verifier_weights else 'no'}"]
        for name, p in (self.parity or {}).items():
            if not p:
                continue
            if p.get("passed") is None:
                lines.append(f"parity {name}: skipped ({p.get('skipped')})")
            else:
                lines.append(f"parity {name}: {'ok' if p['passed'] else 'FAILED'} ({p['runtime']}, "
                             f"top-1 {p['top1']:.3f}, max |Δ| {p['max_abs']:.2e})")
        if not self.checked:
            lines.append("parity: not checked (--no-check)")
        return "\n".join(lines)


class BuildEngineResult(StageResult):
    """``specconv build-engine``: the variant's ``build.json`` plus ``path`` (the variant
    dir), ``manifest`` (``trt/manifest.json``) and ``variants`` (every key it lists)."""

    path: str | None = None
    manifest: str | None = None
    variants: list[str] = Field(default_factory=list)
    builder: str | None = None
    trt_version: str | None = None
    dtype: str | None = None
    plan_bytes: int | None = None
    gpu: str | None = None
    compute_capability: str | None = None
    target_compute_capabilities: list[str] | None = None

    def human(self) -> str:
        targets = self.target_compute_capabilities or self.compute_capability
        return "\n".join([
            f"engine:    {self.path}/drafter.plan  ({self.plan_bytes} bytes, {self.builder} {self.trt_version}, "
            f"{self.dtype})",
            f"gpu:       {self.gpu or 'none (ahead-of-time build)'}  targets {targets}",
            f"manifest:  {self.manifest}  ({len(self.variants)} variant(s))",
        ])


class PushResult(StageResult):
    """``specconv push`` (schema ``specconv.publish/v1``).

    Attributes:
        status: ``published`` | ``unchanged`` | ``pr_opened`` | ``dry_run``.
        repo_id / repo_type / endpoint / revision / private / repo_exists: the target.
        files: the plan, one ``{path, action, size, sha256}`` per file.
        bytes_to_upload, would_change: what the plan sends. parent_commit: the head planned
            against. commit_oid / commit_url / pr_url / pr_revision / tag: what was made.
        verified: the remote checksums matched (None: not checked). warnings: notes.
        detailed_exitcode: ``--detailed-exitcode`` (a dry run that would change exits 10).
    """

    schema_: str | None = Field(default=None, alias="schema")
    status: str | None = None
    repo_id: str | None = None
    repo_type: str | None = None
    endpoint: str | None = None
    files: list[PushFile] = Field(default_factory=list)
    bytes_to_upload: int | None = None
    would_change: bool | None = None
    detailed_exitcode: bool = False
    warnings: list[str] = Field(default_factory=list)
    tag: str | None = None
    revision: str | None = None
    private: bool | None = None
    repo_exists: bool | None = None
    parent_commit: str | None = None
    commit_oid: str | None = None
    commit_url: str | None = None
    pr_url: str | None = None
    pr_revision: str | None = None
    verified: bool | None = None

    def exit_status(self) -> int:
        """10 for a dry run with ``--detailed-exitcode`` that would change the repo, else 0."""
        return EXIT_WOULD_CHANGE if self.would_change and self.detailed_exitcode else 0

    def human(self) -> str:
        lines = [f"{self.status}: {self.repo_id}@{self.revision}"
                 + (f" commit {self.commit_oid}" if self.commit_oid else "")]
        lines += [f"  {f['action']:9} {f['path']}" for f in self.files if f["action"] != "unchanged"]
        if self.pr_url:
            lines.append(f"  pull request: {self.pr_url}")
        if self.tag:
            lines.append(f"  tag: {self.tag}")
        return "\n".join(lines)


class ReleaseResult(StageResult):
    """``specconv release`` (schema ``specconv.release/v1``): every step run, in order.

    Attributes:
        status: ``running`` → the push's status, or ``failed``. steps: one
            ``{step, status, exit_code, duration_s, ...}`` per step. repo_id, dry_run.
        convert / validate / export / engine / sglang / gguf: each step's summary; push: the push result.
        exit_code: the process exit status; failed_step / error / message / hint: the
            first failed step's error. commit_oid / commit_url / pr_url: the push's.
    """

    schema_: str | None = Field(default=None, alias="schema")
    status: str | None = None
    steps: list[ReleaseStep] = Field(default_factory=list)
    repo_id: str | None = None
    dry_run: bool | None = None
    exit_code: int = 0
    convert: ReleaseConvert | None = None
    validate_: ReleaseValidate | None = Field(default=None, alias="validate")
    compare: ReleaseValidate | None = None
    export: ReleaseExport | None = None
    engine: ReleaseEngine | None = None
    sglang: ReleaseSglang | None = None
    gguf: ReleaseGguf | None = None
    push: PushResult | None = None
    commit_oid: str | None = None
    commit_url: str | None = None
    pr_url: str | None = None
    failed_step: str | None = None
    error: str | None = None
    message: str | None = None
    hint: str | None = None

    def exit_status(self) -> int:
        return int(self.exit_code or 0)

    def human(self) -> str:
        rows = [f"{s['step']:9} {s['status']:7} {s['duration_s']:.2f}s" for s in self.steps]
        return "\n".join([f"release {self.status}", *rows])


class GgufExport(BaseModel):
    """What ``specconv export gguf`` wrote (the record's ``export.gguf``, there with ``output``
    relative and ``check`` brief; :class:`ExportGgufResult` has the same fields).

    Attributes:
        output: the export dir (absolute). file: the GGUF's name in it; sha256: its hash.
        algorithm / architecture (llama.cpp's) / dtype (GGUF file type): the drafter.
        spec_type / spec_draft_n_max: llama-server's ``--spec-type`` / ``--spec-draft-n-max``.
        target_layers: verifier layers whose input llama.cpp captures. not_written: drafter
        tensor → why llama.cpp gets no copy.
        contains_verifier_weights / verifier_weights: verifier tensors inside (names).
        verifier_gguf: ``{name, sha256, quantisation, repo}`` of the target GGUF found.
        check: llama-server's result, or ``{skipped: reason}``. created: UTC timestamp.
    """

    model_config = ConfigDict(extra="allow", defer_build=True)

    output: str | None = None
    file: str | None = None
    sha256: str | None = None
    algorithm: str | None = None
    architecture: str | None = None
    dtype: str | None = None
    spec_type: str | None = None
    spec_draft_n_max: int | None = None
    target_layers: list[int] | None = None
    not_written: dict[str, str] | None = None
    contains_verifier_weights: bool | None = None
    verifier_weights: list[str] | None = None
    verifier_gguf: VerifierGguf | None = None
    check: GgufCheck | None = None
    created: str | None = None


class ExportGgufResult(StageResult, GgufExport):
    """``specconv export gguf`` (:func:`specconv.engines.llamacpp.export.export_gguf_dir`): the fields of
    :class:`GgufExport`, ``output`` absolute."""

    def human(self) -> str:
        inside = self.verifier_weights or []
        lines = [f"exported:  {self.output}/{self.file}  ({self.algorithm}, {self.architecture}, {self.dtype})",
                 f"serve:     --spec-type {self.spec_type} --spec-draft-n-max {self.spec_draft_n_max}",
                 f"verifier weights inside: {'yes (' + ', '.join(inside) + ')' if inside else 'no'}"]
        c = self.check or {}
        if c.get("skipped"):
            lines.append(f"check:     skipped ({c['skipped']})")
        else:
            srv = c.get("server") or c.get("llama_server") or {}  # the check's own key / the record's brief
            lines.append(f"check:     {'ok' if c.get('passed') else 'FAILED'} (llama-server "
                         f"{srv.get('commit')}: lossless {c.get('lossless')}, "
                         f"τ {c.get('tau') or 0:.3f}, {c.get('num_accepted_tokens')} draft tokens accepted)")
        return "\n".join(lines)


class SglangExport(BaseModel):
    """What ``specconv export sglang`` wrote (the record's ``export.sglang``, there with
    ``output`` relative and ``launch`` None; :class:`ExportSglangResult` has the same fields).

    Attributes:
        output: the export dir (absolute). format / format_version: ``sglang_export.json``'s.
        algorithm: the drafter's; speculative_algorithm / architecture: what SGLang runs.
        files: sha256 of every file written; drafter_files: of the drafter files it was made from.
        env: environment SGLang needs; expected: what SGLang must resolve (the check compares);
        target_supplied: tensors SGLang takes from the verifier. notes: what the export
        could not prove or did not carry.
        launch: the ``python -m sglang.launch_server`` argv. check: SGLang's loader payload
        (``--check``), else None.
    """

    model_config = ConfigDict(extra="allow", defer_build=True)

    output: str | None = None
    format: str | None = None
    format_version: int | None = None
    algorithm: str | None = None
    speculative_algorithm: str | None = None
    architecture: str | None = None
    files: dict[str, str] = Field(default_factory=dict)
    drafter_files: dict[str, str] | None = None
    env: dict[str, str] | None = None
    expected: SglangResolved | None = None
    target_supplied: list[str] | None = None
    notes: list[str] = Field(default_factory=list)
    launch: list[str] | None = Field(default_factory=list)
    check: SglangLoad | None = None


class ExportSglangResult(StageResult, SglangExport):
    """``specconv export sglang`` (:func:`specconv.engines.sglang.export.export_sglang_dir`): the
    fields of :class:`SglangExport`, ``output`` absolute, ``launch`` the argv."""

    def human(self) -> str:
        import shlex

        env = " ".join(f"{k}={v}" for k, v in sorted((self.env or {}).items()))
        lines = [f"exported:  {self.output}  ({self.algorithm} → SGLang {self.speculative_algorithm}, "
                 f"{self.architecture})",
                 f"files:     {', '.join(sorted(self.files))} (weights byte-identical)",
                 f"serve:     {(env + ' ') if env else ''}{shlex.join(self.launch or [])}"]
        lines += [f"note:      {n}" for n in self.notes]
        c = self.check
        lines.append(f"check:     passed: SGLang {c['version']} loaded it strictly ({c['class']}, "
                     f"{c.get('checkpoint_tensors')} tensors)" if c else "check:     not run (pass --check)")
        return "\n".join(lines)
