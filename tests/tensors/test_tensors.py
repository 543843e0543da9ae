"""Tests for specconv/tensors.py: lazy readers, streaming sharded writer, casts."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save, save_file

from specconv import tensors as T
from specconv.errors import InvalidInputError, UsageError
from specconv.tensors import (
    DTYPE_SIZES,
    OutTensor,
    TensorStore,
    cast_bytes,
    open_store,
    parse_size,
    sha256_file,
    tensor_to_bytes,
    write_safetensors,
)
from specconv.tensors import write as TW


def _sample(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "fc.weight": torch.randn(8, 24, generator=g),  # F32
        "layers.0.mlp.up_proj.weight": torch.randn(16, 8, generator=g).to(torch.bfloat16),
        "layers.0.self_attn.q_norm.weight": torch.randn(4, generator=g).to(torch.float16),
        "d2t": torch.randint(-50, 50, (7,), generator=g, dtype=torch.int64),
        "t2d": torch.rand(13, generator=g) > 0.5,  # BOOL, odd length (alignment)
        "scalar": torch.tensor(3.5),
    }


def _copy_all(store: TensorStore) -> list[OutTensor]:
    return [OutTensor(i.name, i.dtype, i.shape, src=i) for i in store.infos()]


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k


# ------------------------------------------------------------------ reading

def test_open_single_file_dir_reads_every_dtype(tmp_path):
    sd = _sample()
    save_file(sd, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    st = TensorStore.open(tmp_path)
    assert st.names() == sorted(sd)
    assert "fc.weight" in st and "nope" not in st
    assert st.metadata == {"format": "pt"}
    assert st.files == [tmp_path / "model.safetensors"]
    info = st.info("layers.0.mlp.up_proj.weight")
    assert (info.dtype, info.shape, info.nbytes) == ("BF16", (16, 8), 16 * 8 * 2)
    assert info.end - info.start == info.nbytes
    # byte range points at the right data in the file
    raw = (tmp_path / "model.safetensors").read_bytes()[info.start:info.end]
    assert raw == tensor_to_bytes(sd["layers.0.mlp.up_proj.weight"])[2]
    for k, t in sd.items():
        assert st.read_bytes(k) == tensor_to_bytes(t)[2]
        got = st.read_tensor(k)
        assert got.dtype == t.dtype and torch.equal(got, t), k
    assert (st.read_numpy("fc.weight") == sd["fc.weight"].numpy()).all()
    assert (st.read_numpy("t2d") == sd["t2d"].numpy()).all()
    with pytest.raises(ValueError):
        st.read_numpy("layers.0.mlp.up_proj.weight")
    with pytest.raises(InvalidInputError, match="nope"):
        st.info("nope")


def test_safetensors_path_never_imports_torch(tmp_path):
    save_file(_sample(), str(tmp_path / "model.safetensors"))
    code = (
        "import sys\n"
        "from specconv.tensors import open_store, write_safetensors, OutTensor\n"
        f"st = open_store({str(tmp_path)!r})\n"
        "st.read_bytes('fc.weight')\n"
        "write_safetensors(sys.argv[1], [OutTensor(i.name, i.dtype, i.shape, src=i) "
        "for i in st.infos()], max_shard_size=300)\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_single_other_safetensors_and_file_path(tmp_path):
    sd = _sample(1)
    save_file(sd, str(tmp_path / "consolidated.safetensors"))
    _assert_same({k: open_store(tmp_path).read_tensor(k) for k in sd}, sd)
    st = open_store(tmp_path / "consolidated.safetensors")
    assert st.names() == sorted(sd)
    save_file(sd, str(tmp_path / "other.safetensors"))
    with pytest.raises(InvalidInputError, match="2 \\*.safetensors"):
        open_store(tmp_path)


def test_no_weights_found(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(InvalidInputError, match="no weights found"):
        open_store(tmp_path)
    with pytest.raises(InvalidInputError, match="no such file"):
        open_store(tmp_path / "missing")


def _sharded_source(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    sd = _sample(2)
    src = tmp_path / "src"
    src.mkdir()
    names = sorted(sd)
    a, b = names[:3], names[3:]
    save_file({k: sd[k] for k in a}, str(src / "model-00001-of-00002.safetensors"))
    save_file({k: sd[k] for k in b}, str(src / "model-00002-of-00002.safetensors"))
    wm = {k: "model-00001-of-00002.safetensors" for k in a}
    wm.update({k: "model-00002-of-00002.safetensors" for k in b})
    (src / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": wm})
    )
    return src, sd


def test_sharded_index_read(tmp_path):
    src, sd = _sharded_source(tmp_path)
    st = open_store(src)
    assert len(st.files) == 2
    _assert_same({k: st.read_tensor(k) for k in st.names()}, sd)
    # opening the index file directly works too
    assert open_store(src / "model.safetensors.index.json").names() == sorted(sd)


def test_index_missing_shard(tmp_path):
    src, _ = _sharded_source(tmp_path)
    (src / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(InvalidInputError, match="model-00002-of-00002.safetensors"):
        open_store(src)


def test_index_name_not_in_its_shard(tmp_path):
    src, _ = _sharded_source(tmp_path)
    idx = src / "model.safetensors.index.json"
    data = json.loads(idx.read_text())
    data["weight_map"]["ghost.weight"] = "model-00001-of-00002.safetensors"
    idx.write_text(json.dumps(data))
    with pytest.raises(InvalidInputError, match="ghost.weight"):
        open_store(src)
    # a name mapped to the wrong shard is also caught
    data["weight_map"].pop("ghost.weight")
    data["weight_map"]["t2d"] = "model-00001-of-00002.safetensors"
    idx.write_text(json.dumps(data))
    with pytest.raises(InvalidInputError, match="t2d"):
        open_store(src)


def test_index_path_traversal_refused(tmp_path):
    src, _ = _sharded_source(tmp_path)
    idx = src / "model.safetensors.index.json"
    data = json.loads(idx.read_text())
    data["weight_map"]["t2d"] = "../evil.safetensors"
    idx.write_text(json.dumps(data))
    with pytest.raises(InvalidInputError, match="outside"):
        open_store(src)


def test_duplicate_name_across_shards(tmp_path):
    src, sd = _sharded_source(tmp_path)
    name = sorted(sd)[0]  # lives in shard 1; put a copy in shard 2 as well
    shard2 = src / "model-00002-of-00002.safetensors"
    content = load_file(str(shard2))
    content[name] = sd[name]
    save_file(content, str(shard2))
    with pytest.raises(InvalidInputError, match="two shards"):
        open_store(src)


def _write_raw(path: Path, header: dict | bytes, data: bytes, hlen: int | None = None) -> None:
    js = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(js) if hlen is None else hlen
    path.write_bytes(struct.pack("<Q", n) + js + data)


@pytest.mark.parametrize(
    "case, match",
    [
        ("truncated", "does not fit"),
        ("tiny", "shorter than"),
        ("bad_json", "not JSON"),
        ("out_of_bounds", "past the end"),
        ("overlap", "overlap"),
        ("size_mismatch", "needs"),
        ("bad_dtype", "unsupported dtype"),
    ],
)
def test_corrupt_headers(tmp_path, case, match):
    p = tmp_path / "model.safetensors"
    ok = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    if case == "truncated":
        good = save({"a": torch.ones(4)})
        p.write_bytes(good[:20])  # header cut mid-way
    elif case == "tiny":
        p.write_bytes(b"\x01\x02")
    elif case == "bad_json":
        _write_raw(p, b"{not json!", b"\0" * 8)
    elif case == "out_of_bounds":
        _write_raw(p, {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8)
    elif case == "overlap":
        _write_raw(p, {**ok, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}},
                   b"\0" * 16)
    elif case == "size_mismatch":
        _write_raw(p, {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 16)
    elif case == "bad_dtype":
        _write_raw(p, {"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8)
    with pytest.raises(InvalidInputError, match=match) as ei:
        open_store(tmp_path)
    assert str(p) in str(ei.value)


def test_bin_weights_only(tmp_path):
    sd = _sample(3)
    torch.save(sd, tmp_path / "pytorch_model.bin")
    st = open_store(tmp_path)
    assert st.format == "bin" and st.names() == sorted(sd)
    info = st.info("layers.0.mlp.up_proj.weight")
    assert info.start is None and info.dtype == "BF16"
    _assert_same({k: st.read_tensor(k) for k in sd}, sd)
    assert st.read_bytes("t2d") == tensor_to_bytes(sd["t2d"])[2]
    # .bin -> safetensors through the writer (src with a loader, no byte range)
    out = tmp_path / "out"
    write_safetensors(out, _copy_all(st))
    _assert_same(load_file(str(out / "model.safetensors")), sd)


def test_bin_index(tmp_path):
    sd = _sample(4)
    names = sorted(sd)
    torch.save({k: sd[k] for k in names[:2]}, tmp_path / "pytorch_model-00001-of-00002.bin")
    torch.save({k: sd[k] for k in names[2:]}, tmp_path / "pytorch_model-00002-of-00002.bin")
    wm = {k: "pytorch_model-00001-of-00002.bin" for k in names[:2]}
    wm.update({k: "pytorch_model-00002-of-00002.bin" for k in names[2:]})
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": wm}))
    st = open_store(tmp_path)
    _assert_same({k: st.read_tensor(k) for k in st.names()}, sd)


class _Evil:
    """Unpickling this would create the marker file (code execution)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_bin_with_arbitrary_pickle_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"w": torch.ones(2), "obj": _Evil(str(marker))}, tmp_path / "pytorch_model.bin")
    with pytest.raises(InvalidInputError, match="arbitrary unpickling") as ei:
        open_store(tmp_path)
    assert "pytorch_model.bin" in str(ei.value)
    assert ei.value.code == "unsafe_pickle"
    assert not marker.exists(), "the pickle was executed"


