"""``validate --source`` reads a Speculators source the way its conversion did (issue 24 item 2).

A DSpark saved by speculators 0.9.0 with K = B-1 and no ``sample_from_anchor`` (as
speculators#737's converter leaves it) is converted with ``--sample-from-anchor``. Read as it
is, the source would be taken with the K rule (1+N) and G2 would compare the drafter with the
other layout (parity failed, max |Δlogit| ≈ 3.6, before the fix); the recorded option makes
``validate`` convert the source afresh with it, and every gate passes.
"""

from __future__ import annotations

import json

import pytest

import fixtures_peagle as fp
from cli_runner import invoke

pytestmark = [pytest.mark.peer, pytest.mark.usefixtures("one_thread_module")]
pytest.importorskip("speculators")
pytest.importorskip("loguru")


@pytest.mark.slow
def test_a_flag_decided_layout_passes_g2_against_its_speculators_source(validate_set, tmp_path):
    from specconv.cli.validate import validate_cmd

    v = validate_set["verifier"]
    built = fp.build_speculators_block(v, tmp_path / "built", "dspark", sample_from_anchor=False, dtype="float32",
                                       aux=[1, 2, 3])
    src = fp.trainer_save_dir(tmp_path / "save", {0: built}, config_drop=("sample_from_anchor",)) / "0"
    out = tmp_path / "out"
    r = invoke("convert", src, "--verifier", v, "--verifier-name", "org/tiny-llama", "-o", out, "--sample-from-anchor")
    assert r.code == 0, r.stdout
    r = invoke(out, "--verifier", v, "--source", src, "--prompts", validate_set["prompts"], "--num-prompts", 2,
               "--max-new-tokens", 8, "--report-dir", tmp_path / "rep", command=validate_cmd)
    rep = json.loads(r.stdout)
    assert r.code == 0, rep
    assert rep["source"]["kind"] == "converted" and rep["source"]["record_check"]["matches_record"] is True
    assert rep["gates"] == {"structure": True, "parity": True, "acceptance": True, "lossless": True}
    parity = next(g for g in rep["gate_results"] if g["name"] == "parity")
    assert parity["details"]["max_abs"] < 1e-4
