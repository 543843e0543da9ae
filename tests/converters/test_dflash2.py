"""DFlash2 sources: z-lab ``dflash`` 0.1.0 dirs (both codebook namings, keys nested or top level), speculators
0.9.0 ``dflash2`` dirs, and the named refusals (``../shared/reference/dflash2.md`` §2, §4).

Every conversion is loaded strictly by speculators 0.9.0 (``tests/interop.py``: each file tensor lands
unchanged, nothing verifier-owned is missing) and its drafts equal z-lab's on the same weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.peer

pytest.importorskip("dflash")
pytest.importorskip("speculators")
pytest.importorskip("loguru")

import fixtures_dflash2 as f2  # noqa: E402
from fixtures_dflash import cli_convert, out_tensors, read  # noqa: E402
from interop import load_with_speculators  # noqa: E402
from specconv.errors import EXIT_INVALID_INPUT, EXIT_OK  # noqa: E402

SELECTOR = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook",
            "candidate_selector.hidden_projection.weight")


@pytest.fixture(scope="module")
def zlab_sources(tmp_path_factory, tiny_verifier_dir) -> dict[str, Path]:
    """z-lab DFlash2 dirs as ``save_pretrained`` writes them, with bare codebook names, and with the four keys
    at the top level."""
    root = tmp_path_factory.mktemp("dflash2_sources")
    return {name: f2.zlab_dflash2(root / name, tiny_verifier_dir, **kw)
            for name, kw in {"saved": {}, "bare": {"bare": True}, "top_level": {"top_level": True}}.items()}


@pytest.mark.parametrize("name", ["saved", pytest.param("bare", marks=pytest.mark.slow),
                                  pytest.param("top_level", marks=pytest.mark.slow)])
def test_zlab_dflash2_converts_and_speculators_loads_it(name, zlab_sources, tiny_verifier_dir, tmp_path):
    out = tmp_path / "out"
    code, rep, err = cli_convert(zlab_sources[name], tiny_verifier_dir, out)
    assert code == EXIT_OK, err
    assert rep["format"] == "zlab_dflash2" and rep["algorithm"] == "dflash2"
    cfg = read(out)
    assert cfg["speculators_model_type"] == "dflash2" and cfg["architectures"] == ["DFlash2DraftModel"]
    assert {k: cfg[k] for k in f2.KEYS} == f2.KEYS  # all four written, at the top level
    assert cfg["sliding_window_non_causal"] is True and cfg["sample_from_anchor"] is False
    assert cfg["aux_hidden_state_layer_ids"] == [1, 3, 5] and cfg["block_size"] == 8
    assert not set(f2.KEYS) & set(cfg["transformer_layer_config"])
    assert "is_causal" not in cfg["transformer_layer_config"]  # vLLM would give it precedence (pitfall 5)
    names = set(out_tensors(out))
    assert set(SELECTOR) <= names and not any(n.endswith("_codebook.weight") for n in names)
    assert {f"layers.{i}.{c}.base_kernel" for i in (0, 1) for c in ("attention_conv", "mlp_conv")} <= names
    model = load_with_speculators(out, tiny_verifier_dir)
    assert type(model).__name__ == "DFlash2DraftModel"


@pytest.mark.slow
def test_conversion_drafts_what_zlab_drafts(zlab_sources, tiny_verifier_dir, tmp_path):
    """The converted dir's greedy drafts (selector walk) equal z-lab's ``propose`` on the source weights."""
    import torch
    from dflash.model import DFlash2DraftModel
    from safetensors.torch import load_file

    from specconv.drafters import load_drafter

    out = tmp_path / "out"
    assert cli_convert(zlab_sources["saved"], tiny_verifier_dir, out)[0] == EXIT_OK
    drafter = load_drafter(out, tiny_verifier_dir)
    z = DFlash2DraftModel.from_pretrained(str(zlab_sources["saved"]), dtype=torch.float32).eval()
    vw = load_file(str(tiny_verifier_dir / "model.safetensors"))
    embed, head = vw["model.embed_tokens.weight"], vw["lm_head.weight"]
    g = torch.Generator().manual_seed(5)
    hs, ids = torch.randn(1, 10, 3 * 64, generator=g), torch.randint(0, 250, (1, 11), generator=g)
    block = torch.full((1, 8), 255)
    block[0, 0] = ids[0, 10]
    with torch.no_grad():
        h = z(target_hidden=hs, noise_embedding=embed[block], position_ids=torch.arange(18)[None])[:, 1:]
        path, _, _ = z.propose(h, block[:, 0], lambda x: x @ head.T, 0.0)
    assert drafter.propose(ids, hs).tokens.tolist() == path[0].tolist()


@pytest.mark.slow
def test_speculators_dflash2_dir_converts_unchanged(tmp_path, tiny_verifier_dir):
    src = f2.speculators_dflash2(tmp_path / "spec", tiny_verifier_dir)
    code, rep, err = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == EXIT_OK, err
    assert rep["format"] == "speculators_dflash2"
    assert read(tmp_path / "out")["selector_top_k"] == f2.KEYS["selector_top_k"]
    from safetensors.torch import load_file

    ours, theirs = load_file(str(tmp_path / "out" / "model.safetensors")), load_file(str(src / "model.safetensors"))
    assert set(SELECTOR) <= set(ours)
    for n in SELECTOR:
        assert ours[n].equal(theirs[n]), n
    load_with_speculators(tmp_path / "out", tiny_verifier_dir)


def _edit(src: Path, dst: Path, edit) -> Path:
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


REFUSED = {
    "missing_selector_top_k": (lambda c: c["dflash_config"].pop("selector_top_k"), "selector_top_k"),
    "conflicting_rank": (lambda c: c.update(selector_rank=16), "selector_rank"),
    "output_multiplier": (lambda c: c.update(output_multiplier=2.0), "output_multiplier"),
    "softcapping": (lambda c: c["dflash_config"].update(final_logit_softcapping=30.0), "final_logit_softcapping"),
    "beam": (lambda c: c.update(architectures=["DFlash2BeamDraftModel"]), "dflash2_variant"),
    "minimax": (lambda c: c.update(architectures=["MiniMaxDFlash2DraftModel"]), "dflash2_variant"),
    "lilicorr": (lambda c: c.update(architectures=["LiLiCorrDraftModel"]), "lilicorr"),
    "mislabelled_dflash": (lambda c: c.update(architectures=["DFlashDraftModel"]), "dflash2_variant"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_by_name(case, zlab_sources, tiny_verifier_dir, tmp_path):
    edit, named = REFUSED[case]
    src = _edit(zlab_sources["bare"], tmp_path / case, edit)
    code, rep, err = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == EXIT_INVALID_INPUT, (rep, err)
    assert named in json.dumps(rep) + err
    assert not (tmp_path / "out").exists()
