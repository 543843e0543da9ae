"""vLLM 0.33.0 as a real consumer: every conversion fixture loads with vLLM's own loader.

All dirs — every conversion fixture of the three algorithms, the bundled SmolLM2 drafter
and the broken variants — are checked in ONE subprocess of the loader venv ``.venv-vllm``
(``make vllm-venv``; ``make test`` builds it), because vLLM's start-up dominates. Each good
dir is loaded with the ``--speculative-config`` text its own model card (the README.md
written at convert time) prints, verbatim but for ``model``, and the method,
``parallel_drafting`` and draft class vLLM resolved from it are asserted per algorithm
(vLLM accepts a wrong method without a word). The short form (``vllm serve DIR``) resolves
the recorded verifier Hub ids in a real default Hugging Face cache under a temporary
``HOME`` (snapshot symlinks into ``blobs/``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_hub_paths import FakeHub

import fixtures_dflash as fd
import fixtures_dspark as fs
import fixtures_peagle as fp
from card_commands import card_speculative_config
from cli_runner import invoke

REPO = Path(__file__).resolve().parents[2]
LLAMA_HUB = "org/tiny-llama"
SMOL_HUB = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _vllm_python() -> Path | None:
    from specconv.engines.vllm.check import find_vllm_python
    from specconv.errors import InvalidInputError

    try:
        return find_vllm_python()
    except InvalidInputError:
        return None


VLLM_PY = _vllm_python()
#: Tests that run vLLM: skipped (with this reason) where the loader venv is absent.
needs_vllm = [pytest.mark.vllm, pytest.mark.skipif(
    VLLM_PY is None,
    reason="no vLLM loader venv (.venv-vllm or $SPECCONV_VLLM_LOADER_PYTHON): build it with `make vllm-venv`")]


def _mark(fn):
    for m in needs_vllm:
        fn = m(fn)
    return fn


# ------------------------------------------------------------------ fixtures: conversions
def _convert(src, verifier, out, name, **opts) -> Path:
    """Convert and write the model card, as ``specconv convert`` does."""
    from specconv.engines.card import refresh_local_card

    rep = fd.api_convert(src, verifier, out, name=name, **opts)
    assert rep.output or (Path(out) / "config.json").is_file(), rep
    assert refresh_local_card(Path(out)) == Path(out) / "README.md"
    return Path(out)


def _dflash_family(root: Path, v: Path) -> dict[str, Path]:
    out = {}
    for fmt in fd.FORMATS:
        src = fd.make_source(root / "src", fmt, verifier_dir=v)
        out[f"dflash/{fmt}"] = _convert(src, v, root / "out" / fmt, fd.HUB)
    for name in fs.FORMATS:
        out[f"dspark/{name}"] = _convert(fs.make_source(root / "src" / name, name, v), v, root / "out" / name, fd.HUB)
    for strategy in ("dflash", "dspark"):  # SpecForge training_state.pt, with both opt-ins
        ckpt, draft_cfg = fs.make_specforge_training(root / "runs" / strategy, v, strategy=strategy)
        out[f"{strategy}/specforge_training"] = _convert(ckpt, v, root / "out" / f"sft_{strategy}", fd.HUB,
                                                         allow_unpickle=True, draft_config=draft_cfg)
    return out


def _speculators_family(root: Path, v: Path, vl: Path) -> dict[str, Path]:
    """Drafters built by speculators 0.9.0, then in each foreign P-EAGLE layout."""
    pytest.importorskip("speculators")
    out = {}
    blocks = {"dflash": fp.build_speculators_block(v, root / "ref" / "dflash", "dflash"),
              "dflash_pruned": fp.build_speculators_block(v, root / "ref" / "dfp", "dflash", vd=64, seed=2),
              "dspark_sfa": fp.build_speculators_block(v, root / "ref" / "sfa", "dspark", vd=64,
                                                       sample_from_anchor=True),
              "dspark_1n": fp.build_speculators_block(v, root / "ref" / "1n", "dspark", sample_from_anchor=False,
                                                      seed=1)}
    for name, ref in blocks.items():
        save = fp.trainer_save_dir(root / "save" / name, {0: ref})
        out[f"{name.split('_')[0]}/speculators_trainer_{name}"] = _convert(save, v, root / "out" / f"st_{name}", fd.HUB)
    ref = fp.build_speculators_peagle(vl, root / "ref" / "peagle", vd=64)
    full = fp.build_speculators_peagle(vl, root / "ref" / "peagle_full", layers=1, aux=[2, 5], nbr=False, seed=1)
    qwen = fp.build_speculators_peagle(v, root / "ref" / "peagle_qwen3", seed=4)
    flags = dict(mask_token_id=fp.MASK, aux_layer_ids=fp.AUX, speculative_tokens=4)
    sources = {
        "aws_peagle": (fp.to_aws(ref, root / "src" / "aws"), vl, LLAMA_HUB, {"speculative_tokens": 4}),
        "specforge_peagle": (fp.to_specforge(full, root / "src" / "sf"), vl, LLAMA_HUB,
                             {**flags, "aux_layer_ids": [2, 5]}),
        "nemo_peagle": (fp.to_nemo(ref, root / "src" / "nemo"), vl, LLAMA_HUB, {}),
        "early_speculators_peagle": (fp.to_early_speculators(ref, root / "src" / "early"), vl, LLAMA_HUB, {}),
        "speculators_trainer_peagle": (fp.trainer_save_dir(root / "save" / "peagle", {0: ref}), vl, LLAMA_HUB, {}),
        "speculators_trainer_peagle_qwen3": (fp.trainer_save_dir(root / "save" / "pq", {0: qwen}), v, fd.HUB, {}),
    }
    for name, (src, ver, hub, opts) in sources.items():
        out[f"peagle/{name}"] = _convert(src, ver, root / "out" / name, hub, **opts)
    return out


@pytest.fixture(scope="module")
def tiny_hidden32_dir(tmp_path_factory) -> Path:
    """A tiny Qwen3 verifier with another hidden size (32) for the mismatch variant."""
    from conftest import make_tiny_verifier

    return make_tiny_verifier(tmp_path_factory.mktemp("h32") / "qwen3", hidden_size=32)


# ------------------------------------------------------------------ broken variants
def _copy_edit(src: Path, out: Path, *, drop=(), add=None, reshape=None, config=None) -> Path:
    """Copy a converted dir, then drop / add / re-shape tensors or patch config.json."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, out)
    t = load_file(str(out / "model.safetensors"))
    for n in drop:
        del t[n]
    t.update(add or {})
    for n, shape in (reshape or {}).items():
        t[n] = torch.zeros(shape, dtype=t[n].dtype)
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    if config:
        cfg = json.loads((out / "config.json").read_text())
        cfg.update(config)
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def _broken(root: Path, good: dict[str, Path]) -> dict[str, Path]:
    import torch

    df, pe, ds = good["dflash/zlab_dflash"], good["peagle/aws_peagle"], good["dspark/speculators_trainer_dspark_sfa"]
    dfp = good["dflash/speculators_trainer_dflash_pruned"]
    return {
        "missing_tensor": _copy_edit(df, root / "missing", drop=["layers.0.mlp.down_proj.weight"]),
        "missing_qkv_shard": _copy_edit(df, root / "shard", drop=["layers.1.self_attn.k_proj.weight"]),
        "unknown_tensor": _copy_edit(df, root / "unknown", add={"layers.0.self_attn.extra.weight": torch.zeros(4, 4)}),
        "misshapen_fused_tensor": _copy_edit(df, root / "shape", reshape={"layers.0.mlp.up_proj.weight": (96, 64)}),
        "misshapen_tensor": _copy_edit(df, root / "shape2", reshape={"layers.1.self_attn.o_proj.weight": (64, 32)}),
        "pruned_peagle_without_d2t": _copy_edit(pe, root / "nod2t", drop=["d2t"]),
        "pruned_dspark_without_lm_head": _copy_edit(ds, root / "nohead", drop=["lm_head.weight"]),
        "pruned_dflash_without_lm_head": _copy_edit(dfp, root / "nohead_df", drop=["lm_head.weight"]),
        "aux_beyond_verifier": _copy_edit(df, root / "aux", config={"aux_hidden_state_layer_ids": [1, 3, 9]}),
    }


