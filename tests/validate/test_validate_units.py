"""Unit tests of the validate pieces that need no model: gates' decisions, DSpark
calibration, the vLLM command builder and counter parser, the report writers."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from specconv.engines.served import diff_counters
from specconv.engines.vllm.serve import (
    build_serve_command,
    metrics_from_vllm,
    parse_spec_counters,
)
from specconv.validate.loop import RequestResult, StepRecord

LAYER = {
    "model_type": "qwen3", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 512,
    "rope_theta": 10000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "layer_types": ["full_attention"], "tie_word_embeddings": False, "attention_bias": False,
}


def _write_cfg(d: Path, algorithm: str, verifier: str, **fields) -> Path:
    from specconv.format import dump_config, make_config

    d.mkdir(parents=True, exist_ok=True)
    cfg = make_config(algorithm, transformer_layer_config=LAYER, verifier_name_or_path=verifier,
                      verifier_architectures=["LlamaForCausalLM"], mask_token_id=3, **fields)
    (d / "config.json").write_bytes(dump_config(cfg))
    return d


def _req(pid, out, gaps, top1=None, steps=()):
    return RequestResult(prompt_id=pid, prompt_tokens=3, output_ids=list(out), steps=list(steps), k=3,
                         ttft_ms=1.0, decode_ms=10.0, stopped=False, gaps=list(gaps),
                         top1=list(top1 or [10.0] * len(gaps)))


# ------------------------------------------------------------------------------ G4 / G3


def test_lossless_gate_fails_on_clear_margin_in_fp32_only():
    from specconv.validate.gates import gate_lossless

    plain = [_req("a", [1, 2, 3, 4], [5.0, 5.0, 5.0, 5.0]), _req("b", [7, 8], [3.0, 3.0])]
    spec = [_req("a", [1, 2, 9, 4], [5.0, 5.0, 5.0, 5.0]), _req("b", [7, 8], [3.0, 3.0])]
    g = gate_lossless(spec, plain, dtype="float32")
    assert not g.passed
    div = g.details["divergences"][0]
    assert div["first_divergence"] == 2 and div["logit_gap"] == 5.0 and not div["near_tie"]
    assert g.details["exact_match"] == 0.5
    g16 = gate_lossless(spec, plain, dtype="bfloat16")
    assert g16.passed and g16.warnings


def test_lossless_gate_accepts_near_tie_divergence():
    from specconv.validate.gates import gate_lossless

    plain = [_req("a", [1, 2, 3], [5.0, 1e-5, 5.0], top1=[20.0, 20.0, 20.0])]
    spec = [_req("a", [1, 5, 3], [5.0, 1e-5, 5.0], top1=[20.0, 20.0, 20.0])]
    g = gate_lossless(spec, plain, dtype="float32")
    assert g.passed and g.details["divergences"][0]["near_tie"]
    assert gate_lossless(plain, plain).details["exact_match"] == 1.0


def test_acceptance_gate_band_and_floor():
    from specconv.validate.gates import gate_acceptance

    m = {"acceptance_length": 2.0, "tau_ci95_half_width": 0.01, "acceptance_at_pos": [0.6, 0.3, 0.1], "num_drafts": 50}
    assert gate_acceptance(m, source_metrics={"acceptance_length": 2.03}).passed  # 0.03 < 0.02*2.03
    assert not gate_acceptance(m, source_metrics={"acceptance_length": 2.2}).passed
    wide = dict(m, tau_ci95_half_width=0.3)
    assert gate_acceptance(wide, source_metrics={"acceptance_length": 2.2}).passed  # CI dominates
    assert not gate_acceptance(m, min_tau=2.5).passed
    assert gate_acceptance(m, min_tau=1.5).passed
    broken = {"acceptance_length": 1.0, "acceptance_at_pos": [0.0, 0.0], "num_drafts": 40}
    g = gate_acceptance(broken)
    assert g.passed and any("looks broken" in w for w in g.warnings)


@pytest.mark.slow
def test_sampler_check_passes():
    pytest.importorskip("torch")
    from specconv.validate.gates import sampler_check

    g = sampler_check(draws=100_000)
    assert g.passed and g.details["tv"] < 0.01


def test_compare_logits_flags_vocab_permutation():
    torch = pytest.importorskip("torch")
    from specconv.validate.gates import compare_logits

    g = torch.Generator().manual_seed(0)
    ref = torch.randn(6, 40, generator=g) * 3
    same = compare_logits(ref, ref.clone(), margin=1e-3)
    assert same["max_abs"] == 0 and same["top1_agree"] == 1.0 and same["kl_mean"] == 0
    perm = compare_logits(ref, ref[:, torch.randperm(40, generator=g)], margin=1e-3)
    assert perm["top1_agree"] < 0.5 and perm["kl_mean"] > 0.1
    masked = ref.clone()
    masked[:, :5] = float("-inf")
    assert compare_logits(ref, masked, margin=1e-3)["support_mismatch"] == 6



@pytest.mark.slow
def test_compare_logits_cosine_of_equal_rows_is_not_fp32_rounding():
    """Identical full-vocabulary rows (SmolLM2's 49,152 logits) have cosine 1 within the fp32
    G2 threshold (0.999999): a float32 ``cosine_similarity`` of a row with itself gives
    0.9999989 at this width, which failed ``make demo``'s parity gate on the bundled drafter
    (max |Δlogit| 8.6e-6, KL 3e-12)."""
    torch = pytest.importorskip("torch")
    from specconv.format.algorithms import PARITY_TOLERANCES
    from specconv.validate.gates import compare_logits

    g = torch.Generator().manual_seed(0)
    ref = torch.randn(64, 49_152, generator=g) * 5 + 2
    noisy = ref + torch.randn(ref.shape, generator=g) * 1e-6
    for test in (ref.clone(), noisy):
        assert compare_logits(ref, test, margin=1e-3)["cosine_min"] >= PARITY_TOLERANCES["float32"].cosine_min

# ------------------------------------------------------------------------------ metrics


def test_calibration_conditional_pairs():
    from specconv.validate.metrics import calibration

    steps = [
        StepRecord(k=3, accepted=1, accepted_raw=1, emitted=2, draft_ms=0, verify_ms=0, confidence=[0.9, 0.2, 0.1]),
        StepRecord(k=3, accepted=3, accepted_raw=3, emitted=4, draft_ms=0, verify_ms=0, confidence=[0.8, 0.8, 0.8]),
        StepRecord(k=3, accepted=0, accepted_raw=0, emitted=1, draft_ms=0, verify_ms=0, confidence=[0.3, 0.9, 0.9]),
    ]
    c = calibration([_req("a", [1] * 8, [1.0] * 8, steps=steps)])
    # reached slots: step1 (0.9→1, 0.2→0); step2 (0.8→1 ×3); step3 (0.3→0)
    assert c["n"] == 6
    assert c["mean_observed"] == pytest.approx(4 / 6)
    assert c["mean_abs_error"] == pytest.approx((0.1 + 0.2 + 0.2 * 3 + 0.3) / 6)
    assert 0 <= c["ece"] <= 1
    assert calibration([_req("b", [1], [1.0])]) is None


def test_compute_metrics_excludes_zero_draft_steps():
    from specconv.validate.metrics import compute_metrics

    steps = [
        StepRecord(k=3, accepted=2, accepted_raw=2, emitted=3, draft_ms=1, verify_ms=2),
        StepRecord(k=3, accepted=0, accepted_raw=0, emitted=1, draft_ms=1, verify_ms=2),
        StepRecord(k=0, accepted=0, accepted_raw=0, emitted=1, draft_ms=0, verify_ms=2),  # budget tail
    ]
    m = compute_metrics([_req("a", [1] * 6, [1.0] * 6, steps=steps)], 3)
    assert m["num_drafts"] == 2 and m["num_draft_tokens"] == 6
    assert m["acceptance_length"] == pytest.approx(2.0)
    assert m["acceptance_at_pos"] == pytest.approx([0.5, 0.5, 0.0])
    assert m["histogram"] == [1, 0, 1, 0]
    assert m["tau_ci95"] is None  # one request: no bootstrap


# ------------------------------------------------------------------------------ vLLM

METRICS_TEXT = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="specconv-validate"} 120.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="specconv-validate"} 1.7643e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="specconv-validate"} 840.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="specconv-validate"} 300.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="specconv-validate",position="0"} 100.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="specconv-validate",position="1"} 80.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="specconv-validate",position="2"} 60.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="specconv-validate",position="3"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="specconv-validate",position="4"} 20.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="specconv-validate",position="5"} 6.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="specconv-validate",position="6"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="specconv-validate",position="0"} 1.7643e+09
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="specconv-validate"} 420.0
"""


def test_parse_spec_counters_and_metrics():
    c = parse_spec_counters(METRICS_TEXT)
    assert c["num_drafts"] == 120 and c["num_draft_tokens"] == 840 and c["num_accepted_tokens"] == 300
    assert c["accepted_per_pos"] == [100, 80, 60, 30, 20, 6, 4]
    before = parse_spec_counters(METRICS_TEXT.replace("120.0", "20.0").replace("300.0", "50.0")
                                 .replace('position="0"} 100.0', 'position="0"} 25.0'))
    d = diff_counters(before, c)
    assert d["num_drafts"] == 100 and d["num_accepted_tokens"] == 250
    assert d["accepted_per_pos"][0] == 75
    m = metrics_from_vllm({"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_pos": []}, c)
    assert m["acceptance_length"] == pytest.approx(1 + 300 / 120)
    assert m["acceptance_rate"] == pytest.approx(300 / 840)
    assert m["acceptance_at_pos"][0] == pytest.approx(100 / 120)
    assert 1 + sum(m["acceptance_at_pos"]) == pytest.approx(m["acceptance_length"])


def test_parse_counters_sums_engines_and_tolerates_no_suffix():
    text = (
        'vllm:spec_decode_num_drafts{engine="0"} 3\n'
        'vllm:spec_decode_num_drafts{engine="1"} 4\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos{engine="0",position="1"} 2\n'
        'garbage line\n'
    )
    c = parse_spec_counters(text)
    assert c["num_drafts"] == 7
    assert c["accepted_per_pos"] == [0.0, 2.0]
    assert parse_spec_counters("")["accepted_per_pos"] == []


@pytest.mark.parametrize(
    "algorithm,fields,method",
    [
        ("dflash", {"block_size": 8, "aux_hidden_state_layer_ids": [2, 15, 28]}, {"method": "dflash"}),
        ("dspark", {"block_size": 7, "aux_hidden_state_layer_ids": [2, 15, 28], "sample_from_anchor": True,
                    "markov_rank": 8, "enable_confidence_head": True, "confidence_head_with_markov": True},
         {"method": "dspark"}),
        ("peagle", {"eagle_aux_hidden_state_layer_ids": [2, 15, 28], "speculative_tokens": 5},
         {"method": "eagle3", "parallel_drafting": True}),
    ],
)
def test_serve_command_long_form_for_local_verifier(tmp_path, algorithm, fields, method):
    d = _write_cfg(tmp_path / algorithm, algorithm, "/models/verifier", **fields)
    cmd = build_serve_command(d, "/models/verifier", port=9000, dtype="bfloat16")
    assert cmd[:3] == ["vllm", "serve", "/models/verifier"]
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    k = {"dflash": 7, "dspark": 7, "peagle": 5}[algorithm]
    assert spec == {"model": str(d.resolve()), "num_speculative_tokens": k, **method}
    assert cmd[cmd.index("--port") + 1] == "9000" and cmd[cmd.index("--dtype") + 1] == "bfloat16"
    assert shlex.split(shlex.join(cmd)) == cmd


def test_serve_command_short_form_only_for_recorded_hub_id(tmp_path):
    d = _write_cfg(tmp_path / "d", "dflash", "Qwen/Qwen3-8B", block_size=16, aux_hidden_state_layer_ids=[2, 18, 33])
    assert build_serve_command(d, "Qwen/Qwen3-8B")[:3] == ["vllm", "serve", str(d)]
    assert "--speculative-config" not in build_serve_command(d, "Qwen/Qwen3-8B")
    # a local verifier dir given on the command line → long form
    local = build_serve_command(d, str(tmp_path))
    assert local[2] == str(tmp_path) and "--speculative-config" in local


@pytest.mark.gpu
@pytest.mark.slow
def test_vllm_backend_real_run(tmp_path, smollm2_dir):  # pragma: no cover - needs CUDA + vllm
    pytest.importorskip("vllm")
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from examples.zlab_dflash import make_zlab_dflash
    from specconv.convert import convert
    from specconv.validate.run import ValidateOptions, validate_drafter

    z = make_zlab_dflash(tmp_path / "z", dtype="bfloat16")
    out = tmp_path / "spec"
    convert(str(z), verifier=str(smollm2_dir), output=out)
    rep = validate_drafter(out, str(smollm2_dir), ValidateOptions(backend="vllm", num_prompts=2, max_new_tokens=16,
                                                                   dtype="bfloat16"), report_dir=tmp_path / "report")
    assert rep.num_drafts > 0 and len(rep.acceptance_at_pos) == 7


# ------------------------------------------------------------------------------ report


def test_write_report_files(tmp_path):
    pytest.importorskip("matplotlib")
    from specconv.results import ValidationReport
    from specconv.validate.report import write_report

    rep = ValidationReport.of({
        "algorithm": "dflash", "drafter": "d", "verifier": "v", "backend": "torch", "device": {"device": "cpu"},
        "dtype": "float32", "prompts": {"set": "eval", "n": 2}, "max_new_tokens": 8, "temperature": 0.0,
        "metrics": {"acceptance_length": 1.4, "acceptance_at_pos": [0.3, 0.1],
                    "conditional_acceptance_at_pos": [0.3, 1 / 3],
                    "tau_ci95": [1.2, 1.6], "num_drafts": 10, "num_draft_tokens": 20, "num_accepted_tokens": 4},
        "gate_results": [{"name": "structure", "status": "passed", "errors": [], "warnings": [],
                          "skipped_reason": None}],
    })
    files = write_report(rep, tmp_path / "r")
    md = Path(files["markdown"]).read_text()
    assert "| structure | passed |" in md and "| 1 | 0.300 | 0.300 |" in md and "acceptance.png" in md
    assert json.loads(Path(files["json"]).read_text())["plot"] == "acceptance.png"
    assert Path(files["plot"]).stat().st_size > 1000


def test_source_record_check_on_a_speculators_source(tmp_path):
    """A Speculators --source is used as it is: the recorded file names are hashed there;
    a drafter without recorded hashes is reported as not checked."""
    from specconv.errors import InvalidInputError
    from specconv.tensors import sha256_file
    from specconv.validate.run import check_source_unchanged

    src, drafter = tmp_path / "src", tmp_path / "drafter"
    src.mkdir()
    drafter.mkdir()
    (src / "config.json").write_text('{"speculators_model_type": "dflash"}')
    files = {"config.json": sha256_file(src / "config.json")}
    (drafter / "specconv.json").write_text(json.dumps({"schema_version": 1,
                                                       "conversion": {"source": {"files": files}}}))
    source = {"kind": "speculators", "format": "speculators", "path": str(src), "converted": str(src)}
    assert check_source_unchanged(drafter, source) == {"matches_record": True, "files": 1}
    (src / "config.json").write_text('{"speculators_model_type": "dflash", "block_size": 8}')
    with pytest.raises(InvalidInputError, match="config.json: recorded " + files["config.json"]) as e:
        check_source_unchanged(drafter, source)
    assert e.value.code == "source_changed" and sha256_file(src / "config.json") in str(e.value)
    (src / "config.json").unlink()
    with pytest.raises(InvalidInputError, match="now absent"):
        check_source_unchanged(drafter, source)
    (drafter / "specconv.json").unlink()
    assert check_source_unchanged(drafter, source)["matches_record"] is None
