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


@pytest.mark.slow
def test_base_model_verifier_with_plain_prompts(tmp_path, smollm2_dir, bundled_drafter_copy, one_thread):
    """A verifier without a chat template (SmolLM2's files with ``chat_template.jinja`` left out: a
    base model) validates with ``--chat-template none`` and plain ``prompt`` strings; without the
    flag it is refused naming it, and a ``messages`` prompt is refused under it (exit 3 each)."""
    from specconv.cli.validate import validate_cmd

    base = tmp_path / "base"
    base.mkdir()
    for f in smollm2_dir.iterdir():
        if f.name != "chat_template.jinja":
            (base / f.name).symlink_to(f)
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"id": "q1", "prompt": "def fibonacci(n):"}\n'
                     '{"id": "q2", "prompt": "The capital of France is"}\n')
    args = ["--verifier", base, "--prompts", plain, "--num-prompts", "2", "--max-new-tokens", "8",
            "--report-dir", tmp_path / "rep"]
    r = invoke(bundled_drafter_copy, *args, command=validate_cmd, catch=True)
    assert r.code == 3 and json.loads(r.stdout)["error"] == "no_chat_template", r.output
    assert "--chat-template none" in json.loads(r.stdout)["hint"]
    r = invoke(bundled_drafter_copy, *args, "--chat-template", "none", command=validate_cmd, catch=True)
    assert r.code == 0, r.output
    out = json.loads(r.stdout)
    assert out["gates"] == {"structure": True, "acceptance": True, "lossless": True}
    assert out["chat_template"] == {"source": "none", "path": None, "sha256": None, "kwargs": {}, "thinking": None,
                                    "thinking_option": "auto", "add_generation_prompt": None}
    assert out["options"]["chat"] == {"template": "none", "kwargs": {}, "thinking": "auto"}
    rec = json.loads((bundled_drafter_copy / "specconv.json").read_text())["validation"]
    assert rec["chat_template"]["source"] == "none"
    assert "no chat template (plain prompts" in (bundled_drafter_copy / "README.md").read_text()
    msgs = tmp_path / "messages.jsonl"
    msgs.write_text('{"id": "m1", "messages": [{"role": "user", "content": "Hi"}]}\n')
    r = invoke(bundled_drafter_copy, *args[:2], "--prompts", msgs, "--chat-template", "none",
               "--report-dir", tmp_path / "rep2", command=validate_cmd, catch=True)
    assert r.code == 3 and json.loads(r.stdout)["error"] == "messages_without_template", r.output
