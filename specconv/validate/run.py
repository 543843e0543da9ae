"""``validate_drafter``: the whole ``specconv validate`` pipeline behind the CLI.

Order (validation.md §0): G1 structure → (load verifier + drafter) → plain-decode
baseline (k = 0) → speculative run → [source: convert afresh, run it in the same loop,
G2 parity on real captured features] → G3 acceptance → G4 losslessness → DSpark
extras → report. A G1 failure stops before any model is loaded (the other gates are
reported as skipped).
"""

from __future__ import annotations

import datetime as _dt
import logging
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import InvalidInputError, UsageError
from .gates import GATE_ORDER, GateResult, skipped

log = logging.getLogger("specconv.validate")

#: Default cumulative-confidence threshold for the DSpark truncated-block run.
DSPARK_CONFIDENCE_THRESHOLD = 0.5
#: Prompts used for the G2 parity sequences (the first N of the run).
PARITY_SEQUENCES = 8

Progress = Callable[[str, int, int], None]


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
        backend: ``torch`` (this harness) | ``vllm``.
        attn_implementation: verifier attention (``sdpa`` | ``eager``).
        seed: prompt-independent RNG seed (bootstrap, sampling).
        confidence_threshold: DSpark truncated-run threshold (None disables that run).
        vllm_port: port for ``--backend vllm``.
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
    attn_implementation: str = "sdpa"
    seed: int = 0
    confidence_threshold: float | None = DSPARK_CONFIDENCE_THRESHOLD
    vllm_port: int = 8011
    onnx: str | None = None  # --onnx PATH: also run the loop with ONNX Runtime drafting


