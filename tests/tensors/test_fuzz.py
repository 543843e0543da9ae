"""Property tests (hypothesis) over the parsers that read untrusted checkpoints.

Only clean ``SpecconvError``s may come out — never another exception — and a failed
conversion never leaves an output (or a temp dir) behind. Targets: the safetensors
header/offset parser, the sharded index reader (weight_map, shard names), ``config.json``
detection and conversion over every registered format's keys, and the d2t/t2d validator.

Example counts are bounded for CI (whole file well under 90 s on 2 cores);
``HYPOTHESIS_PROFILE=slow`` runs 25x more.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from fixtures_dflash import FORMATS, HUB, source_config, source_tensors
from specconv.errors import SpecconvError
from specconv.tensors import DTYPE_SIZES, OutTensor, open_store, write_safetensors

ROOT = Path(__file__).resolve().parents[2]

settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True, database=None,
                          suppress_health_check=list(HealthCheck))
settings.register_profile("slow", deadline=None, print_blob=True, suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
_SCALE = 25 if os.environ.get("HYPOTHESIS_PROFILE") == "slow" else 1


def examples(n: int):
    return settings(max_examples=n * _SCALE)


def _fresh(base: Path, tag: str) -> Path:
    d = base / f"{tag}-{os.urandom(4).hex()}"
    d.mkdir(parents=True)
    return d


# ------------------------------------------------------------ safetensors header parser

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**65, 2**65) | st.floats() | st.text(max_size=6),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                    max_leaves=8)
DTYPE = st.sampled_from(sorted(DTYPE_SIZES)) | st.sampled_from(["F4", "bf16", ""]) | JSON
ENTRY = st.fixed_dictionaries({
    "dtype": DTYPE,
    "shape": st.lists(st.integers(-2, 6), max_size=3) | JSON,
    "data_offsets": st.lists(st.integers(-4, 300), min_size=0, max_size=3) | JSON,
}) | JSON
HEADER = st.dictionaries(st.text(max_size=6), ENTRY, max_size=5) | JSON


@st.composite
def _valid_header(draw) -> tuple[dict, bytes]:
    """A consistent header + data section (the writer's layout), to be mutated."""
    header, off = {}, 0
    for i, dtype in enumerate(draw(st.lists(st.sampled_from(sorted(DTYPE_SIZES)), max_size=4))):
        shape = draw(st.lists(st.integers(0, 5), max_size=3))
        n = int(np.prod(shape, dtype=np.int64)) * DTYPE_SIZES[dtype]
        header[f"t{i}"] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    return header, bytes(off)


@st.composite
def _mutated(draw) -> bytes:
    header, data = draw(_valid_header())
    for _ in range(draw(st.integers(0, 3))):
        if not header:
            break
        e = header[draw(st.sampled_from(sorted(header)))]
        field = draw(st.sampled_from(["dtype", "shape", "data_offsets", "drop"]))
        if field == "drop" or not e:
            e.clear()
        elif field == "data_offsets":
            e["data_offsets"] = [x + draw(st.integers(-9, 9)) for x in e["data_offsets"]]
        else:
            e[field] = draw(DTYPE if field == "dtype" else st.lists(st.integers(-1, 6), max_size=3))
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.dictionaries(st.text(max_size=3), st.text(max_size=3)) | JSON)
    js = json.dumps(header).encode()
    js += b" " * draw(st.integers(0, 7))
    n = len(js) + draw(st.sampled_from([0, 0, 0, -1, 1, 8]))
    cut = draw(st.integers(0, len(data))) if draw(st.integers(0, 5)) == 0 else len(data)
    return struct.pack("<Q", max(n, 0)) + js + data[:cut] + draw(st.binary(max_size=8))


@st.composite
def safetensors_files(draw) -> bytes:
    kind = draw(st.integers(0, 9))
    if kind < 6:
        return draw(_mutated())
    if kind < 8:
        header = draw(HEADER)
        try:
            js = json.dumps(header).encode()
        except (ValueError, OverflowError):
            js = b"{}"
    else:
        js = draw(st.binary(max_size=64))
    n = len(js) if draw(st.integers(0, 4)) else draw(st.integers(0, 2**64 - 1))
    return struct.pack("<Q", n) + js + draw(st.binary(max_size=300)) if kind < 9 else draw(st.binary(max_size=12))


def _file(header: dict, data: bytes) -> bytes:
    js = json.dumps(header).encode()
    return struct.pack("<Q", len(js)) + js + data


@pytest.mark.slow
@examples(150)
@given(raw=safetensors_files())
@example(raw=_file({"t": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}, bytes(4)))  # was TypeError
def test_header_parser_never_crashes(raw, tmp_path):
    f = _fresh(tmp_path, "h") / "model.safetensors"
    f.write_bytes(raw)
    try:
        store = open_store(f)
    except SpecconvError:
        event("refused")
        return
    event(f"parsed {min(len(store), 2)}+ tensors")
    size = len(raw)
    for info in store.infos():
        assert 8 <= info.start <= info.end <= size and info.end - info.start == info.nbytes
        assert len(store.read_bytes(info.name)) == info.nbytes


