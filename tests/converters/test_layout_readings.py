"""Block layouts the checkpoint does not decide alone (issue 24, items 2 and 4).

Inputs are written by the producers' own code: speculators 0.9.0 (``from_training_args`` +
``save_pretrained``; a key dropped the way an older writer or speculators#737's converter
leaves it out) and z-lab ``dflash`` 0.1.0 (``DFlashDraftModel.save_pretrained``).

* ``sample_from_anchor`` absent: the K rule and speculators 0.9.0's default for the algorithm
  (DFlash false, DSpark true: ``src/speculators/models/{dflash,dspark}/config.py``) are two
  readings; where they disagree the conversion is refused (exit 3) until
  ``--[no-]sample-from-anchor`` decides, and the decision is recorded so ``validate --source``
  reads the source the same way.
* a z-lab ``dflash_config.sample_from_anchor: true`` is a key z-lab's runtime never reads
  (``dflash/model.py`` ``dflash_generate`` drafts slots 1..B-1): written as the runtime runs it,
  warned.
* ``--sliding-window-non-causal``: sets the key where it changes nothing speculators runs
  (every draft layer full attention) and refused elsewhere.
"""

from __future__ import annotations

import json
import subprocess

import pytest

import fixtures_peagle as fp

pytestmark = pytest.mark.peer
pytest.importorskip("speculators")
pytest.importorskip("loguru")

HUB = "org/tiny"
K_PATH = ("speculators_config", "proposal_methods", 0, "speculative_tokens")


def convert(src, verifier, out=None, **opts):
    from specconv.convert import convert as _convert
    from specconv.converters import ConvertOptions

    return _convert(str(src), verifier=str(verifier), output=out, options=ConvertOptions(**opts),
                    verifier_name=HUB, dry_run=out is None)


def codes(rep, level=None):
    return {f["code"] for f in rep.findings if level is None or f["level"] == level}


def k_of(cfg: dict) -> int:
    return cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"]


def without_key(built, root, key="sample_from_anchor", **patch):
    """A trainer save dir of ``built`` whose config lacks ``key`` (``patch`` applied first)."""
    return fp.trainer_save_dir(root, {0: built}, config_patch=patch or None, config_drop=(key,)) / "0"


@pytest.fixture(scope="module")
def built(tiny_verifier_dir, tmp_path_factory):
    """Drafters saved by speculators 0.9.0: a 1+N DSpark (K = B-1), an anchor-first DFlash (K = B),
    an all-full-attention DFlash and a sliding-window DFlash (block 4)."""
    d = tmp_path_factory.mktemp("built")
    return {
        "dspark_1n": fp.build_speculators_block(tiny_verifier_dir, d / "dspark_1n", "dspark", sample_from_anchor=False),
        "dflash_af": fp.build_speculators_block(tiny_verifier_dir, d / "dflash_af", "dflash", sample_from_anchor=True),
        "dflash_full": fp.build_speculators_block(tiny_verifier_dir, d / "dflash_full", "dflash", full_attention=True,
                                                  dtype="float32"),
        "dflash_swa": fp.build_speculators_block(tiny_verifier_dir, d / "dflash_swa", "dflash"),
    }


