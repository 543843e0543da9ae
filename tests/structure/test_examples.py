"""Tests for examples/: z-lab DFlash producer and the trained / random SmolLM2 drafters."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))

pytestmark = pytest.mark.peer

EXPECTED_TENSORS_2L = {
    "fc.weight": [576, 1728],
    "hidden_norm.weight": [576],
    "norm.weight": [576],
    **{
        f"layers.{i}.{n}": s
        for i in range(2)
        for n, s in {
            "input_layernorm.weight": [576],
            "post_attention_layernorm.weight": [576],
            "self_attn.q_proj.weight": [576, 576],
            "self_attn.k_proj.weight": [192, 576],
            "self_attn.v_proj.weight": [192, 576],
            "self_attn.o_proj.weight": [576, 576],
            "self_attn.q_norm.weight": [64],
            "self_attn.k_norm.weight": [64],
            "mlp.gate_proj.weight": [1536, 576],
            "mlp.up_proj.weight": [1536, 576],
            "mlp.down_proj.weight": [576, 1536],
        }.items()
    },
}


def _header(path: Path) -> dict:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n])


def _tensor_shapes(d: Path) -> dict:
    h = _header(d / "model.safetensors")
    return {k: v["shape"] for k, v in h.items() if k != "__metadata__"}


def _check_zlab_layout(d: Path, target_layer_ids, block_size=8, mask=16, layers=2):
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"]
    assert cfg["model_type"] == "qwen3"
    assert cfg["num_hidden_layers"] == layers
    assert cfg["num_target_layers"] == 30
    assert cfg["dflash_config"]["target_layer_ids"] == list(target_layer_ids)
    assert cfg["dflash_config"]["mask_token_id"] == mask
    assert cfg["hidden_size"] == 576 and cfg["vocab_size"] == 49152
    assert cfg["num_attention_heads"] == 9 and cfg["num_key_value_heads"] == 3
    assert cfg["head_dim"] == 64 and cfg["intermediate_size"] == 1536
    assert cfg["tie_word_embeddings"] is False
    assert cfg["rope_parameters"]["rope_theta"] == 100000.0
    assert "speculators_model_type" not in cfg
    bs = [v for v in (cfg.get("block_size"), cfg["dflash_config"].get("block_size")) if v is not None]
    assert bs and set(bs) == {block_size}
    shapes = _tensor_shapes(d)
    assert not any("embed" in k or "lm_head" in k for k in shapes)
    assert shapes["fc.weight"] == [576, 576 * len(target_layer_ids)]
    return cfg, shapes


def test_producer_layout_and_reload(tmp_path):
    torch = pytest.importorskip("torch")
    dm = pytest.importorskip("dflash.model")
    from zlab_dflash import make_zlab_dflash

    d = make_zlab_dflash(tmp_path / "a", seed=3)
    cfg, shapes = _check_zlab_layout(d, [1, 14, 27])
    assert shapes == EXPECTED_TENSORS_2L
    assert cfg["block_size"] == 8 and "block_size" not in cfg["dflash_config"]
    h = _header(d / "model.safetensors")
    assert {v["dtype"] for k, v in h.items() if k != "__metadata__"} == {"BF16"}
    m = dm.DFlashDraftModel.from_pretrained(str(d))
    assert m.block_size == 8 and m.mask_token_id == 16 and m.target_layer_ids == [1, 14, 27]
    # weights round-trip exactly
    from safetensors.torch import load_file

    sd = load_file(str(d / "model.safetensors"))
    assert torch.equal(m.state_dict()["fc.weight"].to(torch.bfloat16), sd["fc.weight"])


def test_producer_is_deterministic_and_seeded(tmp_path):
    pytest.importorskip("dflash.model")
    from zlab_dflash import make_zlab_dflash

    a = make_zlab_dflash(tmp_path / "a", seed=0)
    b = make_zlab_dflash(tmp_path / "b", seed=0)
    c = make_zlab_dflash(tmp_path / "c", seed=1)
    ba = (a / "model.safetensors").read_bytes()
    assert ba == (b / "model.safetensors").read_bytes()
    assert ba != (c / "model.safetensors").read_bytes()


@pytest.mark.parametrize("loc", ["nested", "both"])
def test_producer_block_size_location(tmp_path, loc):
    dm = pytest.importorskip("dflash.model")
    from zlab_dflash import make_zlab_dflash

    d = make_zlab_dflash(tmp_path / loc, block_size=4, block_size_location=loc, num_layers=1)
    cfg, _ = _check_zlab_layout(d, [1, 14, 27], block_size=4, layers=1)
    assert cfg["dflash_config"]["block_size"] == 4
    assert ("block_size" in cfg) == (loc == "both")
    assert dm.DFlashDraftModel.from_pretrained(str(d)).block_size == 4


def test_producer_last_layer_variant(tmp_path):
    dm = pytest.importorskip("dflash.model")
    from zlab_dflash import LAST_LAYER_TARGET_IDS, make_zlab_dflash

    assert 29 in LAST_LAYER_TARGET_IDS
    d = make_zlab_dflash(tmp_path / "last", target_layer_ids=(1, 14, 29, 4), num_layers=1)
    _, shapes = _check_zlab_layout(d, [1, 14, 29, 4], layers=1)
    assert shapes["fc.weight"] == [576, 4 * 576]
    assert dm.DFlashDraftModel.from_pretrained(str(d)).target_layer_ids == [1, 14, 29, 4]


def test_producer_layer_types(tmp_path):
    pytest.importorskip("dflash.model")
    from zlab_dflash import make_zlab_dflash

    d = make_zlab_dflash(
        tmp_path / "lt", layer_types=["sliding_attention", "full_attention"], num_layers=2
    )
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["layer_types"] == ["sliding_attention", "full_attention"]
    with pytest.raises(ValueError):
        make_zlab_dflash(tmp_path / "bad", layer_types=["full_attention"], num_layers=2)


def test_mask_token_is_an_unused_special_token():
    transformers = pytest.importorskip("transformers")
    from zlab_dflash import SMOLLM2_MASK_TOKEN_ID

    from specconv.offline import smollm2_verifier_dir

    tok = transformers.AutoTokenizer.from_pretrained(str(smollm2_verifier_dir()))
    assert tok.convert_ids_to_tokens(SMOLLM2_MASK_TOKEN_ID) == "<empty_output>"
    assert SMOLLM2_MASK_TOKEN_ID not in {
        tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id
    }
    # it is an added (special) token, so ordinary text never produces it
    assert SMOLLM2_MASK_TOKEN_ID in tok.added_tokens_decoder
    assert SMOLLM2_MASK_TOKEN_ID not in tok("<empty output> empty_output")["input_ids"]


# --------------------------------------------------------------------------- train_dflash


def _zlab_block_hidden(zl, aux, anchor, block_emb):
    """z-lab forward for one anchor: context = positions < anchor, block at anchor.."""
    import torch

    B = block_emb.shape[1]
    pos = torch.arange(anchor + B)[None]
    return zl(target_hidden=aux[:, :anchor], noise_embedding=block_emb, position_ids=pos)


def test_train_forward_matches_zlab_forward_random_weights():
    """Batched training forward with the DFlash mask == z-lab's forward per anchor."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("dflash.model")
    from train_dflash import TrainDFlash, build_blocks
    from zlab_dflash import build_zlab_dflash

    zl = build_zlab_dflash(seed=5, block_size=4, num_layers=2)
    # perturb the norms so that every weight matters
    with torch.no_grad():
        for n, p in zl.named_parameters():
            if "norm" in n:
                p.add_(0.3 * torch.randn_like(p))
    sd = {k: v for k, v in zl.state_dict().items() if "rotary" not in k}
    tm = TrainDFlash(sd, zl.config)
    g = torch.Generator().manual_seed(0)
    T, B = 21, 4
    emb = torch.randn(64, 576, generator=g)
    tokens = torch.randint(17, 64, (T,), generator=g)
    aux = torch.randn(1, T, 3 * 576, generator=g) * 3
    anchors = [3, 10, 17]
    ids, pos, mask = build_blocks(tokens, anchors, B, 16, T)
    # mask: block i sees context < anchor_i and its own block only
    assert mask.shape == (len(anchors) * B, T + len(anchors) * B)
    assert mask[0, :3].all() and not mask[0, 3:T].any()
    assert mask[B, T + B : T + 2 * B].all()
    assert not mask[B, T : T + B].any() and not mask[B, T + 2 * B :].any()
    with torch.no_grad():
        h = tm.forward(aux, torch.arange(T)[None], emb[ids][None], pos[None], mask[None])[0]
        for i, a in enumerate(anchors):
            ref = _zlab_block_hidden(zl, aux, a, emb[ids[i * B : (i + 1) * B]][None])[0]
            got = h[i * B : (i + 1) * B]
            assert torch.allclose(got, ref, atol=2e-5, rtol=1e-4), (a, (got - ref).abs().max())


