"""specforge_training: SpecForge ``<run_id>-step<N>/training_state.pt`` (pickle, no config.json).

Fixture: ``tests/fixtures_dspark.make_specforge_training`` — a real ``torch.save`` pickle
holding ``draft_state_dict`` (``draft_model._orig_mod.``-prefixed), ``strategy`` and an
``argparse.Namespace`` (not loadable with ``weights_only=True``), plus the separate draft
config file (external_formats.md §6.1).
"""

from __future__ import annotations

import json

import pytest
from _dspark_helpers import out_tensors, record

from cli_runner import invoke
from fixtures_dflash import cli_convert, read
from fixtures_dspark import make_specforge_dspark, make_specforge_training
from specconv.errors import InvalidInputError, UnsupportedFormatError


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_verifier_dir):
    d = tmp_path_factory.mktemp("sf_runs") / "dspark"
    make_specforge_training(d, tiny_verifier_dir, strategy="dspark")
    return d


def _ckpt(run_dir):
    return run_dir / "run0-step100"


def _draft_cfg(run_dir):
    return run_dir / "dspark-draft-config.json"


@pytest.fixture
def no_unpickle(monkeypatch):
    """Fail loudly if anything unpickles training_state.pt with weights_only=False."""
    import torch

    real = torch.load

    def guarded(*a, **kw):
        if kw.get("weights_only") is False:
            raise AssertionError("training_state.pt was unpickled without the opt-in")
        return real(*a, **kw)

    monkeypatch.setattr(torch, "load", guarded)


def test_fixture_is_a_real_pickle(run_dir):
    import pickle

    import torch

    with pytest.raises(pickle.UnpicklingError):
        torch.load(_ckpt(run_dir) / "training_state.pt", weights_only=True)
    assert not (_ckpt(run_dir) / "config.json").exists()


def test_inspect_detects_training_dir(run_dir, no_unpickle):
    code, rep, _ = invoke("inspect",
                          run_dir).code_json_stderr  # the run dir: the latest <run_id>-step<N> child is picked
    assert rep["format"] == "specforge_training"
    assert rep["selected"].startswith("latest checkpoint run0-step100")


def test_inspect_with_verifier_reports_refusal(run_dir, tiny_verifier_dir, no_unpickle):
    code, rep, _ = invoke("inspect", _ckpt(run_dir), "--verifier", tiny_verifier_dir).code_json_stderr
    assert code == 3
    assert rep["supported"] is False
    assert "specforge.export.to_hf" in rep["reason"]


@pytest.mark.parametrize("flags,missing", [
    ((), "--allow-unpickle and --draft-config"),
    (("--allow-unpickle",), "--draft-config"),
    (("--draft-config", "CFG"), "--allow-unpickle"),
])
def test_refused_without_both_opt_ins(run_dir, tiny_verifier_dir, tmp_path, flags, missing, no_unpickle):
    flags = tuple(str(_draft_cfg(run_dir)) if f == "CFG" else f for f in flags)
    code, rep, err = cli_convert(_ckpt(run_dir), tiny_verifier_dir, tmp_path / "o", *flags)
    assert code == 3
    assert rep["error"] == "needs_export"
    assert "python -m specforge.export.to_hf --checkpoint" in rep["message"]
    assert f"pass {missing}" in rep["message"]
    assert not (tmp_path / "o").exists()