TENSORS = st.dictionaries(
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=8).filter(
        lambda s: s != "__metadata__"),
    st.tuples(st.sampled_from(sorted(DTYPE_SIZES)), st.lists(st.integers(0, 4), max_size=3)),
    max_size=5)


@examples(40)
@given(spec=TENSORS, seed=st.integers(0, 2**32 - 1), shard=st.none() | st.integers(1, 64))
def test_writer_output_parses_back_identically(spec, seed, shard, tmp_path):
    rng = np.random.default_rng(seed)
    outs, want = [], {}
    for name, (dtype, shape) in spec.items():
        raw = rng.integers(0, 256, int(np.prod(shape, dtype=np.int64)) * DTYPE_SIZES[dtype], dtype=np.uint8).tobytes()
        want[name] = raw
        outs.append(OutTensor(name, dtype, tuple(shape), produce=lambda raw=raw: raw))
    d = _fresh(tmp_path, "w")
    write_safetensors(d, outs, max_shard_size=shard)
    if not outs:
        return
    store = open_store(d)
    assert sorted(store.names()) == sorted(want)
    assert all(store.read_bytes(n) == want[n] for n in want)


# ---------------------------------------------------------------------- index reader

SHARD = st.sampled_from(["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "missing.safetensors",
                         "../model-00001-of-00002.safetensors", "/etc/passwd", "", "a\x00b", "sub/x.safetensors", "."])


@pytest.mark.slow
@examples(120)
@given(edits=st.dictionaries(st.sampled_from(["a", "b", "c", ""]) | st.text(max_size=4), SHARD | JSON, max_size=3),
       drop=st.lists(st.sampled_from(["a", "b"]), max_size=2, unique=True),
       wrap=st.sampled_from(["ok", "ok", "ok", "list", "nometa", "notdict", "junk"]))
def test_index_reader_never_crashes(edits, drop, wrap, tmp_path):
    wm = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    for k in drop:
        del wm[k]
    wm.update(edits if len(edits) < 3 else {})
    d = _fresh(tmp_path, "i")
    a = OutTensor("a", "U8", (2,), produce=lambda: b"\x01\x02")
    b = OutTensor("b", "U8", (1,), produce=lambda: b"\x03")
    write_safetensors(d, [a, b], max_shard_size=2)  # two shards + a valid index, then replaced
    doc = {"ok": {"metadata": {"total_size": 3}, "weight_map": wm}, "list": [wm], "nometa": {"weight_map": wm},
           "notdict": {"weight_map": list(wm)}, "junk": None}[wrap]
    text = json.dumps(doc) if wrap != "junk" else "{not json"
    (d / "model.safetensors.index.json").write_text(text)
    try:
        store = open_store(d)
    except SpecconvError:
        event("refused")
        return
    event("opened")
    assert sorted(store.names()) == sorted(wm)
    for name, shard in wm.items():
        assert store.info(name).file == d / shard


# ------------------------------------------------- config.json detection and conversion

def _harvest() -> tuple[list[str], list[str]]:
    """Config keys and architecture names every registered converter reads (from their source)."""
    import specconv.converters as conv

    keys, archs = set(), set()
    for cls in conv.REGISTRY.values():
        import inspect as _inspect

        text = _inspect.getsource(_inspect.getmodule(cls))
        keys |= set(re.findall(r'cfg\("([A-Za-z_]+)"', text)) | set(re.findall(r'config\.get\("([A-Za-z_]+)"', text))
        keys |= set(re.findall(r'"([a-z_]+)" in (?:src\.)?config', text))
        archs |= set(re.findall(r'"([A-Z][A-Za-z0-9]*(?:Model|ForCausalLM|Speculator|Drafter)[A-Za-z0-9]*)"', text))
    return sorted(keys), sorted(archs)


KEYS, ARCHS = _harvest()
VALUE = JSON | st.sampled_from(ARCHS or ["X"]) | st.lists(st.sampled_from(ARCHS or ["X"]),
                                                          max_size=2) | st.integers(-3, 300)


@pytest.fixture(scope="module")
def bases(tiny_verifier_dir, tmp_path_factory):
    """(label, config, tensors) to mutate: every DFlash fixture layout, a P-EAGLE drafter
    saved by speculators 0.9.0 and the bundled Speculators-format DFlash example."""
    from safetensors.torch import load_file

    from fixtures_peagle import build_speculators_peagle

    out = [(fmt, source_config(fmt), source_tensors(fmt)) for fmt in FORMATS]
    pe = build_speculators_peagle(tiny_verifier_dir, tmp_path_factory.mktemp("peagle") / "pe")
    out.append(("speculators_peagle", json.loads((pe / "config.json").read_text()),
                load_file(str(pe / "model.safetensors"))))
    ex = ROOT / "examples" / "smollm2-dflash-b8"
    out.append(("speculators_dflash", json.loads((ex / "config.json").read_text()),
                load_file(str(ex / "model.safetensors"))))
    return out


