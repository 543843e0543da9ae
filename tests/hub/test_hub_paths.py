"""The Hub code paths (``--verifier OWNER/NAME``, ``specconv convert OWNER/NAME [--subfolder]``)
run for real, offline, through huggingface_hub's own cache resolution.

A fake Hugging Face cache is built in ``tmp_path`` with the on-disk layout huggingface_hub
2.x reads (``file_download.py`` / ``_snapshot_download.py`` / ``constants.py``)::

    HF_HUB_CACHE/models--{owner}--{name}/
        blobs/<etag>                  # sha256 for LFS files (*.safetensors), git blob sha1 otherwise
        refs/main                     # the commit hash, no trailing newline
        snapshots/<commit>/<path>     # relative symlink to ../../blobs/<etag> (or a plain file)
        .no_exist/<commit>/<path>     # (optional) files the Hub answered 404 for
        trees/<commit>.json           # (optional) cached tree listing

and ``HF_HUB_OFFLINE=1`` + ``HF_HUB_CACHE`` are set in the environment *and* on
``huggingface_hub.constants`` (which reads them once, at import). Nothing touches the network:
offline mode makes huggingface_hub raise before any request.

Every ``specconv.hub.download_file`` / ``download_snapshot`` call (specconv's only way to
``hf_hub_download`` / ``snapshot_download``) is recorded, and verifier shards that a
conversion must not need are left out of the cache entirely, so reading one would fail.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

import fixtures_dflash as fd
from cli_runner import invoke

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SHARDS = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
INDEX = "model.safetensors.index.json"
VERIFIER = "owner/verifier"


# ----------------------------------------------------------------------------- fake cache
def _etag(rel: str, data: bytes) -> str:
    """The blob name huggingface_hub uses: the LFS sha256 for large files, else git's blob sha1."""
    if rel.endswith(".safetensors"):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    """Builds repos in a huggingface_hub cache directory and records the Hub calls made."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache
        self.calls: list[tuple[str, ...]] = []

    def repo_dir(self, repo: str) -> Path:
        return self.cache / ("models--" + repo.replace("/", "--"))

    def add(self, repo: str, files: dict[str, Path | bytes], *, symlinks: bool = True,
            no_exist: tuple[str, ...] = (), tree: dict[str, int] | None = None, commit: str = COMMIT) -> Path:
        """Put ``files`` (repo-relative path → local file or bytes) in the cache at ``commit``
        (``refs/main`` points to it); return the snapshot dir."""
        rd = self.repo_dir(repo)
        (rd / "refs").mkdir(parents=True, exist_ok=True)
        (rd / "refs" / "main").write_text(commit)  # huggingface_hub writes no newline
        snap = rd / "snapshots" / commit
        for rel, content in files.items():
            data = content if isinstance(content, bytes) else Path(content).read_bytes()
            dst = snap / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if symlinks:
                blob = rd / "blobs" / _etag(rel, data)
                blob.parent.mkdir(parents=True, exist_ok=True)
                blob.write_bytes(data)
                os.symlink(os.path.relpath(blob, dst.parent), dst)
            else:
                dst.write_bytes(data)
        for rel in no_exist:
            p = rd / ".no_exist" / commit / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.touch()
        if tree is not None:
            (rd / "trees").mkdir(exist_ok=True)
            listing = {rel: {"size": size, "blob_id": "0" * 40} for rel, size in tree.items()}
            (rd / "trees" / f"{commit}.json").write_text(json.dumps({"format_version": 1, "files": listing}))
        return snap

    def downloads(self, repo: str) -> list[str]:
        """Files requested from ``repo`` with ``hf_hub_download``, in order."""
        return [c[2] for c in self.calls if c[0] == "file" and c[1] == repo]


@pytest.fixture
def hub(tmp_path, monkeypatch):
    import huggingface_hub.constants as constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    fake = FakeHub(cache)
    from specconv import hub as spec_hub

    real_file, real_snapshot = spec_hub.download_file, spec_hub.download_snapshot

    def spy_file(repo_id, filename, *a, **kw):
        fake.calls.append(("file", repo_id, filename))
        return real_file(repo_id, filename, *a, **kw)

    def spy_snapshot(repo_id, *a, **kw):
        fake.calls.append(("snapshot", repo_id, json.dumps(kw.get("allow_patterns"))))
        return real_snapshot(repo_id, *a, **kw)

    # every Hub call of specconv goes through specconv.hub (looked up at call time)
    monkeypatch.setattr(spec_hub, "download_file", spy_file)
    monkeypatch.setattr(spec_hub, "download_snapshot", spy_snapshot)
    # Hub ids are told from local paths by os.path.exists: run where no `owner/...` dir exists
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return fake


# --------------------------------------------------------------------------- verifiers
def _shard(vdir: Path, out: Path) -> Path:
    """Re-save a tiny verifier as 3 shards + index: embeddings and layers 0-1 in shard 1,
    layers 2-3 in shard 2, layers 4-5 + final norm + LM head in shard 3."""
    from safetensors.torch import load_file, save_file

    if (out / INDEX).exists():
        return out
    out.mkdir(parents=True)
    sd = load_file(str(vdir / "model.safetensors"))
    n_layers = json.loads((vdir / "config.json").read_text())["num_hidden_layers"]

    def which(name: str) -> int:
        if ".layers." in name:
            return min(int(name.split(".layers.")[1].split(".")[0]) * 3 // n_layers, 2)
        return 0 if "embed_tokens" in name else 2

    parts: list[dict] = [{}, {}, {}]
    for name, t in sd.items():
        parts[which(name)][name] = t
    assert all(parts), "every shard holds something"
    for fname, part in zip(SHARDS, parts, strict=True):
        save_file(part, str(out / fname), metadata={"format": "pt"})
    wm = {n: SHARDS[i] for i, part in enumerate(parts) for n in part}
    total = sum(t.numel() * t.element_size() for t in sd.values())
    (out / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": wm}, indent=2))
    (out / "config.json").write_bytes((vdir / "config.json").read_bytes())
    return out


def _verifier_files(d: Path, shards=(1, 3)) -> dict[str, Path]:
    return {"config.json": d / "config.json", INDEX: d / INDEX, **{SHARDS[i - 1]: d / SHARDS[i - 1] for i in shards}}


def _load(path: Path, name: str):
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return f.get_tensor(name)


def _tensors(d: Path) -> dict:
    """All tensors of an output dir (single file or shards)."""
    from specconv.tensors import TensorStore

    st = TensorStore.open(d)
    return {n: st.read_tensor(n) for n in st.names()}


# ------------------------------------------------------------------- 1. resolve_verifier
@pytest.mark.parametrize("symlinks", [True, False], ids=["blob-symlinks", "plain-files"])
def test_hub_verifier_reads_only_the_shards_it_needs(hub, sharded_qwen3, symlinks):
    from specconv.errors import InvalidInputError
    from specconv.verifier import resolve_verifier

    snap = hub.add(VERIFIER, _verifier_files(sharded_qwen3, shards=(1, 3)), symlinks=symlinks)
    assert not (snap / SHARDS[1]).exists()  # the layer-only shard is absent from the cache
    v = resolve_verifier(VERIFIER)
    assert (v.hub_id, v.name_or_path) == (VERIFIER, VERIFIER)
    assert v.local_dir == snap
    cfg = json.loads((sharded_qwen3 / "config.json").read_text())
    assert (v.hidden_size, v.num_hidden_layers, v.vocab_size) == (cfg["hidden_size"], cfg["num_hidden_layers"],
                                                                    cfg["vocab_size"])
    assert v.architectures == cfg["architectures"]
    facts = v.facts()
    assert facts.is_local_path is False and facts.name_or_path == VERIFIER

    assert v.find_tensor("embed") == "model.embed_tokens.weight"
    assert v.find_tensor("lm_head") == "lm_head.weight"
    assert v.find_tensor("norm") == "model.norm.weight"  # not a per-layer / q_norm / k_norm gain
    assert hub.downloads(VERIFIER) == ["config.json", INDEX]  # names come from the index alone

    for name, shard in (("lm_head.weight", SHARDS[2]), ("model.embed_tokens.weight", SHARDS[0]),
                        ("model.norm.weight", SHARDS[2])):
        info = v.tensor_info(name)
        assert info.file == snap / shard
        assert list(info.shape) == list(_load(sharded_qwen3 / shard, name).shape)
        assert info.dtype == "F32"
    assert sorted(set(hub.downloads(VERIFIER))) == sorted(["config.json", INDEX, SHARDS[0], SHARDS[2]])

    # a tensor of the missing shard: a clear error naming the shard, not a traceback
    with pytest.raises(InvalidInputError, match=SHARDS[1]) as e:
        v.tensor_info("model.layers.2.mlp.up_proj.weight")
    assert e.value.exit_code == 3
    with pytest.raises(InvalidInputError, match="no tensor"):
        v.tensor_info("not.a.tensor")


def test_hub_verifier_index_only_is_enough_for_names(hub, sharded_qwen3):
    from specconv.verifier import resolve_verifier

    hub.add(VERIFIER, _verifier_files(sharded_qwen3, shards=()))
    v = resolve_verifier(VERIFIER)
    assert [v.find_tensor(r) for r in ("embed", "lm_head", "norm")] == [
        "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"]
    assert hub.downloads(VERIFIER) == ["config.json", INDEX]


def test_hub_verifier_single_file(hub, tiny_verifier_dir):
    """An unsharded verifier: the index is absent (and, as a real cache records after a 404,
    listed in ``.no_exist``), so ``model.safetensors``' header gives the names."""
    import torch

    from specconv.verifier import resolve_verifier

    snap = hub.add(VERIFIER, {"config.json": tiny_verifier_dir / "config.json",
                              "model.safetensors": tiny_verifier_dir / "model.safetensors"}, no_exist=(INDEX,))
    v = resolve_verifier(VERIFIER)
    assert v.find_tensor("lm_head") == "lm_head.weight"
    info = v.tensor_info("lm_head.weight")
    assert info.file == snap / "model.safetensors"
    from specconv.tensors import TensorStore

    got = TensorStore.open(info.file).read_tensor("lm_head.weight")
    assert torch.equal(got, _load(tiny_verifier_dir / "model.safetensors", "lm_head.weight"))


