"""Float comparisons across two compute paths, for the tests (the one helper; issue 14 item 5).

Two compute paths over the same weights agree to rounding, never bit for bit: a batched
vs a per-row GEMM (padding changes the shapes), the ONNX attention op vs the eager formula,
a KV cache vs a full recompute, ONNX Runtime or another library's forward, and whatever
kernels the CPU's ATen capability selects (``ATEN_CPU_CAPABILITY`` = avx512 / avx2 /
default; an AMD EPYC and an Intel Xeon pick differently). So:

* floats are compared within the dtype's row of :data:`TOLERANCES` (``atol + rtol·|expected|``
  per element; ``±inf`` only where the expected value has the same ``±inf``, NaN never);
* token ids picked from those floats are compared exactly except at a *near-tie*: a row
  where the reference's top-1/top-2 logit margin is below the dtype's ``margin`` — the
  rule of G2 parity (``specconv.validate.gates.compare_logits``, which counts the top-1
  agreement only over clear-margin rows). Such a difference is counted (the helpers
  return it) and reported as a :class:`NearTieWarning`, never passed silently; rows after
  it are not compared, since they may condition on the other pick;
* greedy output sequences of two decode paths go through G4 itself
  (:func:`specconv.validate.gates.gate_lossless`): equal, or diverging where the
  verifier's own top-1/top-2 gap is a near-tie (counted and reported the same way).

Comparisons that are exact by construction stay exact (``torch.equal`` / ``==``) in the
tests: byte copies and casts of tensors, integer maps (d2t/t2d), index arithmetic, ids
derived from the very tensor they are compared with, and one code path run twice on the
same inputs (seeded determinism, masked entries that must not leak).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from specconv.validate.gates import PARITY_TOLERANCES, gate_lossless


class NearTieWarning(UserWarning):
    """Ids of two compute paths differed only where the reference's top-1/top-2 margin is a
    near-tie (legitimate rounding; shown in pytest's warnings summary)."""


@dataclass(frozen=True)
class Tolerance:
    """One dtype's row: elementwise ``|a − e| ≤ atol + rtol·|e|``; ids may differ only where
    the reference's top-1 − top-2 margin is below ``margin``."""

    atol: float
    rtol: float
    margin: float


_FP32 = PARITY_TOLERANCES["float32"]

#: dtype → tolerance between two compute paths of the same weights in that dtype.
TOLERANCES: dict[torch.dtype, Tolerance] = {
    # The harness verifier (tests/validate/drafter_doubles.tiny_verifier) runs in float64 so that
    # path differences (~1e-15 relative) never reach a top-1/top-2 gap; 1e-9 leaves six
    # orders of magnitude of headroom and still catches any wrong position or mask.
    torch.float64: Tolerance(atol=1e-9, rtol=1e-9, margin=1e-6),
    # G2's fp32 row (max |Δlogit| 1e-4, top-1 margin 1e-3; docs/validate.md). Reassociating a
    # reduction (AVX-512 vs AVX2 vs scalar lanes, a blocked GEMM, a fused attention) moves an
    # fp32 result by a few ulp per term; for the test models that is ≲1e-6 relative, so
    # rtol 1e-5 keeps 10× headroom while real mistakes (a wrong mask, RoPE position, missed
    # norm) move logits by O(0.1). margin 1e-3 ≥ 2·(atol + rtol·|logit|) for |logit| < 40:
    # an id with a clear margin cannot flip within tolerance.
    torch.float32: Tolerance(atol=float(_FP32["max_abs"]), rtol=1e-5, margin=float(_FP32["margin"])),
    # fp16 eps 9.8e-4: rtol ~1 ulp, atol 1e-2 for sums of O(1) terms rounded per op; margin is
    # G2's fp16 row (0.1 ≥ 2·(atol + rtol·|logit|) for |logit| < 40).
    torch.float16: Tolerance(atol=1e-2, rtol=1e-3, margin=float(PARITY_TOLERANCES["float16"]["margin"])),
    # bf16 eps 7.8e-3: rtol 1.6e-2 (2 ulp, torch.testing's own bf16 rtol), atol 5e-2; margin
    # is G2's bf16 row (0.5 ≥ 2·(atol + rtol·|logit|) for |logit| < 12).
    torch.bfloat16: Tolerance(atol=5e-2, rtol=1.6e-2, margin=float(PARITY_TOLERANCES["bfloat16"]["margin"])),
}


def tolerance(dtype: torch.dtype) -> Tolerance:
    """The row of :data:`TOLERANCES` for ``dtype`` (KeyError for a dtype without one)."""
    return TOLERANCES[dtype]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, *, what: str = "",
                 dtype: torch.dtype | None = None) -> float:
    """Assert two float tensors agree within the tolerance of ``dtype`` (default: the
    dtype of ``expected``; cast ``actual`` to it first when the paths return different dtypes).

    Non-finite entries must match exactly (same ``±inf`` positions, e.g. the ``-inf`` rows
    of a pruned vocabulary). Returns the max |Δ| over the finite entries.
    """
    tol = tolerance(dtype or expected.dtype)
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    torch.testing.assert_close(actual, expected, atol=tol.atol, rtol=tol.rtol, msg=lambda m: f"{what}: {m}")
    fin = torch.isfinite(expected)
    return float((actual[fin].double() - expected[fin].double()).abs().max()) if fin.any() else 0.0


