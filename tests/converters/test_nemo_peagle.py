"""F6 — NeMo Automodel P-EAGLE (``LlamaEagle3DraftModel`` + ``parallel_drafting``) → peagle.

Reference drafters are built by speculators 0.9.0 and re-laid-out as NeMo checkpoints
(external_formats.md §8): ``epoch_E_step_S/model[/consolidated]/``, ``model.``-prefixed
body, top-level ``lm_head``/``d2t``/``t2d``/``mask_hidden``, ``mask_hidden [1, A·H]``,
sharded safetensors, mapping in ``eagle_meta.pt`` for old checkpoints.
"""

from __future__ import annotations

import json

import pytest

import fixtures_peagle as fp

pytestmark = pytest.mark.peer
pytest.importorskip("speculators")
pytest.importorskip("loguru")

HUB = "org/tiny-llama"


def convert(src, verifier, out=None, **opts):
    from specconv.convert import convert as _convert
    from specconv.converters import ConvertOptions

    return _convert(str(src), verifier=str(verifier), output=out, options=ConvertOptions(**opts),
                    verifier_name=HUB, dry_run=out is None)


@pytest.fixture(scope="module")
def ref(tiny_llama_verifier_dir, tmp_path_factory):
    return fp.build_speculators_peagle(tiny_llama_verifier_dir, tmp_path_factory.mktemp("ref") / "peagle", vd=80,
                                       num_depths=5, seed=5)


def test_sharded_consolidated_end_to_end(ref, tiny_llama_verifier_dir, tmp_path):
    import torch

    from interop import load_with_speculators, run_speculators_forward

    root = fp.to_nemo(ref, tmp_path / "nemo", shards=2, consolidated=True)
    d = root / "epoch_0_step_20" / "model" / "consolidated"
    assert (d / "model.safetensors.index.json").is_file()
    names = set(fp.load_tensors(d))
    assert "model.fc.weight" in names and "lm_head.weight" in names and "mask_hidden" in names
    out = tmp_path / "out"
    rep = convert(root, tiny_llama_verifier_dir, out)  # the save root: the pipeline picks the checkpoint
    assert rep.format == "nemo_peagle"
    assert rep.source.endswith("epoch_0_step_20/model/consolidated")
    assert any("latest checkpoint epoch_0_step_20" in n for n in rep.plan["notes"])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5  # num_depths
    assert cfg["mask_token_id"] == fp.MASK
    for k in ("parallel_drafting", "num_depths", "mask_token_id", "draft_vocab_size"):
        assert k not in cfg["transformer_layer_config"]
    got, want = fp.load_tensors(out), fp.load_tensors(ref)
    assert sorted(got) == sorted(want)  # model. prefix stripped, top-level names kept
    for k in want:
        assert torch.equal(got[k], want[k]), k
    rec = json.loads((out / "specconv.json").read_text())["conversion"]
    assert (rec["tensors"]["fc.weight"]["source"] == "model.fc.weight"
            and rec["tensors"]["fc.weight"]["fate"] == "renamed")
    assert rec["tensors"]["lm_head.weight"]["fate"] == "copied"
    assert rec["tensors"]["mask_hidden"]["fate"] == "reshaped"
    run_speculators_forward(load_with_speculators(out, tiny_llama_verifier_dir))


def test_model_dir_single_file(ref, tiny_llama_verifier_dir, tmp_path):
    root = fp.to_nemo(ref, tmp_path / "nemo", shards=1, consolidated=False, mask_hidden_2d=False)
    rep = convert(root, tiny_llama_verifier_dir)
    assert rep.format == "nemo_peagle" and rep.source.endswith("epoch_0_step_20/model")
    rep = convert(root, tiny_llama_verifier_dir, checkpoint="epoch_0_step_10")
    assert rep.source.endswith("epoch_0_step_10/model")


def test_epoch_dir_given_directly(ref, tiny_llama_verifier_dir, tmp_path):
    root = fp.to_nemo(ref, tmp_path / "nemo", shards=1)
    rep = convert(root / "epoch_0_step_10", tiny_llama_verifier_dir)
    assert rep.source.endswith("epoch_0_step_10/model/consolidated")


def test_mapping_from_eagle_meta(ref, tiny_llama_verifier_dir, tmp_path):
    import torch

    from interop import load_with_speculators

    root = fp.to_nemo(ref, tmp_path / "nemo", mapping_in_meta=True)
    d = root / "epoch_0_step_20" / "model" / "consolidated"
    assert "d2t" not in fp.load_tensors(d) and (root / "epoch_0_step_20" / "eagle_meta.pt").is_file()
    out = tmp_path / "out"
    rep = convert(root, tiny_llama_verifier_dir, out)
    assert any("eagle_meta.pt" in n for n in rep.plan["notes"])
    got, want = fp.load_tensors(out), fp.load_tensors(ref)
    assert torch.equal(got["d2t"], want["d2t"]) and torch.equal(got["t2d"], want["t2d"])
    load_with_speculators(out, tiny_llama_verifier_dir)


def test_mapping_missing_everywhere(ref, tiny_llama_verifier_dir, tmp_path):
    from specconv.errors import InvalidInputError

    root = fp.to_nemo(ref, tmp_path / "nemo", mapping_in_meta=True)
    (root / "epoch_0_step_20" / "eagle_meta.pt").unlink()
    with pytest.raises(InvalidInputError) as e:
        convert(root, tiny_llama_verifier_dir)
    assert e.value.code == "vocab_map_missing"


def test_unsafe_eagle_meta_refused(ref, tiny_llama_verifier_dir, tmp_path):
    import pickle

    from specconv.errors import InvalidInputError

    root = fp.to_nemo(ref, tmp_path / "nemo", mapping_in_meta=True)

    class Code:
        def __reduce__(self):
            return (print, ("executed",))

    with open(root / "epoch_0_step_20" / "eagle_meta.pt", "wb") as f:
        pickle.dump({"d2t": Code()}, f)
    with pytest.raises(InvalidInputError) as e:
        convert(root, tiny_llama_verifier_dir)
    assert e.value.code == "unsafe_pickle"


def test_not_parallel_drafting_is_not_nemo_peagle(ref, tmp_path):
    from specconv.converters import SourceInfo, detect

    root = fp.to_nemo(ref, tmp_path / "nemo", shards=1)
    d = root / "epoch_0_step_20" / "model" / "consolidated"
    assert detect(SourceInfo.open(d)).format_id == "nemo_peagle"
    cfg = fp.read_json(d / "config.json")
    cfg["parallel_drafting"] = False
    fp.write_json(d / "config.json", cfg)
    cls = detect(SourceInfo.open(d))
    assert cls is None or cls.format_id != "nemo_peagle"