def test_kl_topk_is_zero_iff_distributions_match():
    torch = pytest.importorskip("torch")
    from train_dflash import kl_topk

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 300, generator=g) * 3
    lp = torch.log_softmax(logits, -1)
    t_lp, t_id = lp.topk(8, -1)
    kl, _, match = kl_topk(logits, t_id, t_lp)
    assert kl.abs().max() < 1e-5 and match.all()
    kl2, _, _ = kl_topk(logits.flip(-1), t_id, t_lp)
    assert (kl2 > 1e-2).all()


# --------------------------------------------------------------------------- committed drafters

TRAINED = EXAMPLES / "smollm2-dflash-b8"
RANDOM = EXAMPLES / "smollm2-dflash-b8-random"


@pytest.mark.parametrize("d", [TRAINED, RANDOM], ids=["trained", "random"])
def test_committed_drafters_have_zlab_layout(d):
    cfg, shapes = _check_zlab_layout(d, [1, 14, 27])
    assert shapes == EXPECTED_TENSORS_2L
    assert cfg["dtype"] == "bfloat16"
    size = (d / "model.safetensors").stat().st_size
    assert 15e6 < size < 17e6  # 8.08 M params in bf16


def test_random_control_is_the_seeded_producer_output(tmp_path):
    """Byte-identical on the CPU kernels that wrote it; elsewhere (another ATen capability
    draws normal_ differently) equal up to the RNG kernel's rounding (tests/tolerances.py)."""
    pytest.importorskip("dflash.model")
    from safetensors.torch import load_file
    from zlab_dflash import make_zlab_dflash

    from tests.tolerances import assert_same_draws

    info = json.loads((RANDOM / "fixture.json").read_text())
    out = make_zlab_dflash(tmp_path / "r", **info["producer_kwargs"])
    if (out / "model.safetensors").read_bytes() != (RANDOM / "model.safetensors").read_bytes():
        assert_same_draws(load_file(str(out / "model.safetensors")), load_file(str(RANDOM / "model.safetensors")),
                          what="random control")


