"""Tests for specconv.format: typed config,
deterministic dump/load, servability lint.

The three example configs are tiny P-EAGLE, DFlash and DSpark drafts whose configs load in
speculators 0.9.0 (``test_dumped_config_parses_in_speculators``); the good tensor lists are
the tensors speculators saves for them (``src/speculators/models/{peagle,dflash,dspark}/core.py``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable

import numpy as np
import pytest

from specconv.errors import InvalidInputError, UnsupportedFormatError
from specconv.format import (
    LINT_RULES,
    DFlashConfig,
    DSparkConfig,
    Finding,
    PEagleConfig,
    VerifierFacts,
    config_to_dict,
    dump_config,
    expected_speculative_tokens,
    expected_tensors,
    has_errors,
    is_hub_repo_id,
    lint,
    lint_dir,
    load_config,
    make_config,
    parse_config,
)

VERIFIER_ID = "your-org/tiny-qwen3-verifier"


def _layer_cfg(num_layers: int, layer_types: list[str], window, use_sw: bool | None) -> dict:
    d = {
        "model_type": "qwen3", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": num_layers, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "hidden_act": "silu", "rms_norm_eps": 1e-06,
        "max_position_embeddings": 512, "attention_bias": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "layer_types": layer_types, "sliding_window": window, "tie_word_embeddings": False,
    }
    if use_sw is not None:
        d["use_sliding_window"] = use_sw
    return d


def _spec_cfg(algo: str, k: int) -> dict:
    return {
        "algorithm": algo,
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k,
                              "verifier_accept_k": 1, "accept_tolerance": 0.0}],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": VERIFIER_ID, "architectures": ["Qwen3ForCausalLM"]},
    }


PEAGLE_EXAMPLE = {
    "speculators_model_type": "peagle", "speculators_version": "0.9.0",
    "architectures": ["PEagleDraftModel"], "dtype": "bfloat16", "tie_word_embeddings": False,
    "draft_vocab_size": 256, "target_hidden_size": None,
    "eagle_aux_hidden_state_layer_ids": [1, 3, 5], "mask_token_id": 255,
    "norm_before_residual": True, "norm_before_fc": False, "fc_norm": False,
    "norm_output": False, "embed_requires_grad": True,
    "transformer_layer_config": _layer_cfg(1, ["full_attention"], None, None),
    "speculators_config": _spec_cfg("peagle", 8),
}

DFLASH_EXAMPLE = {
    "speculators_model_type": "dflash", "speculators_version": "0.9.0",
    "architectures": ["DFlashDraftModel"], "dtype": "bfloat16", "tie_word_embeddings": False,
    "draft_vocab_size": 256, "target_hidden_size": None,
    "aux_hidden_state_layer_ids": [1, 2, 3, 4, 5], "mask_token_id": 255, "block_size": 8,
    "sample_from_anchor": False, "sliding_window_non_causal": True,
    "transformer_layer_config": _layer_cfg(2, ["full_attention"] * 2, None, False),
    "speculators_config": _spec_cfg("dflash", 7),
}

DSPARK_EXAMPLE = {
    "speculators_model_type": "dspark", "speculators_version": "0.9.0",
    "architectures": ["DSparkDraftModel"], "dtype": "bfloat16", "tie_word_embeddings": False,
    "draft_vocab_size": 64, "target_hidden_size": None,
    "aux_hidden_state_layer_ids": [1, 3, 5], "mask_token_id": 255, "block_size": 8,
    "sample_from_anchor": True, "sliding_window_non_causal": False,
    "markov_rank": 16, "markov_head_type": "vanilla", "enable_confidence_head": True,
    "confidence_head_with_markov": True,
    "transformer_layer_config": _layer_cfg(2, ["sliding_attention"] * 2, 2048, True),
    "speculators_config": _spec_cfg("dspark", 8),
}

EXAMPLES = {"peagle": PEAGLE_EXAMPLE, "dflash": DFLASH_EXAMPLE, "dspark": DSPARK_EXAMPLE}
CLASSES = {"peagle": PEagleConfig, "dflash": DFlashConfig, "dspark": DSparkConfig}


def _layer_tensors(i: int, d_in: int, qk_norm: bool = True) -> dict:
    p = f"layers.{i}."
    t = {
        p + "input_layernorm.weight": (64,), p + "post_attention_layernorm.weight": (64,),
        p + "self_attn.q_proj.weight": (64, d_in), p + "self_attn.k_proj.weight": (32, d_in),
        p + "self_attn.v_proj.weight": (32, d_in), p + "self_attn.o_proj.weight": (64, 64),
        p + "mlp.gate_proj.weight": (128, 64), p + "mlp.up_proj.weight": (128, 64),
        p + "mlp.down_proj.weight": (64, 128),
    }
    if qk_norm:
        t[p + "self_attn.q_norm.weight"] = (16,)
        t[p + "self_attn.k_norm.weight"] = (16,)
    return t


def good_tensors(algo: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """Tensor name -> (shape, dtype) speculators saves for each example."""
    if algo == "peagle":
        shapes = {"embed_tokens.weight": (256, 64), "fc.weight": (64, 192),
                  "mask_hidden": (1, 1, 192), "norm.weight": (64,), "lm_head.weight": (256, 64),
                  "layers.0.hidden_norm.weight": (64,), **_layer_tensors(0, 128)}
    elif algo == "dflash":
        shapes = {"fc.weight": (64, 320), "hidden_norm.weight": (64,), "norm.weight": (64,),
                  **_layer_tensors(0, 64), **_layer_tensors(1, 64)}
    else:
        shapes = {"fc.weight": (64, 192), "hidden_norm.weight": (64,), "norm.weight": (64,),
                  **_layer_tensors(0, 64), **_layer_tensors(1, 64),
                  "lm_head.weight": (64, 64),
                  "markov_head.markov_w1.weight": (256, 16),
                  "markov_head.markov_w2.weight": (64, 16),
                  "confidence_head.proj.weight": (1, 80), "confidence_head.proj.bias": (1,)}
    out = {n: (s, "BF16") for n, s in shapes.items()}
    if algo == "dspark":
        out["d2t"] = ((64,), "I64")
        out["t2d"] = ((256,), "BOOL")
    return out


def good_verifier(**kw) -> VerifierFacts:
    base = dict(num_hidden_layers=6, hidden_size=64, vocab_size=256,
                architectures=["Qwen3ForCausalLM"], bos_token_id=1, eos_token_id=[2, 3],
                pad_token_id=0, name_or_path=VERIFIER_ID, is_local_path=False)
    base.update(kw)
    return VerifierFacts(**base)


def codes(findings: list[Finding], level: str | None = None) -> set[str]:
    return {f.code for f in findings if level is None or f.level == level}


# ------------------------------------------------------------------ config model


@pytest.mark.parametrize("algo", sorted(EXAMPLES))
def test_example_parses_into_right_class(algo):
    cfg = parse_config(copy.deepcopy(EXAMPLES[algo]))
    assert type(cfg) is CLASSES[algo]
    assert cfg.speculators_model_type == algo
    assert cfg.hidden_size == 64 and cfg.vocab_size == 256
    assert cfg.rope_theta == 1e6
    assert cfg.speculative_tokens == EXAMPLES[algo]["speculators_config"]["proposal_methods"][0][
        "speculative_tokens"]


def test_dspark_is_not_a_dflash_subclass():
    cfg = parse_config(copy.deepcopy(DSPARK_EXAMPLE))
    assert not isinstance(cfg, DFlashConfig)


@pytest.mark.parametrize("algo", sorted(EXAMPLES))
def test_dump_load_roundtrip_and_deterministic(algo, tmp_path):
    cfg = parse_config(copy.deepcopy(EXAMPLES[algo]))
    raw = dump_config(cfg)
    assert raw == dump_config(parse_config(copy.deepcopy(EXAMPLES[algo])))
    assert raw.endswith(b"}\n")
    (tmp_path / "config.json").write_bytes(raw)
    back = load_config(tmp_path)
    assert back == cfg
    assert dump_config(back) == raw
    # also via the file path
    assert load_config(tmp_path / "config.json") == cfg
    # sorted keys, indent 2
    assert raw.decode() == json.dumps(json.loads(raw), sort_keys=True, indent=2) + "\n"
    # the dumped dict equals the spec example key for key
    assert json.loads(raw) == EXAMPLES[algo]


@pytest.mark.parametrize("algo", sorted(EXAMPLES))
def test_never_writes_top_level_model_type_or_auto_map(algo):
    d = copy.deepcopy(EXAMPLES[algo])
    d["model_type"] = "qwen3"
    d["auto_map"] = {"": "config.DFlashSpeculatorConfig"}
    cfg = parse_config(d)
    out = json.loads(dump_config(cfg))
    assert "model_type" not in out and "auto_map" not in out
    assert "model_type" not in config_to_dict(cfg)
    # the layer config keeps its own model_type
    assert out["transformer_layer_config"]["model_type"] == "qwen3"


def test_legacy_extra_keys_roundtrip():
    d = copy.deepcopy(PEAGLE_EXAMPLE)
    d["num_depths"] = 8
    d["down_sample_ratio"] = 0.7
    d["speculators_config"]["proposal_methods"][0]["legacy_knob"] = 3
    cfg = parse_config(d)
    out = json.loads(dump_config(cfg))
    assert out["num_depths"] == 8 and out["down_sample_ratio"] == 0.7
    assert out["speculators_config"]["proposal_methods"][0]["legacy_knob"] == 3


@pytest.mark.parametrize("algo", sorted(EXAMPLES))
def test_make_config_reproduces_example(algo):
    ex = copy.deepcopy(EXAMPLES[algo])
    sc = ex.pop("speculators_config")
    ex.pop("speculators_model_type")
    tlc = ex.pop("transformer_layer_config")
    cfg = make_config(
        algo, transformer_layer_config=tlc,
        verifier_name_or_path=sc["verifier"]["name_or_path"],
        verifier_architectures=sc["verifier"]["architectures"],
        speculative_tokens=sc["proposal_methods"][0]["speculative_tokens"] if algo == "peagle" else None,
        **ex,
    )
    assert json.loads(dump_config(cfg)) == EXAMPLES[algo]


def test_make_config_defaults():
    cfg = make_config("dflash", transformer_layer_config=DFLASH_EXAMPLE["transformer_layer_config"],
                      verifier_name_or_path=VERIFIER_ID, block_size=16,
                      aux_hidden_state_layer_ids=(1, 3))
    out = json.loads(dump_config(cfg))
    assert out["architectures"] == ["DFlashDraftModel"]
    assert out["draft_vocab_size"] == 256
    assert out["aux_hidden_state_layer_ids"] == [1, 3]
    assert out["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 15
    for key in ("mask_token_id", "block_size", "sample_from_anchor", "sliding_window_non_causal",
                "draft_vocab_size", "target_hidden_size"):
        assert key in out
    # DSpark default layout is anchor-first: K = B
    ds = make_config("dspark", transformer_layer_config=DFLASH_EXAMPLE["transformer_layer_config"],
                     verifier_name_or_path=VERIFIER_ID, block_size=7)
    assert ds.speculative_tokens == 7 and ds.sample_from_anchor is True
    with pytest.raises(InvalidInputError, match="speculative_tokens"):
        make_config("peagle", transformer_layer_config=PEAGLE_EXAMPLE["transformer_layer_config"])
    with pytest.raises(UnsupportedFormatError):
        make_config("eagle3", transformer_layer_config=PEAGLE_EXAMPLE["transformer_layer_config"])


@pytest.mark.parametrize(
    "algo,block,sfa,expected",
    [("dflash", 8, False, 7), ("dflash", 8, True, 8), ("dspark", 7, True, 7),
     ("dspark", 16, False, 15), ("peagle", None, None, None)],
)
def test_expected_speculative_tokens(algo, block, sfa, expected):
    d = copy.deepcopy(EXAMPLES[algo])
    if block is not None:
        d["block_size"] = block
        d["sample_from_anchor"] = sfa
    assert expected_speculative_tokens(parse_config(d)) == expected


def test_rope_theta_legacy_top_level_accepted():
    d = copy.deepcopy(DFLASH_EXAMPLE)
    del d["transformer_layer_config"]["rope_parameters"]
    d["transformer_layer_config"]["rope_theta"] = 10000.0
    assert parse_config(d).rope_theta == 1e4


def _del(path: str) -> Callable[[dict], None]:
    def f(d: dict) -> None:
        *parents, last = path.split(".")
        for p in parents:
            d = d[p]
        del d[last]
    return f


def _set(path: str, value) -> Callable[[dict], None]:
    def f(d: dict) -> None:
        *parents, last = path.split(".")
        for p in parents:
            d = d[int(p)] if isinstance(d, list) else d[p]
        d[last] = value
    return f


@pytest.mark.parametrize(
    "mutate,key",
    [
        (_del("speculators_config"), "speculators_config"),
        (_del("draft_vocab_size"), "draft_vocab_size"),
        (_del("transformer_layer_config.hidden_size"), "transformer_layer_config.hidden_size"),
        (_del("transformer_layer_config.model_type"), "transformer_layer_config.model_type"),
        (_del("transformer_layer_config.rms_norm_eps"), "transformer_layer_config.rms_norm_eps"),
        (_del("transformer_layer_config.rope_parameters"), "rope_theta"),
        (_set("block_size", "8"), "block_size"),
        (_set("sample_from_anchor", 0), "sample_from_anchor"),
        (_set("speculators_config.default_proposal_method", "tree"), "default_proposal_method"),
        (_set("speculators_config.proposal_methods", []), "proposal_methods"),
        (_del("speculators_config.verifier.architectures"), "speculators_config.verifier.architectures"),
    ],
)
def test_load_config_names_bad_key_and_file(tmp_path, mutate, key):
    d = copy.deepcopy(DFLASH_EXAMPLE)
    mutate(d)
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(InvalidInputError) as ei:
        load_config(tmp_path)
    assert key in ei.value.message
    assert "config.json" in ei.value.message
    assert ei.value.exit_code == 3


def test_load_config_missing_type_and_unsupported(tmp_path):
    d = copy.deepcopy(DFLASH_EXAMPLE)
    del d["speculators_model_type"]
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(InvalidInputError, match="speculators_model_type"):
        load_config(tmp_path)
    d["speculators_model_type"] = "eagle3"
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(UnsupportedFormatError, match="eagle3"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(InvalidInputError, match="JSON"):
        load_config(tmp_path)
    with pytest.raises(InvalidInputError, match="not found"):
        load_config(tmp_path / "nowhere")


def test_hub_repo_id_rules(tmp_path):
    assert is_hub_repo_id("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert is_hub_repo_id("gpt2")
    for bad in ("/abs/path", "./rel", "a/b/c", "foo--bar", "foo.git", "", None, "x" * 97):
        assert not is_hub_repo_id(bad), bad
    d = tmp_path / "local"
    d.mkdir()
    assert not is_hub_repo_id(str(d))


# ------------------------------------------------------------------ lint


@pytest.mark.parametrize("algo", sorted(EXAMPLES))
def test_good_examples_lint_clean(algo):
    cfg = parse_config(copy.deepcopy(EXAMPLES[algo]))
    findings = lint(cfg, good_tensors(algo), good_verifier())
    assert not [f for f in findings if f.level in ("error", "warning")], findings
    assert not has_errors(findings)
    for f in findings:
        assert f.code in LINT_RULES
        assert set(f.to_dict()) == {"level", "code", "message", "key"}


def test_expected_tensors_match_spec_lists():
    for algo in EXAMPLES:
        cfg = parse_config(copy.deepcopy(EXAMPLES[algo]))
        exp = expected_tensors(cfg)
        good = good_tensors(algo)
        for name, (shape, _) in good.items():
            assert exp[name].shape == shape, name
        required = {n for n, s in exp.items() if s.need == "required"}
        assert required <= set(good)


# Each case: (id, algorithm, mutate(config dict, tensors dict) -> verifier | None,
#             expected code, expected level)
def _mut_cfg(**changes):
    def f(d, t):
        for k, v in changes.items():
            _set(k, v)(d)
    return f


def _drop_tensors(*names):
    def f(d, t):
        for n in list(t):
            if n in names or any(n.startswith(p) for p in names if p.endswith(".")):
                del t[n]
    return f


def _add_tensor(name, shape, dtype="BF16"):
    def f(d, t):
        t[name] = (shape, dtype)
    return f


def _chain(*fns):
    def f(d, t):
        out = None
        for fn in fns:
            r = fn(d, t)
            out = r if r is not None else out
        return out
    return f


def _verifier(**kw):
    def f(d, t):
        return good_verifier(**kw)
    return f


_ST = "speculators_config.proposal_methods.0.speculative_tokens"
_SWA_TLC = {"transformer_layer_config.layer_types": ["sliding_attention"] * 2,
            "transformer_layer_config.sliding_window": 2048,
            "transformer_layer_config.use_sliding_window": True}

BAD_CASES = [
    ("mask-missing-peagle", "peagle", lambda d, t: _del("mask_token_id")(d), "mask-token-missing", "error"),
    ("mask-missing-dflash", "dflash", _mut_cfg(mask_token_id=None), "mask-token-missing", "error"),
    ("mask-too-big", "dflash", _mut_cfg(mask_token_id=256), "mask-token-out-of-range", "error"),
    ("mask-eos", "dspark", _mut_cfg(mask_token_id=3), "mask-token-special", "warning"),
    ("mask-bos", "peagle", _mut_cfg(mask_token_id=1), "mask-token-special", "warning"),
    ("st-dflash", "dflash", _mut_cfg(**{_ST: 8}), "speculative-tokens-mismatch", "error"),
    ("st-dspark-no-sfa", "dspark", _mut_cfg(sample_from_anchor=False),
     "speculative-tokens-mismatch", "error"),
    ("st-peagle-zero", "peagle", _mut_cfg(**{_ST: 0}), "speculative-tokens-invalid", "error"),
    ("peagle-depths", "peagle", _mut_cfg(num_depths=4), "peagle-depths-exceeded", "warning"),
    ("block-size-1", "dflash", _mut_cfg(block_size=1), "block-size-invalid", "error"),
    ("dflash-sfa", "dflash", _mut_cfg(sample_from_anchor=True, **{_ST: 8}),
     "dflash-sample-from-anchor", "warning"),
    ("verifier-abs-path", "dflash",
     _mut_cfg(**{"speculators_config.verifier.name_or_path": "/models/tiny-verifier"}),
     "verifier-not-hub-id", "warning"),
    ("verifier-local-dir", "peagle",
     _chain(_mut_cfg(**{"speculators_config.verifier.name_or_path": "tiny-verifier"}),
            _verifier(name_or_path="tiny-verifier", is_local_path=True)),
     "verifier-not-hub-id", "warning"),
    ("verifier-null", "dspark", _mut_cfg(**{"speculators_config.verifier.name_or_path": None}),
     "verifier-name-missing", "error"),
    ("dflash-full-causal", "dflash", _mut_cfg(sliding_window_non_causal=False),
     "dflash-causal-full-attention", "error"),
    ("dflash-swa-noncausal", "dflash", _mut_cfg(**_SWA_TLC), "dflash-swa-non-causal", "warning"),
    ("dflash-mixed", "dflash",
     _mut_cfg(sliding_window_non_causal=False, **{
         **_SWA_TLC,
         "transformer_layer_config.layer_types": ["full_attention", "sliding_attention"]}),
     "dflash-mixed-attention", "warning"),
    ("dspark-gated", "dspark", _mut_cfg(markov_head_type="gated"), "dspark-markov-head-type", "warning"),
    ("dspark-rnn-weights", "dspark", _mut_cfg(markov_head_type="rnn"), "markov-head-missing", "error"),
    ("dspark-rank0", "dspark",
     _chain(_mut_cfg(markov_rank=0, confidence_head_with_markov=False),
            _drop_tensors("markov_head.markov_w1.weight", "markov_head.markov_w2.weight"),
            _add_tensor("confidence_head.proj.weight", (1, 64))),
     "dspark-markov-rank-zero", "warning"),
    ("dspark-conf-rank0", "dspark", _mut_cfg(markov_rank=0), "dspark-confidence-markov-rank-zero", "error"),
    ("dspark-swa-flag", "dspark", _mut_cfg(sliding_window_non_causal=True),
     "dspark-swa-non-causal-ignored", "warning"),
    ("dspark-no-sfa-key", "dspark", lambda d, t: _del("sample_from_anchor")(d), "implicit-key", "warning"),
    ("swa-disabled", "dspark", _mut_cfg(**{"transformer_layer_config.use_sliding_window": False}),
     "swa-disabled", "warning"),
    ("layer-types-len", "dflash",
     _mut_cfg(**{"transformer_layer_config.layer_types": ["full_attention"]}), "layer-types-length", "error"),
    ("gqa", "dflash", _mut_cfg(**{"transformer_layer_config.num_key_value_heads": 3}), "gqa-heads", "error"),
    ("pruned-no-lm-head", "dspark", _drop_tensors("lm_head.weight"), "lm-head-missing", "error"),
    ("pruned-no-d2t", "dspark", _drop_tensors("d2t"), "d2t-missing", "error"),
    ("pruned-no-t2d", "dspark", _drop_tensors("t2d"), "t2d-missing", "error"),
    ("padded-vocab", "dflash",
     _chain(_mut_cfg(draft_vocab_size=300), _add_tensor("lm_head.weight", (300, 64))),
     "draft-vocab-padded", "warning"),
    ("full-vocab-d2t", "dflash", _add_tensor("d2t", (256,), "I64"), "vocab-map-unneeded", "warning"),
    ("peagle-no-mask-hidden", "peagle", _drop_tensors("mask_hidden"), "mask-hidden-missing", "error"),
    ("peagle-no-embed", "peagle", _drop_tensors("embed_tokens.weight"), "embed-tokens-missing", "error"),
    ("peagle-no-lm-head", "peagle", _drop_tensors("lm_head.weight"), "lm-head-missing", "error"),
    ("peagle-fc-norm", "peagle",
     _chain(_mut_cfg(fc_norm=True), *[_add_tensor(f"fc_norm.{i}.weight", (64,)) for i in range(3)]),
     "peagle-fc-norm", "warning"),
    ("peagle-both-norms", "peagle", _mut_cfg(fc_norm=True, norm_before_fc=True),
     "norm-flags-exclusive", "error"),
    ("peagle-llama-4-aux", "peagle",
     _chain(_mut_cfg(**{"transformer_layer_config.model_type": "llama",
                        "eagle_aux_hidden_state_layer_ids": [1, 2, 3, 5]}),
            _add_tensor("fc.weight", (64, 256)), _add_tensor("mask_hidden", (1, 1, 256))),
     "peagle-llama-aux-count", "warning"),
    ("peagle-mistral", "peagle", _mut_cfg(**{"transformer_layer_config.model_type": "mistral"}),
     "layer-model-type-unsupported", "error"),
    ("peagle-aux-null", "peagle", _mut_cfg(eagle_aux_hidden_state_layer_ids=None), "aux-ids-implicit", "warning"),
    ("dflash-mask-hidden", "dflash", _add_tensor("mask_hidden", (1, 1, 320)), "mask-hidden-present", "error"),
    ("verifier-tensor", "dspark", _add_tensor("verifier_lm_head.weight", (256, 64)), "verifier-tensor", "error"),
    ("fused-qkv", "dflash", _add_tensor("layers.0.self_attn.qkv_proj.weight", (128, 64)), "fused-tensor", "error"),
    ("fc-shape", "dflash", _add_tensor("fc.weight", (64, 192)), "fc-shape", "error"),
    ("layer-count-missing", "dflash", _drop_tensors("layers.1."), "layer-count", "error"),
    ("layer-count-extra", "peagle", _add_tensor("layers.1.input_layernorm.weight", (64,)), "layer-count", "error"),
    ("q-proj-shape", "peagle", _add_tensor("layers.0.self_attn.q_proj.weight", (64, 64)), "tensor-shape", "error"),
    ("k-proj-shape", "dflash", _add_tensor("layers.1.self_attn.k_proj.weight", (64, 64)), "tensor-shape", "error"),
    ("v-proj-shape", "dspark", _add_tensor("layers.0.self_attn.v_proj.weight", (16, 64)), "tensor-shape", "error"),
    ("markov-w1-shape", "dspark", _add_tensor("markov_head.markov_w1.weight", (64, 16)), "tensor-shape", "error"),
    ("markov-w2-shape", "dspark", _add_tensor("markov_head.markov_w2.weight", (256, 16)), "tensor-shape", "error"),
    ("d2t-dtype", "dspark", _add_tensor("d2t", (64,), "I32"), "tensor-dtype", "error"),
    ("t2d-dtype", "dspark", _add_tensor("t2d", (256,), "U8"), "tensor-dtype", "error"),
    ("t2d-shape", "dspark", _add_tensor("t2d", (64,), "BOOL"), "tensor-shape", "error"),
    ("mask-hidden-shape", "peagle", _add_tensor("mask_hidden", (1, 192)), "tensor-shape", "error"),
    ("model-prefix", "dflash", _add_tensor("model.norm.weight", (64,)), "prefixed-tensor-names", "error"),
    ("unexpected", "dflash", _add_tensor("foo.weight", (3,)), "unexpected-tensor", "warning"),
    ("mixed-dtypes", "dflash", _add_tensor("norm.weight", (64,), "F32"), "mixed-float-dtypes", "warning"),
    ("aux-dup", "dspark", _mut_cfg(aux_hidden_state_layer_ids=[1, 1, 5]), "aux-ids-duplicate", "error"),
    ("aux-range", "dspark", _mut_cfg(aux_hidden_state_layer_ids=[1, 3, 7]), "aux-ids-out-of-range", "error"),
    ("aux-order", "dflash", _mut_cfg(aux_hidden_state_layer_ids=[5, 4, 3, 2, 1]), "aux-ids-order", "warning"),
    ("aux-negative", "peagle", _mut_cfg(eagle_aux_hidden_state_layer_ids=[-1, 3, 5]),
     "aux-ids-out-of-range", "error"),
    ("aux-missing", "dflash", _mut_cfg(aux_hidden_state_layer_ids=None), "aux-ids-missing", "error"),
    ("top-model-type", "dflash", _mut_cfg(model_type="qwen3"), "top-level-model-type", "error"),
    ("hidden-mismatch", "peagle", _verifier(hidden_size=128), "hidden-size-mismatch", "error"),
    ("vocab-mismatch", "dflash", _verifier(vocab_size=512), "vocab-size-mismatch", "error"),
    ("algo-mismatch", "dflash", _mut_cfg(**{"speculators_config.algorithm": "eagle3"}),
     "algorithm-mismatch", "warning"),
    ("arch-pydantic-default", "dflash", _mut_cfg(architectures=["DFlashSpeculator"]),
     "architectures-unexpected", "info"),
    ("dflash-all-swa-causal", "dflash", _mut_cfg(sliding_window_non_causal=False, **_SWA_TLC),
     "dflash-vllm-version", "info"),
    ("draft-vocab-zero", "dflash", _mut_cfg(draft_vocab_size=0), "draft-vocab-invalid", "error"),
    ("draft-vocab-larger", "dflash",
     _chain(_mut_cfg(draft_vocab_size=300), _add_tensor("lm_head.weight", (300, 64)),
            _add_tensor("embed_tokens.weight", (256, 64))), "draft-vocab-larger", "info"),
    ("dtype-mismatch", "peagle", lambda d, t: t.update({n: (s, "F32") for n, (s, _) in t.items()}),
     "dtype-mismatch", "warning"),
    ("layer-types-absent", "dflash", lambda d, t: _del("transformer_layer_config.layer_types")(d),
     "layer-types-implicit", "info"),
    ("layer-types-unknown", "dflash",
     _mut_cfg(**{"transformer_layer_config.layer_types": ["full_attention", "chunked_attention"]}),
     "layer-types-unknown", "error"),
    ("markov-rank-negative", "dspark", _mut_cfg(markov_rank=-1), "markov-rank-invalid", "error"),
    ("two-proposals", "dflash",
     lambda d, t: d["speculators_config"]["proposal_methods"].append(
         dict(d["speculators_config"]["proposal_methods"][0])),
     "multiple-proposal-methods", "info"),
    ("swa-no-window", "dflash",
     _mut_cfg(**{**_SWA_TLC, "transformer_layer_config.sliding_window": None}),
     "swa-window-missing", "warning"),
    ("target-hidden", "dflash", _mut_cfg(target_hidden_size=128), "target-hidden-size", "warning"),
    ("no-final-norm", "dspark", _drop_tensors("norm.weight"), "tensor-missing", "error"),
    ("no-conf-bias", "dspark", _drop_tensors("confidence_head.proj.bias"),
     "tensor-recommended-missing", "warning"),
    ("tied", "peagle", _mut_cfg(tie_word_embeddings=True), "tie-word-embeddings", "warning"),
    ("verifier-arch", "peagle", _verifier(architectures=["LlamaForCausalLM"]),
     "verifier-architectures-mismatch", "info"),
    ("dflash-not-qwen3", "dflash", _mut_cfg(**{"transformer_layer_config.model_type": "llama"}),
     "layer-model-type-not-qwen3", "warning"),
]


@pytest.mark.parametrize("case", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_lint_rule_fires_on_bad_input_only(case):
    _, algo, mutate, code, level = case
    assert code in LINT_RULES
    d = copy.deepcopy(EXAMPLES[algo])
    tensors = good_tensors(algo)
    verifier = mutate(d, tensors) or good_verifier()
    findings = lint(parse_config(d), tensors, verifier)
    hits = [f for f in findings if f.code == code]
    assert hits, f"{code} did not fire: {findings}"
    assert {f.level for f in hits} == {level}
    assert all(f.message for f in hits)
    # and the same rule is silent on the untouched example
    good = lint(parse_config(copy.deepcopy(EXAMPLES[algo])), good_tensors(algo), good_verifier())
    assert code not in codes(good)


def test_fc_shape_message_names_both_numbers():
    cfg = parse_config(copy.deepcopy(DFLASH_EXAMPLE))
    t = good_tensors("dflash")
    t["fc.weight"] = ((64, 192), "BF16")
    (f,) = [f for f in lint(cfg, t) if f.code == "fc-shape"]
    assert "320" in f.message and "192" in f.message and f.key == "fc.weight"


def test_dspark_sfa_info_only_when_true():
    cfg = parse_config(copy.deepcopy(DSPARK_EXAMPLE))
    assert ("info", "dspark-sample-from-anchor-vllm") in {(f.level, f.code) for f in lint(cfg)}
    d = copy.deepcopy(DSPARK_EXAMPLE)
    d["sample_from_anchor"] = False
    d["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 7
    assert "dspark-sample-from-anchor-vllm" not in codes(lint(parse_config(d)))


def test_lint_without_tensors_or_verifier_skips_those_checks():
    d = copy.deepcopy(DSPARK_EXAMPLE)
    d["aux_hidden_state_layer_ids"] = [1, 3, 99]
    cfg = parse_config(d)
    f = lint(cfg)
    assert "aux-ids-out-of-range" not in codes(f)   # range needs verifier facts
    assert "lm-head-missing" not in codes(f)        # tensor checks skipped
    assert "aux-ids-out-of-range" in codes(lint(cfg, None, good_verifier()))


def test_findings_sorted_errors_first():
    d = copy.deepcopy(DFLASH_EXAMPLE)
    d["sample_from_anchor"] = True        # warning
    d["mask_token_id"] = None            # error
    levels = [f.level for f in lint(parse_config(d))]
    assert levels == sorted(levels, key=["error", "warning", "info"].index)
    assert levels[0] == "error"


# ------------------------------------------------------------------ lint_dir


def _np_dtype(st: str):
    return {"BF16": np.float16, "F16": np.float16, "F32": np.float32,
            "I64": np.int64, "BOOL": np.bool_}[st]


def _write_draft(path, algo, tensors=None, cfg_dict=None):
    from safetensors.numpy import save_file

    d = copy.deepcopy(cfg_dict or EXAMPLES[algo])
    d["dtype"] = "float16"
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_bytes(dump_config(parse_config(d)))
    tensors = tensors or good_tensors(algo)
    arrays = {n: np.zeros(s, dtype=_np_dtype(dt)) for n, (s, dt) in tensors.items()}
    save_file(arrays, str(path / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("algo", sorted(EXAMPLES))
def test_lint_dir_good_and_bad(tmp_path, algo):
    good_dir = tmp_path / "good"
    _write_draft(good_dir, algo)
    f = lint_dir(good_dir, good_verifier())
    assert not [x for x in f if x.level in ("error", "warning")], f

    bad = good_tensors(algo)
    bad["fc.weight"] = ((64, 64), "BF16")
    bad["verifier_norm.weight"] = ((64,), "BF16")
    bad_dir = tmp_path / "bad"
    _write_draft(bad_dir, algo, bad)
    (bad_dir / "optimizer_state_dict.pt").write_bytes(b"x")
    c = codes(lint_dir(bad_dir))
    assert {"fc-shape", "verifier-tensor", "training-leftovers"} <= c


def test_lint_dir_without_weights(tmp_path):
    (tmp_path / "config.json").write_bytes(dump_config(parse_config(copy.deepcopy(DFLASH_EXAMPLE))))
    assert "weights-missing" in codes(lint_dir(tmp_path), "error")


# ------------------------------------------------------------------ interop (speculators 0.9.0)


@pytest.mark.peer
@pytest.mark.parametrize("algo", sorted(EXAMPLES))
def test_dumped_config_parses_in_speculators(tmp_path, algo):
    pytest.importorskip("speculators")
    from speculators import SpeculatorModelConfig
    from speculators.models import (
        DFlashSpeculatorConfig,
        DSparkSpeculatorConfig,
        PEagleSpeculatorConfig,
    )

    ours = parse_config(copy.deepcopy(EXAMPLES[algo]))
    (tmp_path / "config.json").write_bytes(dump_config(ours))
    # the path speculators itself uses for config.json: get_config_dict -> from_dict
    theirs = SpeculatorModelConfig.from_pretrained(str(tmp_path))
    cls = {"peagle": PEagleSpeculatorConfig, "dflash": DFlashSpeculatorConfig,
           "dspark": DSparkSpeculatorConfig}[algo]
    assert type(theirs) is cls
    direct = cls.model_validate(json.loads(dump_config(ours)))
    for sc in (theirs, direct):
        assert sc.speculators_model_type == algo
        assert sc.draft_vocab_size == ours.draft_vocab_size
        assert sc.mask_token_id == ours.mask_token_id
        assert sc.transformer_layer_config.hidden_size == ours.hidden_size
        assert sc.transformer_layer_config.num_hidden_layers == ours.num_layers
        assert sc.speculators_config.proposal_methods[0].speculative_tokens == ours.speculative_tokens
        assert sc.speculators_config.verifier.name_or_path == VERIFIER_ID
        if algo == "peagle":
            assert sc.eagle_aux_hidden_state_layer_ids == ours.aux_layer_ids
            assert sc.norm_before_residual is ours.norm_before_residual
        else:
            assert sc.aux_hidden_state_layer_ids == ours.aux_layer_ids
            assert sc.block_size == ours.block_size
            assert sc.sample_from_anchor is ours.sample_from_anchor
            assert sc.sliding_window_non_causal is ours.sliding_window_non_causal
        if algo == "dspark":
            assert sc.markov_rank == ours.markov_rank
            assert sc.enable_confidence_head is ours.enable_confidence_head
            assert sc.confidence_head_with_markov is ours.confidence_head_with_markov

    # and the reverse: what speculators' save_pretrained writes loads here, and our dump
    # of it drops the auto_map artifact and never gains a top-level model_type
    out = tmp_path / "saved"
    theirs.save_pretrained(str(out))
    saved = json.loads((out / "config.json").read_text())
    assert "model_type" not in saved
    back = load_config(out)
    assert type(back) is CLASSES[algo]
    redumped = json.loads(dump_config(back))
    assert "auto_map" not in redumped and "model_type" not in redumped
    assert back.speculative_tokens == ours.speculative_tokens
    assert back.aux_layer_ids == ours.aux_layer_ids
    assert back.rope_theta == ours.rope_theta
