"""`specconv validate` end to end on a tiny verifier (SmolLM2 tokenizer) + a z-lab DFlash
source converted with the converter registry; gates failing on purpose; report files."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("dflash")

from chat_templates import THINKING_TEMPLATE  # noqa: E402
from cli_runner import invoke  # noqa: E402
from conftest import copy_validate_set  # noqa: E402
from specconv.cli.validate import validate_cmd  # noqa: E402
from tests.tolerances import lossless_near_ties  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread_module")  # conftest: torch on one thread


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, validate_set):
    """A module copy of conftest's ``validate_set`` (a validate run here records into ``spec``)."""
    return copy_validate_set(validate_set, tmp_path_factory.mktemp("validate_tiny"))


@pytest.mark.slow
def test_validate_json_report_all_gates(tiny, tmp_path):
    rep_dir = tmp_path / "rep"
    before = json.loads((tiny["spec"] / "specconv.json").read_text())
    r = invoke(
        tiny["spec"], "--verifier", tiny["verifier"], "--source", tiny["zlab"],
        "--prompts", tiny["prompts"], "--num-prompts", 2, "--max-new-tokens", 8,
        "--report-dir", rep_dir, "--device", "auto", command=validate_cmd,
    )
    assert r.code == 0, r.output
    out = json.loads(r.stdout)
    for key in ("acceptance_length", "acceptance_at_pos", "num_drafts", "num_draft_tokens",
                "num_accepted_tokens", "gates", "metrics", "device", "versions", "prompts", "dtype"):
        assert key in out, key
    assert out["gates"] == {"structure": True, "parity": True, "acceptance": True, "lossless": True}
    assert len(out["acceptance_at_pos"]) == out["k"] == 3
    assert out["acceptance_length"] == pytest.approx(1 + out["num_accepted_tokens"] / out["num_drafts"])
    assert out["prompts"]["n"] == 2 and out["dtype"] == "float32"
    assert out["device"]["device"] == "cpu"
    assert out["source"]["format"] == "zlab_dflash"
    parity = next(g for g in out["gate_results"] if g["name"] == "parity")
    assert parity["details"]["reference"].startswith("zlab-dflash")
    assert parity["details"]["max_abs"] < 1e-4
    lossless_near_ties(out["lossless"], what="validate")  # equal, or apart only at near-ties
    # report files
    on_disk = json.loads((rep_dir / "validation.json").read_text())
    assert on_disk["acceptance_length"] == out["acceptance_length"]
    assert (rep_dir / "validation.md").read_text().startswith("# specconv validate")
    assert (rep_dir / "acceptance.png").read_bytes()[:4] == b"\x89PNG"
    # specconv.json: validation recorded, the writer's keys kept
    after = json.loads((tiny["spec"] / "specconv.json").read_text())
    assert after["validation"]["acceptance_length"] == out["acceptance_length"]
    assert after["validation"]["gates"] == out["gates"]
    for k, v in before.items():
        if k != "validation":
            assert after[k] == v


def test_source_changed_since_convert_is_exit_3_before_any_gate(tiny, tmp_path):
    """A --source whose bytes differ from the sha256 recorded at convert is refused up front
    (exit 3, both hashes named), not left to fail G2 against other weights (issue 14 item 10)."""
    from safetensors.torch import load_file, save_file

    from specconv.tensors import sha256_file

    src = tmp_path / "retrained"
    shutil.copytree(tiny["zlab"], src)
    t = load_file(str(src / "model.safetensors"))
    t["fc.weight"] = t["fc.weight"] + 0.01  # the same layout, other weights
    save_file(t, str(src / "model.safetensors"), metadata={"format": "pt"})
    recorded = json.loads((tiny["spec"] / "specconv.json").read_text())["conversion"]["source"]["files"]
    before = (tiny["spec"] / "specconv.json").read_bytes()
    r = invoke(tiny["spec"], "--verifier", tiny["verifier"], "--source", src, "--prompts", tiny["prompts"],
               "--num-prompts", 1, "--max-new-tokens", 4, "--report-dir", tmp_path / "rep", command=validate_cmd)
    assert r.code == 3, r.output
    out = json.loads(r.stdout)
    assert out["error"] == "source_changed"
    msg = out["message"]
    assert "model.safetensors" in msg and "config.json" not in msg  # only the file that changed
    assert recorded["model.safetensors"] in msg and sha256_file(src / "model.safetensors") in msg
    assert (tiny["spec"] / "specconv.json").read_bytes() == before  # nothing recorded
    assert not (tmp_path / "rep").exists()


