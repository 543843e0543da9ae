"""`specconv validate` on the real SmolLM2-135M verifier with a z-lab DFlash source
(written by z-lab's own code) converted by the registry: all four gates, 2 prompts."""

from __future__ import annotations

import json

import pytest
from cli_runner import invoke

torch = pytest.importorskip("torch")
pytest.importorskip("dflash")

from tests.tolerances import lossless_near_ties  # noqa: E402


@pytest.mark.slow
def test_validate_smollm2_zlab_dflash(tmp_path, smollm2_dir, one_thread):
    from examples.zlab_dflash import make_zlab_dflash
    from specconv.cli.validate import validate_cmd
    from specconv.convert import convert

    z = make_zlab_dflash(tmp_path / "zlab", dtype="bfloat16")
    spec = tmp_path / "spec"
    convert(str(z), verifier=str(smollm2_dir), output=spec)
    r = invoke(spec, "--verifier", smollm2_dir, "--source", z, "--num-prompts", "2",
               "--max-new-tokens", "16", "--report-dir", tmp_path / "rep", command=validate_cmd)
    assert r.code == 0, r.output
    out = json.loads(r.stdout)
    assert out["gates"] == {"structure": True, "parity": True, "acceptance": True, "lossless": True}
    assert out["k"] == 7 and out["aux_layer_ids"] == [2, 15, 28]
    # random-init drafter: the harness must see it as (nearly) useless
    assert out["acceptance_length"] < 1.1
    lossless_near_ties(out["lossless"], what="validate")  # equal, or apart only at near-ties
    parity = next(g for g in out["gate_results"] if g["name"] == "parity")["details"]
    assert parity["aux_layer_ids"] == {"reference": [2, 15, 28], "converted": [2, 15, 28]}
    assert parity["top1_agree"] == 1.0  # every clear-margin slot; near-ties may differ (G2's rule)
    assert out["stop_token_ids"] == [2]