def _mutate(draw, base) -> tuple[str, dict, dict, bool]:
    label, cfg, tensors = base
    cfg, tensors = json.loads(json.dumps(cfg)), dict(tensors)
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["set", "del", "nest"]))
        nested = [k for k, v in cfg.items() if isinstance(v, dict)]
        if op == "set":
            cfg[draw(st.sampled_from(KEYS) | st.sampled_from(sorted(cfg)))] = draw(VALUE)
        elif op == "del" and cfg:
            cfg.pop(draw(st.sampled_from(sorted(cfg))), None)
        elif nested:
            sub = cfg[draw(st.sampled_from(sorted(nested)))]
            sub[draw(st.sampled_from(KEYS) | st.sampled_from(sorted(sub) or KEYS))] = draw(VALUE)
    names = sorted(tensors)
    for n in draw(st.lists(st.sampled_from(names), max_size=3, unique=True)):
        if draw(st.booleans()):
            del tensors[n]
        else:
            tensors[n.replace("layers.", draw(st.sampled_from(["layers.", "model.layers.", "midlayer.", "x."])))] = \
                tensors.pop(n)
    return label, cfg, tensors, draw(st.integers(0, 9)) > 0


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


@pytest.mark.slow
@examples(25)
@given(data=st.data())
def test_detection_and_conversion_fail_cleanly(data, bases, tmp_path, tiny_verifier_dir):
    from safetensors.torch import save_file

    from specconv.convert import convert, inspect_source

    fmt, cfg, tensors, as_text = _mutate(data.draw, data.draw(st.sampled_from(bases)))
    event(f"base {fmt}")
    d = _fresh(tmp_path, fmt)
    (d / "config.json").write_text(json.dumps(cfg) if as_text else json.dumps(cfg)[:-1])  # some truncated
    if tensors:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(d / "model.safetensors"))
    try:
        r = inspect_source(str(d))
        assert isinstance(r.supported, bool)
    except SpecconvError:
        pass
    parent = _fresh(tmp_path, "out")
    out = parent / "converted"
    try:
        rep = convert(str(d), verifier=str(tiny_verifier_dir), output=out, verifier_name=HUB)
    except SpecconvError as e:
        event(f"refused: {e.code}")
        assert not out.exists() and _leftovers(parent) == []
        return
    event("converted")
    assert rep.output == str(out) and (out / "specconv.json").is_file() and _leftovers(parent) == []


# ------------------------------------------------------------- d2t / t2d validator

INTS = st.sampled_from(["int8", "int16", "int32", "int64", "uint8", "uint32", "uint64", "bool", "float32"])


@st.composite
def arrays(draw, max_len: int = 12):
    dt = np.dtype(draw(INTS))
    ndim = draw(st.sampled_from([1, 1, 1, 0, 2]))
    shape = tuple(draw(st.lists(st.integers(0, max_len), min_size=ndim, max_size=ndim)))
    n = int(np.prod(shape, dtype=np.int64))
    if dt.kind == "b":
        vals = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    elif dt.kind == "f":
        vals = draw(st.lists(st.floats(-1e3, 1e3), min_size=n, max_size=n))
    else:
        info = np.iinfo(dt)
        vals = draw(st.lists(st.integers(int(info.min), int(info.max)) | st.integers(max(int(info.min), -20), 20),
                             min_size=n, max_size=n))
    return np.array(vals, dtype=dt).reshape(shape)


@pytest.mark.slow
@examples(300)
@given(d2t=arrays(), t2d=st.none() | arrays(), vocab=st.integers(0, 16), vd=st.integers(0, 14))
def test_vocab_validator_never_crashes(d2t, t2d, vocab, vd):
    from specconv.converters._vocab import check_mapping, normalise_d2t

    for fn in (check_mapping, normalise_d2t):
        try:
            fn(d2t, t2d, vocab, vd, where="fuzz")
        except SpecconvError:
            pass


@examples(100)
@given(data=st.data(), vocab=st.integers(2, 40))
def test_vocab_validator_accepts_every_valid_mapping(data, vocab):
    from specconv.converters._vocab import check_mapping, normalise_d2t

    vd = data.draw(st.integers(1, vocab - 1))
    targets = np.array(sorted(data.draw(st.lists(st.integers(0, vocab - 1), min_size=vd, max_size=vd, unique=True))))
    d2t = targets - np.arange(vd)
    t2d = np.zeros(vocab, dtype=bool)
    t2d[targets] = True
    check_mapping(d2t, t2d, vocab, vd)
    r = normalise_d2t(d2t, t2d, vocab, vd)
    assert r.form == "offsets" and np.array_equal(r.offsets, d2t)
    assume(d2t.any())
    try:  # without t2d: kept as offsets, or refused as ambiguous (never silently converted)
        r = normalise_d2t(d2t, None, vocab, vd)
        assert r.form == "offsets" and np.array_equal(r.offsets, d2t)
    except SpecconvError as e:
        assert e.code in ("vocab_map_ambiguous",)