# ------------------------------------------------------------- sample_from_anchor absent
@pytest.mark.parametrize("name,k_rule,default", [("dspark_1n", False, True), ("dflash_af", True, False)])
def test_disagreeing_readings_are_refused_until_the_flag_decides(built, tiny_verifier_dir, tmp_path, name, k_rule,
                                                                 default):
    from speculators import SpeculatorModelConfig

    from interop import load_with_speculators, run_speculators_forward
    from specconv.errors import InvalidInputError

    src = without_key(built[name], tmp_path / "save")
    B = fp.read_json(src / "config.json")["block_size"]
    assert k_of(fp.read_json(src / "config.json")) == (B if k_rule else B - 1)
    assert SpeculatorModelConfig.from_pretrained(str(src)).sample_from_anchor is default  # the owner's reading
    with pytest.raises(InvalidInputError) as e:
        convert(src, tiny_verifier_dir)
    assert e.value.code == "ambiguous_sample_from_anchor" and e.value.exit_code == 3
    assert f"the K rule reads {str(k_rule).lower()}" in e.value.message
    assert f"default {str(default).lower()}" in e.value.message
    assert "--sample-from-anchor" in e.value.hint and "--no-sample-from-anchor" in e.value.hint
    for flag in (True, False):
        out = tmp_path / f"out-{flag}"
        rep = convert(src, tiny_verifier_dir, out, sample_from_anchor=flag)
        cfg = fp.read_json(out / "config.json")
        assert cfg["sample_from_anchor"] is flag and k_of(cfg) == (B if flag else B - 1)
        assert "layout-from-flag" in codes(rep, "warning")
        assert ("speculative-tokens-fixed" in codes(rep)) is (flag != k_rule)  # K follows the decided layout
        assert fp.read_json(out / "specconv.json")["conversion"]["options"]["sample_from_anchor"] is flag
        model = load_with_speculators(out, tiny_verifier_dir)
        assert model.config.sample_from_anchor is flag
        run_speculators_forward(model)


def test_agreeing_readings_fill_as_before(built, tiny_verifier_dir, tmp_path):
    """DFlash K = B-1 without the key: the K rule and speculators' default (false) agree."""
    src = without_key(built["dflash_swa"], tmp_path / "save")
    rep = convert(src, tiny_verifier_dir)
    assert rep.plan["config"]["sample_from_anchor"] is False
    assert "sample-from-anchor-filled" in codes(rep, "info") and "layout-from-flag" not in codes(rep)


def test_the_flag_decides_a_k_the_rule_cannot_read(built, tiny_verifier_dir, tmp_path):
    """K neither B-1 nor B: the refusal's hint names the flag, and the flag is then honoured
    (it used to be refused whatever was passed)."""
    from specconv.errors import InvalidInputError

    cfg = fp.read_json(built["dflash_swa"] / "config.json")
    sc = cfg["speculators_config"]
    sc["proposal_methods"][0]["speculative_tokens"] = 2  # block 4: neither 3 nor 4
    src = without_key(built["dflash_swa"], tmp_path / "save", speculators_config=sc)
    with pytest.raises(InvalidInputError) as e:
        convert(src, tiny_verifier_dir)
    assert e.value.code == "missing_sample_from_anchor" and "--no-sample-from-anchor" in e.value.hint
    rep = convert(src, tiny_verifier_dir, sample_from_anchor=False)
    assert rep.plan["config"]["sample_from_anchor"] is False and k_of(rep.plan["config"]) == 3
    assert {"layout-from-flag", "speculative-tokens-fixed"} <= codes(rep, "warning")


def test_validate_source_reads_a_speculators_source_with_the_recorded_flag(built, tiny_verifier_dir, tmp_path):
    """``validate --source`` used a Speculators dir as it is, i.e. read with the K rule: the
    drafter converted with ``--sample-from-anchor`` would have been compared with the other layout."""
    from specconv.validate.run import prepare_source
    from specconv.verifier import resolve_verifier

    src = without_key(built["dspark_1n"], tmp_path / "save")
    out = tmp_path / "out"
    convert(src, tiny_verifier_dir, out, sample_from_anchor=True)
    work = tmp_path / "work"
    work.mkdir()
    got = prepare_source(str(src), resolve_verifier(str(tiny_verifier_dir), name=HUB), out, work)
    assert got["kind"] == "converted"
    assert fp.read_json(got["converted"] + "/config.json")["sample_from_anchor"] is True