def test_bin_not_a_state_dict(tmp_path):
    torch.save({"model": {"w": torch.ones(2)}, "step": 3}, tmp_path / "pytorch_model.bin")
    with pytest.raises(InvalidInputError, match="not a tensor"):
        open_store(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"garbage" * 10)
    with pytest.raises(InvalidInputError, match="pytorch_model.bin.*weights_only=True") as ei:
        open_store(tmp_path)
    assert ei.value.code != "unsafe_pickle"


# ------------------------------------------------------------------ writing

def test_roundtrip_and_matches_safetensors_library_bytes(tmp_path):
    sd = _sample(5)
    save_file(sd, str(tmp_path / "model.safetensors"))
    out = tmp_path / "out"
    files = write_safetensors(out, _copy_all(open_store(tmp_path)))
    assert files == ["model.safetensors"]
    _assert_same(load_file(str(out / "model.safetensors")), sd)
    # same layout as the reference library, byte for byte
    assert (out / "model.safetensors").read_bytes() == save(sd, metadata={"format": "pt"})
    raw = (out / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    assert n % 8 == 0
    assert json.loads(raw[8:8 + n])["__metadata__"] == {"format": "pt"}


def test_produce_and_src_mix(tmp_path):
    sd = _sample(6)
    save_file(sd, str(tmp_path / "model.safetensors"))
    st = open_store(tmp_path)
    extra = torch.arange(10, dtype=torch.int64)
    outs = _copy_all(st) + [
        OutTensor("extra", "I64", (10,), produce=lambda: tensor_to_bytes(extra)[2]),
        # rename + free reshape of a src range
        OutTensor("fc_flat", "F32", (8 * 24,), src=st.info("fc.weight")),
    ]
    write_safetensors(tmp_path / "out", outs)
    got = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert torch.equal(got["extra"], extra)
    assert torch.equal(got["fc_flat"], sd["fc.weight"].reshape(-1))


def test_writer_rejects_bad_input(tmp_path):
    with pytest.raises(InvalidInputError, match="wrong|needs"):
        write_safetensors(tmp_path, [OutTensor("x", "F32", (3,), produce=lambda: b"\0" * 8)])
    assert not (tmp_path / "model.safetensors").exists()
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(InvalidInputError, match="twice"):
        write_safetensors(tmp_path, [OutTensor("x", "U8", (1,), produce=lambda: b"\0")] * 2)
    with pytest.raises(InvalidInputError, match="exactly one"):
        write_safetensors(tmp_path, [OutTensor("x", "U8", (1,))])
    save_file({"w": torch.ones(4)}, str(tmp_path / "model.safetensors"))
    info = open_store(tmp_path).info("w")
    with pytest.raises(InvalidInputError, match="cast"):
        write_safetensors(tmp_path / "o", [OutTensor("w", "F16", (4,), src=info)])
    with pytest.raises(InvalidInputError, match="does not hold"):
        write_safetensors(tmp_path / "o", [OutTensor("w", "F32", (5,), src=info)])


def test_sharded_write_transformers_style(tmp_path):
    sd = _sample(7)
    save_file(sd, str(tmp_path / "model.safetensors"))
    st = open_store(tmp_path)
    limit = 300
    out = tmp_path / "out"
    files = write_safetensors(out, _copy_all(st), max_shard_size=limit)
    n = len(files) - 1
    assert n >= 2
    assert files[-1] == "model.safetensors.index.json"
    assert files[:-1] == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    text = (out / "model.safetensors.index.json").read_text()
    assert text.endswith("}\n")
    index = json.loads(text)
    assert index["metadata"]["total_size"] == sum(i.nbytes for i in st.infos())
    assert list(index["weight_map"]) == sorted(sd)
    # transformers-style loading: follow the weight map shard by shard
    loaded: dict[str, torch.Tensor] = {}
    for shard in sorted(set(index["weight_map"].values())):
        part = load_file(str(out / shard))
        assert all(index["weight_map"][k] == shard for k in part)
        loaded.update(part)
        data = sum(t.numel() * t.element_size() for t in part.values())
        big = max(t.numel() * t.element_size() for t in part.values())
        assert data <= limit or len(part) == 1 and big > limit
    _assert_same(loaded, sd)
    # the sharded output reads back through TensorStore too
    assert open_store(out).names() == sorted(sd)
    # a tensor bigger than the limit gets its own shard
    fc = st.info("fc.weight")
    assert fc.nbytes > limit
    part = load_file(str(out / index["weight_map"]["fc.weight"]))
    assert list(part) == ["fc.weight"]


def test_byte_identical_rerun(tmp_path):
    sd = _sample(8)
    save_file(sd, str(tmp_path / "model.safetensors"))
    st = open_store(tmp_path)
    digests = []
    for run in ("a", "b"):
        out = tmp_path / run
        files = write_safetensors(out, list(reversed(_copy_all(st))), max_shard_size=400)
        digests.append({f: sha256_file(out / f) for f in files})
    assert digests[0] == digests[1]
    assert len(digests[0]) >= 3


@pytest.mark.parametrize("method", ["copy_file_range", "sendfile", "readwrite", None])
def test_copy_larger_than_chunk(tmp_path, monkeypatch, method):
    monkeypatch.setattr(TW, "COPY_CHUNK_SIZE", 1000)
    monkeypatch.setattr(TW, "KERNEL_COPY_CHUNK", 1000)
    g = torch.Generator().manual_seed(9)
    big = torch.randn(3, 1234, generator=g)  # 14,808 bytes: 15 chunks
    save_file({"big": big, "a": torch.ones(3)}, str(tmp_path / "model.safetensors"))
    info = open_store(tmp_path).info("big")
    out = tmp_path / "out.bin"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT)
    try:
        os.write(fd, b"HEAD")
        try:
            used = T.write._copy_range(info.file, info.start, info.nbytes, fd, method=method)
        except OSError:
            pytest.skip(f"{method} not supported on this filesystem")
    finally:
        os.close(fd)
    assert method is None or used == method
    assert out.read_bytes() == b"HEAD" + tensor_to_bytes(big)[2]
    # and through the writer
    write_safetensors(tmp_path / "w", [OutTensor("big", "F32", (3, 1234), src=info)])
    assert torch.equal(load_file(str(tmp_path / "w" / "model.safetensors"))["big"], big)