def _multimodal(d: Path, *, tie: bool) -> dict[str, bytes]:
    """A multimodal wrapper config (Qwen2.5-VL-like: ``text_config`` + ``vision_config``)
    and an index whose names carry ``model.language_model.`` / ``model.visual.`` prefixes."""
    text = json.loads((d / "config.json").read_text())
    text["tie_word_embeddings"] = tie
    text.pop("architectures", None)
    raw = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
           "text_config": text, "vision_config": {"hidden_size": 32, "depth": 2}, "image_token_id": 151655}
    names = ["model.language_model.embed_tokens.weight", "model.language_model.norm.weight",
             "model.language_model.layers.0.input_layernorm.weight",
             "model.language_model.layers.0.self_attn.q_norm.weight",
             "model.visual.blocks.0.norm1.weight", "model.visual.merger.ln_q.weight",
             "model.visual.patch_embed.proj.weight"]
    if not tie:
        names.append("lm_head.weight")
    wm = {n: SHARDS[i % 3] for i, n in enumerate(names)}
    return {"config.json": json.dumps(raw).encode(), INDEX: json.dumps({"metadata": {}, "weight_map": wm}).encode()}


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_hub_multimodal_verifier_text_config(hub, tiny_verifier_dir, tie):
    from specconv.verifier import resolve_verifier

    hub.add(VERIFIER, _multimodal(tiny_verifier_dir, tie=tie))  # no shards at all
    v = resolve_verifier(VERIFIER)
    assert (v.hidden_size, v.num_hidden_layers, v.vocab_size) == (fd.H, fd.VERIFIER_LAYERS, fd.VOCAB)
    assert v.architectures == ["Qwen2_5_VLForConditionalGeneration"]
    assert "vision_config" in v.raw_config and "vision_config" not in v.config
    assert v.tie_word_embeddings is tie
    assert v.find_tensor("embed") == "model.language_model.embed_tokens.weight"
    assert v.find_tensor("norm") == "model.language_model.norm.weight"
    assert v.find_tensor("lm_head") == ("model.language_model.embed_tokens.weight" if tie else "lm_head.weight")