def test_training_json_records_recipe_and_tau():
    info = json.loads((TRAINED / "training.json").read_text())
    assert info["steps"] > 0 and info["seed"] == 0
    assert info["dataset"]["n_generated_tokens"] > 0
    ev = info["eval"]
    k = 7
    assert len(ev["per_pos"]) == k and len(ev["hist"]) == k + 1
    # τ = 1 + Σ p_i (vLLM convention) must be internally consistent
    assert abs(ev["tau_pooled"] - (1 + sum(ev["per_pos"]))) < 1e-3
    assert sum(ev["hist"]) == ev["n_steps"]


def _real_features(n_new=24):
    """Real verifier inputs for one eval prompt: tokens, aux states, verifier, embed."""
    import torch
    from train_dflash import TARGET_LAYER_IDS, load_verifier

    from specconv.prompts import load_prompts, render

    target, tok = load_verifier()
    ids = torch.tensor([render(load_prompts("eval", 1, offset=64)[0], tok)])
    with torch.inference_mode():
        seq = target.generate(ids, max_new_tokens=n_new, do_sample=False, pad_token_id=2)
        out = target(seq, output_hidden_states=True)
    aux = torch.cat([out.hidden_states[i + 1] for i in TARGET_LAYER_IDS], dim=-1)
    return seq[0], ids.shape[1], aux.float(), target


