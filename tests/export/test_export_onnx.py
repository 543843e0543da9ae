"""``specconv export onnx`` on tiny DFlash / DSpark / P-EAGLE dirs (real torch.onnx dynamo
export, onnx checker and ONNX Runtime on the shipped files, ONNX Runtime parity), the ORT
drafter's refusals (version-1 exports included), bad inputs."""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from test_export_wrappers import make_case  # noqa: E402

from cli_runner import invoke  # noqa: E402
from specconv.engines.onnx import ENGINE as ONNX  # noqa: E402
from specconv.errors import InvalidInputError  # noqa: E402
from specconv.tensors import sha256_file  # noqa: E402
from tests.tolerances import assert_close, assert_logits_match  # noqa: E402

#: every test reads the module's three real exports (~80 s on a busy 2-core machine): make test only
pytestmark = pytest.mark.slow

_EXPORTED: dict = {}  # one set of exports per session, shared with test_build_engine.py


@pytest.fixture(scope="module")
def exported(tmp_path_factory, verifier_dir):
    if _EXPORTED:
        return _EXPORTED
    root = tmp_path_factory.mktemp("export")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = {}
        make_case("dflash-swa-pruned", root, verifier_dir)
        code, res = invoke("export", "onnx", str(root / "dflash-swa-pruned"), "--verifier", str(verifier_dir),
                           "--dtype", "float16", "--outputs", "ids,logprobs,topk,logits", "--top-k", "3",
                           "--sampling-noise", catch=True).code_json
        assert code == 0, res
        out["dflash"] = (root / "dflash-swa-pruned", res)
        make_case("dspark", root, verifier_dir)
        out["dspark"] = (root / "dspark", ONNX.export.run(
            root / "dspark", None, verifier=str(verifier_dir), dtype="float32",
            outputs=("ids", "logprobs", "logits", "confidence")).to_dict())
        make_case("peagle-qwen3-pruned", root, verifier_dir)
        out["peagle"] = (root / "peagle-qwen3-pruned", ONNX.export.run(
            root / "peagle-qwen3-pruned", None, verifier=str(verifier_dir), dtype="float32",
            max_context=16).to_dict())
        _EXPORTED.update(out)
        return out
    finally:
        torch.set_num_threads(n)


def _graph(d):
    return onnx.load(str(d / "onnx" / "drafter.onnx"), load_external_data=False)


def _meta(d):
    return json.loads((d / "onnx" / "onnx_meta.json").read_text())


@pytest.mark.parametrize("algo", ["dflash", "dspark", "peagle"])
def test_graph_census_and_tensorrt_rules(exported, algo):
    d, res = exported[algo]
    for rel in _meta(d)["graphs"]:
        m = onnx.load(str(d / "onnx" / rel), load_external_data=False)
        ops = [n.op_type for n in m.graph.node]
        assert ops.count("Attention") == 2  # one per draft layer
        assert "RMSNormalization" in ops
        assert not {"If", "Loop", "Scan", "CumProd"} & set(ops)
        assert {n.domain for n in m.graph.node} <= {"", "ai.onnx"}
        for n in m.graph.node:
            if n.op_type == "Attention":
                attrs = {a.name: a.i for a in n.attribute}
                assert "TRT_decomposable" not in attrs  # TensorRT-only: build-engine sets it in memory
                assert attrs.get("is_causal", 0) == 0  # explicit masks instead
    ins = {i.name: i.type.tensor_type for i in _graph(d).graph.input}
    assert ins["block_ids"].elem_type == onnx.TensorProto.INT32
    assert ins["ctx_valid"].elem_type == onnx.TensorProto.BOOL
    assert [x.dim_param or x.dim_value for x in ins["ctx_position_ids"].shape.dim] == ["batch", "context"]
    assert res["census"]["Attention"] == 2