def _k(d: Path) -> int:
    return json.loads((d / "config.json").read_text())["speculators_config"]["proposal_methods"][0][
        "speculative_tokens"]


def _wrong_cards(good: dict[str, Path]) -> dict[str, tuple[Path, str]]:
    """Good dirs given the ``--speculative-config`` the model card printed at b56e881."""
    ds, pe = good["dspark/deepspec_dspark"], good["peagle/aws_peagle"]
    return {"dspark_served_as_dflash": (ds, json.dumps({"model": "x", "method": "dflash",
                                                        "num_speculative_tokens": _k(ds)})),
            "peagle_without_parallel_drafting": (pe, json.dumps({"model": "x", "method": "eagle3",
                                                                   "num_speculative_tokens": _k(pe)}))}


# ------------------------------------------------------------------ the one subprocess
def _home_with_cache(home: Path, repos: dict[str, Path]) -> Path:
    """A default HF cache (``HOME/.cache/huggingface/hub``, snapshot symlinks into blobs)."""
    hub = FakeHub(home / ".cache" / "huggingface" / "hub")
    for repo, d in repos.items():
        hub.add(repo, {p.name: p for p in sorted(Path(d).iterdir()) if p.is_file()})
    return home


def _subprocess_env(home: Path) -> dict[str, str | None]:
    """``HOME`` set, every cache override unset: huggingface_hub (which fixes its cache path
    at import) then uses ``HOME/.cache/huggingface/hub``."""
    env: dict[str, str | None] = {"HOME": str(home), "HF_HUB_OFFLINE": "1"}
    env.update(dict.fromkeys(("HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME", "HUGGINGFACE_HUB_CACHE",
                              "TRANSFORMERS_CACHE", "VLLM_CACHE_ROOT")))
    return env