# ------------------------------------------------------------------- 2. end-to-end convert
def _zlab_files(root: Path, prefix: str = "") -> dict[str, Path]:
    src = fd.make_source(root, "zlab_dflash")
    return {prefix + f.name: f for f in sorted(src.iterdir())}


def _check_hub_output(out: Path, rep: dict, snap_src: Path) -> dict:
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == VERIFIER
    assert "verifier-not-hub-id" not in fd.codes(rep["findings"])
    rec = json.loads((out / "specconv.json").read_text())["conversion"]
    assert rec["verifier"]["spec"] == VERIFIER and rec["verifier"]["name_or_path"] == VERIFIER
    # the absolute snapshot path is in the conversion report; the record names the Hub repo
    assert Path(rep["source"]) == snap_src
    assert (rec["source"]["hub_id"]
            == snap_src.parts[snap_src.parts.index("snapshots") - 1][len("models--"):].replace("--", "/"))
    assert not Path(rec["source"]["path"]).is_absolute()
    return rec


def test_cli_convert_hub_drafter_with_hub_verifier(hub, sharded_qwen3, tmp_path):
    """z-lab DFlash needs no verifier tensor: a verifier cache with config + index and no
    shard at all is enough; the drafter's tensors are copied bit-exactly."""
    import torch

    files = _zlab_files(tmp_path / "src")
    snap_src = hub.add("z-lab/tiny-dflash", files)
    hub.add(VERIFIER, _verifier_files(sharded_qwen3, shards=()))
    out = tmp_path / "out"
    code, rep, err = invoke("convert", "z-lab/tiny-dflash", "--verifier", VERIFIER, "-o", out).code_json_stderr
    assert code == 0, (rep, err)
    _check_hub_output(out, rep, snap_src)
    src_t, dst_t = _tensors(files["model.safetensors"].parent), _tensors(out)
    assert "fc.weight" in dst_t
    for name in ("fc.weight", "hidden_norm.weight", "norm.weight"):
        assert dst_t[name].dtype == src_t[name].dtype and torch.equal(dst_t[name], src_t[name])
    assert set(hub.downloads(VERIFIER)) <= {"config.json", INDEX}
    snaps = [c for c in hub.calls if c[0] == "snapshot"]
    assert [c[1] for c in snaps] == ["z-lab/tiny-dflash"]
    assert "*.safetensors" in json.loads(snaps[0][2]) and "*.bin" not in snaps[0][2]


