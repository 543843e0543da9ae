"""``specconv export sglang``: SGLang's layout written from a Speculators dir, and every refusal
of what SGLang 0.5.23 would load but serve wrongly (pure Python: no SGLang here; the loader
check itself is tests/sglang_check/test_sglang_load.py).

Inputs are real conversions (the bundled z-lab drafter against SmolLM2, the DFlash / DSpark
fixture sources through the converter registry) and drafters saved by speculators 0.9.0
(P-EAGLE, pruned DFlash / DSpark); a refusal case is such a dir with one config key changed,
as another tool could have written it.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

import fixtures_dflash as fd
import fixtures_dspark as fs
from cli_runner import invoke

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "smollm2-dflash-b8"
SMOL_HUB = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def bundled(tmp_path_factory, bundled_drafter) -> tuple[Path, int, dict]:
    """A copy of the bundled drafter's conversion and ``specconv export sglang`` of it (exit code, JSON)."""
    out = Path(shutil.copytree(bundled_drafter, tmp_path_factory.mktemp("sgl") / "smol"))
    return (out, *invoke("export", "sglang", out).code_json)


@pytest.fixture(scope="module")
def dflash(tmp_path_factory, tiny_verifier_dir) -> Path:
    root = tmp_path_factory.mktemp("sgl-df")
    return Path(fd.api_convert(fd.make_source(root / "src", "zlab_dflash"), tiny_verifier_dir, root / "out").output)


@pytest.fixture(scope="module")
def dspark(tmp_path_factory, tiny_verifier_dir) -> Path:
    """DeepSpec DSpark, full vocabulary, shipping the verifier's embedding / LM head (bf16 copies)."""
    root = tmp_path_factory.mktemp("sgl-ds")
    src = fs.make_deepspec_dspark(root / "src", tiny_verifier_dir, target_layer_ids=(0, 2, 4))
    return Path(fd.api_convert(src, tiny_verifier_dir, root / "out").output)