@pytest.mark.slow
def test_zlab_forward_on_saved_checkpoint_matches_training_forward():
    """z-lab's DFlashDraftModel on the committed checkpoint == TrainDFlash on its weights."""
    torch = pytest.importorskip("torch")
    dm = pytest.importorskip("dflash.model")
    from safetensors.torch import load_file
    from train_dflash import TrainDFlash, build_blocks

    from tests.tolerances import assert_close, assert_ids_match

    zl = dm.DFlashDraftModel.from_pretrained(str(TRAINED), dtype=torch.float32).eval()
    sd = {k: v.float() for k, v in load_file(str(TRAINED / "model.safetensors")).items()}
    tm = TrainDFlash(sd, zl.config)
    tokens, P, aux, target = _real_features()
    T, B = tokens.shape[0], zl.block_size
    anchors = [P, P + 5, P + 13]
    ids, pos, mask = build_blocks(tokens, anchors, B, zl.mask_token_id, T)
    emb = target.get_input_embeddings().weight.float()
    head = target.lm_head
    with torch.no_grad():
        h = tm.forward(aux, torch.arange(T)[None], emb[ids][None], pos[None], mask[None])[0]
        got_logits = head(h)
        for i, a in enumerate(anchors):
            blk = ids[i * B : (i + 1) * B]
            ref_h = zl(
                target_hidden=aux[:, :a],
                noise_embedding=torch.nn.functional.embedding(blk[None], emb),
                position_ids=torch.arange(a + B)[None],
            )
            ref = zl.compute_logits(ref_h, head)[0]
            got = got_logits[i * B : (i + 1) * B]
            assert_close(got, ref, what=f"anchor {a} logits")
            assert_ids_match(got[1:].argmax(-1), ref[1:].argmax(-1), ref[1:], what=f"anchor {a} drafts")


@pytest.mark.slow
def test_trained_drafter_beats_random_in_zlab_loop():
    """z-lab's dflash_generate: trained drafter accepts tokens, random ~never; both lossless."""
    torch = pytest.importorskip("torch")
    dm = pytest.importorskip("dflash.model")
    from train_dflash import load_verifier, patch_cpu_timer

    from specconv.prompts import load_prompts, render
    from tests.tolerances import assert_same_greedy, greedy_result

    patch_cpu_timer()
    target, tok = load_verifier()
    ids = torch.tensor([render(load_prompts("eval", 1)[0], tok)])
    P = ids.shape[1]
    with torch.inference_mode():
        ref = target.generate(ids, max_new_tokens=32, do_sample=False, pad_token_id=2)
        ref_logits = target(ref).logits[0, P - 1 : -1].float()  # the logits that picked ref[P:]
    taus = {}
    for name, d in (("trained", TRAINED), ("random", RANDOM)):
        m = dm.DFlashDraftModel.from_pretrained(str(d), dtype=torch.float32).eval()
        res = dm.dflash_generate(m, target, ids, 32, [tok.eos_token_id], return_stats=True)
        assert torch.equal(res.output_ids[0, :P], ids[0])
        n = min(res.output_ids.shape[1], ref.shape[1])
        # greedy speculative == greedy (two decode paths: equal up to a verifier near-tie)
        assert_same_greedy(res.output_ids[0, P:n].tolist(),
                           greedy_result(ref[0, P:n].tolist(), ref_logits[: n - P]), what=name)
        acc = res.acceptance_lengths
        taus[name] = sum(acc) / len(acc)
    assert taus["random"] < 1.05
    assert taus["trained"] > taus["random"] + 0.1