def test_opt_in_converts_like_the_hf_export(run_dir, tiny_verifier_dir, tmp_path):
    out = tmp_path / "from_training"
    code, rep, err = cli_convert(_ckpt(run_dir), tiny_verifier_dir, out, "--allow-unpickle", "--draft-config",
                                 _draft_cfg(run_dir))
    assert code == 0, err
    assert rep["format"] == "specforge_training" and rep["algorithm"] == "dspark"
    notes = rep["plan"]["notes"]
    assert any("weights_only=False" in n and "--allow-unpickle" in n for n in notes)
    assert any("strategy 'dspark'" in n and "global_step 100" in n for n in notes)
    rec = record(out)
    assert rec["options"]["allow_unpickle"] is True
    assert "training_state.pt" in rec["source"]["files"]
    # the same drafter exported the SpecForge way converts to identical bytes
    export = make_specforge_dspark(tmp_path / "export", tiny_verifier_dir)
    ref = tmp_path / "from_export"
    assert cli_convert(export, tiny_verifier_dir, ref)[0] == 0
    assert (out / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()
    assert read(out) == read(ref)
    assert not [k for k in out_tensors(out) if "draft_model" in k or "_orig_mod" in k]


def test_temp_dir_removed(run_dir, tiny_verifier_dir, tmp_path, monkeypatch):
    import gc
    import tempfile

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    assert cli_convert(_ckpt(run_dir), tiny_verifier_dir, tmp_path / "o", "--allow-unpickle",
                       "--draft-config", _draft_cfg(run_dir))[0] == 0
    gc.collect()
    assert not [p for p in scratch.iterdir() if p.name.startswith("specconv-specforge-")]


@pytest.mark.peer
def test_dflash_strategy_loads_in_speculators(tmp_path, tiny_verifier_dir):
    from interop import load_with_speculators, run_speculators_forward

    ckpt, cfg = make_specforge_training(tmp_path / "runs", tiny_verifier_dir, strategy="dflash", prefix="_orig_mod.")
    out = tmp_path / "o"
    code, rep, err = cli_convert(ckpt, tiny_verifier_dir, out, "--allow-unpickle", "--draft-config", cfg)
    assert code == 0, err
    assert rep["algorithm"] == "dflash"
    assert any("mapped as zlab_dflash" in n for n in rep["plan"]["notes"])
    assert run_speculators_forward(load_with_speculators(out, tiny_verifier_dir)).shape[-1] == 256


def _plan(ckpt, verifier, **opts):
    from specconv.converters import ConvertOptions, SourceInfo
    from specconv.converters.specforge_training import SpecForgeTraining
    from specconv.verifier import resolve_verifier

    return SpecForgeTraining().plan(SourceInfo.open(ckpt), resolve_verifier(str(verifier)), ConvertOptions(**opts))


def test_unsupported_strategy_refused(tmp_path, tiny_verifier_dir):
    import torch

    ckpt, cfg = make_specforge_training(tmp_path / "runs", tiny_verifier_dir)
    state = torch.load(ckpt / "training_state.pt", weights_only=False)
    state["strategy"] = "eagle3"
    torch.save(state, ckpt / "training_state.pt")
    with pytest.raises(UnsupportedFormatError, match="speculators convert --algorithm eagle3"):
        _plan(ckpt, tiny_verifier_dir, allow_unpickle=True, draft_config=cfg)


def test_strategy_and_draft_config_must_agree(tmp_path, tiny_verifier_dir):
    ckpt, _ = make_specforge_training(tmp_path / "a", tiny_verifier_dir, strategy="dspark")
    _, dflash_cfg = make_specforge_training(tmp_path / "b", tiny_verifier_dir, strategy="dflash")
    with pytest.raises(InvalidInputError, match="strategy 'dspark'") as e:
        _plan(ckpt, tiny_verifier_dir, allow_unpickle=True, draft_config=dflash_cfg)
    assert e.value.code == "draft_config_mismatch"


def test_algorithm_flag_checked_against_strategy(run_dir, tiny_verifier_dir):
    with pytest.raises(InvalidInputError, match="strategy 'dspark'"):
        _plan(_ckpt(run_dir), tiny_verifier_dir, allow_unpickle=True, draft_config=_draft_cfg(run_dir),
              algorithm="dflash")


def test_strip_prefixes():
    from specconv.converters.specforge_training import strip_prefixes

    assert strip_prefixes("draft_model._orig_mod.layers.0.mlp.up_proj.weight") == "layers.0.mlp.up_proj.weight"
    assert strip_prefixes("_orig_mod.draft_model.fc.weight") == "fc.weight"
    assert strip_prefixes("layers.0._orig_mod.self_attn.q_proj.weight") == "layers.0.self_attn.q_proj.weight"
    assert strip_prefixes("markov_head.markov_w1.weight") == "markov_head.markov_w1.weight"


def test_missing_draft_state_dict(tmp_path, tiny_verifier_dir):
    import torch

    ckpt, cfg = make_specforge_training(tmp_path / "runs", tiny_verifier_dir)
    torch.save({"strategy": "dspark", "global_step": 1}, ckpt / "training_state.pt")
    with pytest.raises(InvalidInputError, match="no draft_state_dict"):
        _plan(ckpt, tiny_verifier_dir, allow_unpickle=True, draft_config=cfg)


def test_draft_config_must_be_json_object(run_dir, tiny_verifier_dir, tmp_path):
    bad = tmp_path / "cfg.json"
    bad.write_text(json.dumps([1, 2]))
    with pytest.raises(InvalidInputError, match="not a JSON object"):
        _plan(_ckpt(run_dir), tiny_verifier_dir, allow_unpickle=True, draft_config=bad)


@pytest.mark.peer
def test_peagle_strategy_maps_like_the_specforge_export(tmp_path, tiny_llama_verifier_dir):
    """strategy peagle → the SpecForge P-EAGLE export mapping (``specforge_peagle``); the
    legacy training state lacks t2d/d2t and the result equals converting the export."""
    import fixtures_peagle as fp
    from fixtures_dspark import training_dir_from_export
    from interop import load_with_speculators, run_speculators_forward

    ref = fp.build_speculators_peagle(tiny_llama_verifier_dir, tmp_path / "ref", layers=2, seed=2)
    export = fp.to_specforge(ref, tmp_path / "export")
    ckpt, cfg = training_dir_from_export(tmp_path / "runs", export, strategy="peagle", drop=("t2d", "d2t"))
    flags = ("--mask-token-id", fp.MASK, "--aux-layer-ids", ",".join(map(str, fp.AUX)), "--speculative-tokens", 4)
    out, ref_out = tmp_path / "o", tmp_path / "ref_out"
    code, rep, err = cli_convert(ckpt, tiny_llama_verifier_dir, out, "--allow-unpickle", "--draft-config", cfg, *flags)
    assert code == 0, err
    assert rep["algorithm"] == "peagle"
    assert any("mapped as specforge_peagle" in n for n in rep["plan"]["notes"])
    assert cli_convert(export, tiny_llama_verifier_dir, ref_out, *flags)[0] == 0
    assert (out / "model.safetensors").read_bytes() == (ref_out / "model.safetensors").read_bytes()
    run_speculators_forward(load_with_speculators(out, tiny_llama_verifier_dir))
