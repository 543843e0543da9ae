"""``--backend torch``: G2–G4 and τ in specconv's own speculative loop, as steps in the order of
``docs/validate.md`` ("What it does").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from ..verifier import Verifier
    from .backend import PlacedDrafter
    from .verifier_runner import VerifierRunner

from ..errors import InvalidInputError
from .backend import ValidationRun, copy_top

log = logging.getLogger("specconv.validate")

#: Prompts used for the G2 parity sequences (the first N of the run).
PARITY_SEQUENCES = 8

def _float_numel(store) -> int:
    from ..format.facts import FLOAT_DTYPES

    return sum(i.numel for i in store.infos() if i.dtype in FLOAT_DTYPES)


def plan_placement(verifier: Verifier, drafter_dir: Path, device: str, dtype: str) -> dict:
    """Check that verifier + drafter fit on ``device`` (the rule: ``docs/validate.md``); choose ``device_map``.

    Returns ``{"device_map": None | "auto", "need_bytes", "free_bytes"}``; InvalidInputError (naming the
    sizes) when the models do not fit.
    """
    import torch

    from ..tensors import TensorStore

    out: dict[str, Any] = {"device_map": None}
    if not str(device).startswith("cuda"):
        return out
    el = torch.tensor([], dtype=getattr(torch, dtype)).element_size()
    v_bytes = _float_numel(verifier.store()) * el if verifier.hub_id is None else 0
    H, V = int(verifier.hidden_size), int(verifier.vocab_size)
    d_bytes = (_float_numel(TensorStore.open(drafter_dir)) + 2 * V * H) * el
    free, _total = torch.cuda.mem_get_info(torch.device(device).index or 0)
    need = int((v_bytes + d_bytes) * 1.15) + (1 << 30)
    out.update({"need_bytes": need, "free_bytes": int(free)})
    if need <= free:
        return out
    if _has_accelerate() and int(d_bytes * 1.15) + (1 << 30) <= free:
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


def _has_accelerate() -> bool:
    import importlib.util

    return importlib.util.find_spec("accelerate") is not None


@dataclass
class _Harness:
    """The loaded models of one torch run and a ``decode(name, drafter)`` over the prompts."""

    run: ValidationRun
    runner: VerifierRunner
    drafter: PlacedDrafter
    rendered: list[tuple[str, list[int]]]
    stops: list[int]
    dtype: torch.dtype
    device: str

    def decode(self, name: str, drafter, **kw):
        """Every prompt through :func:`~specconv.validate.loop.run_requests` (progress per request)."""
        from .loop import run_requests

        n, opts, prog = len(self.rendered), self.run.options, self.run.progress
        prog(name, 0, n)
        return run_requests(self.runner, drafter, self.rendered, max_new_tokens=opts.max_new_tokens,
                            temperature=opts.temperature, stop_token_ids=self.stops, seed=opts.seed,
                            on_done=lambda i, _r: prog(name, i + 1, n), drafter_cache=opts.drafter_cache, **kw)


class TorchBackend:
    """The torch harness (:mod:`.loop`): every gate, timings, DSpark extras."""

    name = "torch"

    def run(self, run: ValidationRun) -> None:
        h = self._load(run)
        try:
            self._gates(h)
        finally:
            h.runner.close()

    # -- steps ---------------------------------------------------------------------
    def _load(self, run: ValidationRun) -> _Harness:
        """Place, then load the drafter and the verifier runner (the prompts are the run's rendered ids)."""
        import torch

        from .report import device_info, torch_backend_flags
        from .runtimes import get_runtime
        from .verifier_runner import VerifierRunner, resolve_device, torch_dtype

        opts, rep, v = run.options, run.report, run.verifier
        device, dt = resolve_device(opts.device), torch_dtype(opts.dtype)
        torch.manual_seed(opts.seed)
        placement = plan_placement(v, run.drafter_dir, device, opts.dtype)
        rep.update(device=device_info(device), placement=placement, torch_backends=torch_backend_flags(),
                   attn_implementation=opts.attn_implementation)
        run.progress("loading drafter", 0, 1)
        drafter = get_runtime(opts.drafter_backend, "drafter backend").load(run.drafter_dir, v, path=None,
                                                                         dtype=opts.dtype, device=device,
                                                                         config=run.config)
        rep.update(algorithm=drafter.algorithm, k=int(drafter.num_draft_tokens),
                   block_size=getattr(drafter, "block_size", None), aux_layer_ids=list(drafter.aux_layer_ids))
        run.progress("loading verifier", 0, 1)
        runner = VerifierRunner.load(
            v.hub_id or v.local_dir,  # Hub ids load from the local HF cache
            device=device, dtype=opts.dtype, attn_implementation=opts.attn_implementation,
            aux_layer_ids=drafter.aux_layer_ids, device_map=placement.get("device_map"),
        )
        stops = runner.stop_token_ids()
        rep["stop_token_ids"] = stops
        return _Harness(run, runner, drafter, run.rendered, stops, dt, device)

    def _gates(self, h: _Harness) -> None:
        """Decode plainly and speculatively, then G2 (with a source), G3, G4, extras."""
        from ..format import algorithm
        from .gates import gate_acceptance
        from .metrics import compute_metrics, summary

        run, opts, k = h.run, h.run.options, int(h.drafter.num_draft_tokens)
        plain = h.decode("plain decode (k=0)", None)
        spec = h.decode("speculative decode", h.drafter)
        metrics = compute_metrics(spec, k, baseline=plain, seed=opts.seed)
        run.report["metrics"] = metrics
        run.spec_requests = list(spec)
        if opts.runtime:  # a registered runtime drafting the same requests, compared with this run
            from .runtimes import compare_runtime

            run.results.append(compare_runtime(run, h.drafter, h.decode, spec, plain))
        copy_top(run.report, metrics)
        source_metrics = self._source_gates(h, plain)
        run.results.append(gate_acceptance(metrics, source_metrics=source_metrics, min_tau=opts.min_tau))
        run.results.append(self._lossless(h, spec, plain))
        if algorithm(h.drafter.algorithm).markov_head:  # DSpark: confidence-head extras
            run.report["dspark"] = _dspark_extras(spec, h)
        run.report["summary"] = summary(metrics)
        if opts.compare:  # every --compare engine on the same token ids, judged against this run
            from .compare_run import compare_step

            compare_step(run, k)

    def _source_gates(self, h: _Harness, plain) -> dict | None:
        """G2 parity and the source drafter's τ (same loop, same prompts); None without a source."""
        from ..format import algorithm
        from .gates import gate_parity, skipped
        from .metrics import compute_metrics

        run = h.run
        if run.source is None:
            run.results.append(skipped("parity", "no --source given"))
            return None
        reference, ref_kind = _load_reference(run.source, h)
        run.progress("parity", 0, 1)
        seqs = [(ids + r.output_ids, len(ids))
                for (_, ids), r in zip(h.rendered[:PARITY_SEQUENCES], plain, strict=False)]
        tolerance = algorithm(h.drafter.algorithm).parity_tolerance(run.options.dtype).as_dict()
        run.results.append(gate_parity(reference, h.drafter, h.runner, seqs, dtype=run.options.dtype,
                                       reference_kind=ref_kind, tolerance=tolerance))
        saved = list(h.runner.aux_layer_ids)
        try:
            h.runner.set_aux_layer_ids(reference.aux_layer_ids)
            src_runs = h.decode("source speculative decode", reference)
        finally:
            h.runner.set_aux_layer_ids(saved)
        source_metrics = compute_metrics(src_runs, int(reference.num_draft_tokens), baseline=plain,
                                         seed=run.options.seed)
        run.report["source_metrics"] = source_metrics
        return source_metrics

    def _lossless(self, h: _Harness, spec, plain):
        """G4: greedy speculative == plain greedy; for T > 0 the rejection sampler's law."""
        from .gates import gate_lossless, sampler_check

        opts = h.run.options
        if opts.temperature > 0:
            return sampler_check(seed=opts.seed)
        g4 = gate_lossless(spec, plain, dtype=opts.dtype)
        dv = g4.details.get("divergences", [])
        h.run.report["lossless"] = {
            "exact_match": g4.details.get("exact_match"),
            "n": g4.details.get("n"),
            "first_div": [x["first_divergence"] for x in dv],
            "near_tie": [x["near_tie"] for x in dv],
        }
        return g4


def _load_reference(src_info: dict, h: _Harness):
    """Reference drafter for G2/G3: z-lab's forward for z-lab DFlash, else the source converted afresh."""
    from ..converters import REGISTRY
    from ..drafters import load_drafter

    model_class = getattr(REGISTRY.get(src_info.get("format") or ""), "reference_model", None)
    if model_class:
        try:
            from .zlab_reference import ZLabDFlashReference

            ref = ZLabDFlashReference(src_info["path"], h.runner.model, dtype=h.dtype, device=h.device,
                                      model_class=model_class)
            return ref, f"zlab-dflash ({model_class.replace(':', '.')})"
        except InvalidInputError as e:
            log.warning("z-lab reference forward unavailable (%s); using the source converted afresh", e.message)
    drafter = load_drafter(src_info["converted"], h.run.verifier, config=h.run.source_config, dtype=h.dtype,
                           device=h.device)
    return drafter, f"specconv drafter on {src_info['format']} source converted afresh"


def _dspark_extras(spec, h: _Harness) -> dict:
    """DSpark: confidence-head calibration, and τ when truncating at a confidence threshold
    (reported, not gated: a truncated block's τ is not comparable with the full block's)."""
    from .metrics import calibration, compute_metrics

    opts, drafter = h.run.options, h.drafter
    out: dict[str, Any] = {"calibration": calibration(spec)}
    if opts.confidence_threshold is not None and any(s.confidence for r in spec for s in r.steps):
        trunc = h.decode("DSpark confidence-truncated decode", drafter, confidence_threshold=opts.confidence_threshold)
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
            "note": "not comparable with the full-block τ (docs/validate.md)",
        }
    return out