@pytest.fixture(scope="module")
def checked(tmp_path_factory, tiny_verifier_dir, tiny_llama_verifier_dir, tiny_hidden32_dir, smollm2_dir):
    """``{name: (dir, result)}`` for every good and broken dir, plus the run's env."""
    from specconv.engines.vllm.check import LoadCheck, run_load_checks

    root = tmp_path_factory.mktemp("vllm_load")
    v, vl = tiny_verifier_dir, tiny_llama_verifier_dir
    good = {**_dflash_family(root / "df", v), **_speculators_family(root / "sp", v, vl)}
    good["dflash/bundled_smollm2"] = _convert(REPO / "examples" / "smollm2-dflash-b8", smollm2_dir, root / "smol",
                                              SMOL_HUB)
    broken = _broken(root / "broken", good)
    wrong = _wrong_cards(good)
    verifier_of = {n: (vl if n.startswith("peagle/") and "qwen3" not in n else v) for n in good}
    verifier_of["dflash/bundled_smollm2"] = smollm2_dir
    verifier_of.update({n: v for n in broken})
    verifier_of.update({"pruned_peagle_without_d2t": vl, "dspark_served_as_dflash": v,
                        "peagle_without_parallel_drafting": vl})
    dirs = {**good, **broken, "other_hidden_size": good["dflash/zlab_dflash"], **{n: d for n, (d, _) in wrong.items()}}
    verifier_of["other_hidden_size"] = tiny_hidden32_dir
    # the card's --speculative-config text, verbatim (the runner replaces only its model)
    spec_of = {**{n: card_speculative_config(d / "README.md") for n, d in good.items()},
               **{n: text for n, (_, text) in wrong.items()}}
    checks = [LoadCheck(str(d), str(verifier_of[n]), short_form=(n in good), speculative_config=spec_of.get(n))
              for n, d in dirs.items()]
    home = _home_with_cache(root / "home", {fd.HUB: v, LLAMA_HUB: vl, SMOL_HUB: smollm2_dir})
    result = run_load_checks(checks, python=VLLM_PY, env=_subprocess_env(home))
    assert len(result["results"]) == len(checks)
    by_name = {n: (dirs[n], r) for n, r in zip(dirs, result["results"], strict=True)}
    return {"good": sorted(good), "broken": sorted(broken) + ["other_hidden_size"], "by_name": by_name,
            "env": result["env"], "result": result, "spec_of": spec_of}