def test_meta_hashes_versions_and_record(exported):
    d, res = exported["dflash"]
    meta = _meta(d)
    assert meta["format"] == "specconv-onnx-drafter" and meta["format_version"] == 2
    assert meta["opset"] == 23 and meta["ir_version"] >= 10 and meta["dtype"] == "float16"
    assert set(meta["versions"]) >= {"torch", "onnx", "onnxscript", "onnxruntime", "specconv"}
    assert meta["block_size"] == 4 and meta["num_draft_tokens"] == 3
    assert meta["dynamic"] == {"batch": {"min": 1, "max": 8}, "context": {"min": 1, "max": 4096}}
    assert set(meta["files"]) == {"drafter.onnx", "drafter.onnx.data", "fp32/drafter.onnx", "fp32/drafter.onnx.data"}
    for rel, digest in meta["files"].items():
        assert sha256_file(d / "onnx" / rel) == digest
    assert meta["drafter_files"]["model.safetensors"] == sha256_file(d / "model.safetensors")
    # embedding from the verifier (pruned head ships with the drafter)
    assert meta["contains_verifier_weights"] is True and meta["verifier_weights"] == ["embed_tokens"]
    g = meta["graphs"]["drafter.onnx"]
    assert [o["name"] for o in g["outputs"]] == ["draft_ids", "draft_logprobs", "topk_ids", "topk_logprobs", "logits"]
    assert [i["name"] for i in g["inputs"]][-1] == "sampling_noise"
    assert meta["graphs"]["fp32/drafter.onnx"]["dtype"] == "float32"
    rec = json.loads((d / "specconv.json").read_text())["export"]["onnx"]
    assert rec["parity_passed"] is True and rec["dtype"] == "float16"
    p_meta = _meta(exported["peagle"][0])
    assert p_meta["contains_verifier_weights"] is False and p_meta["dynamic"]["context"]["max"] == 16
    # --dtype float32: one graph, written once (no fp32/ twin, no link, no copy)
    assert set(p_meta["files"]) == {"drafter.onnx", "drafter.onnx.data"}
    assert list(p_meta["graphs"]) == ["drafter.onnx"] and p_meta["graphs"]["drafter.onnx"]["dtype"] == "float32"


def _run_feeds(g: dict, meta: dict, batch: int = 2, ctx: int = 5) -> dict:
    """ONNX Runtime feeds built from the meta's I/O spec: random aux states, token 0, real
    positions, every context entry valid, zero noise."""
    import numpy as np

    rng = np.random.default_rng(0)
    dims = {"batch": batch, "context": ctx}
    feeds = {}
    for i in g["inputs"]:
        shape = [dims[x] if isinstance(x, str) else x for x in i["shape"]]
        if i["name"] == "ctx_position_ids":
            feeds[i["name"]] = np.broadcast_to(np.arange(ctx, dtype=np.int32), shape).copy()
        elif i["name"] == "block_position_ids":
            feeds[i["name"]] = np.broadcast_to(ctx + np.arange(shape[1], dtype=np.int32), shape).copy()
        elif i["dtype"] == "bool":
            feeds[i["name"]] = np.ones(shape, dtype=bool)
        elif i["name"] == "aux_hidden":
            feeds[i["name"]] = rng.standard_normal(shape).astype(i["dtype"])
        else:
            feeds[i["name"]] = np.zeros(shape, dtype=i["dtype"])
    return feeds


@pytest.mark.parametrize("algo", ["dflash", "dspark", "peagle"])
def test_shipped_graphs_are_standard_onnx(exported, algo):
    """Every file under onnx/ as shipped: onnx.checker's full check passes, ONNX Runtime loads
    and runs it as written, no file has a second hard link and no file is a copy of another."""
    import hashlib

    import numpy as np
    import onnxruntime as ort

    d, _ = exported[algo]
    meta = _meta(d)
    files = [p for p in (d / "onnx").rglob("*") if p.is_file()]
    assert sorted(p.relative_to(d / "onnx").as_posix() for p in files) == sorted([*meta["files"], "onnx_meta.json"])
    assert [p.name for p in files if p.stat().st_nlink != 1] == []
    digests = [hashlib.sha256(p.read_bytes()).hexdigest() for p in files]
    assert len(set(digests)) == len(digests)  # no second copy of a graph or its weights
    for rel, g in meta["graphs"].items():
        path = str(d / "onnx" / rel)
        onnx.checker.check_model(path, full_check=True)
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        outs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, _run_feeds(g, meta)), strict=True))
        assert list(outs) == [o["name"] for o in g["outputs"]]
        ids = outs["draft_ids"]
        assert ids.shape == (2, meta["num_draft_tokens"]) and ids.dtype == np.int32
        assert ((0 <= ids) & (ids < meta["vocab_size"])).all()
        assert np.isfinite(outs["draft_logprobs"]).all() and (outs["draft_logprobs"] <= 1e-3).all()