def _copy_with(tiny, tmp_path, extra: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import load_file, save_file

    d = tmp_path / "broken"
    shutil.copytree(tiny["spec"], d)
    t = load_file(str(d / "model.safetensors"))
    t.update(extra)
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


@pytest.mark.slow
def test_random_lm_head_fails_structure_with_exit_4(tiny, tmp_path):
    d = _copy_with(tiny, tmp_path, {"lm_head.weight": torch.randn(49152, 64)})
    r = invoke(d, "--verifier", tiny["verifier"], "--prompts", tiny["prompts"], "--report-dir", tmp_path / "rep",
               command=validate_cmd)
    assert r.code == 4
    out = json.loads(r.stdout)
    assert out["gates"] == {"structure": False}
    g1 = out["gate_results"][0]
    assert any("lm_head.weight differs from the verifier" in e for e in g1["errors"])
    assert [g["status"] for g in out["gate_results"][1:]] == ["skipped"] * 3
    assert out["exit_code"] == 4
    human = invoke(d, "--verifier", tiny["verifier"], "--report-dir", tmp_path / "rep2", command=validate_cmd,
                   as_json=False)
    assert human.code == 4
    assert "structure   failed" in human.stdout and "lm_head.weight differs" in human.stdout


def test_verifier_lm_head_copy_passes_structure(tiny, tmp_path):
    from safetensors.torch import load_file

    from specconv.validate.gates import gate_structure
    from specconv.verifier import resolve_verifier

    emb = load_file(str(tiny["verifier"] / "model.safetensors"))["model.embed_tokens.weight"]
    d = _copy_with(tiny, tmp_path, {"lm_head.weight": emb.clone(), "embed_tokens.weight": emb.clone()})
    g = gate_structure(d, resolve_verifier(str(tiny["verifier"])))
    assert g.passed, g.errors
    assert g.details["verifier_tensors"]["lm_head.weight"]["equal"]
    assert g.details["verifier_tensors"]["embed_tokens.weight"]["equal"]


def test_unaccounted_tensor_fails_structure(tiny, tmp_path):
    from specconv.validate.gates import gate_structure
    from specconv.verifier import resolve_verifier

    d = _copy_with(tiny, tmp_path, {"extra_head.weight": torch.zeros(4, 64)})
    g = gate_structure(d, resolve_verifier(str(tiny["verifier"])))
    assert not g.passed
    assert g.details["unaccounted_tensors"] == ["extra_head.weight"]


@pytest.mark.slow
def test_parity_catches_aux_layer_off_by_one(tiny, tmp_path):
    """A converted config reading the wrong verifier layers must fail G2 vs z-lab's forward."""
    from specconv.drafters import load_drafter
    from specconv.validate.gates import gate_parity
    from specconv.validate.verifier_runner import VerifierRunner
    from specconv.validate.zlab_reference import ZLabDFlashReference

    d = tmp_path / "offbyone"
    shutil.copytree(tiny["spec"], d)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["aux_hidden_state_layer_ids"] == [1, 3]
    cfg["aux_hidden_state_layer_ids"] = [0, 2]  # z-lab ids copied without +1
    (d / "config.json").write_text(json.dumps(cfg))
    runner = VerifierRunner.load(tiny["verifier"], aux_layer_ids=[0, 2])
    ref = ZLabDFlashReference(tiny["zlab"], runner.model)
    assert ref.aux_layer_ids == [1, 3]
    seq = ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], 6)
    bad = gate_parity(ref, load_drafter(d, tiny["verifier"]), runner, [seq], anchors_per_sequence=3)
    assert not bad.passed
    good = gate_parity(ref, load_drafter(tiny["spec"], tiny["verifier"]), runner, [seq], anchors_per_sequence=3)
    assert good.passed, good.errors
    assert runner.aux_layer_ids == [0, 2]  # restored after the union capture