def test_a_no_flag_is_recorded_as_a_decision():
    """``--no-sample-from-anchor`` / ``--no-norm-before-residual`` are decisions (recorded false);
    an on/off flag left off is not recorded."""
    from specconv.converters import ConvertOptions

    assert ConvertOptions().to_dict() == {"dtype": "keep"}
    assert not ConvertOptions(dtype="bfloat16").decides_reading()
    opts = ConvertOptions(sample_from_anchor=False, norm_before_residual=False)
    assert opts.to_dict() == {"dtype": "keep", "sample_from_anchor": False, "norm_before_residual": False}
    assert opts.decides_reading()
    assert ConvertOptions(sliding_window_non_causal=True).to_dict()["sliding_window_non_causal"] is True


# ------------------------------------------------------------- a key the runtime ignores
def _zlab_dflash(out, verifier_dir, dflash_config):
    """A z-lab DFlash drafter saved by z-lab ``dflash`` 0.1.0 for the tiny Qwen3 verifier."""
    import torch
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config

    v = fp.read_json(verifier_dir / "config.json")
    zc = Qwen3Config(
        vocab_size=v["vocab_size"], hidden_size=v["hidden_size"], intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6,
        rope_theta=10000.0, num_target_layers=v["num_hidden_layers"], block_size=4, dflash_config=dflash_config,
        architectures=["DFlashDraftModel"], tie_word_embeddings=False, dtype="float32",
    )
    torch.manual_seed(3)
    DFlashDraftModel(zc).float().eval().save_pretrained(out, safe_serialization=True)
    return out


def test_zlab_sample_from_anchor_the_runtime_ignores_is_written_as_it_runs(tiny_verifier_dir, tmp_path):
    pytest.importorskip("dflash")
    from specconv.errors import InvalidInputError

    src = _zlab_dflash(tmp_path / "zlab", tiny_verifier_dir,
                       {"target_layer_ids": [0, 2], "mask_token_id": 200, "sample_from_anchor": True})
    assert fp.read_json(src / "config.json")["dflash_config"]["sample_from_anchor"] is True  # z-lab wrote it
    rep = convert(src, tiny_verifier_dir)
    assert rep.plan["config"]["sample_from_anchor"] is False and k_of(rep.plan["config"]) == 3
    hit = [f for f in rep.findings if f["code"] == "sample-from-anchor-ignored"]
    assert len(hit) == 1 and hit[0]["level"] == "warning", rep.findings
    assert "dflash_config.sample_from_anchor=True" in hit[0]["message"] and "dflash/model.py" in hit[0]["message"]
    with pytest.raises(InvalidInputError) as e:  # the runtime's layout still decides
        convert(src, tiny_verifier_dir, sample_from_anchor=True)
    assert e.value.code == "conflicting_layout"
    plain = _zlab_dflash(tmp_path / "plain", tiny_verifier_dir,
                         {"target_layer_ids": [0, 2], "mask_token_id": 200, "sample_from_anchor": False})
    assert "sample-from-anchor-ignored" not in codes(convert(plain, tiny_verifier_dir))


# ------------------------------------------------------------- --sliding-window-non-causal
def test_all_full_attention_dflash_is_refused_naming_the_flag(built, tiny_verifier_dir, tmp_path):
    from cli_runner import invoke

    assert fp.read_json(built["dflash_full"] / "config.json")["sliding_window_non_causal"] is False
    r = invoke("convert", built["dflash_full"], "--verifier", tiny_verifier_dir, "--verifier-name", HUB,
               "-o", tmp_path / "o")
    err = json.loads(r.stdout)
    assert r.code == 3 and err["error"] == "lint_failed" and "dflash-causal-full-attention" in err["message"], err
    assert "--sliding-window-non-causal" in err["hint"] and not (tmp_path / "o").exists()


