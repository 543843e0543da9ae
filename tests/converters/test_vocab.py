"""converters/_vocab.py: d2t/t2d reading, validation, normalisation and planning."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from specconv.converters import ConvertOptions, SourceInfo
from specconv.converters import _vocab as vb
from specconv.errors import InvalidInputError

V, VD = 32, 8


def _targets(seed: int = 0, v: int = V, vd: int = VD) -> np.ndarray:
    """Sorted draft vocab with one consecutive pair (as frequency pruning always has),
    so the offset-form d2t repeats a value and is not mistaken for absolute ids."""
    rng = np.random.default_rng(seed)
    rest = rng.choice(np.arange(2, v), size=vd - 2, replace=False)
    return np.sort(np.concatenate([[0, 1], rest])).astype(np.int64)


def _mapping(seed: int = 0):
    tgt = _targets(seed)
    d2t = tgt - np.arange(VD)
    t2d = np.zeros(V, dtype=bool)
    t2d[tgt] = True
    return tgt, d2t, t2d


def _src(tmp_path: Path, tensors: dict, cfg: dict | None = None) -> SourceInfo:
    import torch
    from safetensors.torch import save_file

    tmp_path.mkdir(parents=True, exist_ok=True)
    save_file({k: torch.as_tensor(v) for k, v in tensors.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg or {}))
    return SourceInfo.open(tmp_path)


def test_t2d_from_d2t_roundtrip():
    tgt, d2t, t2d = _mapping()
    assert np.array_equal(vb.t2d_from_d2t(d2t, V), t2d)


def test_check_mapping_accepts_valid_and_rejects_each_rule():
    _, d2t, t2d = _mapping()
    vb.check_mapping(d2t, t2d, V, VD)
    bad = d2t.copy()
    bad[-1] = V  # out of range
    with pytest.raises(InvalidInputError, match="outside"):
        vb.check_mapping(bad, t2d, V, VD)
    t_bad = t2d.copy()
    t_bad[np.nonzero(~t2d)[0][0]] = True
    with pytest.raises(InvalidInputError, match="marks 9"):
        vb.check_mapping(d2t, t_bad, V, VD)
    # t2d with the right count but disagreeing with d2t
    t_moved = t2d.copy()
    first_true = np.nonzero(t2d)[0][0]
    t_moved[first_true] = False
    t_moved[np.nonzero(~t2d)[0][0]] = True
    with pytest.raises(InvalidInputError, match="t2d is false"):
        vb.check_mapping(d2t, t_moved, V, VD)
    with pytest.raises(InvalidInputError, match="draft_vocab_size"):
        vb.check_mapping(d2t[:-1], t2d, V, VD)


def test_normalise_detects_absolute_ids_with_t2d():
    tgt, d2t, t2d = _mapping(1)
    r = vb.normalise_d2t(tgt, t2d, V, VD)
    assert r.form == "absolute"
    assert np.array_equal(r.offsets, d2t)
    assert vb.normalise_d2t(d2t, t2d, V, VD).form == "offsets"


def test_normalise_absolute_without_t2d_when_offsets_out_of_range():
    # the last selected ids near the end of the vocab: offsets reading leaves [0, V)
    tgt = np.array([1, 5, 9, 20, 25, 28, 30, 31])
    r = vb.normalise_d2t(tgt, None, V, VD)
    assert r.form == "absolute"
    assert np.array_equal(r.offsets + np.arange(VD), tgt)


def test_normalise_without_t2d_keeps_offsets_or_refuses_ambiguity():
    # repeated offsets: absolute reading not distinct → offsets, unremarkable
    r = vb.normalise_d2t(np.array([0, 0, 1, 1, 3, 3, 3, 9]), None, V, VD)
    assert r.form == "offsets" and not r.ambiguous_but_offsets
    # unsorted but valid both ways → offsets (convention) flagged as unconfirmed
    r = vb.normalise_d2t(np.array([10, 0, 1, 2, 3, 4, 5, 6]), None, V, VD)
    assert r.form == "offsets" and r.ambiguous_but_offsets
    # strictly increasing and valid both ways → cannot tell → refused
    with pytest.raises(InvalidInputError) as e:
        vb.normalise_d2t(np.array([3, 4, 5, 6, 8, 9, 10, 11]), None, V, VD)
    assert e.value.code == "vocab_map_ambiguous"
    # ... but a t2d settles it either way
    t2d = vb.t2d_from_d2t(np.array([3, 4, 5, 6, 8, 9, 10, 11]), V)
    assert vb.normalise_d2t(np.array([3, 4, 5, 6, 8, 9, 10, 11]), t2d, V, VD).form == "offsets"
    t2d = np.zeros(V, dtype=bool)
    t2d[[3, 4, 5, 6, 8, 9, 10, 11]] = True
    assert vb.normalise_d2t(np.array([3, 4, 5, 6, 8, 9, 10, 11]), t2d, V, VD).form == "absolute"


def test_all_zero_d2t_refused_unless_t2d_confirms():
    zeros = np.zeros(VD, dtype=np.int64)
    with pytest.raises(InvalidInputError, match="#222") as e:
        vb.normalise_d2t(zeros, None, V, VD)
    assert e.value.code == "vocab_map_all_zero"
    t2d = np.zeros(V, dtype=bool)
    t2d[5:5 + VD] = True
    with pytest.raises(InvalidInputError, match="#222"):
        vb.normalise_d2t(zeros, t2d, V, VD)
    t2d = np.zeros(V, dtype=bool)
    t2d[:VD] = True  # the first Vd ids: zero offsets are right
    assert vb.normalise_d2t(zeros, t2d, V, VD).form == "offsets"


def test_invalid_both_ways():
    d2t = np.full(VD, 40)
    with pytest.raises(InvalidInputError,
                       match=r"as offsets i \+ d2t\[i\] .*; as absolute ids d2t\[i\] is outside") as e:
        vb.normalise_d2t(d2t, None, V, VD)
    assert str(e.value).count("as absolute ids") == 1  # said once (issue 14 item 10)


def test_read_mapping_files(tmp_path):
    import torch
    from safetensors.torch import save_file

    _, d2t, t2d = _mapping(2)
    np.save(tmp_path / "d2t.npy", d2t)
    np.save(tmp_path / "mask.npy", t2d)
    torch.save({"d2t": torch.from_numpy(d2t), "t2d": torch.from_numpy(t2d)}, tmp_path / "vm.pt")
    save_file({"d2t": torch.from_numpy(d2t), "t2d": torch.from_numpy(t2d)}, str(tmp_path / "vm.safetensors"))
    assert np.array_equal(vb.read_mapping_file(tmp_path / "d2t.npy")["d2t"], d2t)
    assert np.array_equal(vb.read_mapping_file(tmp_path / "mask.npy")["t2d"], t2d)
    for f in ("vm.pt", "vm.safetensors"):
        got = vb.read_mapping_file(tmp_path / f)
        assert np.array_equal(got["d2t"], d2t) and np.array_equal(got["t2d"], t2d)
    np.save(tmp_path / "mystery.npy", d2t)
    with pytest.raises(InvalidInputError, match="cannot tell"):
        vb.read_mapping_file(tmp_path / "mystery.npy")


def test_pickle_with_code_is_refused(tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    p = tmp_path / "evil.pt"
    with open(p, "wb") as f:
        pickle.dump({"d2t": Evil()}, f)
    with pytest.raises(InvalidInputError) as e:
        vb.read_mapping_file(p)
    assert e.value.code == "unsafe_pickle"


def test_resolve_pruned_rebuilds_t2d(tmp_path):
    tgt, d2t, t2d = _mapping(3)
    src = _src(tmp_path, {"d2t": d2t, "w": np.zeros((2, 2), dtype=np.float32)})
    r = vb.resolve_vocab(src, ConvertOptions(), vocab_size=V, draft_vocab_size=VD)
    assert r.kind == "pruned"
    fates = {p.out: p for p in r.tensors}
    assert fates["d2t"].fate == "copied" and fates["d2t"].produce is None
    assert fates["t2d"].fate == "generated"
    assert np.frombuffer(fates["t2d"].produce(), dtype=bool).tolist() == t2d.tolist()
    assert r.consumed == {"d2t"}
    assert np.array_equal(r.target_ids(), tgt)


def test_resolve_absolute_and_int32_converted(tmp_path):
    tgt, d2t, t2d = _mapping(4)
    src = _src(tmp_path, {"d2t": tgt.astype(np.int32), "t2d": t2d.astype(np.uint8)})
    r = vb.resolve_vocab(src, ConvertOptions(), vocab_size=V, draft_vocab_size=VD)
    fates = {p.out: p for p in r.tensors}
    assert fates["d2t"].fate == "generated" and fates["d2t"].dtype == "I64"
    assert np.array_equal(np.frombuffer(fates["d2t"].produce(), dtype="<i8"), d2t)
    assert fates["t2d"].dtype == "BOOL" and fates["t2d"].produce is not None
    assert any(f.code == "d2t-absolute-ids" for f in r.findings)


def test_resolve_side_files_and_flag(tmp_path):
    _, d2t, t2d = _mapping(5)
    src_dir = tmp_path / "src"
    src = _src(src_dir, {"w": np.zeros(2, dtype=np.float32)})
    np.save(src_dir / "d2t.npy", d2t)
    np.save(src_dir / "t2d.npy", t2d)
    r = vb.resolve_vocab(SourceInfo.open(src_dir), ConvertOptions(), vocab_size=V, draft_vocab_size=VD)
    assert {p.out: p.fate for p in r.tensors} == {"d2t": "copied", "t2d": "copied"}
    assert "side file d2t.npy" in r.notes[0]
    # --vocab-mapping that contradicts the side file
    other = tmp_path / "other.npz"
    _, d2 = _mapping(6)[:2]
    np.savez(other, d2t=d2)
    with pytest.raises(InvalidInputError) as e:
        vb.resolve_vocab(src, ConvertOptions(vocab_mapping=other), vocab_size=V, draft_vocab_size=VD)
    assert e.value.code == "conflicting_vocab_mapping"


def test_resolve_missing_mapping_for_pruned(tmp_path):
    src = _src(tmp_path, {"w": np.zeros(2, dtype=np.float32)})
    with pytest.raises(InvalidInputError) as e:
        vb.resolve_vocab(src, ConvertOptions(), vocab_size=V, draft_vocab_size=VD)
    assert e.value.code == "vocab_map_missing" and "--vocab-mapping" in (e.value.hint or "")


def test_resolve_full_vocab_drops_identity(tmp_path):
    src = _src(tmp_path, {"t2d": np.ones(V, dtype=bool), "d2t": np.zeros(V, dtype=np.int64)})
    r = vb.resolve_vocab(src, ConvertOptions(), vocab_size=V, draft_vocab_size=V)
    assert r.kind == "full" and not r.tensors
    assert sorted(d.name for d in r.dropped) == ["d2t", "t2d"]
    assert all("no mapping needed" in d.reason for d in r.dropped)
    # not the identity → refused
    t = np.ones(V, dtype=bool)
    t[3] = False
    src = _src(tmp_path / "b", {"t2d": t})
    with pytest.raises(InvalidInputError, match="not the identity"):
        vb.resolve_vocab(src, ConvertOptions(), vocab_size=V, draft_vocab_size=V)


def test_resolve_padded_identity(tmp_path):
    src = _src(tmp_path, {"w": np.zeros(2, dtype=np.float32)})
    r = vb.resolve_vocab(src, ConvertOptions(), vocab_size=V, draft_vocab_size=V + 8)
    assert r.kind == "padded" and not r.tensors
    assert any(f.code == "vocab-padded" for f in r.findings)


def test_slice_rows_plan_markov_w2(tmp_path):
    import torch

    tgt, d2t, _ = _mapping(7)
    w2 = torch.arange(V * 3, dtype=torch.bfloat16).reshape(V, 3)
    src = _src(tmp_path, {"d2t": d2t, "markov_head.markov_w2.weight": w2, "markov_head.markov_w1.weight": w2.clone()})
    r = vb.resolve_vocab(src, ConvertOptions(), vocab_size=V, draft_vocab_size=VD)
    p = vb.slice_rows_plan(src.store, "markov_head.markov_w2.weight", "markov_head.markov_w2.weight", r)
    assert p.fate == "sliced" and p.shape == (VD, 3) and p.dtype == "BF16"
    got = torch.frombuffer(bytearray(p.produce()), dtype=torch.bfloat16).reshape(VD, 3)
    assert torch.equal(got, w2[torch.from_numpy(tgt)])
    with pytest.raises(InvalidInputError, match="never sliced"):
        vb.slice_rows_plan(src.store, "markov_head.markov_w1.weight", "markov_head.markov_w1.weight", r)


def test_speculators_cached_side_files_and_mapping_dir(tmp_path):
    _, d2t, t2d = _mapping(8)
    src_dir = tmp_path / "src"
    src = _src(src_dir, {"w": np.zeros(2, dtype=np.float32)})
    # speculators' trainer caches the mapping as d2t-{Vd}.npy / t2d-{Vd}.npy
    np.save(src_dir / f"d2t-{VD}.npy", d2t)
    np.save(src_dir / f"t2d-{VD}.npy", t2d)
    np.save(src_dir / "d2t-999.npy", d2t)  # another size: ignored when Vd is known
    r = vb.resolve_vocab(src, ConvertOptions(), vocab_size=V, draft_vocab_size=VD)
    assert f"d2t-{VD}.npy" in r.notes[0]
    # a directory given to --vocab-mapping
    mdir = tmp_path / "data"
    mdir.mkdir()
    np.save(mdir / f"d2t-{VD}.npy", d2t)
    np.save(mdir / f"t2d-{VD}.npy", t2d)
    got = vb.read_mapping_file(mdir, draft_vocab_size=VD)
    assert np.array_equal(got["d2t"], d2t) and np.array_equal(got["t2d"], t2d)
    src2 = _src(tmp_path / "src2", {"w": np.zeros(2, dtype=np.float32)})
    r = vb.resolve_vocab(src2, ConvertOptions(vocab_mapping=mdir), vocab_size=V, draft_vocab_size=VD)
    assert {p.out for p in r.tensors} == {"d2t", "t2d"}
    with pytest.raises(InvalidInputError, match="no d2t/t2d"):
        vb.read_mapping_file(tmp_path / "src2")


def test_all_true_t2d_with_pruned_vocab_is_ignored(tmp_path):
    tgt, d2t, t2d = _mapping(9)
    src = _src(tmp_path, {"d2t": d2t, "t2d": np.ones(V, dtype=bool)})
    r = vb.resolve_vocab(src, ConvertOptions(), vocab_size=V, draft_vocab_size=VD)
    assert any(f.code == "t2d-default-all-true" for f in r.findings)
    assert [d.name for d in r.dropped] == ["t2d"]
    t2d_plan = next(p for p in r.tensors if p.out == "t2d")
    assert t2d_plan.fate == "generated"
    assert np.frombuffer(t2d_plan.produce(), dtype=bool).tolist() == t2d.tolist()