def _copy(src: Path, dst: Path, edit=None, layer_edit=None) -> Path:
    """A copy of a Speculators dir with ``config.json`` edited (top level / layer config)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("sglang"))
    cfg = json.loads((dst / "config.json").read_text())
    for k, v in (edit or {}).items():
        cfg.pop(k) if v is _DROP else cfg.__setitem__(k, v)
    cfg["transformer_layer_config"].update(layer_edit or {})
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst


_DROP = object()


def _tensor_bytes(d: Path) -> dict[str, bytes]:
    from specconv.tensors import open_store

    st = open_store(d)
    return {n: st.read_bytes(n) for n in st.names()}


# ------------------------------------------------------------------ the layout
def test_bundled_drafter_reproduces_the_zlab_original(bundled):
    """z-lab's own config is the layout SGLang loads as it ships: the export must say the same
    (target_layer_ids [1, 14, 27], mask 16, block 8) and carry the same tensor bytes."""
    d, code, r = bundled
    assert code == 0, r
    out = d / "sglang"
    ours, orig = json.loads((out / "config.json").read_text()), json.loads((EXAMPLE / "config.json").read_text())
    assert ours["dflash_config"] == {"mask_token_id": 16, "target_layer_ids": [1, 14, 27]} == orig["dflash_config"]
    assert (ours["block_size"], ours["num_target_layers"], ours["architectures"]) == (8, 30, ["DFlashDraftModel"])
    for key in sorted(set(orig) - {"transformers_version", "use_cache"}):  # z-lab's bookkeeping, not read by SGLang
        assert ours[key] == orig[key], key
    assert ours["is_causal"] is False and "target_hidden_size" not in ours  # every layer bidirectional, said once
    assert not any(k.startswith("speculators") or k in ("aux_hidden_state_layer_ids", "transformer_layer_config")
                   for k in ours)
    assert _tensor_bytes(out) == _tensor_bytes(EXAMPLE)
    p = out / "model.safetensors"  # byte-identical to the Speculators file, as a regular file
    assert p.read_bytes() == (d / "model.safetensors").read_bytes()
    assert not p.is_symlink() and p.stat().st_nlink == 1
    assert r["expected"]["captured_layer_ids"] == [1, 14, 27] and r["expected"]["capture_layer_inputs"] == [2, 15, 28]
    assert (r["speculative_algorithm"], r["env"], r["target_supplied"]) == ("DFLASH", {}, [])


def test_the_export_is_recorded_with_its_files(bundled):
    from specconv.record import read_record
    from specconv.tensors import sha256_file

    d = bundled[0]
    assert read_record(d).export.sglang.output == "sglang"  # typed
    rec = json.loads((d / "specconv.json").read_text())["export"]["sglang"]  # the bytes on disk
    out = d / "sglang"
    assert rec["output"] == "sglang" and rec["format"] == "specconv-sglang-drafter"
    assert rec["files"] == {n: sha256_file(out / n) for n in ("config.json", "model.safetensors")}
    assert rec["drafter_files"]["model.safetensors"] == rec["files"]["model.safetensors"]
    meta = json.loads((out / "sglang_export.json").read_text())
    assert meta["files"] == rec["files"] and meta["verifier"] == SMOL_HUB
    assert "check" not in rec  # no SGLang loader ran: the card prints no SGLang line
    assert "## SGLang" not in (d / "README.md").read_text()


def test_overwrite_follows_the_one_rule(bundled, tmp_path):
    d = bundled[0]
    code, r = invoke("export", "sglang", d).code_json
    assert code == 3 and r["error"] == "output_exists"
    code, _ = invoke("export", "sglang", d, "--overwrite").code_json
    assert code == 0
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    code, r = invoke("export", "sglang", d, "-o", foreign, "--overwrite").code_json
    assert code == 3 and r["error"] == "output_exists" and (foreign / "notes.txt").read_text() == "mine"
    code, first = invoke("export", "sglang", d, "-o", foreign).code_json  # says so, not "pass --overwrite"
    assert code == 3 and (first["message"], first.get("hint")) == (r["message"], r.get("hint"))
    from specconv.engines.exportdir import output_kinds
    from specconv.outdir import check_replaceable

    check_replaceable(d, "conversion", output_kinds)  # a conversion holding its sglang/ is still specconv's own


def test_dspark_writes_its_head_keys_and_the_confidence_head_env(dspark):
    from specconv.engines.sglang.export import export_sglang_dir

    r = export_sglang_dir(dspark)
    cfg = json.loads((dspark / "sglang" / "config.json").read_text())
    assert cfg["architectures"] == ["DSparkDraftModel"] and cfg["dflash_config"]["target_layer_ids"] == [0, 2, 4]
    assert {k: cfg[k] for k in ("markov_rank", "markov_head_type", "sample_from_anchor", "enable_confidence_head",
                                "confidence_head_with_markov")} == {
        "markov_rank": 8, "markov_head_type": "vanilla", "sample_from_anchor": True, "enable_confidence_head": True,
        "confidence_head_with_markov": True}
    assert cfg["block_size"] == 4  # DSpark's block_size is SGLang's γ = K (anchor-first: K = B)
    assert r.env == {"SGLANG_RAGGED_VERIFY_MODE": "compact"}
    assert r.target_supplied == ["embed_tokens.weight", "lm_head.weight"]  # equal to the verifier's (bf16 cast)
    from specconv.results import ExportSglangResult

    ExportSglangResult.model_validate(r.to_dict())  # the declared types hold


def test_dspark_1n_block_size_is_gamma(dspark, tmp_path):
    from specconv.engines.sglang.export import export_sglang_dir

    d = _copy(dspark, tmp_path / "1n", {"sample_from_anchor": False,
                                         "speculators_config": _k(dspark, 3)})
    r = export_sglang_dir(d)
    cfg = json.loads((d / "sglang" / "config.json").read_text())
    assert (cfg["block_size"], cfg["sample_from_anchor"]) == (3, False)  # γ = B - 1; SGLang queries γ + 1 = B rows
    assert (r.expected["block_slots"], r.expected["drafts_per_block"]) == (4, 3)


def _k(d: Path, k: int) -> dict:
    sc = json.loads((d / "config.json").read_text())["speculators_config"]
    sc["proposal_methods"][0]["speculative_tokens"] = k
    return sc


def test_mixed_layers_leave_causality_to_sglangs_per_type_default(dflash, tmp_path):
    """full + causal SWA: no global is_causal reproduces both, SGLang's per-type default does."""
    from specconv.engines.sglang.export import export_sglang_dir

    d = _copy(dflash, tmp_path / "mixed", {"sliding_window_non_causal": False},
              {"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 32,
               "use_sliding_window": True})
    r = export_sglang_dir(d)
    cfg = json.loads((d / "sglang" / "config.json").read_text())
    assert "is_causal" not in cfg and cfg["use_sliding_window"] is True and cfg["sliding_window"] == 32
    assert r.expected["layer_causal"] == [False, True]
    assert any("sliding_window" in n for n in r.notes)  # the window's meaning is not proven: said