def _summary(r: dict) -> str:
    return json.dumps({k: r.get(k) for k in ("ok", "errors", "model_class", "short_form")}, default=str)[:2000]


# ------------------------------------------------------------------ good dirs
@_mark
def test_every_conversion_fixture_loads_in_vllm(checked):
    algos = {n.split("/")[0] for n in checked["good"]}
    assert algos == {"dflash", "dspark", "peagle"}
    failed = {n: _summary(checked["by_name"][n][1]) for n in checked["good"] if not checked["by_name"][n][1]["ok"]}
    assert not failed, failed


#: What vLLM 0.33 must resolve from each card (``vllm/config/speculative.py``: dflash and
#: dspark force ``parallel_drafting``; P-EAGLE gets it only from the card) and the draft
#: classes it builds (``vllm/model_executor/models/registry.py``).
CARD_RESOLVES = {
    "dflash": ("dflash", True, {"DFlashQwen3ForCausalLM"}),
    "dspark": ("dspark", True, {"Qwen3DSparkForCausalLM"}),
    "peagle": ("eagle3", True, {"Eagle3LlamaForCausalLM", "Eagle3Qwen3ForCausalLM"}),
}


@_mark
@pytest.mark.parametrize("algo", sorted(CARD_RESOLVES))
def test_the_card_serve_command_builds_the_algorithm_and_fills_every_parameter(checked, algo):
    """The long form of each dir's model card, given to vLLM verbatim (only ``model``
    replaced): vLLM resolves the algorithm's method and parallel drafting, builds its draft
    class, fills every parameter, and agrees with its own reading of the dir."""
    method, parallel, classes = CARD_RESOLVES[algo]
    names = [n for n in checked["good"] if n.startswith(algo + "/")]
    assert names
    for n in names:
        d, r = checked["by_name"][n]
        given = json.loads(checked["spec_of"][n])
        assert r["speculative_config"] == {**given, "model": str(d.resolve())}, (n, r["speculative_config"])
        assert r["model_class"] in classes, (n, r["model_class"])
        w = r["weights"]
        assert w["loaded"] and not w["missing"] and not w["partial"], (n, w)
        spec = r["long_form"]["config"]
        assert spec["num_speculative_tokens"] == _k(d) and spec["draft_model"] == str(d.resolve()), (n, spec)
        assert (spec["method"], spec["parallel_drafting"]) == (method, parallel), (n, spec)
        own = r["vllm_reading"]
        assert own["method"] == method and own.get("parallel_drafting", False) == (algo == "peagle"), (n, own)


@_mark
@pytest.mark.parametrize("name,method,parallel", [("dspark_served_as_dflash", "dflash", True),
                                                   ("peagle_without_parallel_drafting", "eagle3", False)])
def test_a_wrong_card_is_caught_although_vllm_accepts_it(checked, name, method, parallel):
    """The cards of b56e881 (DSpark as ``dflash``, P-EAGLE without ``parallel_drafting``):
    vLLM builds an engine config from them without a word; the check names the disagreement."""
    r = checked["by_name"][name][1]
    assert r["long_form"]["ok"] is True, _summary(r)  # vLLM itself accepted it
    assert (r["long_form"]["config"]["method"], r["long_form"]["config"]["parallel_drafting"]) == (method, parallel)
    assert r["ok"] is False
    assert any("disagrees with vLLM's own reading of the dir" in e for e in r["errors"]), _summary(r)