def _version_1(src, dst):
    """A copy of export dir ``src`` whose onnx_meta.json says format_version 1."""
    shutil.copytree(src, dst)
    m = json.loads((dst / "onnx_meta.json").read_text())
    (dst / "onnx_meta.json").write_text(json.dumps({**m, "format_version": 1}))
    return dst


def test_version_1_export_is_refused_by_validate_onnx(exported, tmp_path):
    from specconv.engines.onnx.ort_drafter import OrtDrafter

    d, _ = exported["peagle"]
    old = _version_1(d / "onnx", tmp_path / "onnx")
    for path in (old, old / "drafter.onnx"):
        with pytest.raises(InvalidInputError, match="re-export with `specconv export onnx`") as e:
            OrtDrafter(path, d, dtype="float32")
        assert e.value.code == "onnx_format_version" and e.value.exit_code == 3
    # the CLI refuses it before anything runs (the verifier is not even resolved)
    code, res = invoke("validate", str(d), "--verifier", str(tmp_path / "no-verifier"), "--onnx", str(old),
                       "--dtype", "float32", "--report-dir", str(tmp_path / "rep"), catch=True).code_json
    assert code == 3 and res["error"] == "onnx_format_version", res
    assert "re-export with `specconv export onnx`" in res["message"]
    assert not (tmp_path / "rep").exists()


@pytest.mark.parametrize("algo", ["dflash", "dspark", "peagle"])
def test_parity_with_onnx_runtime(exported, algo):
    _d, res = exported[algo]
    p32 = res["parity"]["fp32/drafter.onnx" if algo == "dflash" else "drafter.onnx"]  # float32: one graph
    assert p32["passed"] and p32["runtime"] == "onnxruntime-cpu" and p32["dtype"] == "float32"
    assert p32["top1"] == 1.0 and p32["max_abs"] <= 1e-3
    assert [c["shape"]["batch"] for c in p32["cases"]] == [1, 3]
    if algo == "dflash":  # fp16 main graph vs torch fp16
        p16 = res["parity"]["drafter.onnx"]
        assert p16["passed"] and p16["dtype"] == "float16"
        assert all(c["mismatches"] == c["near_tie_mismatches"] for c in p16["cases"])


def test_ort_drafter_matches_torch_propose(exported, verifier_dir):
    from specconv.drafters import load_drafter
    from specconv.engines.onnx.ort_drafter import OrtDrafter

    d, _ = exported["dspark"]
    dr = load_drafter(d, verifier_dir)
    od = OrtDrafter(d / "onnx", d, dtype="float32")
    assert od.graph_dtype == "float32" and od.num_draft_tokens == dr.num_draft_tokens
    g = torch.Generator().manual_seed(3)
    for T in (1, 9, 30):
        tok = torch.randint(0, 60, (1, T + 1), generator=g)
        aux = torch.randn(1, T, 96, generator=g)
        a, b = dr.propose(tok, aux), od.propose(tok, aux)
        assert_logits_match(b.logits, a.logits, actual_ids=b.tokens, expected_ids=a.tokens, what=f"ORT T={T}")
        assert_close(b.confidence, a.confidence, what=f"ORT confidence T={T}")