def _rows(logits: torch.Tensor) -> torch.Tensor:
    return logits.reshape(-1, logits.shape[-1])


def top2_margin(logits: torch.Tensor) -> torch.Tensor:
    """Top-1 − top-2 value per row of ``logits`` ``[..., V]`` (float64, ``inf`` when V = 1)."""
    rows = _rows(logits).double()
    if rows.shape[-1] < 2:
        return torch.full(rows.shape[:1], float("inf"), dtype=torch.float64)
    top = torch.topk(rows, 2, dim=-1).values
    return top[:, 0] - top[:, 1]


def assert_ids_match(actual_ids: Any, expected_ids: Any, expected_logits: torch.Tensor, *,
                     what: str = "", dtype: torch.dtype | None = None) -> int:
    """Assert token ids of two paths are equal, row by row, up to a near-tie.

    Rows are read in order; the first row whose ids differ must be a near-tie of the
    reference (top-1 − top-2 margin < the dtype's ``margin``), else the assertion fails.
    Rows after it are not compared: they may condition on the other pick (DSpark's
    Markov head, the next step of a decode loop).

    Args:
        actual_ids, expected_ids: ids ``[...]`` (tensors or lists), one per row of
            ``expected_logits``.
        expected_logits: the reference path's logits ``[..., V]`` the ids were picked from
            (argmax, possibly through d2t: the margin is the same on the target-vocab view).
        dtype: selects the margin (default: the dtype of ``expected_logits``).

    Returns:
        1 when the ids differ at a near-tie (reported as a :class:`NearTieWarning`), else 0.
    """
    return int(_near_tie_row(actual_ids, expected_ids, expected_logits, what, dtype) is not None)


def _near_tie_row(actual_ids: Any, expected_ids: Any, expected_logits: torch.Tensor, what: str,
                  dtype: torch.dtype | None) -> int | None:
    """The row where the ids first differ, at a near-tie (asserted); ``None`` when equal."""
    tol = tolerance(dtype or expected_logits.dtype)
    a = torch.as_tensor(actual_ids).reshape(-1).long()
    e = torch.as_tensor(expected_ids).reshape(-1).long()
    marg = top2_margin(expected_logits)
    assert a.shape == e.shape == marg.shape, f"{what}: {a.shape[0]} / {e.shape[0]} ids for {marg.shape[0]} rows"
    diff = (a != e).nonzero().flatten().tolist()
    if not diff:
        return None
    j = diff[0]
    m = float(marg[j])
    assert m < tol.margin, (f"{what}: ids differ at row {j} with a clear top-1/top-2 margin "
                            f"{m:.6g} ≥ {tol.margin}: {int(a[j])} != {int(e[j])}")
    warnings.warn(NearTieWarning(f"{what}: ids differ at row {j} of {e.numel()}, a near-tie (top-1/top-2 "
                                 f"margin {m:.3g} < {tol.margin}); later rows not compared"), stacklevel=3)
    return j


def assert_logits_match(actual: torch.Tensor, expected: torch.Tensor, *, actual_ids: Any = None,
                        expected_ids: Any = None, what: str = "", dtype: torch.dtype | None = None) -> int:
    """Logit tensors ``[..., V]`` of two paths: ids (default: each side's argmax) as in
    :func:`assert_ids_match`, then :func:`assert_close` on the rows up to and including a
    near-tie difference (all rows without one). Returns 1 at a near-tie difference, else 0."""
    a = actual.argmax(-1) if actual_ids is None else actual_ids
    e = expected.argmax(-1) if expected_ids is None else expected_ids
    j = _near_tie_row(a, e, expected, what, dtype)
    if j is None:
        assert_close(actual, expected, what=what, dtype=dtype)
        return 0
    assert_close(_rows(actual)[: j + 1], _rows(expected)[: j + 1], what=what, dtype=dtype)
    return 1


