"""The drafter dir's own README.md: rendered at convert time from the record, refreshed
after validate (the τ row) — through the real CLI on the bundled drafter and SmolLM2."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jinja2")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "smollm2-dflash-b8"
VERIFIER = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _cli(cwd: Path, *argv) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "specconv.cli.main", *map(str, argv)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def _front_matter(text: str) -> dict:
    import yaml

    m = re.match(r"^---\n(.*?)\n---\n", text, re.S)
    assert m, text[:300]
    return yaml.safe_load(m.group(1))


def test_convert_writes_the_card_and_validate_refreshes_it(tmp_path, smollm2_dir):
    out = tmp_path / "drafter"
    r = _cli(tmp_path, "convert", EXAMPLE, "--verifier", smollm2_dir, "--verifier-name", VERIFIER, "-o", out)
    assert r.returncode == 0, r.stderr[-2000:]
    card = (out / "README.md").read_text()
    meta = _front_matter(card)
    assert meta["library_name"] == "speculators" and meta["base_model"] == VERIFIER
    assert {"dflash", "speculative-decoding", "vllm"} <= set(meta["tags"])
    assert "| acceptance length τ |" not in card  # not validated yet
    from specconv.publish.card import write_local_card

    assert write_local_card(out).read_text() == card  # deterministic: same record, same bytes
    r = _cli(tmp_path, "validate", out, "--verifier", smollm2_dir, "--prompts", "humaneval", "--num-prompts", "2",
             "--max-new-tokens", "16", "--device", "cpu", "--report-dir", tmp_path / "report")
    assert r.returncode in (0, 4), r.stderr[-2000:]
    from specconv.record import read_record

    tau = read_record(out).validation.acceptance_length
    refreshed = (out / "README.md").read_text()
    assert f"| acceptance length τ | {tau:.3f}" in refreshed, refreshed
    assert _front_matter(refreshed)["base_model"] == VERIFIER