def test_the_flag_sets_the_key_without_changing_what_speculators_runs(built, tiny_verifier_dir, tmp_path):
    from cli_runner import invoke
    from interop import load_with_speculators, run_speculators_forward
    from tolerances import assert_close

    out = tmp_path / "out"
    r = invoke("convert", built["dflash_full"], "--verifier", tiny_verifier_dir, "--verifier-name", HUB, "-o", out,
               "--sliding-window-non-causal")
    assert r.code == 0, r.stdout
    assert "sliding-window-non-causal-from-flag" in {f["code"] for f in json.loads(r.stdout)["findings"]}
    assert fp.read_json(out / "config.json")["sliding_window_non_causal"] is True
    assert fp.read_json(out / "specconv.json")["conversion"]["options"]["sliding_window_non_causal"] is True
    before = run_speculators_forward(load_with_speculators(built["dflash_full"], tiny_verifier_dir))
    after = run_speculators_forward(load_with_speculators(out, tiny_verifier_dir))
    assert_close(after, before, what="speculators' forward, sliding_window_non_causal true vs false")


@pytest.mark.parametrize("name,needle", [("dflash_swa", "0 (sliding_attention)"), ("dspark", "vLLM ignores"),
                                         ("peagle", "has no block")])
def test_the_flag_is_refused_where_it_would_change_a_layer_or_nobody_reads_it(
        built, tiny_verifier_dir, tiny_llama_verifier_dir, tmp_path, name, needle):
    from specconv.errors import InvalidInputError

    verifier = tiny_verifier_dir
    if name == "dspark":
        src = fp.build_speculators_block(tiny_verifier_dir, tmp_path / "ds", "dspark", full_attention=True)
    elif name == "peagle":
        src, verifier = fp.build_speculators_peagle(tiny_llama_verifier_dir, tmp_path / "pe"), tiny_llama_verifier_dir
    else:
        src = built[name]
    with pytest.raises(InvalidInputError) as e:
        convert(src, verifier, sliding_window_non_causal=True)
    assert e.value.code == "flag_not_applicable" and needle in e.value.message, e.value.message


def test_validate_source_reproduces_the_flag(built, tiny_verifier_dir, tmp_path):
    from specconv.validate.run import prepare_source
    from specconv.verifier import resolve_verifier

    out = tmp_path / "out"
    convert(built["dflash_full"], tiny_verifier_dir, out, sliding_window_non_causal=True)
    work = tmp_path / "work"
    work.mkdir()
    got = prepare_source(str(built["dflash_full"]), resolve_verifier(str(tiny_verifier_dir), name=HUB), out, work)
    assert got["kind"] == "converted"
    assert fp.read_json(got["converted"] + "/config.json")["sliding_window_non_causal"] is True


_VLLM_CAUSALITY = """
import json, sys
from types import SimpleNamespace
from vllm.transformers_utils.configs.speculators.algos import update_dflash
from vllm.model_executor.models.qwen3_dflash import _dflash_layer_causal
cfg = json.load(open(sys.argv[1]))
pre = dict(cfg["transformer_layer_config"])
update_dflash(cfg, pre)
print(json.dumps([_dflash_layer_causal(SimpleNamespace(**pre), i) for i in range(pre["num_hidden_layers"])]))
"""


@pytest.mark.vllm
def test_vllm_runs_the_flagged_layers_bidirectionally(built, tiny_verifier_dir, tmp_path):
    """vLLM 0.33's own updater and layer-causality rule on the written config: every layer
    non-causal with the flag, every layer causal without (what the lint refuses)."""
    from specconv.engines.vllm.check import find_vllm_python
    from specconv.errors import InvalidInputError

    try:
        py = find_vllm_python()
    except InvalidInputError:
        pytest.skip("no vLLM loader venv (make vllm-venv)")
    out = tmp_path / "out"
    convert(built["dflash_full"], tiny_verifier_dir, out, sliding_window_non_causal=True)
    script = tmp_path / "causal.py"
    script.write_text(_VLLM_CAUSALITY)
    causal = {}
    for name, cfg in (("flagged", out / "config.json"), ("source", built["dflash_full"] / "config.json")):
        p = subprocess.run([str(py), str(script), str(cfg)], capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        causal[name] = json.loads(p.stdout.strip().splitlines()[-1])
    assert causal == {"flagged": [False], "source": [True]}