def select_prompts(spec: str, n: int | None) -> list:
    """Load a prompt set and keep ``n`` prompts evenly spaced over it (deterministic)."""
    from ..prompts import load_prompts

    allp = load_prompts(spec)
    if not allp:
        raise InvalidInputError(f"prompt set {spec!r} is empty")
    if n is None or n >= len(allp):
        return allp
    if n < 1:
        raise UsageError("--num-prompts must be at least 1")
    idx = sorted({(i * len(allp)) // n for i in range(n)})
    return [allp[i] for i in idx]


def _float_numel(store) -> int:
    return sum(i.numel for i in store.infos() if i.dtype in ("F32", "F16", "BF16", "F64", "F8_E4M3", "F8_E5M2"))


def plan_placement(verifier, drafter_dir: Path, device: str, dtype: str) -> dict:
    """Check that verifier + drafter fit on ``device``; choose ``device_map``.

    On CUDA, the weights at the run dtype (drafter: plus the verifier's embedding and LM
    head it may borrow) plus 15% and 1 GiB headroom must fit in free memory of device
    ``cuda:i``; when only the verifier is too large (and accelerate is installed) it is placed with ``device_map="auto"`` (sharded over the
    GPUs; with a single GPU, accelerate offloads the rest to CPU memory).

    Returns:
        ``{"device_map": None | "auto", "need_bytes", "free_bytes"}``.

    Raises:
        InvalidInputError: the models do not fit (names the sizes).
    """
    import torch

    from ..tensors import TensorStore

    out: dict[str, Any] = {"device_map": None}
    if not str(device).startswith("cuda"):
        return out
    el = torch.tensor([], dtype=getattr(torch, dtype)).element_size()
    v_bytes = _float_numel(verifier.store()) * el if verifier.hub_id is None else 0
    d_store = TensorStore.open(drafter_dir)
    H, V = int(verifier.hidden_size), int(verifier.vocab_size)
    d_bytes = (_float_numel(d_store) + 2 * V * H) * el
    idx = torch.device(device).index or 0
    free, _total = torch.cuda.mem_get_info(idx)
    need = int((v_bytes + d_bytes) * 1.15) + (1 << 30)
    out.update({"need_bytes": need, "free_bytes": int(free)})
    if need <= free:
        return out
    try:
        import accelerate  # noqa: F401

        have_acc = True
    except ImportError:
        have_acc = False
    if have_acc and int(d_bytes * 1.15) + (1 << 30) <= free:
        if torch.cuda.device_count() > 1:
            log.warning("verifier (%.1f GiB) does not fit on %s: sharding it over %d GPUs with device_map='auto'",
                        v_bytes / 2**30, device, torch.cuda.device_count())
        else:
            log.warning("verifier (%.1f GiB) does not fit on %s: device_map='auto' offloads part of it to CPU "
                        "memory (slow; timings are not meaningful)", v_bytes / 2**30, device)
        out["device_map"] = "auto"
        return out
    raise InvalidInputError(
        f"verifier + drafter need about {need / 2**30:.1f} GiB at {dtype} but {device} has "
        f"{free / 2**30:.1f} GiB free",
        hint="use --dtype bfloat16, a larger GPU, several GPUs (device_map auto needs accelerate), or --device cpu",
    )


def _source_options(drafter_dir: Path):
    """ConvertOptions recorded in the drafter's specconv.json (so the source converts the same way)."""
    import json

    from specconv.converters import ConvertOptions

    p = drafter_dir / "specconv.json"
    if not p.is_file():
        return ConvertOptions()
    try:
        rec = json.loads(p.read_text())
    except json.JSONDecodeError:
        return ConvertOptions()
    opts = rec.get("options") or {}
    fields = set(ConvertOptions.__dataclass_fields__)
    kw = {k: v for k, v in opts.items() if k in fields}
    for k in ("vocab_mapping", "draft_config"):
        if kw.get(k):
            kw[k] = Path(kw[k])
    try:
        return ConvertOptions(**kw)
    except TypeError:
        return ConvertOptions()


def prepare_source(source: str, verifier_spec: str, drafter_dir: Path, workdir: Path) -> dict:
    """Make the ``--source`` checkpoint loadable in the harness.

    A Speculators directory is used as is. Anything else is converted afresh with the
    converter registry (the options recorded in the drafter's ``specconv.json``) into
    ``workdir``; a z-lab DFlash source additionally gets z-lab's own reference forward.

    Returns:
        ``{"kind", "format", "path" (source dir), "converted" (Speculators dir)}``.
    """
    import json

    p = Path(source)
    cfg_p = p / "config.json"
    if cfg_p.is_file():
        try:
            cfg = json.loads(cfg_p.read_text())
        except json.JSONDecodeError:
            cfg = {}
        if isinstance(cfg, dict) and "speculators_model_type" in cfg:
            return {"kind": "speculators", "format": "speculators", "path": str(p), "converted": str(p)}
    from ..convert import convert

    out = workdir / "source-converted"
    rep = convert(source, verifier=verifier_spec, output=out, options=_source_options(drafter_dir), overwrite=True)
    return {"kind": "converted", "format": rep.get("format"), "path": rep.get("source") or str(p), "converted": str(out)}


def _render_all(prompts, tokenizer) -> list[tuple[str, list[int]]]:
    from ..prompts import render

    if tokenizer is None:
        raise InvalidInputError("the verifier has no tokenizer; cannot render prompts")
    return [(pr.id, render(pr, tokenizer)) for pr in prompts]


def failed_gates(report: dict) -> list[str]:
    """Names of the gates that ran and failed."""
    return [k for k, v in (report.get("gates") or {}).items() if v is False]


def _gate_map(results: list[GateResult]) -> dict[str, bool]:
    return {g.name: bool(g.passed) for g in results if g.passed is not None}


def _finish(report: dict, results: list[GateResult]) -> dict:
    by = {g.name: g for g in results}
    ordered = [by.get(n) or skipped(n, "not reached") for n in GATE_ORDER]
    report["gate_results"] = [g.to_dict() for g in ordered]
    report["gates"] = _gate_map(ordered)
    report["passed"] = all(report["gates"].values())
    return report


def validate_drafter(
    drafter_dir: str | Path,
    verifier: str,
    options: ValidateOptions | None = None,
    *,
    progress: Progress | None = None,
) -> dict:
    """Run the gates on a Speculators drafter directory against ``verifier``.

    Args:
        drafter_dir: the converted drafter (Speculators format).
        verifier: local verifier dir or Hub id (resolved from the local cache).
        options: :class:`ValidateOptions`.
        progress: ``progress(phase, done, total)`` callback.

    Returns:
        The report dict (see :mod:`specconv.validate.report`); ``report["gates"]`` maps
        gate name → passed; ``report["passed"]`` is their conjunction.

    Raises:
        InvalidInputError: unreadable inputs, models that do not fit, bad prompt sets.
        UsageError: inconsistent options.
    """
    import torch

    from .. import __version__
    from ..verifier import resolve_verifier
    from .gates import gate_acceptance, gate_lossless, gate_parity, gate_structure, sampler_check
    from .metrics import compute_metrics, summary
    from .report import device_info, library_versions, torch_backend_flags
    from .verifier_runner import VerifierRunner, resolve_device, torch_dtype

    opts = options or ValidateOptions()
    d = Path(drafter_dir)
    if not d.is_dir():
        raise InvalidInputError(f"drafter dir {d} does not exist")
    if opts.temperature < 0:
        raise UsageError("--temperature must be >= 0")
    if opts.backend not in ("torch", "vllm"):
        raise UsageError(f"unknown backend {opts.backend!r}")
    torch_dtype(opts.dtype)
    v = resolve_verifier(verifier)
    prog = progress or (lambda *_: None)
    report: dict[str, Any] = {
        "specconv_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "drafter": str(d),
        "verifier": v.name_or_path,
        "verifier_dir": str(v.local_dir),
        "backend": opts.backend,
        "dtype": opts.dtype,
        "temperature": opts.temperature,
        "max_new_tokens": opts.max_new_tokens,
        "seed": opts.seed,
        "options": asdict(opts),
        "versions": library_versions(),
    }
    results: list[GateResult] = []

    with tempfile.TemporaryDirectory(prefix="specconv-validate-") as tmp:
        src_info = None
        src_cfg = None
        if opts.source:
            prog("converting source", 0, 1)
            src_info = prepare_source(opts.source, verifier, d, Path(tmp))
            from ..speculators import load_config

            src_cfg = load_config(src_info["converted"])
            report["source"] = src_info
        prog("structure", 0, 1)
        g1 = gate_structure(d, v, source_config=src_cfg)
        results.append(g1)
        report["algorithm"] = g1.details.get("algorithm")
        report["aux_layer_ids"] = g1.details.get("aux_layer_ids")
        if not g1.passed:
            for n in GATE_ORDER[1:]:
                results.append(skipped(n, "G1 structure failed"))
            report["device"] = {"device": opts.device}
            return _finish(report, results)

        prompts = select_prompts(opts.prompts, opts.num_prompts)
        report["prompts"] = {
            "set": opts.prompts,
            "n": len(prompts),
            "ids": [p.id for p in prompts],
            "selection": "evenly spaced over the set" if opts.num_prompts else "all",
        }

        if opts.backend == "vllm":
            from .vllm_backend import run_vllm_validation

            vm = run_vllm_validation(d, v, prompts, opts)
            report["device"] = vm.pop("device", {"device": "cuda"})
            report["vllm"] = vm.pop("server", {})
            report["metrics"] = vm
            report["k"] = len(vm.get("acceptance_at_pos") or [])
            results.append(skipped("parity", "--backend vllm: parity runs in the torch harness"))
            results.append(gate_acceptance(vm, min_tau=opts.min_tau))
            results.append(skipped("lossless", "--backend vllm: losslessness runs in the torch harness"))
            _copy_top(report, vm)
            report["summary"] = summary(vm)
            return _finish(report, results)

        device = resolve_device(opts.device)
        dt = torch_dtype(opts.dtype)
        torch.manual_seed(opts.seed)
        placement = plan_placement(v, d, device, opts.dtype)
        report["device"] = device_info(device)
        report["placement"] = placement
        report["torch_backends"] = torch_backend_flags()
        report["attn_implementation"] = opts.attn_implementation

        from ..drafters import load_drafter

        prog("loading drafter", 0, 1)
        drafter = load_drafter(d, v.local_dir, dtype=dt, device=device)
        k = int(drafter.num_draft_tokens)
        report.update(
            {
                "algorithm": drafter.algorithm,
                "k": k,
                "block_size": getattr(drafter, "block_size", None),
                "aux_layer_ids": list(drafter.aux_layer_ids),
            }
        )
        prog("loading verifier", 0, 1)
        runner = VerifierRunner.load(
            v.hub_id or v.local_dir,  # Hub ids load from the local HF cache
            device=device,
            dtype=opts.dtype,
            attn_implementation=opts.attn_implementation,
            aux_layer_ids=drafter.aux_layer_ids,
            device_map=placement.get("device_map"),
        )
        rendered = _render_all(prompts, runner.tokenizer)
        stops = runner.stop_token_ids()
        report["stop_token_ids"] = stops

        def run(name, dr, **kw):
            n = len(rendered)
            prog(name, 0, n)
            from .loop import run_requests

            return run_requests(
                runner,
                dr,
                rendered,
                max_new_tokens=opts.max_new_tokens,
                temperature=opts.temperature,
                stop_token_ids=stops,
                seed=opts.seed,
                on_done=lambda i, _r: prog(name, i + 1, n),
                **kw,
            )

        plain = run("plain decode (k=0)", None)
        spec = run("speculative decode", drafter)
        metrics = compute_metrics(spec, k, baseline=plain, seed=opts.seed)
        report["metrics"] = metrics
        if opts.onnx:  # ONNX Runtime as the drafter, side by side with the torch run
            from ..export.ort_validate import onnx_acceptance

            report["onnx"] = onnx_acceptance(opts.onnx, d, drafter, run, spec, plain, k, opts)
        _copy_top(report, metrics)

        source_metrics = None
        if src_info is not None:
            reference, ref_kind = _load_reference(src_info, runner, v, dt, device)
            saved = list(runner.aux_layer_ids)
            prog("parity", 0, 1)
            seqs = [(ids + r.output_ids, len(ids)) for (_, ids), r in zip(rendered[:PARITY_SEQUENCES], plain)]
            results_parity = gate_parity(reference, drafter, runner, seqs, dtype=opts.dtype, reference_kind=ref_kind)
            try:
                runner.set_aux_layer_ids(reference.aux_layer_ids)
                src_runs = run("source speculative decode", reference)
            finally:
                runner.set_aux_layer_ids(saved)
            source_metrics = compute_metrics(src_runs, int(reference.num_draft_tokens), baseline=plain, seed=opts.seed)
            report["source_metrics"] = source_metrics
        else:
            results_parity = skipped("parity", "no --source given")
        results.append(results_parity)
        results.append(gate_acceptance(metrics, source_metrics=source_metrics, min_tau=opts.min_tau))
        if opts.temperature > 0:
            g4 = sampler_check(seed=opts.seed)
        else:
            g4 = gate_lossless(spec, plain, dtype=opts.dtype)
            dv = g4.details.get("divergences", [])
            report["lossless"] = {
                "exact_match": g4.details.get("exact_match"),
                "n": g4.details.get("n"),
                "first_div": [x["first_divergence"] for x in dv],
                "near_tie": [x["near_tie"] for x in dv],
            }
        results.append(g4)

        if drafter.algorithm == "dspark":
            report["dspark"] = _dspark_extras(spec, run, drafter, opts)
        report["summary"] = summary(metrics)
        runner.close()
        _finish(report, results)
        if opts.onnx:
            from ..export.ort_validate import apply_onnx_gate

            apply_onnx_gate(report)
        return report


def _copy_top(report: dict, metrics: dict) -> None:
    for key in (
        "acceptance_length",
        "acceptance_at_pos",
        "conditional_acceptance_at_pos",
        "acceptance_rate",
        "num_drafts",
        "num_draft_tokens",
        "num_accepted_tokens",
        "tau_pooled",
        "tau_request_mean",
        "tau_ci95",
        "histogram",
        "tpot_ms",
        "tpot_ar_ms",
        "draft_ms",
        "verify_ms",
        "speedup",
    ):
        if key in metrics:
            report[key] = metrics[key]


def _load_reference(src_info: dict, runner, v, dtype, device):
    """Reference drafter for G2/G3: z-lab's forward for z-lab DFlash, else the source
    converted afresh loaded by specconv's reference drafter."""
    from ..drafters import load_drafter

    if src_info.get("format") == "zlab_dflash":
        try:
            from .zlab_reference import ZLabDFlashReference

            return ZLabDFlashReference(src_info["path"], runner.model, dtype=dtype, device=device), "zlab-dflash (dflash.model.DFlashDraftModel)"
        except InvalidInputError as e:
            log.warning("z-lab reference forward unavailable (%s); using the source converted afresh", e.message)
    return load_drafter(src_info["converted"], v.local_dir, dtype=dtype, device=device), f"specconv drafter on {src_info['format']} source converted afresh"


def _dspark_extras(spec, run, drafter, opts) -> dict:
    from .metrics import calibration, compute_metrics

    out: dict[str, Any] = {"calibration": calibration(spec)}
    if opts.confidence_threshold is not None and any(s.confidence for r in spec for s in r.steps):
        trunc = run("DSpark confidence-truncated decode", drafter, confidence_threshold=opts.confidence_threshold)
        m = compute_metrics(trunc, int(drafter.num_draft_tokens), seed=opts.seed)
        steps = [s for r in trunc for s in r.steps]
        out["truncated"] = {
            "threshold": opts.confidence_threshold,
            "rule": "verify the leading drafts whose cumulative confidence product is >= threshold",
            "acceptance_length": m["acceptance_length"],
            "acceptance_at_pos": m["acceptance_at_pos"],
            "num_drafts": m["num_drafts"],
            "num_draft_tokens": m["num_draft_tokens"],
            "mean_draft_tokens_per_step": (sum(s.k for s in steps) / len(steps)) if steps else None,
            "note": "not comparable with the full-block τ (validation.md §8)",
        }
    return out