def test_dflash2_train_forward_matches_zlab_dflash2_random_weights():
    """The DFlash2 training forward (convolutions per block of B rows, DFlash mask) == z-lab's
    ``DFlash2DraftModel`` forward per anchor, and its selector scores == z-lab's ``candidate_selector``."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("dflash.model")
    from dflash.model import DFlash2DraftModel
    from train_dflash import build_blocks
    from train_dflash2 import SELECTOR_TOP_K, TrainDFlash2, dflash2_config

    torch.manual_seed(3)
    zl = DFlash2DraftModel(dflash2_config()).float().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in zl.named_parameters():
            if n.endswith("base_kernel"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
                p[:, 0] += 1.0
            elif "norm" in n:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
            elif "codebook" in n:  # strong enough that the selector reorders the top-K
                p.copy_(2.0 * torch.randn(p.shape, generator=g))
            elif "kernel_projection" in n or "candidate_selector" in n:
                p.copy_(0.5 * torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    sd = {k: v for k, v in zl.state_dict().items() if "rotary" not in k}
    tm = TrainDFlash2(sd, zl.config)
    T, B = 21, 8
    emb = torch.randn(64, 576, generator=g)
    tokens = torch.randint(17, 64, (T,), generator=g)
    aux = torch.randn(1, T, 3 * 576, generator=g) * 3
    anchors = [3, 10]
    ids, pos, mask = build_blocks(tokens, anchors, B, 16, T)
    with torch.no_grad():
        h = tm.forward(aux, torch.arange(T)[None], emb[ids][None], pos[None], mask[None])[0]
        for i, a in enumerate(anchors):
            ref = _zlab_block_hidden(zl, aux, a, emb[ids[i * B : (i + 1) * B]][None])[0]
            got = h[i * B : (i + 1) * B]
            assert torch.allclose(got, ref, atol=5e-5, rtol=1e-4), (a, (got - ref).abs().max())
        ys = h[1:B]
        logits = ys @ torch.randn(576, 64, generator=g)
        path, _, _ = zl.candidate_selector.select(ys[None], logits[None], tokens[anchors[0]][None], 0.0)
        pred = torch.cat([tokens[anchors[0]][None], path[0, :-1]])  # the walk's predecessors
        cand = logits.topk(SELECTOR_TOP_K, dim=-1).indices
        ours = tm.selector_scores(logits, ys, pred, cand)
        assert torch.equal(cand.gather(-1, ours.argmax(-1, keepdim=True))[:, 0], path[0])
        assert (path[0] != logits.argmax(-1)).any()  # the selector moved at least one pick


# --------------------------------------------------------------------------- the DFlash2 drafter

TRAINED2 = EXAMPLES / "smollm2-dflash2-b8"


@pytest.fixture(scope="module")
def trained2() -> Path:
    """:data:`TRAINED2` with its weights unpacked from the committed ``model.safetensors.xz`` (examples/packed.py)."""
    import packed

    (st,) = packed.unpack("smollm2-dflash2-b8/model.safetensors")
    assert st.parent == TRAINED2
    return TRAINED2
#: what DFlash2 adds to the DFlash layout (z-lab ``save_pretrained``: codebooks as ``….codebook.weight``)
EXPECTED_DFLASH2_EXTRA = {
    **{f"layers.{i}.{c}.{n}": s for i in range(2) for c in ("attention_conv", "mlp_conv")
       for n, s in (("base_kernel", [2, 2, 576]), ("kernel_projection.weight", [144, 576]))},
    "candidate_selector.predecessor_codebook.weight": [49152, 32],
    "candidate_selector.successor_codebook.weight": [49152, 32],
    "candidate_selector.hidden_projection.weight": [32, 576],
}


def test_committed_dflash2_has_the_zlab_dflash2_layout_and_its_record(trained2):
    cfg = json.loads((trained2 / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"] and cfg["model_type"] == "qwen3"
    dc = cfg["dflash_config"]
    assert dc["target_layer_ids"] == [1, 14, 27] and dc["mask_token_id"] == 16
    assert {k: dc[k] for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")} == {
        "conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 32, "selector_top_k": 16}
    assert _tensor_shapes(trained2) == {**EXPECTED_TENSORS_2L, **EXPECTED_DFLASH2_EXTRA}
    assert cfg["dtype"] == "bfloat16"
    info = json.loads((trained2 / "training.json").read_text())
    assert set(info["runs"]) == {"dflash2", "dflash"}  # the DFlash2 run and its DFlash control
    assert info["runs"]["dflash2"]["steps"] > 0 and info["runs"]["dflash"]["n_train_seqs"] == \
        info["runs"]["dflash2"]["n_train_seqs"]
    for ev in info["eval"].values():
        assert abs(ev["tau_pooled"] - (1 + sum(ev["per_pos"]))) < 1e-3 and sum(ev["hist"]) == ev["n_steps"]


@pytest.mark.slow
def test_committed_dflash2_in_zlab_loop_is_lossless_and_accepts(trained2):
    """z-lab's own ``dflash_generate`` with ``DFlash2DraftModel`` (selector walk) on the committed drafter:
    greedy speculative == greedy, and it accepts drafts (the random DFlash control accepts none)."""
    torch = pytest.importorskip("torch")
    dm = pytest.importorskip("dflash.model")
    from train_dflash import load_verifier, patch_cpu_timer

    from specconv.prompts import load_prompts, render
    from tests.tolerances import assert_same_greedy, greedy_result

    patch_cpu_timer()
    target, tok = load_verifier()
    ids = torch.tensor([render(load_prompts("eval", 1)[0], tok)])
    P = ids.shape[1]
    with torch.inference_mode():
        ref = target.generate(ids, max_new_tokens=32, do_sample=False, pad_token_id=2)
        ref_logits = target(ref).logits[0, P - 1 : -1].float()
    m = dm.DFlash2DraftModel.from_pretrained(str(trained2), dtype=torch.float32).eval()
    res = dm.dflash_generate(m, target, ids, 32, [tok.eos_token_id], return_stats=True)
    n = min(res.output_ids.shape[1], ref.shape[1])
    assert_same_greedy(res.output_ids[0, P:n].tolist(), greedy_result(ref[0, P:n].tolist(), ref_logits[: n - P]),
                       what="dflash2")
    acc = res.acceptance_lengths
    assert sum(acc) / len(acc) > 1.1


# --------------------------------------------------------------------------- packed example weights


def test_no_tracked_file_over_20_mb_and_every_packed_file_is_recorded():
    """Example weights over 20 MB live in git as ``.xz`` with their SHA-256 in ``examples/packed.json``."""
    import subprocess

    import packed

    root = EXAMPLES.parent
    try:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    big = [f for f in files.decode().split("\0") if f and (root / f).is_file()
           and (root / f).stat().st_size > 20 * 1024 * 1024]
    assert big == [], big
    record = json.loads(packed.RECORD.read_text())
    assert "smollm2-dflash2-b8/model.safetensors" in record
    for name, rec in record.items():
        assert (EXAMPLES / (name + ".xz")).is_file() and int(rec["bytes"]) > 20 * 1024 * 1024 // 2, name


def test_unpack_checks_the_record_and_rewrites_a_damaged_file(tmp_path, monkeypatch):
    import lzma

    import packed

    monkeypatch.setattr(packed, "HERE", tmp_path)
    monkeypatch.setattr(packed, "RECORD", tmp_path / "packed.json")
    (tmp_path / "d").mkdir()
    plain = tmp_path / "d" / "w.bin"
    plain.write_bytes(bytes(range(256)) * 64)
    packed.pack(plain)
    good = plain.read_bytes()
    plain.write_bytes(b"damaged")
    assert packed.unpack("d/w.bin") == [plain] and plain.read_bytes() == good
    (tmp_path / "d" / "w.bin.xz").write_bytes(lzma.compress(b"other bytes"))
    plain.unlink()
    with pytest.raises(ValueError, match="does not decompress to the recorded"):
        packed.unpack("d/w.bin")
    assert not plain.exists() and sorted(p.name for p in (tmp_path / "d").iterdir()) == ["w.bin.xz"]
    with pytest.raises(FileNotFoundError):
        packed.unpack("d/nosuch")
