"""SGLang 0.5.23 as a real consumer: its own loader takes the bundled z-lab DFlash drafter.

``specconv/engines/sglang/runner.py`` runs in the loader venv ``.venv-sglang`` (``make
sglang-venv``; ``make test`` builds it). All dirs load in ONE subprocess, the room's
(``sglang_batch.py``: :func:`specconv.engines.sglang.check.run_checks` with the other module's checks; the
import costs 20–80 s on 2 busy cores): the bundled drafter as it ships, two broken copies that a
non-strict loader would accept silently (a renamed tensor, a missing tensor), and tiny
DeepSpec-layout DSpark drafts (``Qwen3DSparkModel``, the layout SGLang reads) with the
confidence head that SGLang builds only outside ``SGLANG_RAGGED_VERIFY_MODE=static``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import sglang_batch

import fixtures_dspark as fs

REPO = Path(__file__).resolve().parents[2]
DRAFTER = REPO / "examples" / "smollm2-dflash-b8"
SGLANG_PY = REPO / ".venv-sglang" / "bin" / "python"

pytestmark = [pytest.mark.sglang, pytest.mark.slow,
              pytest.mark.skipif(not SGLANG_PY.is_file(), reason="no .venv-sglang: build it with `make sglang-venv`")]


def _broken_copy(dst: Path, edit) -> Path:
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    shutil.copy(DRAFTER / "config.json", dst / "config.json")
    tensors = load_file(str(DRAFTER / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def sglang_jobs(root: Path, smollm2_dir: Path, tiny_verifier_dir: Path):
    """The runner's checks of the bundled drafter, its two broken copies and the two DSpark
    drafts (``tests/sglang_check/sglang_batch.py`` runs them with the room's other checks in one
    subprocess); ``results`` is the runner's ``{env, results}`` for them, in this order."""
    dspark = [fs.make_deepspec_dspark(root / name, tiny_verifier_dir, target_layer_ids=(0, 2, 4), embed=False,
                                      extra_cfg=extra) for name, extra in (("dspark", {}),
                                                                            ("dspark-1n",
                                                                             {"sample_from_anchor": False}))]
    renamed = _broken_copy(root / "renamed", lambda t: t.__setitem__("layers.0.mlp.up.weight",
                                                                      t.pop("layers.0.mlp.up_proj.weight")))
    missing = _broken_copy(root / "missing", lambda t: t.pop("layers.1.self_attn.k_norm.weight"))
    checks = ([{"dir": str(d), "verifier": str(smollm2_dir)} for d in (DRAFTER, renamed, missing)]
              + [{"dir": str(d), "verifier": str(tiny_verifier_dir)} for d in dspark])
    return checks, lambda result: result


@pytest.fixture(scope="module")
def results(request):
    return sglang_batch.share(request, __name__)


def test_sglang_loads_the_bundled_zlab_dflash_drafter_strictly(results):
    r = results["results"][0]
    assert r["ok"], r["errors"]
    assert r["class"] == "DFlashDraftModel" and r["sglang"] == "0.5.23"
    assert r["unfilled_params"] == [] and r["unconsumed_tensors"] == []
    assert r["checkpoint_tensors"] == 25  # every tensor of model.safetensors reached a weight loader
    res = r["resolved"]
    assert res["captured_layer_ids"] == [1, 14, 27] and res["capture_layer_inputs"] == [2, 15, 28]
    assert (res["block_size"], res["mask_token_id"]) == (8, 16)
    assert res["draft_rows"] == [1, 2, 3, 4, 5, 6, 7] and res["sample_from_anchor"] is False  # SGLang's own sampler
    assert res["verifier_layers"] == 30
    assert set(r["stubs_used"]) <= {"torchvision", "vllm._custom_ops"}


def test_the_stubs_are_recorded_and_never_called(results):
    env = results["env"]
    assert env["sglang"] == "0.5.23" and env["SGLANG_RAGGED_VERIFY_MODE"] == "compact"
    stubs = {s["name"]: s for s in env["stubs"]}
    assert set(stubs) <= {"torchvision", "vllm._custom_ops"}
    assert not any("(CALLED)" in u for s in stubs.values() for u in s["used"])


def test_a_renamed_tensor_is_named_twice(results):
    r = results["results"][1]
    assert not r["ok"]
    assert r["unconsumed_tensors"] == ["layers.0.mlp.up.weight"]
    assert r["unfilled_params"] == ["layers.0.mlp.gate_up_proj.weight"]  # fused: the up half stays NaN


def test_a_missing_tensor_leaves_its_parameter_unfilled(results):
    r = results["results"][2]
    assert not r["ok"]
    assert r["unconsumed_tensors"] == []
    assert r["unfilled_params"] == ["layers.1.self_attn.k_norm.weight"]


def test_dspark_loads_with_its_markov_and_confidence_heads(results):
    anchor, one_n = results["results"][3], results["results"][4]
    for r in (anchor, one_n):
        assert r["ok"], r["errors"]
        assert r["class"] == "Qwen3DSparkModel" and r["unfilled_params"] == [] and r["unconsumed_tensors"] == []
        res = r["resolved"]
        assert res["confidence_head"] is True and (res["markov_rank"], res["markov_head_type"]) == (8, "vanilla")
        assert res["captured_layer_ids"] == [0, 2, 4] and (res["block_size"], res["mask_token_id"]) == (4, fs.MASK)
    assert anchor["checkpoint_tensors"] == 29  # body 25 (2 layers) + markov w1/w2 + confidence weight/bias
    assert anchor["resolved"]["sample_from_anchor"] is True  # SGLang's default when the key is absent
    assert one_n["resolved"]["sample_from_anchor"] is False