@_mark
def test_short_form_resolves_the_verifier_from_the_default_hf_cache(checked):
    """``vllm serve DIR``: vLLM reads the verifier Hub id from DIR and finds it offline."""
    for n in checked["good"]:
        r = checked["by_name"][n][1]
        sf = r["short_form"]
        assert sf["ok"] is True, (n, sf)
        d = checked["by_name"][n][0]
        name = json.loads((d / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"]
        assert sf["config"]["model"] == name and name in (fd.HUB, LLAMA_HUB, SMOL_HUB), (n, sf)
        # the Hub id resolved (offline) to the same verifier the long form was given
        assert sf["config"]["verifier_facts"] == r["verifier_facts"], (n, sf)
        for k in ("method", "num_speculative_tokens", "draft_model", "parallel_drafting"):
            assert sf["config"][k] == r["long_form"]["config"][k], (n, k)


@_mark
def test_bundled_smollm2_drafter_loads_against_the_real_verifier(checked):
    r = checked["by_name"]["dflash/bundled_smollm2"][1]
    assert r["ok"] and r["model_class"] == "DFlashQwen3ForCausalLM", _summary(r)
    assert r["verifier_facts"] == {"hidden_size": 576, "num_layers": 30, "vocab_size": 49152}
    # the bundled drafter ships no embed_tokens / lm_head: vLLM shares the verifier's
    assert set(r["weights"]["shared"]) >= {"model.embed_tokens.weight", "lm_head.weight"}


@_mark
def test_environment_is_recorded(checked):
    env = checked["env"]
    assert env["vllm"] == "0.33.0" and env["distribution"] == "vllm"
    assert env["torch"].startswith("2.13.0") and env["transformers"]
    import torch  # the same torch 2.13.0 CPU wheel on the same host: the stubs must match its needs

    try:
        torch.accelerator.empty_cache()
        empty_cache_needed = False
    except (AttributeError, RuntimeError):
        empty_cache_needed = True
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
    names = {s["name"] for s in env["stubs"]}
    assert ("torch.accelerator.empty_cache" in names) is empty_cache_needed, env["stubs"]
    assert ("torch.cpu._is_amx_tile_supported" in names) is (amx is None or bool(amx())), env["stubs"]
    assert all(s["reason"] for s in env["stubs"])


# ------------------------------------------------------------------ broken variants
@_mark
@pytest.mark.parametrize("name,needle", [
    ("missing_tensor", "did not fill: model.layers.0.mlp.down_proj.weight"),
    ("missing_qkv_shard", "model.layers.1.self_attn.qkv_proj.weight (shards loaded ['q', 'v']"),
    ("unknown_tensor", "no module or parameter named 'layers.0.self_attn.extra'"),  # vLLM's own refusal
    ("misshapen_fused_tensor", "loading model.layers.0.mlp.gate_up_proj.weight (shard 1) (256, 64) from a "
                               "checkpoint tensor of shape (96, 64)"),
    ("misshapen_tensor", "loading model.layers.1.self_attn.o_proj.weight (64, 64) from a checkpoint tensor of "
                         "shape (64, 32)"),
    ("pruned_peagle_without_d2t", "did not fill: draft_id_to_target_id"),
    ("pruned_dspark_without_lm_head", "must include lm_head weights"),  # vLLM's own refusal
    ("pruned_dflash_without_lm_head", "did not fill: lm_head.weight"),
    ("aux_beyond_verifier", "outside the verifier's [0, 6]"),
    ("other_hidden_size", "verifier hidden size 32"),
])
def test_strict_check_catches_broken_variant(checked, name, needle):
    r = checked["by_name"][name][1]
    assert r["ok"] is False, _summary(r)
    assert any(needle in e for e in r["errors"]), _summary(r)


# ------------------------------------------------------------------ the CLI
def test_missing_interpreter_is_exit_3(tmp_path, monkeypatch):
    """No vLLM venv: a clear error (exit 3) before any gate runs; nothing recorded."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"speculators_model_type": "dflash"}))
    monkeypatch.setenv("SPECCONV_VLLM_LOADER_PYTHON", str(tmp_path / "nope" / "python"))
    r = invoke("validate", out, "--verifier", "x", "--vllm-load-check", catch=True)
    assert r.code == 3, r.output
    obj = json.loads(r.stdout)
    assert obj["error"] == "vllm_python_missing" and "nope/python" in obj["message"]
    assert "SPECCONV_VLLM_LOADER_PYTHON" in obj["hint"]
    assert not (out / "specconv.json").exists()
    r = invoke("validate", out, "--verifier", "x", "--vllm-load-check",
               "--vllm-loader-python", tmp_path / "also-nope", catch=True)
    assert r.code == 3 and "also-nope" in json.loads(r.stdout)["message"]


@_mark
def test_validate_vllm_load_check_records_in_specconv_json(tmp_path, smollm2_dir, monkeypatch):
    """``specconv validate DIR --vllm-load-check`` on a tiny verifier with SmolLM2's tokenizer,
    run from another directory with a relative ``--verifier`` that looks like a Hub id
    (``t/verifier``; issue 24: the runner, in its temp dir, got it as typed and vLLM looked it up
    as a Hub id: ``LocalEntryNotFoundError``, exit 4)."""
    pytest.importorskip("dflash")
    from conftest import make_validate_set

    tiny = make_validate_set(tmp_path / "t", smollm2_dir)
    before = json.loads((tiny["spec"] / "specconv.json").read_text())
    monkeypatch.chdir(tmp_path)
    args = ["validate", "t/spec", "--verifier", "t/verifier", "--prompts", "t/prompts.jsonl",
            "--num-prompts", "1", "--max-new-tokens", "4", "--report-dir", str(tmp_path / "rep"),
            "--vllm-load-check", "--vllm-loader-python", str(VLLM_PY), "--format", "json"]
    r = invoke(*args, as_json=False)
    assert r.code == 0, r.output
    vl = json.loads(r.stdout)["vllm_load"]
    assert vl["ok"] is True and vl["model_class"] == "DFlashQwen3ForCausalLM", vl
    assert (vl["distribution"], vl["version"]) == ("vllm", "0.33.0") and vl["torch"].startswith("2.13.0")
    assert vl["resolved"] == {"method": "dflash", "parallel_drafting": True}
    assert vl["patches"] == ["vllm.model_executor.models.registry._run_in_subprocess (in-process)"]
    assert vl["forms"]["long"] is True and vl["forms"]["short_skipped"]  # local verifier: no Hub id to resolve
    after = json.loads((tiny["spec"] / "specconv.json").read_text())
    # the record names the vLLM that loaded it, nothing else; the report keeps the details
    assert after["validation"]["vllm_load"] == {"distribution": "vllm", "version": "0.33.0"}
    assert "vllm_serve" not in after["validation"]
    report = json.loads((tmp_path / "rep" / "validation.json").read_text())
    assert report["vllm_load"] == vl and "vllm" not in report["versions"]
    card = (tiny["spec"] / "README.md").read_text()  # refreshed from the record just written
    assert "| vLLM | loaded by `vllm` 0.33.0 (`specconv validate --vllm-load-check`) |" in card
    assert after["validation"]["gates"]  # the gates' summary is kept beside it
    assert {k: v for k, v in after.items() if k != "validation"} == {k: v for k, v in before.items()
                                                                      if k != "validation"}


def test_interpreter_lookup_order(tmp_path, monkeypatch):
    import specconv.engines.vllm.check as vc
    from specconv.errors import InvalidInputError

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    env_py = tmp_path / "env-python"
    env_py.write_text("")
    monkeypatch.setattr(vc, "DEFAULT_VENV", venv)
    monkeypatch.delenv(vc.ENV_PYTHON, raising=False)
    assert vc.find_vllm_python() == venv / "bin" / "python"
    monkeypatch.setenv(vc.ENV_PYTHON, str(env_py))
    assert vc.find_vllm_python() == env_py
    assert vc.find_vllm_python(venv / "bin" / "python") == venv / "bin" / "python"  # the flag wins
    monkeypatch.delenv(vc.ENV_PYTHON)
    monkeypatch.setattr(vc, "DEFAULT_VENV", tmp_path / "absent")
    with pytest.raises(InvalidInputError, match="no vLLM interpreter") as e:
        vc.find_vllm_python()
    assert e.value.exit_code == 3 and "make vllm-venv" in e.value.hint


@_mark
def test_the_cards_revision_advice_names_a_speculative_config_field():
    """The card's long form tells users to pin the drafter with ``"revision"`` in
    ``--speculative-config``: vLLM's own ``SpeculativeConfig`` has that field."""
    import subprocess

    from specconv.engines.card import _templates

    assert '"revision": "<commit>"' in (_templates() / "model_card.md.j2").read_text()
    probe = ("import dataclasses; from vllm.config.speculative import SpeculativeConfig; "
             "print(sorted(f.name for f in dataclasses.fields(SpeculativeConfig)))")
    out = subprocess.run([str(VLLM_PY), "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    assert "'revision'" in out.stdout