def test_adjacent_source_ranges_are_copied_in_one_call(tmp_path, monkeypatch):
    sd = _sample(11)
    save_file(sd, str(tmp_path / "model.safetensors"))
    st = open_store(tmp_path)
    calls = []
    orig = TW._copy_range
    monkeypatch.setattr(TW, "_copy_range",
                        lambda *a, **k: calls.append(a[:3]) or orig(*a, **k))
    write_safetensors(tmp_path / "o", _copy_all(st))
    # same layout as the source: the whole data section is one range
    assert calls == [(st.files[0], min(i.start for i in st.infos()), sum(i.nbytes for i in st.infos()))]
    _assert_same(load_file(str(tmp_path / "o" / "model.safetensors")), sd)
    # a produced tensor in the middle splits the run; the output is still right
    calls.clear()
    outs = [o if o.name != "scalar" else  # laid out mid-file (F32, after fc.weight)
            OutTensor("scalar", "F32", (), produce=lambda: tensor_to_bytes(sd["scalar"] + 1)[2])
            for o in _copy_all(st)]
    write_safetensors(tmp_path / "p", outs)
    assert len(calls) == 2
    got = load_file(str(tmp_path / "p" / "model.safetensors"))
    assert torch.equal(got["scalar"], sd["scalar"] + 1)
    assert all(torch.equal(got[k], sd[k]) for k in sd if k != "scalar")


