"""Non-finite weights (NaN/±Inf) and the one-pass cold copy (specconv/tensors/onepass.py)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from cli_runner import invoke
from fixtures_dflash import HUB, cli_convert, make_source, read
from specconv.tensors import OutTensor, onepass, open_store, sha256_file, tensor_to_bytes, write_safetensors
from specconv.tensors.onepass import CopyPass, SourceFile
from specconv.tensors.scan import scan_bytes, unravel

BODY = "layers.0.mlp.up_proj.weight"

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.float8_e5m2, torch.float8_e4m3fn]


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_scan_matches_torch_isfinite(dt):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(997, generator=g, dtype=torch.float32)
    x[[3, 500, 996]] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    x[10] = 1e-40  # subnormal in f32, flushes in narrow types: finite either way
    t = x.to(dt)
    t[20] = torch.finfo(dt).max  # largest finite (e4m3fn: 448 = S.1111.110, exponent all ones)
    want = int((~torch.isfinite(t.double())).sum())
    dtype, _, raw = tensor_to_bytes(t)
    count, first = scan_bytes(raw, dtype)
    # e4m3fn has no inf: torch saturates ±inf to ±448 there, so only the NaN stays
    assert count == want >= (1 if dt == torch.float8_e4m3fn else 3) and first == 3
    assert scan_bytes(raw, dtype, elem_offset=7) == (count, 10)
    assert scan_bytes(tensor_to_bytes(torch.ones(5, dtype=dt))[2], dtype) == (0, None)


def test_scan_ignores_integers_and_unravels():
    assert scan_bytes(b"\xff" * 16, "I64") == (0, None)
    assert unravel(7, (2, 5)) == [1, 2] and unravel(0, ()) == []


def _nan_source(root: Path, where=(1, 3), value=float("nan")) -> Path:
    src = make_source(root)
    sd = load_file(str(src / "model.safetensors"))
    w = sd[BODY].clone()
    w[where] = value
    w[-1, -1] = float("-inf")
    sd[BODY] = w
    save_file(sd, str(src / "model.safetensors"), metadata={"format": "pt"})
    return src


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty hash/scan cache for this test (the module keeps one per process)."""
    import specconv.writer as w

    monkeypatch.setenv("SPECCONV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(w, "_HASH_CACHE", None)
    return tmp_path / "cache" / "sha256.json"


@pytest.mark.parametrize("warm", [False, True])
def test_nan_refused_cold_and_warm(tmp_path, tiny_verifier_dir, fresh_cache, warm):
    src = _nan_source(tmp_path / "s")
    if warm:  # a first, allowed run fills the cache: the refusal then comes from it
        code, _, err = cli_convert(src, tiny_verifier_dir, tmp_path / "first", "--allow-nonfinite")
        assert code == 0, err
        entry = json.loads(fresh_cache.read_text())[os.path.realpath(src / "model.safetensors")]
        assert entry["scan"][BODY] == [2, 1 * load_file(str(src / "model.safetensors"))[BODY].shape[1] + 3]
    out = tmp_path / "out"
    code, obj, _ = cli_convert(src, tiny_verifier_dir, out)
    assert code == 3 and obj["error"] == "nonfinite_weights", obj
    assert BODY in obj["message"] and "2 NaN/Inf" in obj["message"] and "first at index [1, 3]" in obj["message"]
    assert "--allow-nonfinite" in obj["message"]
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_allow_nonfinite_converts_and_records(tmp_path, tiny_verifier_dir, fresh_cache):
    src = _nan_source(tmp_path / "s", where=(0, 0), value=float("inf"))
    out = tmp_path / "out"
    code, rep, err = cli_convert(src, tiny_verifier_dir, out, "--allow-nonfinite")
    assert code == 0, err
    for findings in (rep["findings"], read(out, "specconv.json")["conversion"]["findings"]):
        f = [x for x in findings if x["code"] == "nonfinite-weights"]
        assert len(f) == 1 and f[0]["key"] == BODY and "first at index [0, 0]" in f[0]["message"]
    got = load_file(str(out / "model.safetensors"))
    assert torch.isinf(got[BODY][0, 0]) and torch.isneginf(got[BODY][-1, -1])


def test_inspect_scan(tmp_path):
    src = _nan_source(tmp_path / "s")
    r = invoke("inspect", src, "--scan", catch=True)
    obj = json.loads(r.stdout)
    assert r.code == 3 and obj["nonfinite"] == [
        {"tensor": BODY, "dtype": "BF16", "count": 2, "numel": obj["nonfinite"][0]["numel"], "first_index": [1, 3]}]
    clean = make_source(tmp_path / "c")
    r = invoke("inspect", clean, "--scan", catch=True)
    assert r.code == 0 and json.loads(r.stdout)["nonfinite"] == []


def _mixed_store(d: Path):
    g = torch.Generator().manual_seed(3)
    sd = {"a.f32": torch.randn(37, 29, generator=g), "b.bf16": torch.randn(301, generator=g).to(torch.bfloat16),
          "c.i64": torch.arange(13), "d.f16": torch.randn(3, 333, generator=g).to(torch.float16)}
    sd["d.f16"][2, 300] = float("nan")
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    return open_store(d), sd


@pytest.mark.parametrize("kernel", [True, False], ids=["copy_file_range", "pwrite"])
@pytest.mark.parametrize("chunk", [1000, 1 << 20])
def test_cold_warm_and_legacy_give_the_same_bytes(tmp_path, monkeypatch, chunk, kernel):
    monkeypatch.setattr(onepass, "CHUNK", chunk)  # 1000: chunks end inside tensors (odd element counts)
    monkeypatch.setattr(onepass, "_CFR_OK", [kernel and onepass._CFR_OK[0]])  # the cold write: kernel or pwrite
    st, sd = _mixed_store(tmp_path)
    f = st.files[0]
    outs = [OutTensor(i.name, i.dtype, i.shape, src=i) for i in st.infos()]
    outs.append(OutTensor("gen", "F32", (4,), produce=lambda: tensor_to_bytes(torch.full((4,), float("nan")))[2]))
    write_safetensors(tmp_path / "legacy", outs)
    legacy = (tmp_path / "legacy" / "model.safetensors").read_bytes()

    cold = CopyPass({f: SourceFile(f, want_sha256=True)}, outs, hash_output=True)
    write_safetensors(tmp_path / "cold", outs, engine=cold)
    assert (tmp_path / "cold" / "model.safetensors").read_bytes() == legacy
    assert cold.stats["streamed"] == 1 and cold.files[f].sha256 == sha256_file(f)
    assert cold.output_sha256["model.safetensors"] == hashlib.sha256(legacy).hexdigest()
    assert {k: (v.count, v.first) for k, v in cold.nonfinite.items()} == {"d.f16": (1, 2 * 333 + 300), "gen": (4, 0)}

    sf = cold.files[f]
    warm = CopyPass({f: SourceFile(f, want_sha256=True, sha256=sf.sha256, scans=sf.scans)}, outs, hash_output=True)
    write_safetensors(tmp_path / "warm", outs, engine=warm)
    assert (tmp_path / "warm" / "model.safetensors").read_bytes() == legacy
    assert warm.stats == {"streamed": 0, "ranges": 0, "kernel": 2}  # copy_file_range, adjacent ranges joined
    assert warm.output_sha256 == cold.output_sha256
    assert {k: (v.count, v.first) for k, v in warm.nonfinite.items()} == {"d.f16": (1, 966), "gen": (4, 0)}


def test_known_digest_reads_only_float_ranges(tmp_path):
    st, _ = _mixed_store(tmp_path)
    f = st.files[0]
    outs = [OutTensor(i.name, i.dtype, i.shape, src=i) for i in st.infos()]
    eng = CopyPass({f: SourceFile(f, want_sha256=True, sha256="0" * 64)}, outs)
    write_safetensors(tmp_path / "o", outs, max_shard_size=3000, engine=eng)  # sharded output
    assert eng.stats == {"streamed": 0, "ranges": 3, "kernel": 1}  # I64 by kernel copy
    got = open_store(tmp_path / "o")
    assert all(got.read_bytes(i.name) == st.read_bytes(i.name) for i in st.infos())


def test_sharded_cold_output_streams_each_source_once(tmp_path):
    st, _ = _mixed_store(tmp_path)
    f = st.files[0]
    outs = [OutTensor(i.name, i.dtype, i.shape, src=i) for i in st.infos()]
    eng = CopyPass({f: SourceFile(f, want_sha256=True)}, outs)
    names = write_safetensors(tmp_path / "o", outs, max_shard_size=3000, engine=eng)
    assert len(names) > 2 and eng.stats["streamed"] == 1 and eng.files[f].sha256 == sha256_file(f)
    got = open_store(tmp_path / "o")
    assert all(got.read_bytes(i.name) == st.read_bytes(i.name) for i in st.infos())
    assert eng.nonfinite["d.f16"].count == 1


def test_hub_blob_digest_is_taken_from_the_name(tmp_path, monkeypatch):
    from specconv import writer

    data = b"x" * 100
    blob = tmp_path / "models--o--n" / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True)
    blob.write_bytes(data)
    snap = tmp_path / "models--o--n" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "model.safetensors").symlink_to(os.path.relpath(blob, snap))
    (snap / "config.json").symlink_to(os.path.relpath(blob.parent / ("a" * 40), snap))  # git sha1 blob
    (blob.parent / ("a" * 40)).write_text("{}")
    monkeypatch.setenv("SPECCONV_HASH_CACHE", "0")
    monkeypatch.setattr("specconv.tensors.sha256_file", lambda p: "hashed:" + Path(p).name)
    assert writer._sha256(snap / "model.safetensors") == blob.name
    assert writer._sha256(snap / "config.json") == "hashed:config.json"  # hashed, not named
    assert writer.hub_blob_sha256(blob) is None  # not a symlink: no claim