def test_hub_source_files_recorded_by_repo_name(hub, sharded_qwen3, tmp_path):
    files = _zlab_files(tmp_path / "src")
    hub.add("z-lab/tiny-dflash", files)
    hub.add(VERIFIER, _verifier_files(sharded_qwen3, shards=()))
    out = tmp_path / "out"
    rep = fd.api_convert("z-lab/tiny-dflash", VERIFIER, out, name=None)
    rec = json.loads((out / "specconv.json").read_text())["conversion"]
    assert sorted(rec["source"]["files"]) == sorted(files), rep


def test_cli_convert_hub_multimodal_verifier_without_shards(hub, tiny_verifier_dir, tmp_path):
    hub.add("z-lab/tiny-dflash", _zlab_files(tmp_path / "src"))
    hub.add(VERIFIER, _multimodal(tiny_verifier_dir, tie=False))
    out = tmp_path / "out"
    code, rep, err = invoke("convert", "z-lab/tiny-dflash", "--verifier", VERIFIER, "-o", out).code_json_stderr
    assert code == 0, (rep, err)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"] == {"name_or_path": VERIFIER,
                                                     "architectures": ["Qwen2_5_VLForConditionalGeneration"]}
    assert "verifier-not-hub-id" not in fd.codes(rep["findings"])


