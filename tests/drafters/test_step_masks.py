"""The drafting step's attention masks against speculators 0.9.0's own mask functions.

speculators builds its training masks as flex-attention ``mask_mod`` functions
(``src/speculators/models/peagle/attention.py::create_peagle_mask_mod``,
``src/speculators/models/dflash/attention.py::create_anchor_block_mask_mod``); evaluated on
the grid of one drafting step they are an independent oracle for the explicit boolean masks
the step builds (``PEagleDrafter.entry_mask``, ``DFlashDrafter.block_mask``), including the
sliding-window edges (a window smaller than the depth) and left padding.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("speculators")

from speculators.models.dflash.attention import create_anchor_block_mask_mod  # noqa: E402
from speculators.models.peagle.attention import create_peagle_mask_mod  # noqa: E402
from test_drafters import H, make_dflash, make_peagle  # noqa: E402

from specconv.drafters import load_drafter  # noqa: E402
from specconv.drafters.step import StepBatch, batch_inputs  # noqa: E402


def _grid(mask_mod, q_len: int, kv_len: int) -> torch.Tensor:
    q, kv = torch.arange(q_len)[:, None], torch.arange(kv_len)[None, :]
    zero = torch.tensor(0)
    return mask_mod(zero, zero, q, kv).expand(q_len, kv_len)


def _batch(drafter, lengths) -> StepBatch:
    reqs = [(torch.zeros(T + 1, dtype=torch.long), torch.zeros(T, len(drafter.aux_layer_ids) * H)) for T in lengths]
    shape = drafter.shape
    return StepBatch.of(shape.input_names(), batch_inputs(shape, reqs))


@pytest.mark.parametrize("window", [None, 2, 5])
@pytest.mark.parametrize("T", [1, 4, 9])
def test_peagle_mask_is_speculators_mask(tmp_path, verifier_dir, window, T):
    K = 4
    drafter = load_drafter(make_peagle(tmp_path / "pe", K=K), verifier_dir)
    drafter.windows = [window] * len(drafter.layers)
    anchor = torch.cat([torch.arange(T), torch.full((K - 1,), T - 1)])
    depth = torch.cat([torch.zeros(T, dtype=torch.long), torch.arange(1, K)])
    ref = _grid(create_peagle_mask_mod(anchor, depth, torch.zeros(T, dtype=torch.long), window), T + K - 1, T + K - 1)
    ours = drafter.entry_mask(0, *drafter.entries(_batch(drafter, [T])))[0]
    assert torch.equal(ours, ref)
    # left-padded next to a longer request: the real rows see exactly the same entries
    padded = drafter.entry_mask(0, *drafter.entries(_batch(drafter, [T, T + 3])))[0]
    keep = torch.cat([torch.arange(3, 3 + T), torch.arange(T + 3, T + 3 + K - 1)])
    assert torch.equal(padded[keep][:, keep], ref)
    assert not padded[keep][:, :3].any()  # padding is never a key of a real row
    assert padded.any(-1).all()  # every row (padding too) sees a key: no NaN


@pytest.mark.parametrize("window,non_causal", [(None, False), (3, False), (3, True), (20, False)])
@pytest.mark.parametrize("T", [2, 8])
def test_dflash_mask_is_speculators_mask(tmp_path, verifier_dir, window, non_causal, T):
    B = 4
    lt = ["sliding_attention" if window else "full_attention"] * 2
    drafter = load_drafter(make_dflash(tmp_path / "d", block=B, layer_types=lt, sliding_window=window,
                                       non_causal=non_causal), verifier_dir)
    assert drafter.windows == [window] * 2
    # speculators' base sequence holds the anchor at position T (never a key of its own block)
    mod, q_len, kv_len = create_anchor_block_mask_mod(torch.zeros(T + 1, dtype=torch.long), T + 1,
                                                      torch.tensor([T]), B, window, non_causal)
    ref = _grid(mod, q_len, kv_len)
    ref = torch.cat([ref[:, :T], ref[:, T + 1:]], dim=1)  # drop the anchor's base column
    assert torch.equal(drafter.block_mask(0, _batch(drafter, [T]))[0], ref)
    padded = drafter.block_mask(0, _batch(drafter, [T, T + 2]))[0]
    assert torch.equal(padded[:, 2:], ref) and not padded[:, :2].any()