def _random_speculators_dir(out: Path, algorithm: str, verifier: Path, **fields) -> Path:
    """A random-weight Speculators dir built from the config's expected tensor list."""
    from safetensors.torch import load_file, save_file

    from specconv.format import dump_config, expected_tensors, make_config

    layer = {
        "model_type": "qwen3", "vocab_size": 49152, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 1024,
        "rope_theta": 10000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "layer_types": ["full_attention"], "tie_word_embeddings": False, "attention_bias": False,
    }
    cfg = make_config(algorithm, transformer_layer_config=layer, verifier_name_or_path="local/tiny",
                      verifier_architectures=["LlamaForCausalLM"], mask_token_id=16, dtype="float32", **fields)
    out.mkdir(parents=True)
    (out / "config.json").write_bytes(dump_config(cfg))
    g = torch.Generator().manual_seed(3)
    emb = load_file(str(verifier / "model.safetensors"))["model.embed_tokens.weight"]
    tensors = {}
    for name, spec in expected_tensors(cfg).items():
        if spec.need == "optional":
            continue
        if name == "lm_head.weight":
            tensors[name] = emb.clone()  # frozen copy of the verifier head (tied embedding)
        elif "norm" in name:
            tensors[name] = torch.ones(spec.shape)
        else:
            tensors[name] = torch.randn(spec.shape, generator=g) * 0.05
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "algorithm,fields,k",
    [
        ("peagle", {"eagle_aux_hidden_state_layer_ids": [1, 2, 4], "speculative_tokens": 3}, 3),
        ("dspark", {"aux_hidden_state_layer_ids": [1, 4], "block_size": 3, "sample_from_anchor": True,
                    "markov_rank": 8, "enable_confidence_head": True, "confidence_head_with_markov": True}, 3),
    ],
)
def test_validate_peagle_and_dspark_run(tiny, tmp_path, algorithm, fields, k):
    from specconv.validate.run import ValidateOptions, validate_drafter

    d = _random_speculators_dir(tmp_path / algorithm, algorithm, tiny["verifier"], **fields)
    rep = validate_drafter(d, str(tiny["verifier"]), ValidateOptions(prompts=str(tiny["prompts"]), num_prompts=1,
                                                                   max_new_tokens=8), report_dir=tmp_path / "report")
    assert rep.gates == {"structure": True, "acceptance": True, "lossless": True}, rep.gate_results
    assert rep.k == k and rep.algorithm == algorithm
    assert len(rep.acceptance_at_pos) == k
    if algorithm == "dspark":
        cal = rep.extra("dspark")["calibration"]
        assert cal is not None and 0.0 <= cal["mean_confidence"] <= 1.0
        assert rep.extra("dspark")["truncated"]["threshold"] == 0.5
    else:
        assert "dspark" not in rep.to_dict()
    # the library finished the stage: report files, the record's section, the card
    assert (tmp_path / "report" / "validation.json").is_file() and (d / "specconv.json").is_file()


