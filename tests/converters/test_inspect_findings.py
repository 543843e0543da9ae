"""``inspect SRC --verifier V`` runs the lint ``convert --dry-run`` runs (the planned config
and tensors against the verifier's facts, its tokenizer's special tokens included), so the
two report the same findings; on the converted dir ``inspect --verifier`` reports them too.

The input is the shipped example (``examples/smollm2-dflash-b8``) with the bundled SmolLM2
verifier: its mask token id is one of SmolLM2's added special tokens (``mask-token-special``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_runner import invoke

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2-dflash-b8"


def _codes(*argv) -> list[str]:
    code, obj = invoke(*argv).code_json
    assert code == 0, obj
    return sorted(f["code"] for f in obj["findings"])


@pytest.mark.slow
def test_inspect_with_a_verifier_reports_the_findings_convert_dry_run_reports(smollm2_dir, tmp_path):
    for name in ((), ("--verifier-name", "HuggingFaceTB/SmolLM2-135M-Instruct")):
        dry = _codes("convert", EXAMPLE, "--verifier", smollm2_dir, *name, "--dry-run")
        assert "mask-token-special" in dry
        assert _codes("inspect", EXAMPLE, "--verifier", smollm2_dir, *name) == dry
    out = tmp_path / "out"
    code, obj = invoke("convert", EXAMPLE, "--verifier", smollm2_dir, *name, "-o", out).code_json
    assert code == 0, obj
    assert _codes("inspect", out, "--verifier", smollm2_dir, *name) == sorted(f["code"] for f in obj["findings"])