@pytest.mark.parametrize("with_tree", [False, True], ids=["no-tree-cache", "tree-cache"])
def test_cli_convert_hub_subfolder(hub, sharded_qwen3, tmp_path, with_tree):
    """MiMo-like repo: the main model at the root (its weights never downloaded), the drafter
    in ``dflash/``. With a cached tree listing, only ``dflash/`` files must be present."""
    files = _zlab_files(tmp_path / "src", prefix="dflash/")
    root_cfg = json.dumps({"architectures": ["MiMoForCausalLM"], "model_type": "mimo"}).encode()
    tree = {"config.json": len(root_cfg), "model-00001-of-00002.safetensors": 10**9,
            "model-00002-of-00002.safetensors": 10**9, "modeling_mimo.py": 100,
            **{rel: p.stat().st_size for rel, p in files.items()}} if with_tree else None
    snap = hub.add("xiaomi/mimo-like", {"config.json": root_cfg, **files}, tree=tree)
    hub.add(VERIFIER, _verifier_files(sharded_qwen3, shards=()))
    out = tmp_path / "out"
    code, rep, err = invoke("convert", "xiaomi/mimo-like", "--subfolder", "dflash", "--verifier", VERIFIER,
                            "-o", out).code_json_stderr
    assert code == 0, (rep, err)
    assert rep["format"] == "zlab_dflash"
    _check_hub_output(out, rep, snap / "dflash")
    snaps = [json.loads(c[2]) for c in hub.calls if c[0] == "snapshot"]
    assert snaps and all(p.startswith("dflash/") for p in snaps[0])
    # a subfolder that is not in the repo
    code, rep, _ = invoke("convert", "xiaomi/mimo-like", "--subfolder", "eagle", "--verifier", VERIFIER,
                          "-o", tmp_path / "out2").code_json_stderr
    assert code == 3 and "eagle" in rep["message"]


def test_cli_inspect_hub_subfolder_with_hub_verifier(hub, sharded_qwen3, tmp_path):
    snap = hub.add("xiaomi/mimo-like", _zlab_files(tmp_path / "src", prefix="dflash/"))
    hub.add(VERIFIER, _verifier_files(sharded_qwen3, shards=()))
    code, rep, err = invoke("inspect", "xiaomi/mimo-like", "--subfolder", "dflash",
                            "--verifier", VERIFIER).code_json_stderr
    assert code == 0, (rep, err)
    assert (rep["format"], rep["supported"]) == ("zlab_dflash", True)
    assert Path(rep["path"]) == snap / "dflash"
    assert rep["plan"]["config"]["speculators_config"]["verifier"]["name_or_path"] == VERIFIER


def test_hub_subfolder_incomplete_snapshot_exit_3(hub, sharded_qwen3, tmp_path):
    """The cached tree listing says ``dflash/`` has a file the cache lacks (a partial
    download): huggingface_hub refuses the snapshot; exit 3 naming the missing file."""
    files = _zlab_files(tmp_path / "src", prefix="dflash/")
    tree = {**{rel: p.stat().st_size for rel, p in files.items()}, "dflash/README.md": 10}
    hub.add("xiaomi/mimo-like", files, tree=tree)
    hub.add(VERIFIER, _verifier_files(sharded_qwen3, shards=()))
    code, rep, err = invoke("convert", "xiaomi/mimo-like", "--subfolder", "dflash", "--verifier", VERIFIER,
                            "-o", tmp_path / "out").code_json_stderr
    assert code == 3, (rep, err)
    assert "dflash/README.md" in rep["message"] and "Traceback" not in err


@pytest.mark.parametrize("subfolder, listing, wanted", [
    ("dflash",
     ["config.json", "model-00001-of-00002.safetensors", "modeling_mimo.py", "dflash/config.json",
      "dflash/model.safetensors", "dflash/mask_embedding.pt", "dflash/dflash.py", "dflash/README.md",
      "dflash/optimizer.pt", "eagle/config.json"],
     ["dflash/README.md", "dflash/config.json", "dflash/mask_embedding.pt", "dflash/model.safetensors"]),
    (None,
     ["config.json", "model.safetensors", "d2t.npy", "t2d.npy", "training_args.bin", "optimizer.pt",
      "pytorch_model.bin", "README.md", "model/consolidated/eagle_meta.pt", "model/consolidated/config.json"],
     ["README.md", "config.json", "d2t.npy", "model.safetensors", "model/consolidated/config.json",
      "model/consolidated/eagle_meta.pt", "t2d.npy"]),
], ids=["mimo-subfolder", "peagle-side-files"])
def test_hub_source_download_patterns(hub, tmp_path, subfolder, listing, wanted):
    """What an online ``snapshot_download`` would fetch, by huggingface_hub's own filter:
    config/safetensors/docs and the side files converters read or detect by name
    (``mask_embedding.pt`` → MiMo refusal, ``d2t.npy``, ``eagle_meta.pt``), never pickled
    weights or training state, and only inside ``--subfolder``."""
    from huggingface_hub.utils import filter_repo_objects

    from specconv.convert import resolve_source

    hub.add("some/repo", {rel: b"{}" for rel in listing if rel.endswith(".json")})
    resolve_source("some/repo", subfolder=subfolder)
    (patterns,) = [json.loads(c[2]) for c in hub.calls if c[0] == "snapshot"]
    assert sorted(filter_repo_objects(listing, allow_patterns=patterns)) == wanted