def test_copy_detects_truncated_source(tmp_path):
    save_file({"big": torch.ones(1000)}, str(tmp_path / "model.safetensors"))
    info = open_store(tmp_path).info("big")
    with open(info.file, "r+b") as f:
        f.truncate(info.start + 100)
    with pytest.raises(InvalidInputError, match="truncated"):
        write_safetensors(tmp_path / "o", [OutTensor("big", "F32", (1000,), src=info)])


# ------------------------------------------------------------------ casts & helpers

@pytest.mark.parametrize("src, dst", [("BF16", "F32"), ("F32", "BF16"), ("F32", "F16"),
                                      ("F16", "BF16"), ("I64", "F32")])
def test_cast_bytes_matches_torch(src, dst):
    g = torch.Generator().manual_seed(10)
    t = (torch.randn(5, 7, generator=g) * 100).to(T.torch_dtype(src))
    _, shape, raw = tensor_to_bytes(t)
    got = cast_bytes(raw, src, dst, shape)
    assert len(got) == t.numel() * DTYPE_SIZES[dst]
    assert got == tensor_to_bytes(t.to(T.torch_dtype(dst)))[2]
    with pytest.raises(InvalidInputError):
        cast_bytes(raw[:-1], src, dst, shape)


def test_tensor_to_bytes_dtypes():
    for name, dt in T.dtypes._torch_dtype_map().items():
        t = torch.zeros(2, 3, dtype=dt)
        d, shape, raw = tensor_to_bytes(t)
        assert (d, shape, len(raw)) == (name, (2, 3), 6 * DTYPE_SIZES[name])
    # non-contiguous input is serialised in logical (row-major) order
    x = torch.arange(6, dtype=torch.int16).reshape(2, 3).t()
    assert tensor_to_bytes(x)[2] == tensor_to_bytes(x.contiguous())[2]


def test_parse_size():
    assert parse_size("5GB") == 5 * 10**9
    assert parse_size("500MB") == 500 * 10**6
    assert parse_size("2GiB") == 2 * 2**30
    assert parse_size("1.5G") == 1_500_000_000
    assert parse_size(123) == 123
    assert parse_size("64") == 64
    for bad in ("lots", "5XB", "0", -1, "-3MB"):
        with pytest.raises(UsageError):
            parse_size(bad)


def test_sha256_file(tmp_path):
    import hashlib

    p = tmp_path / "f"
    data = os.urandom(3 * 1024 + 7)
    p.write_bytes(data)
    assert sha256_file(p, chunk_size=1000) == hashlib.sha256(data).hexdigest()
