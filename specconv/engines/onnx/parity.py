"""Numerical parity of an exported graph with the PyTorch wrapper (ONNX Runtime CPU; the ONNX
reference evaluator for small bf16 graphs): :data:`TOLERANCES`, docs/engines.md, "Parity and acceptance".
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

__all__ = ["TOLERANCES", "parity_inputs", "run_ort", "compare", "check_parity"]

#: dtype → (atol used for the near-tie margin, max |Δ| gate or None = report only)
TOLERANCES = {"float32": (1e-3, 1e-3), "float16": (5e-2, None), "bfloat16": (1e-1, None)}
#: the reference evaluator is pure Python: only graphs up to this many weights
_REFERENCE_EVALUATOR_MAX_PARAMS = 2_000_000


def parity_inputs(shape, *, sampling_noise: bool, seed: int = 0,
                  max_context: int = 4096) -> list[tuple[torch.Tensor, ...]]:
    """Two input sets of step ``shape``: batch 1 (context 12) and a left-padded batch 3 (contexts
    3/17/30), capped at ``max_context``; Gaussian aux states with a few large outlier channels (as
    real ones have), uniform ids."""
    from ...drafters.step import batch_inputs

    g = torch.Generator().manual_seed(seed)
    sets = []
    for lengths in ((12,), (3, 17, 30)):
        reqs = []
        for T in lengths:
            T = min(T, max_context)
            aux = torch.randn(T, shape.aux_width, generator=g)
            aux[:, :: max(1, shape.aux_width // 8)] *= 20.0
            reqs.append((torch.randint(0, shape.vocab_size, (T + 1,), generator=g), aux))
        sets.append(batch_inputs(shape, reqs, sampling_noise=sampling_noise))
    return sets


def _np(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def run_ort(path: Path, names: list[str], inputs: tuple[torch.Tensor, ...], session=None):
    """Run a graph with ONNX Runtime (CPU) → list of numpy outputs."""
    sess = session or ort_session(path)
    return sess.run(None, {n: _np(t) for n, t in zip(names, inputs, strict=True)})


def ort_session(path: Path):
    """An ONNX Runtime CPU session (threads = torch's intra-op threads) of the graph file at
    ``path``, loaded as written (its external data beside it)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = max(1, torch.get_num_threads())
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def run_reference(path: Path, names: list[str], inputs: tuple[torch.Tensor, ...]):
    """Run the graph file at ``path`` with ``onnx.reference.ReferenceEvaluator``
    (bf16-capable, slow; weights loaded into memory, small graphs only)."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    ev = ReferenceEvaluator(onnx.load(str(path)))  # the file's graph and its external data
    return ev.run(None, {n: _np(t) for n, t in zip(names, inputs, strict=True)})


def _upstream(diff: np.ndarray) -> np.ndarray:
    """Bool ``[B, N]``: the drafts up to and including each request's first flip (a sequential stage's later
    drafts are conditioned on a different pick, so they are not comparable)."""
    return np.cumsum(diff, axis=-1) - diff == 0


def compare(ref: dict[str, torch.Tensor], got: dict[str, np.ndarray], atol: float, *, sequential: bool = False) -> dict:
    """Compare graph outputs ``got`` with the torch wrapper's ``ref`` (with ``logits``), fp32; a near
    tie is a torch top-1/top-2 margin below ``2·atol``; ``sequential`` (``ExportFacts.sequential_picks``):
    each request is compared up to its first flip.

    Returns:
        ``{"top1": agreement, "n": drafts, "mismatches", "near_tie_mismatches",
        "max_abs": {output: max |Δ|}}``.
    """
    t_ids = ref["draft_ids"].numpy()
    g_ids = got["draft_ids"]
    top2 = torch.topk(ref["logits"].nan_to_num(neginf=-1e30), 2, dim=-1).values
    margin = (top2[..., 0] - top2[..., 1]).numpy()
    diff = t_ids != g_ids
    keep = _upstream(diff) if sequential else np.ones_like(diff, dtype=bool)
    diff = diff & keep
    max_abs: dict[str, float] = {}
    out = {"n": int(t_ids.size), "top1": float(1.0 - diff.mean()), "mismatches": int(diff.sum()),
           "near_tie_mismatches": int((diff & (margin < 2 * atol)).sum()), "max_abs": max_abs}
    for name, arr in got.items():
        if name in ("draft_ids", "topk_ids"):
            continue
        r = ref[name].to(torch.float32).numpy()
        a = np.asarray(arr, dtype=np.float32)
        if sequential and r.shape[:2] == keep.shape:
            r, a = r[keep], a[keep]
        fin = np.isfinite(r) & np.isfinite(a)
        if not np.array_equal(np.isfinite(r), np.isfinite(a)):
            max_abs[name] = float("inf")
            continue
        max_abs[name] = float(np.abs(r[fin] - a[fin]).max()) if fin.any() else 0.0
    return out


def check_parity(path: Path, wrapper_all, output_names: list[str], input_names: list[str],
                 dtype: str, *, sampling_noise: bool, max_context: int = 4096) -> dict:
    """Parity of the graph at ``path`` with ``wrapper_all`` (eager, every output).

    Returns:
        ``{"runtime", "dtype", "cases": [...], "passed": bool | None, "tolerance"}``;
        ``passed`` is None when no runtime could run the graph (reason in ``skipped``).
    """
    from ...format.algorithms import algorithm

    atol, gate = TOLERANCES[dtype]
    sequential = algorithm(wrapper_all.shape.algorithm).export.sequential_picks
    n_params = sum(p.numel() for p in wrapper_all.parameters())
    runtime = "onnxruntime-cpu"
    if dtype == "bfloat16":
        if n_params > _REFERENCE_EVALUATOR_MAX_PARAMS:
            return {"runtime": None, "dtype": dtype, "passed": None,
                    "skipped": f"bf16 graph with {n_params} weights: ONNX Runtime CPU cannot run "
                               "bf16 and the reference evaluator is too slow; checked by the fp32 twin"}
        runtime = "onnx-reference-evaluator"
    sess = ort_session(path) if runtime == "onnxruntime-cpu" else None
    cases = []
    for inputs in parity_inputs(wrapper_all.shape, sampling_noise=sampling_noise, max_context=max_context):
        with torch.no_grad():
            ref = dict(zip(wrapper_all.output_names, wrapper_all(*inputs), strict=True))
        if sess is not None:
            raw = run_ort(path, input_names, inputs, sess)
        else:
            try:
                raw = run_reference(path, input_names, inputs)
            except (TypeError, ValueError, NotImplementedError) as e:  # evaluator op gaps
                return {"runtime": runtime, "dtype": dtype, "passed": None,
                        "skipped": f"the ONNX reference evaluator cannot run this graph "
                                   f"({type(e).__name__}: {str(e)[:200]}); checked by the fp32 twin"}
        got = dict(zip(output_names, raw, strict=True))
        case = compare(ref, got, atol, sequential=sequential)
        case["shape"] = {"batch": int(inputs[0].shape[0]), "context": int(inputs[0].shape[1])}
        cases.append(case)
    ok_top1 = all(case["mismatches"] == (0 if gate else case["near_tie_mismatches"]) for case in cases)
    worst = max(max(case["max_abs"].values(), default=0.0) for case in cases)
    passed = ok_top1 and (gate is None or worst <= gate)
    return {"runtime": runtime, "dtype": dtype, "cases": cases, "max_abs": worst,
            "top1": min(case["top1"] for case in cases), "passed": bool(passed),
            "tolerance": {"max_abs": gate, "near_tie_margin": 2 * atol,
                          "top1": "100%" if gate else "100% outside near-ties"}}