# ------------------------------------------------------------------ refusals (exit 3, nothing written)
def _refused(d: Path, code: str, words: str, *extra) -> None:
    exit_code, r = invoke("export", "sglang", d, *extra).code_json
    assert exit_code == 3 and r["error"] == code, r
    assert words in r["message"], r["message"]
    assert not (d / "sglang").exists() and not list(d.glob(".sglang.*"))


REFUSALS = {
    "aux_final_state": ({"aux_hidden_state_layer_ids": [1, 3, 6]}, None, "sglang_aux_id_final_state",
                        "final state of the 6-layer verifier"),
    "aux_zero": ({"aux_hidden_state_layer_ids": [0, 3, 5]}, None, "sglang_aux_id_embedding", "-1"),
    "dflash_anchor_layout": ({"sample_from_anchor": True}, None, "sglang_block_layout", "rows 1.."),
    "target_hidden_size": ({"target_hidden_size": 32}, None, "sglang_target_hidden_size", "fc"),
    "window_null": (None, {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": None},
                    "sglang_layer_types", "sliding_window is null"),
    # a qwen3 layer config: without use_sliding_window transformers nulls the window, so the drafter
    # attends fully while SGLang would apply it
    "window_unused": (None, {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 32,
                             "use_sliding_window": False}, "sglang_layer_types", "use_sliding_window"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_dflash_refusals(dflash, tmp_path, case):
    edit, layer_edit, code, words = REFUSALS[case]
    _refused(_copy(dflash, tmp_path / case, edit, layer_edit), code, words)


DSPARK_REFUSALS = {
    "no_markov_head_type": ({"markov_head_type": _DROP}, "sglang_missing_key", "markov_head_type"),
    "markov_rank_0": ({"markov_rank": 0}, "sglang_key_not_positive", "markov_rank > 0"),
    "confidence_flag_without_head": ({"enable_confidence_head": False}, "sglang_confidence_head", "holds"),
}


@pytest.mark.parametrize("case", sorted(DSPARK_REFUSALS))
def test_dspark_refusals(dspark, tmp_path, case):
    edit, code, words = DSPARK_REFUSALS[case]
    _refused(_copy(dspark, tmp_path / case, edit), code, words)


def test_a_trained_embedding_is_not_replaced_silently(dspark, tmp_path):
    """SGLang takes embed_tokens from the target: a copy that differs would be dropped."""
    from safetensors.torch import load_file, save_file

    d = _copy(dspark, tmp_path / "emb")
    t = load_file(str(d / "model.safetensors"))
    t["embed_tokens.weight"] = t["embed_tokens.weight"] * 2
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    _refused(d, "sglang_target_tensor_differs", "embed_tokens.weight")


def test_deepspec_anchor_first_dflash_is_refused(tmp_path, tiny_verifier_dir):
    """A real anchor-first DFlash (DeepSpec, markov_rank 0): SGLang's DFlash path drafts rows 1.."""
    out = tmp_path / "out"
    fd.api_convert(fd.make_source(tmp_path / "src", "deepspec_dflash", verifier_dir=tiny_verifier_dir),
                   tiny_verifier_dir, out)
    assert json.loads((out / "config.json").read_text())["sample_from_anchor"] is True
    _refused(out, "sglang_block_layout", "sample_from_anchor false")


@pytest.fixture(scope="module")
def speculators_built(tmp_path_factory, tiny_verifier_dir, tiny_llama_verifier_dir):
    pytest.importorskip("speculators")
    import fixtures_peagle as fp

    root = tmp_path_factory.mktemp("sgl-sp")
    return {"peagle": fp.build_speculators_peagle(tiny_llama_verifier_dir, root / "peagle"),
            "dflash_pruned": fp.build_speculators_block(tiny_verifier_dir, root / "dfp", "dflash", vd=64),
            "dspark_pruned": fp.build_speculators_block(tiny_verifier_dir, root / "dsp", "dspark", vd=64,
                                                        sample_from_anchor=True),
            "verifiers": {"peagle": tiny_llama_verifier_dir}, "default": tiny_verifier_dir}


@pytest.mark.parametrize("name, code, words", [
    ("peagle", "sglang_unsupported_algorithm", "sgl-project/sglang#23171"),
    ("dflash_pruned", "sglang_pruned_vocab", "target's LM head"),
    ("dspark_pruned", "sglang_pruned_vocab", "markov_w2"),
])
def test_speculators_built_drafters_sglang_cannot_serve(speculators_built, name, code, words):
    d = speculators_built[name]
    v = speculators_built["verifiers"].get(name, speculators_built["default"])
    _refused(d, code, words, "--verifier", v)


def test_peagle_refusal_names_every_reason():
    from specconv.format.algorithms import algorithm

    reason = algorithm("peagle").sglang.refusal
    for word in ("mask_hidden", "q_norm/k_norm", "embedding", "sequentially", "#23171"):
        assert word in reason


# ------------------------------------------------------------------ the card and the gates
def _fake_check(d: Path, ok: bool = True) -> None:
    """Record a check of DIR/sglang's bytes (as the loader check does; its result here made up)."""
    from specconv.engines.sglang.export import layout_files, record_sglang_check
    from specconv.record import read_record
    from specconv.results import ExportSglangResult

    exp = ExportSglangResult.of(read_record(d).export.sglang.model_dump(exclude_unset=True))
    record_sglang_check(d, exp, {"ok": ok, "distribution": "sglang", "version": "0.5.23",
                                 "class": "DFlashDraftModel", "files": layout_files(d / "sglang")})


def test_the_card_prints_the_sglang_line_only_after_a_passed_check(dflash, tmp_path):
    from specconv.engines.card import write_local_card
    from specconv.engines.sglang.export import export_sglang_dir
    from specconv.engines.sglang.layout import launch_argv

    d = _copy(dflash, tmp_path / "card")
    export_sglang_dir(d)
    assert "## SGLang" not in write_local_card(d).read_text()
    _fake_check(d, ok=False)
    assert "## SGLang" not in write_local_card(d).read_text()
    _fake_check(d)
    card = write_local_card(d).read_text()
    block = card.split("## SGLang", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    assert shlex.split(block.replace("\\\n", "")) == launch_argv(fd.HUB, "./sglang", "dflash")
    (d / "sglang" / "config.json").write_text((d / "sglang" / "config.json").read_text() + " ")
    assert "## SGLang" not in write_local_card(d).read_text()  # bytes changed after the check


def test_push_refuses_an_unchecked_sglang_layout_before_any_request(dflash, tmp_path):
    from specconv.engines.sglang.export import export_sglang_dir

    d = _copy(dflash, tmp_path / "push")
    export_sglang_dir(d)
    code, r = invoke("push", d, "--repo-id", "org/drafter", "--sglang-repo-id", "org/drafter-sglang",
                     "--endpoint", "http://127.0.0.1:9", "--dry-run").code_json
    assert code == 4 and r["error"] == "sglang_not_checked" and "has not checked it" in r["message"]
    code, r = invoke("push", d, "--repo-id", "org/drafter", "--sglang-repo-id", "org/drafter", "--dry-run").code_json
    assert code == 2 and "another repo" in r["message"]


def test_the_speculators_payload_never_holds_sglang(dflash, tmp_path):
    from specconv.engines.sglang.export import export_sglang_dir
    from specconv.publish.payload import collect

    d = _copy(dflash, tmp_path / "payload")
    export_sglang_dir(d)
    p, _ = collect(d, allow_unvalidated=True)
    assert not [f for f in p.files if f.startswith("sglang/")] and "model.safetensors" in p.files


def test_release_without_the_sglang_venv_is_exit_3_before_converting(tmp_path, tiny_verifier_dir, monkeypatch):
    monkeypatch.setenv("SPECCONV_SGLANG_LOADER_PYTHON", str(tmp_path / "no-such-python"))
    src = fd.make_source(tmp_path / "src", "zlab_dflash")
    code, r = invoke("release", src, "--verifier", tiny_verifier_dir, "--verifier-name", fd.HUB, "--repo-id", "org/x",
                     "--work-dir", tmp_path / "work", "--export-sglang", "--dry-run").code_json
    assert code == 3 and r["failed_step"] == "preflight" and r["error"] == "sglang_python_missing"
    assert not (tmp_path / "work" / "drafter").exists()
    code, r = invoke("release", src, "--verifier", tiny_verifier_dir, "--verifier-name", fd.HUB, "--repo-id", "org/x",
                     "--work-dir", tmp_path / "work", "--sglang-repo-id", "org/x-sglang", "--dry-run").code_json
    assert code == 2 and "--export-sglang" in r["message"]


def test_validate_refuses_an_unservable_drafter_before_any_gate(dflash, tmp_path, tiny_verifier_dir, monkeypatch):
    monkeypatch.setenv("SPECCONV_SGLANG_LOADER_PYTHON", shutil.which("python3") or "/usr/bin/python3")
    d = _copy(dflash, tmp_path / "val", {"aux_hidden_state_layer_ids": [1, 3, 6]})
    code, r = invoke("validate", d, "--verifier", tiny_verifier_dir, "--sglang-load-check",
                     "--report-dir", tmp_path / "rep").code_json
    assert code == 3 and r["error"] == "sglang_aux_id_final_state"
    assert not (tmp_path / "rep").exists()


def test_a_serve_line_with_a_mode_sglang_does_not_know_fails_the_check():
    """The judge of a load: a resolved value that differs, or a ragged-verify mode SGLang's own
    enum does not hold (the runner parses the line), fails an otherwise strict load."""
    from specconv.engines.sglang.check import judge

    run = {"ok": True, "architecture": "DFlashDraftModel", "resolved": {"mask_token_id": 16}}
    assert judge({}, run, {"mask_token_id": 16, "architecture": "DFlashDraftModel"}, {})["ok"]
    assert not judge({}, run, {"mask_token_id": 17}, {})["ok"]
    bad = {**run, "serve_args": {"ragged_verify_mode": "compactt", "ragged_verify_mode_known": False}}
    assert judge({}, bad, {"mask_token_id": 16}, {})["mismatches"] == [
        "SGLANG_RAGGED_VERIFY_MODE 'compactt' is no mode SGLang knows"]
