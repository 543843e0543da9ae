"""The cross-path float comparison helper (``tests/tolerances.py``) and the CPU kernels.

The helper must fail what it is there to catch (a logit moved by a real mistake, a changed
``-inf`` support, an id flipped at a clear margin, a lossless claim broken at a clear gap) and
pass — counted and reported — what two compute paths legitimately do. The float tests it
serves must pass whichever kernels ATen picks: ``ATEN_CPU_CAPABILITY=default`` and ``=avx2``
are what an Intel or AMD CPU may select (an AMD EPYC failed a bit-for-bit comparison before).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from tests.tolerances import (  # noqa: E402
    TOLERANCES,
    NearTieWarning,
    assert_close,
    assert_ids_match,
    assert_logits_match,
    assert_same_draws,
    assert_same_greedy,
    lossless_near_ties,
)

ROOT = Path(__file__).resolve().parents[2]


def _logits():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, generator=g)
    x[:, 3] = x.max(-1).values + 1.0  # row-wise clear top-1 (margin ≥ 1)
    x[2, 7] = x[2, 3] - 1e-5  # row 2: a near-tie between ids 3 and 7
    return x


def test_rounding_passes_and_real_differences_fail():
    x = _logits()
    assert assert_close(x * (1 + 1e-7), x) < 1e-5
    with pytest.raises(AssertionError, match="moved"):
        assert_close(x + 1e-3 * (x > 0), x, what="moved")  # a real mistake moves logits by more
    pruned = x.clone()
    pruned[:, 0] = float("-inf")
    with pytest.raises(AssertionError):
        assert_close(x, pruned)  # a changed -inf support (a vocab-map bug) never passes
    with pytest.raises(AssertionError):
        assert_close(x.double(), x)  # dtypes differ: the caller casts and says which row


def test_ids_equal_outside_near_ties_counted_and_reported():
    x = _logits()
    ids = x.argmax(-1)
    assert assert_ids_match(ids, ids, x) == 0
    flipped = ids.clone()
    flipped[2] = 7
    with pytest.warns(NearTieWarning, match="row 2"):
        assert assert_ids_match(flipped, ids, x, what="near") == 1
    clear = ids.clone()
    clear[1] = 5
    with pytest.raises(AssertionError, match="clear top-1/top-2 margin"):
        assert_ids_match(clear, ids, x)


def test_rows_after_a_near_tie_may_condition_on_the_other_pick():
    """DSpark's Markov head: once slot 2 picked the other near-tied id, slot 3 differs."""
    x = _logits()
    y = x.clone()
    y[3] += 1.0  # slot 3 conditioned on the other pick
    ids, other = x.argmax(-1), y.argmax(-1)
    other[2] = 7
    with pytest.warns(NearTieWarning):
        assert assert_logits_match(y, x, actual_ids=other, expected_ids=ids) == 1
    with pytest.raises(AssertionError):
        assert_logits_match(y, x)  # without the near-tie pick, slot 3 is a real difference


def test_greedy_sequences_use_g4_near_tie_rule():
    ref = SimpleNamespace(prompt_id="p", output_ids=[5, 6, 7, 8], gaps=[3.0, 2.0, 1e-6, 4.0],
                          top1=[10.0] * 4)
    assert assert_same_greedy([5, 6, 7, 8], ref) == 0
    with pytest.warns(NearTieWarning):
        assert assert_same_greedy([5, 6, 9, 1], ref) == 1  # forks at the near-tie token 2
    with pytest.raises(AssertionError, match="clear margin"):
        assert_same_greedy([5, 9, 7, 8], ref)  # token 1 has a clear gap: not lossless
    with pytest.raises(AssertionError):
        assert_same_greedy([5, 6, 7], ref)  # a dropped token is a divergence at a clear gap
    with pytest.raises(AssertionError):
        lossless_near_ties({"divergences": [{"near_tie": False, "first_divergence": 3}]})


def test_seeded_draws_equal_up_to_the_rng_kernel():
    w = (torch.randn(64, 64, generator=torch.Generator().manual_seed(0)) * 0.02).bfloat16()
    near = w.clone()
    near.view(-1)[:3] = (near.view(-1)[:3].float() * (1 + 2 ** -8)).bfloat16()  # the neighbouring bf16
    assert assert_same_draws({"w": near}, {"w": w}) <= 3
    other = (torch.randn(64, 64, generator=torch.Generator().manual_seed(1)) * 0.02).bfloat16()
    with pytest.raises(AssertionError, match="differ"):
        assert_same_draws({"w": other}, {"w": w})  # another seed
    with pytest.raises(AssertionError, match="step"):
        big = w.clone()
        big.view(-1)[0] += 0.05
        assert_same_draws({"w": big}, {"w": w})
    with pytest.raises(AssertionError, match="names"):
        assert_same_draws({"v": w}, {"w": w})


def test_each_margin_exceeds_twice_the_tolerance():
    """An id with a clear margin cannot flip while every logit stays within tolerance
    (logits up to 10 in magnitude, the size the test models produce)."""
    for dtype, t in TOLERANCES.items():
        assert t.margin >= 2 * (t.atol + t.rtol * 10), dtype


KEY_FLOAT_TESTS = ["tests/export/test_export_wrappers.py::test_wrapper_matches_forward_block",
                   "tests/export/test_export_wrappers.py::test_onnx_attention_path_matches_reference"]


@pytest.mark.slow
@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_float_tests_pass_with_each_cpu_capability(capability):
    """The key cross-path tests under the kernels another CPU would pick (a subprocess each:
    ATen reads ATEN_CPU_CAPABILITY once, at start-up)."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "OMP_NUM_THREADS": "1"}
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                           env=env, capture_output=True, text=True, check=True)
    if probe.stdout.strip().lower() != capability:  # e.g. avx2 on a CPU without it
        pytest.skip(f"this CPU runs {probe.stdout.strip()} kernels when asked for {capability}")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *KEY_FLOAT_TESTS],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "failed" not in r.stdout