def test_hub_mimo_mask_embedding_is_refused(hub, sharded_qwen3, tmp_path):
    """MiMo's ``dflash/mask_embedding.pt`` replaces the mask-token embedding: the refusal keys
    on the file, so it must come with the snapshot (the cached tree lists it)."""
    files = _zlab_files(tmp_path / "src", prefix="dflash/")
    files["dflash/mask_embedding.pt"] = b"not read: detection looks at the name only"
    tree = {rel: (len(p) if isinstance(p, bytes) else p.stat().st_size) for rel, p in files.items()}
    hub.add("xiaomi/mimo-like", files, tree=tree)
    hub.add(VERIFIER, _verifier_files(sharded_qwen3, shards=()))
    code, rep, err = invoke("convert", "xiaomi/mimo-like", "--subfolder", "dflash", "--verifier", VERIFIER,
                            "-o", tmp_path / "out").code_json_stderr
    assert code == 3, (rep, err)
    assert "mask_embedding" in rep["message"] and not (tmp_path / "out").exists()


def _mapping(path: Path, V: int = fd.VOCAB, Vd: int = 64):
    import numpy as np

    rng = np.random.default_rng(0)
    tgt = np.sort(np.concatenate([[0, 1], rng.choice(np.arange(2, V), Vd - 2, replace=False)])).astype(np.int64)
    t2d = np.zeros(V, dtype=bool)
    t2d[tgt] = True
    np.savez(path, d2t=tgt - np.arange(Vd), t2d=t2d)
    return path, tgt


def test_dspark_pruned_vocab_takes_lm_head_rows_from_hub_verifier(hub, sharded_qwen3, tiny_verifier_dir, tmp_path):
    """DeepSpec DSpark shipping no lm_head + ``--vocab-mapping``: the output ``lm_head`` is the
    verifier's LM head rows of the draft tokens, read from the one cached shard holding it."""
    import torch

    from fixtures_dspark import make_deepspec_dspark

    src = make_deepspec_dspark(tmp_path / "src" / "dspark", tiny_verifier_dir, embed=False)
    hub.add("deepspec/tiny-dspark", {f.name: f for f in src.iterdir()})
    snap = hub.add(VERIFIER, _verifier_files(sharded_qwen3, shards=(3,)))  # only the LM head's shard
    mp, tgt = _mapping(tmp_path / "vocab.npz")
    out = tmp_path / "out"
    code, rep, err = invoke("convert", "deepspec/tiny-dspark", "--verifier", VERIFIER, "-o", out,
                            "--vocab-mapping", mp, "--sample-from-anchor").code_json_stderr
    assert code == 0, (rep, err)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 64
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == VERIFIER
    assert "verifier-not-hub-id" not in fd.codes(rep["findings"])
    dst = _tensors(out)
    want = _load(sharded_qwen3 / SHARDS[2], "lm_head.weight")[torch.as_tensor(tgt)]
    got = dst["lm_head.weight"]
    assert tuple(got.shape) == (64, fd.H)
    assert torch.equal(got.float(), want.to(got.dtype).float())
    assert set(hub.downloads(VERIFIER)) == {"config.json", INDEX, SHARDS[2]}
    assert not (snap / SHARDS[0]).exists() and not (snap / SHARDS[1]).exists()