def test_ort_drafter_refuses_long_context_truncated_and_foreign_graphs(exported, tmp_path):
    from specconv.engines.onnx.ort_drafter import OrtDrafter

    pd, _ = exported["peagle"]
    od = OrtDrafter(pd / "onnx" / "drafter.onnx", pd)
    with pytest.raises(InvalidInputError, match="exceeds the graph's max context 16") as e:
        od.propose(torch.zeros(1, 18, dtype=torch.long), torch.zeros(1, 17, 96))
    assert e.value.exit_code == 3
    with pytest.raises(InvalidInputError) as e:
        OrtDrafter(pd / "onnx", exported["dspark"][0], dtype="float32")
    assert e.value.code == "onnx_other_drafter"
    bad = tmp_path / "onnx"
    shutil.copytree(pd / "onnx", bad)
    data = bad / "drafter.onnx.data"
    data.write_bytes(data.read_bytes()[:1000])
    with pytest.raises(InvalidInputError) as e:
        OrtDrafter(bad, pd, dtype="float32")
    assert e.value.code == "onnx_corrupt"
    (bad / "onnx_meta.json").unlink()
    with pytest.raises(InvalidInputError, match="no onnx_meta.json"):
        OrtDrafter(bad, pd, dtype="float32")


def test_bad_inputs_exit_codes_and_nothing_written(exported, tmp_path):
    d, _ = exported["peagle"]
    before = sorted(p.name for p in tmp_path.iterdir())
    plain = tmp_path / "not-speculators"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"model_type": "llama"}))
    code, res = invoke("export", "onnx", str(plain), catch=True).code_json
    assert code == 3 and res["error"] == "not_speculators_dir" and "not a Speculators" in res["message"]
    assert not (plain / "onnx").exists()
    stamp = sha256_file(d / "onnx" / "onnx_meta.json")
    code, res = invoke("export", "onnx", str(d), catch=True).code_json  # DIR/onnx exists
    assert code == 3 and "--overwrite" in res["message"]
    assert sha256_file(d / "onnx" / "onnx_meta.json") == stamp
    code, res = invoke("export", "onnx", str(d), "--outputs", "ids,bogus", catch=True).code_json
    assert code == 2 and res["error"] == "usage"
    assert sorted(p.name for p in tmp_path.iterdir()) == [*before, "not-speculators"]


def test_parity_failure_is_exit_4_and_writes_nothing(exported, tmp_path, monkeypatch, verifier_dir):
    from specconv.engines.onnx import parity

    d, _ = exported["peagle"]
    monkeypatch.setitem(parity.TOLERANCES, "float32", (1e-3, 0.0))  # no difference tolerated
    out = tmp_path / "o"
    code, res = invoke("export", "onnx", str(d), "--verifier", str(verifier_dir), "--dtype", "float32",
                       "-o", str(out), catch=True).code_json
    assert code == 4 and res["error"] == "gate_failed"
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_ort_drafter_samples_with_gumbel_noise(exported):
    """T > 0: noise drawn from the generator, picks distributed as softmax(logits / T)."""
    from specconv.engines.onnx.ort_drafter import OrtDrafter
    from specconv.errors import UsageError

    d, _ = exported["dflash"]
    od = OrtDrafter(d / "onnx", d, dtype="float32")
    g = torch.Generator().manual_seed(0)
    tok, aux = torch.randint(0, 60, (1, 6), generator=g), torch.randn(1, 5, 96, generator=g)
    T = 1.5
    probs = torch.softmax(od.propose(tok, aux).logits[0] / T, -1)
    n = 400
    counts = torch.zeros_like(probs)
    for _ in range(n):
        counts[int(od.propose(tok, aux, temperature=T, generator=g).tokens[0])] += 1
    assert float(counts.sum()) == n and bool((counts[probs == 0] == 0).all())  # never outside the draft vocab
    assert 0.5 * float((counts / n - probs).abs().sum()) < 0.12  # total variation
    pd, _ = exported["peagle"]
    with pytest.raises(UsageError, match="--sampling-noise"):
        OrtDrafter(pd / "onnx", pd, dtype="float32").propose(torch.zeros(1, 4, dtype=torch.long),
                                                             torch.zeros(1, 3, 96), temperature=1.0)