def test_conversion_records_the_same_digests_cold_and_warm(tmp_path, tiny_verifier_dir, fresh_cache):
    src = make_source(tmp_path / "s")
    recs = []
    for i in range(2):
        code, _, err = cli_convert(src, tiny_verifier_dir, tmp_path / f"o{i}")
        assert code == 0, err
        recs.append(read(tmp_path / f"o{i}", "specconv.json")["conversion"]["source"]["files"])
    assert recs[0] == recs[1] and recs[0]["model.safetensors"] == sha256_file(src / "model.safetensors")
    assert recs[0]["config.json"] == sha256_file(src / "config.json")
    assert (tmp_path / "o0" / "model.safetensors").read_bytes() == (tmp_path / "o1" / "model.safetensors").read_bytes()
    entry = json.loads(fresh_cache.read_text())[os.path.realpath(src / "model.safetensors")]
    assert entry["sha256"] == recs[0]["model.safetensors"] and BODY in entry["scan"]
    assert HUB


def test_convert_help_imports_no_registry_numpy_or_pydantic():
    import subprocess
    import sys

    code = ("import sys\nfrom specconv.cli.main import cli\ntry:\n    cli(['convert', '--help'], "
            "prog_name='specconv')\n"
            "except SystemExit:\n    pass\n"
            "print('IMPORTED', sorted(m for m in ('specconv.converters', 'numpy', 'pydantic', 'rich', 'torch')"
            " if m in sys.modules), file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "IMPORTED []" in p.stderr, p.stderr


def test_cache_forgets_deleted_files(tmp_path, fresh_cache, monkeypatch):
    import specconv.writer as w

    monkeypatch.setattr(w, "_CACHE_PRUNE_ABOVE", 1)
    keep = tmp_path / "keep.bin"
    keep.write_bytes(b"k")
    w._hash_cache().update({str(keep): {"stat": [1, 2, 3], "sha256": "0" * 64},
                            str(tmp_path / "gone.bin"): {"stat": [1, 2, 3], "sha256": "1" * 64}})
    fresh_cache.parent.mkdir(parents=True, exist_ok=True)
    w._save_hash_cache()
    assert sorted(json.loads(fresh_cache.read_text())) == [str(keep)]


# ---- a --dtype cast that overflows is the cast's fault, never the weights' (issue 14 item 6)
def _big_source(root: Path, value: float, dtype: str = "bfloat16") -> Path:
    """A finite source whose BODY[1, 3] is ``value`` (finite in ``dtype``)."""
    src = make_source(root, dtype=dtype)
    sd = load_file(str(src / "model.safetensors"))
    sd[BODY][1, 3] = value
    assert torch.isfinite(sd[BODY]).all()
    save_file(sd, str(src / "model.safetensors"), metadata={"format": "pt"})
    return src


@pytest.mark.parametrize("allow", [False, True], ids=["plain", "allow-nonfinite"])
def test_cast_overflow_is_refused_and_not_blamed_on_the_source(tmp_path, tiny_verifier_dir, fresh_cache, allow):
    src = _big_source(tmp_path / "s", 70000.0)  # bf16 70144: finite; float16 tops out at 65504
    out = tmp_path / "out"
    code, obj, _ = cli_convert(src, tiny_verifier_dir, out, "--dtype", "float16", *(["--allow-nonfinite"] * allow))
    assert code == 3 and obj["error"] == "cast_overflow", obj
    msg = obj["message"]
    assert BODY in msg and "max |value| 70144" in msg and "65504" in msg and "keep bfloat16" in msg, msg
    assert "Pass --allow-nonfinite" not in msg and "non-finite weights" not in msg
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_cast_overflow_names_a_dtype_that_holds_it(tmp_path, tiny_verifier_dir, fresh_cache):
    src = _big_source(tmp_path / "s", 1e5, dtype="float32")
    code, obj, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out", "--dtype", "float16")
    assert code == 3 and obj["error"] == "cast_overflow", obj
    assert "keep float32 (--dtype keep), or --dtype bfloat16, which holds it" in obj["message"], obj["message"]


def test_cast_rounding_to_the_limit_is_no_overflow(tmp_path, tiny_verifier_dir, fresh_cache):
    src = _big_source(tmp_path / "s", 65500.0, dtype="float32")  # rounds to 65504, finite
    out = tmp_path / "out"
    code, _, err = cli_convert(src, tiny_verifier_dir, out, "--dtype", "float16")
    assert code == 0, err
    assert float(load_file(str(out / "model.safetensors"))[BODY][1, 3]) == 65504.0


def test_source_nonfinite_through_a_cast_stays_allowable(tmp_path, tiny_verifier_dir, fresh_cache):
    src = _nan_source(tmp_path / "s")  # NaN at [1, 3], -inf at [-1, -1] in the bf16 source
    code, obj, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "refused", "--dtype", "float16")
    assert code == 3 and obj["error"] == "nonfinite_weights" and "2 NaN/Inf" in obj["message"], obj
    out = tmp_path / "out"
    code, rep, err = cli_convert(src, tiny_verifier_dir, out, "--dtype", "float16", "--allow-nonfinite")
    assert code == 0, err
    assert [f["key"] for f in rep["findings"] if f["code"] == "nonfinite-weights"] == [BODY]
    got = load_file(str(out / "model.safetensors"))[BODY]
    assert got.dtype == torch.float16 and torch.isnan(got[1, 3]) and torch.isneginf(got[-1, -1])
    assert int((~torch.isfinite(got)).sum()) == 2


def test_cast_tensor_counts_on_both_sides():
    from specconv.errors import CastOverflowError
    from specconv.tensors import cast_bytes, cast_tensor

    t = torch.tensor([1.0, float("nan"), float("-inf"), -3e5], dtype=torch.float32)
    with pytest.raises(CastOverflowError, match=r"max \|value\| 300000 .* 65504 \(1 value\(s\)"):
        cast_tensor(t, "F16", name="w")
    ok = cast_tensor(t[:3], "F16")  # the source's own NaN/-inf carry over
    assert torch.isnan(ok[1]) and torch.isneginf(ok[2])
    raw = tensor_to_bytes(torch.tensor([7e4], dtype=torch.bfloat16))[2]
    with pytest.raises(CastOverflowError, match="^x: casting BF16 to F16"):
        cast_bytes(raw, "BF16", "F16", (1,), name="x")
    assert cast_bytes(raw, "BF16", "F32", (1,)) == tensor_to_bytes(torch.tensor([70144.0]))[2]