@pytest.mark.peer
def test_peagle_takes_embed_and_lm_head_from_hub_verifier(hub, tiny_llama_verifier_dir, tmp_path):
    """An AWS P-EAGLE export shipping neither embed_tokens nor lm_head: both come from the
    (sharded, partly cached) Hub verifier and equal its tensors bit for bit."""
    import torch
    from safetensors.torch import load_file, save_file

    import fixtures_peagle as fp

    ref = fp.build_speculators_peagle(tiny_llama_verifier_dir, tmp_path / "ref", layers=1, aux=[2, 5], nbr=False,
                                      seed=1)
    src = fp.to_aws(ref, tmp_path / "src" / "aws", keep_embed=False)
    t = load_file(str(src / "model.safetensors"))
    t.pop("lm_head.weight")
    save_file(t, str(src / "model.safetensors"))
    vdir = _shard(tiny_llama_verifier_dir, tmp_path / "llama_sharded")
    hub.add("aws/tiny-peagle", {f.name: f for f in src.iterdir()})
    snap = hub.add(VERIFIER, _verifier_files(vdir, shards=(1, 3)))
    out = tmp_path / "out"
    code, rep, err = invoke("convert", "aws/tiny-peagle", "--verifier", VERIFIER, "-o", out,
                            "--speculative-tokens", "2").code_json_stderr
    assert code == 0, (rep, err)
    assert {"lm-head-from-verifier", "embed-from-verifier"} <= fd.codes(rep["findings"])
    assert "verifier-not-hub-id" not in fd.codes(rep["findings"])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == VERIFIER
    rec = json.loads((out / "specconv.json").read_text())["conversion"]
    dst = _tensors(out)
    for out_name, v_name, shard in (("lm_head.weight", "lm_head.weight", SHARDS[2]),
                                    ("embed_tokens.weight", "model.embed_tokens.weight", SHARDS[0])):
        assert rec["tensors"][out_name]["fate"] == "from_verifier"
        assert torch.equal(dst[out_name], _load(vdir / shard, v_name))
    assert SHARDS[1] not in hub.downloads(VERIFIER) and not (snap / SHARDS[1]).exists()


# ------------------------------------------------------------------- 3. not in the cache
def test_hub_ids_absent_from_cache_exit_3(hub, sharded_qwen3, tmp_path):
    hub.add("z-lab/tiny-dflash", _zlab_files(tmp_path / "src"))
    hub.add(VERIFIER, _verifier_files(sharded_qwen3, shards=()))
    cases = [
        (("z-lab/tiny-dflash", "--verifier", "nobody/absent-verifier"), "nobody/absent-verifier"),
        (("nobody/absent-drafter", "--verifier", VERIFIER), "nobody/absent-drafter"),
    ]
    for args, missing in cases:
        code, rep, err = invoke("convert", *args, "-o", tmp_path / "out").code_json_stderr
        assert code == 3, (rep, err)
        assert missing in rep["message"]
        assert "HF_HUB_OFFLINE" in rep["message"] and "cache" in rep["message"]
        assert "Traceback" not in err
        assert not (tmp_path / "out").exists()
    # human output: one clear line on stderr
    code, _, err = invoke("convert", "z-lab/tiny-dflash", "--verifier", "nobody/absent-verifier", "-o",
                          tmp_path / "out", as_json=False).code_json_stderr
    assert code == 3 and "nobody/absent-verifier" in err and "Traceback" not in err


def test_hub_verifier_missing_weights_exit_3(hub, tiny_verifier_dir, tmp_path):
    """A cached config.json without any weight file (neither index nor model.safetensors):
    a conversion that needs a verifier tensor fails with exit 3 naming the verifier."""
    from fixtures_dspark import make_deepspec_dspark

    src = make_deepspec_dspark(tmp_path / "src" / "dspark", tiny_verifier_dir, embed=False)
    hub.add("deepspec/tiny-dspark", {f.name: f for f in src.iterdir()})
    hub.add(VERIFIER, {"config.json": tiny_verifier_dir / "config.json"})
    mp, _ = _mapping(tmp_path / "vocab.npz")
    code, rep, err = invoke("convert", "deepspec/tiny-dspark", "--verifier", VERIFIER, "-o", tmp_path / "out",
                            "--vocab-mapping", mp, "--sample-from-anchor").code_json_stderr
    assert code == 3, (rep, err)
    assert VERIFIER in rep["message"] and "Traceback" not in err