def _greedy(x: Any, pid: str) -> Any:
    """A RequestResult-like for :func:`gate_lossless` (a plain id list carries no gaps)."""
    if isinstance(x, (list, tuple)):
        return SimpleNamespace(prompt_id=pid, output_ids=list(x), gaps=[], top1=[])
    return x


def greedy_result(output_ids: Sequence[int], logits: torch.Tensor, prompt_id: str = "") -> SimpleNamespace:
    """A RequestResult-like reference for :func:`assert_same_greedy` from a decode that
    recorded no gaps: ``logits`` ``[n, V]`` are the verifier's at the positions that picked
    ``output_ids`` (row i picked id i)."""
    top = torch.topk(logits.double(), 2, dim=-1).values
    return SimpleNamespace(prompt_id=prompt_id, output_ids=list(output_ids),
                           gaps=(top[:, 0] - top[:, 1]).tolist(), top1=top[:, 0].tolist())


def assert_same_greedy(actual: Any, expected: Any, *, dtype: str = "float32", what: str = "") -> int:
    """Greedy outputs of two decode paths are equal, or diverge at a verifier near-tie (G4).

    Args:
        actual: a :class:`~specconv.validate.loop.RequestResult` (or a list of ids).
        expected: the reference decode's RequestResult, which carries the verifier's
            top-1/top-2 ``gaps`` and ``top1`` logits at every output token (or a
            ``SimpleNamespace(prompt_id, output_ids, gaps, top1)``).
        dtype: the run dtype (G4's near-tie rule, :func:`specconv.validate.gates.near_tie`).

    Returns:
        1 when the outputs diverge at a near-tie (reported as a NearTieWarning), else 0.
    """
    g = gate_lossless([_greedy(actual, what)], [_greedy(expected, what)], dtype=dtype)
    assert g.passed, f"{what}: {g.errors}"
    return lossless_near_ties(g.details, what=what)


def lossless_near_ties(lossless: dict, *, what: str = "") -> int:
    """The divergences of a G4 result (``gate_lossless(...).details`` or a validate
    report's ``lossless``) must all sit at near-ties; returns (and reports) how many."""
    divs: Sequence[dict] = lossless.get("divergences") or []
    clear = [d for d in divs if not d.get("near_tie")]
    assert not clear, f"{what}: greedy outputs diverge at clear margins: {clear}"
    if divs:
        warnings.warn(NearTieWarning(f"{what}: {len(divs)} greedy output(s) diverge at a verifier "
                                     f"near-tie: {[d.get('first_divergence') for d in divs]}"), stacklevel=2)
    return len(divs)


def assert_same_draws(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], *,
                      what: str = "", max_fraction: float = 1e-3) -> int:
    """Tensors a seeded producer drew (``torch.randn`` / ``normal_`` initialisation) equal
    the committed ones, up to the CPU's RNG kernel.

    The RNG kernel is a compute path too: ``normal_`` runs a vectorised Box–Muller under
    AVX2 / AVX-512 and a scalar one under ``ATEN_CPU_CAPABILITY=default``; their float32
    draws differ in the last bits, and stored in a low-precision dtype a few of them round
    to the neighbouring value (about 1e-4 of a bf16 drafter's elements). So: the same
    names, dtypes and shapes; per tensor at most ``max_fraction`` of the elements differ,
    each by at most one rounding step of the stored dtype at the tensor's scale
    (``finfo(dtype).eps · max|expected|``). Another seed or initialisation differs almost
    everywhere. Returns the number of differing elements.
    """
    assert sorted(actual) == sorted(expected), f"{what}: tensor names differ"
    n = 0
    for k in sorted(expected):
        a, e = actual[k], expected[k]
        assert (a.dtype, a.shape) == (e.dtype, e.shape), f"{what}: {k} is {a.dtype} {tuple(a.shape)}"
        if torch.equal(a, e) or not e.is_floating_point():
            assert torch.equal(a, e), f"{what}: {k} (integer tensor) differs"
            continue
        diff = a.double() != e.double()
        step = torch.finfo(e.dtype).eps * float(e.double().abs().max())
        worst = float((a.double() - e.double()).abs().max())
        assert float(diff.double().mean()) <= max_fraction, f"{what}: {k}: {int(diff.sum())} of {e.numel()} differ"
        assert worst <= step, f"{what}: {k}: max |Δ| {worst:.3g} > one {e.dtype} step {step:.3g}"
        n += int(diff.sum())
    return n
