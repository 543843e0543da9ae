"""``specconv release`` records the same ``validation`` section as ``specconv validate``
(issue 15 item 2): release calls the library's ``convert()`` and ``validate_drafter()``, which
finish their own work, so there is one writer of the section.

The same z-lab DFlash drafter (the tiny SmolLM2-tokenizer set of ``tests/test_validate_cli.py``)
is converted twice: once by ``specconv convert`` + ``specconv validate --source``, once by
``specconv release --dry-run`` against the loopback Hub double (``tests/hub_double.py``), both
in subprocesses with one thread. The two ``validation`` sections are compared key for key
(the section holds no timestamp); the drafters and reports sit at the same depth, so their
relative paths are equal too. Both render the prompts with the same ``--chat-template FILE
--thinking off`` (issue 25: release takes and records the options validate takes).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("dflash")
pytest.importorskip("jinja2")

from chat_templates import THINKING_TEMPLATE  # noqa: E402
from cli_runner import run_in  # noqa: E402
from hub_double import HubDouble  # noqa: E402

TINY = ("--num-prompts", "1", "--max-new-tokens", "4", "--device", "cpu")


def _cli(cwd: Path, *argv, endpoint: str | None = None) -> tuple[int, dict]:
    r = run_in(cwd, *argv, endpoint=endpoint, token="hf_specconvFAKE0", cwd=cwd, timeout=900)
    assert r.stdout.strip(), r.stderr[-3000:]
    return r.code_json


@pytest.mark.slow
def test_release_records_the_validation_section_validate_records(tmp_path, smollm2_dir):
    import torch

    from conftest import make_validate_set
    from specconv.record import read_record

    torch.manual_seed(0)
    b = make_validate_set(tmp_path / "set", smollm2_dir)
    name = ("--verifier", b["verifier"], "--verifier-name", "org/tiny-llama")
    a, w = tmp_path / "a", tmp_path / "w"
    (tmp_path / "thinking.jinja").write_text(THINKING_TEMPLATE)
    chat = ("--chat-template", tmp_path / "thinking.jinja", "--thinking", "off")
    code, _ = _cli(tmp_path / "cwd", "convert", b["zlab"], *name, "-o", a / "drafter")
    assert code == 0
    code, report = _cli(tmp_path / "cwd", "validate", a / "drafter", "--verifier", b["verifier"], "--source", b["zlab"],
                        "--prompts", b["prompts"], *TINY, *chat, "--report-dir", a / "report")
    assert code == 0 and report["passed"] is True, report
    double = HubDouble().start()
    try:
        code, released = _cli(tmp_path / "cwd", "release", b["zlab"], *name, "--repo-id", "specconv-test/sections",
                              "--work-dir", w, "--prompts", b["prompts"], *TINY, *chat, "--dry-run",
                              endpoint=double.url)
    finally:
        double.stop()
    assert code == 0 and released["status"] == "dry_run", released
    by_validate = read_record(a / "drafter").validation.model_dump(mode="json", exclude_unset=True)
    by_release = read_record(w / "drafter").validation.model_dump(mode="json", exclude_unset=True)
    assert by_release == by_validate
    # the one section holds everything either command recorded before: parity, losslessness, verifier, versions
    assert {"parity_kl_max", "lossless_exact_match", "verifier", "versions", "tau_ci95", "files", "report"} <= set(
        by_validate)
    assert by_validate["verifier"] == "../../set/verifier" and by_validate["report"] == "../report/validation.json"
    assert {k: by_release["chat_template"][k] for k in ("source", "path", "kwargs", "thinking")} == {
        "source": "file", "path": "../../thinking.jinja", "kwargs": {"enable_thinking": False}, "thinking": "off"}
    assert released["validate"]["parity_kl_max"] == by_release["parity_kl_max"]
    # both cards are rendered from that section, so they show the same validation table
    card_a, card_w = (a / "drafter" / "README.md").read_text(), (w / "drafter" / "README.md").read_text()
    assert f"{by_validate['parity_kl_max']:.2e}" in card_a and f"{by_validate['parity_kl_max']:.2e}" in card_w