@pytest.mark.slow
def test_drafter_backend_seam_runs_the_registered_loader(tiny, tmp_path, monkeypatch):
    """The torch harness loads the drafter under test through the runtime registry
    (``specconv.validate.runtimes.runtimes()``): a registered loader is used and gets the
    run's one resolved Verifier; an unknown name is a usage error before anything is read."""
    from specconv.errors import UsageError
    from specconv.validate import runtimes
    from specconv.validate.run import ValidateOptions, validate_drafter
    from specconv.verifier import Verifier

    calls = []

    def spy_loader(drafter_dir, verifier, *, path, dtype, device, config):
        calls.append((Path(drafter_dir), type(verifier), path, dtype, device, type(config).__name__))
        return runtimes.load_torch(drafter_dir, verifier, path=path, dtype=dtype, device=device, config=config)

    monkeypatch.setattr(sys.modules[__name__], "spy_loader", spy_loader, raising=False)
    known = runtimes.runtimes()
    monkeypatch.setattr(runtimes, "runtimes",
                        lambda: {**known, "spy": runtimes.Runtime("spy", f"{__name__}:spy_loader")})
    opts = ValidateOptions(prompts=str(tiny["prompts"]), num_prompts=2, max_new_tokens=6, drafter_backend="spy")
    rep = validate_drafter(tiny["spec"], str(tiny["verifier"]), opts, report_dir=tmp_path / "report")
    # the typed config.json the run parsed once is handed over (no second parse in the loader)
    assert calls == [(tiny["spec"], Verifier, None, "float32", rep.device["device"], "DFlashConfig")]
    assert rep.gates["structure"] and rep.gates["lossless"] and rep.num_drafts > 0
    with pytest.raises(UsageError, match="drafter backend"):
        validate_drafter(tiny["spec"], str(tiny["verifier"]), ValidateOptions(drafter_backend="nope"))


@pytest.mark.slow
def test_chat_template_file_and_thinking_are_recorded(tiny, tmp_path):
    """``--chat-template FILE --thinking off``: validation.json, the record (the file relative to
    DIR) and the card hold the template's sha256, its kwargs and the thinking mode; the verifier's
    own template (no enable_thinking) refuses ``--thinking on`` with exit 3 before any model loads."""
    import hashlib
    import os

    tpl = tmp_path / "thinking.jinja"
    tpl.write_text(THINKING_TEMPLATE)
    args = ["--verifier", tiny["verifier"], "--prompts", tiny["prompts"], "--num-prompts", 1, "--max-new-tokens", 4]
    r = invoke(tiny["spec"], *args, "--chat-template", tpl, "--thinking", "off", "--report-dir", tmp_path / "rep",
               command=validate_cmd)
    assert r.code == 0, r.output
    out = json.loads(r.stdout)
    facts = out["chat_template"]
    sha = hashlib.sha256(tpl.read_bytes()).hexdigest()
    # the torch loop decoded the ids this template renders with thinking off (one rendering per run)
    from transformers import AutoTokenizer

    from specconv.prompts import ChatOptions, chat_renderer, select_prompts
    from specconv.validate.run import rendered_digest

    renderer = chat_renderer(AutoTokenizer.from_pretrained(str(tiny["verifier"])),
                             ChatOptions(str(tpl), thinking="off"))
    expected = renderer.render_all(select_prompts(str(tiny["prompts"]), 1))
    assert out["prompts"]["rendered_sha256"] == rendered_digest(expected)
    assert out["prompts"]["token_counts"] == [len(ids) for _, ids in expected]
    assert facts == {"source": "file", "path": str(tpl), "sha256": sha, "kwargs": {"enable_thinking": False},
                     "thinking": "off", "thinking_option": "off", "add_generation_prompt": True}
    rec = json.loads((tiny["spec"] / "specconv.json").read_text())["validation"]["chat_template"]
    assert rec["path"] == os.path.relpath(tpl, tiny["spec"]) and rec["sha256"] == sha and rec["thinking"] == "off"
    card = (tiny["spec"] / "README.md").read_text()
    assert (f"chat template `thinking.jinja` (sha256 `{sha}`), "
            "kwargs `{\"enable_thinking\": false}`, thinking off") in card
    r = invoke(tiny["spec"], *args, "--thinking", "on", "--report-dir", tmp_path / "rep2", command=validate_cmd,
               catch=True)
    assert r.code == 3 and json.loads(r.stdout)["error"] == "thinking_unsupported", r.output
    r = invoke(tiny["spec"], *args, "--chat-template-kwargs", "[1]", command=validate_cmd, catch=True)
    assert r.code == 2 and "JSON object" in json.loads(r.stdout)["message"]
