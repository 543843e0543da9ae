"""Issue 11 item 3: a conversion reads from a local sharded verifier only the tensor bytes
its output holds (≤ 1.1× the embedding / LM head rows / final norm taken), and none at
all for a full-vocabulary DFlash / DSpark.

The verifier is the tiny Qwen3 / Llama one re-saved as 3 shards + index
(``tests/hub/test_hub_paths.py::_shard``); the counter is :attr:`specconv.verifier.Verifier.bytes_read`,
reported as ``verifier_bytes_read`` next to ``verifier_bytes_needed`` in the conversion report.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_hub_paths import _shard

from cli_runner import invoke
from fixtures_dspark import make_specforge_dspark, make_zlab_dflash, verifier_tensor

V, VD, H = 256, 32, 64  # the tiny verifiers' vocab / the pruned draft vocab / hidden size


@pytest.fixture(scope="module")
def sf_dspark(tiny_verifier_dir, tmp_path_factory) -> Path:
    return make_specforge_dspark(tmp_path_factory.mktemp("vb_sf") / "qwen3-tiny-dspark", tiny_verifier_dir)


def _convert(src: Path, verifier: Path, out: Path, **opts):
    from specconv.convert import convert
    from specconv.converters import ConvertOptions

    return convert(str(src), verifier=str(verifier), output=out, options=ConvertOptions(**opts),
                   verifier_name="org/tiny")


def _d2t(path: Path, seed: int = 1) -> np.ndarray:
    """A d2t file for VD draft tokens (scattered target ids, so several row runs)."""
    tgt = np.sort(np.random.default_rng(seed).choice(np.arange(V), VD, replace=False))
    np.save(path, (tgt - np.arange(VD)).astype(np.int64))
    return tgt


def test_read_rows_reads_only_the_runs_of_rows(sharded_qwen3):
    import torch

    from specconv.tensors import TensorStore

    st = TensorStore.open(sharded_qwen3)
    rows = np.array([7, 3, 4, 5, 200, 7, 0], dtype=np.int64)
    got = st.read_rows("lm_head.weight", rows)
    full = TensorStore.open(sharded_qwen3).read_tensor("lm_head.weight")
    assert torch.equal(got, full.index_select(0, torch.from_numpy(rows)))
    info = st.info("lm_head.weight")
    assert st.bytes_read == 6 * info.nbytes // info.shape[0]  # 6 distinct rows, nothing else
    with pytest.raises(Exception, match="out of range"):
        st.read_rows("lm_head.weight", np.array([V]))


def test_pruned_dspark_reads_only_the_lm_head_rows(sf_dspark, sharded_qwen3, tiny_verifier_dir, tmp_path):
    from safetensors.torch import load_file

    tgt = _d2t(tmp_path / "d2t.npy")
    rep = _convert(sf_dspark, sharded_qwen3, tmp_path / "o", vocab_mapping=str(tmp_path / "d2t.npy"))
    head = verifier_tensor(tiny_verifier_dir, "lm_head")
    needed = VD * H * head.element_size()
    assert rep.verifier_bytes_needed == needed
    assert 0 < rep.verifier_bytes_read <= 1.1 * needed, rep.verifier_bytes_read
    out = load_file(str(tmp_path / "o" / "model.safetensors"))
    assert bool((out["lm_head.weight"] == head.to(out["lm_head.weight"].dtype)[tgt]).all())


@pytest.mark.parametrize("kind", ["zlab_dflash", "specforge_dspark_full_vocab"])
def test_full_vocab_reads_no_verifier_tensor_bytes(kind, sf_dspark, sharded_qwen3, tiny_verifier_dir, tmp_path):
    src = make_zlab_dflash(tmp_path / "zlab", tiny_verifier_dir) if kind == "zlab_dflash" else sf_dspark
    rep = _convert(src, sharded_qwen3, tmp_path / "o")
    assert (rep.verifier_bytes_read, rep.verifier_bytes_needed) == (0, 0)


def test_cli_json_report_carries_the_counts(sf_dspark, sharded_qwen3, tmp_path):
    _d2t(tmp_path / "d2t.npy", seed=2)
    res = invoke("convert", sf_dspark, "--verifier", sharded_qwen3, "-o", tmp_path / "o",
                 "--vocab-mapping", tmp_path / "d2t.npy")
    assert res.code == 0, res.stderr
    rep = json.loads(res.stdout)
    assert rep["verifier_bytes_needed"] > 0 and rep["verifier_bytes_read"] <= 1.1 * rep["verifier_bytes_needed"]


@pytest.mark.peer
def test_peagle_embedding_from_verifier_reads_only_it(tiny_llama_verifier_dir, tmp_path):
    pytest.importorskip("speculators")
    pytest.importorskip("loguru")
    import torch

    import fixtures_peagle as fp

    ref = fp.build_speculators_peagle(tiny_llama_verifier_dir, tmp_path / "ref", layers=1, aux=[2, 5], nbr=False,
                                      seed=1)
    src = fp.to_aws(ref, tmp_path / "aws", keep_embed=False)
    verifier = _shard(tiny_llama_verifier_dir, tmp_path / "sharded_llama")
    rep = _convert(src, verifier, tmp_path / "o", speculative_tokens=2)
    emb = fp.load_tensors(tiny_llama_verifier_dir)["model.embed_tokens.weight"]
    needed = emb.numel() * emb.element_size()
    assert rep.verifier_bytes_needed == needed
    assert 0 < rep.verifier_bytes_read <= 1.1 * needed, rep.verifier_bytes_read
    assert torch.equal(fp.load_tensors(tmp_path / "o")["embed_tokens.weight"], emb)
