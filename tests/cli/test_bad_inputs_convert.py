"""Hostile / careless input to ``specconv inspect|convert|formats``: every case must give
a stable exit code, one clear line naming the file / key / flag, no traceback, exactly one
JSON object on stdout with ``--format json``, and lose nothing (inputs and an existing
output stay intact, no temp dirs left behind)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cli_runner import invoke, specconv_argv
from fixtures_dflash import HUB, make_source, sha_tree

PY = sys.executable


def cli(*args) -> tuple[int, dict, str]:
    """Run the CLI in-process with ``--format json``; unexpected exceptions propagate (a
    traceback is a failure). Returns (exit code, the one JSON object on stdout, stderr)."""
    r = invoke(*args)
    obj = r.one()
    assert "Traceback" not in r.stderr, r.stderr
    return r.code, obj, r.stderr


def convert(src, verifier, out, *args):
    return cli("convert", src, "--verifier", verifier, "--verifier-name", HUB, "-o", out, *args)


def leftovers(parent: Path) -> list[str]:
    """Hidden temp / backup dirs the writer may leave next to an output."""
    return sorted(p.name for p in Path(parent).iterdir()
                  if p.name.startswith(".") and (".tmp-" in p.name or ".old-" in p.name))


def edit_config(src: Path, fn) -> Path:
    cfg = json.loads((src / "config.json").read_text())
    fn(cfg)
    (src / "config.json").write_text(json.dumps(cfg))
    return src


# ------------------------------------------------------------------ source config.json
def test_config_not_utf8(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path)
    (src / "config.json").write_bytes(b'{"a": "\xf4\x90\x80"}')
    for args in (("inspect", src), ("convert", src, "--verifier", tiny_verifier_dir, "-o", tmp_path / "o")):
        code, obj, err = cli(*args)
        assert code == 3 and "config.json" in obj["message"] and "utf-8" in obj["message"]
    assert not (tmp_path / "o").exists()


def test_config_nan_is_refused_naming_the_key(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path)
    text = (src / "config.json").read_text()
    (src / "config.json").write_text(text.replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": NaN'))
    code, obj, _ = convert(src, tiny_verifier_dir, tmp_path / "o")
    assert code == 3 and "rms_norm_eps" in obj["message"] and "NaN" in obj["message"]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("archs", [[1, 2], {"a": 1}])
def test_config_architectures_wrong_type(tmp_path, archs):
    src = edit_config(make_source(tmp_path), lambda c: c.__setitem__("architectures", archs))
    code, obj, _ = cli("inspect", src)
    assert code == 3 and "architectures" in obj["message"]


# ------------------------------------------------------- meaning-bearing config values
@pytest.mark.parametrize("key, value, needle", [
    ("dflash_config.mask_token_id", True, "mask token id"),       # bool is not an id (was read as 1 = bos)
    ("dflash_config.target_layer_ids", [True, 2, 4], "target_layer_ids"),  # was read as layer 1
    ("block_size", 10**30, "block_size"),                         # was written to config.json as is
    ("num_attention_heads", 0, "num_attention_heads"),            # ZeroDivisionError
    ("num_hidden_layers", -1, "num_hidden_layers"),
    ("rope_parameters", {"rope_type": "default", "rope_theta": "abc"}, "rope_theta"),  # ValueError
    ("rope_scaling", "linear", "rope_scaling"),                   # was silently dropped
    ("rope_parameters", [1], "rope_parameters"),                  # TypeError when rope_theta is top level
    ("is_causal", "yes", "is_causal"),                            # was treated as "not set"
])
def test_bad_config_values(tmp_path, tiny_verifier_dir, key, value, needle):
    def setk(c):
        d = c
        *parents, last = key.split(".")
        for p in parents:
            d = d[p]
        d[last] = value
        if key == "num_attention_heads":
            c.pop("head_dim")
        if key == "rope_parameters" and isinstance(value, list):
            c["rope_theta"] = 1e6  # θ found at the top level, so rope_parameters itself is read

    src = edit_config(make_source(tmp_path), setk)
    code, obj, _ = convert(src, tiny_verifier_dir, tmp_path / "o")
    assert code == 3 and needle in obj["message"], obj
    assert not (tmp_path / "o").exists()


def test_aux_layer_ids_flag_errors_name_the_flag(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path)
    code, obj, _ = convert(src, tiny_verifier_dir, tmp_path / "o", "--aux-layer-ids", "1,3,99")
    assert code == 3 and "--aux-layer-ids" in obj["message"] and "target_layer_ids" not in obj["message"]


# ---------------------------------------------------------------------------- verifier
def _verifier_copy(tiny_verifier_dir, tmp_path, fn=None, name="v") -> Path:
    v = tmp_path / name
    shutil.copytree(tiny_verifier_dir, v)
    if fn is not None:
        cfg = json.loads((v / "config.json").read_text())
        cfg = fn(cfg) or cfg
        (v / "config.json").write_text(json.dumps(cfg))
    return v


@pytest.mark.parametrize("case, needle", [
    ("not_utf8", "utf-8"),            # UnicodeDecodeError traceback before
    ("bool_vocab", "vocab_size"),     # vocab_size: true was read as 1
    ("no_config", "no config.json"),
    ("hidden_mismatch", "hidden_size"),
])
def test_bad_verifier(tmp_path, tiny_verifier_dir, case, needle):
    src = make_source(tmp_path)
    if case == "not_utf8":
        v = _verifier_copy(tiny_verifier_dir, tmp_path)
        (v / "config.json").write_bytes(b'{"hidden_size": "\xd5\x01"}')
    elif case == "bool_vocab":
        v = _verifier_copy(tiny_verifier_dir, tmp_path, lambda c: c.__setitem__("vocab_size", True))
    elif case == "no_config":
        v = _verifier_copy(tiny_verifier_dir, tmp_path)
        (v / "config.json").unlink()
    else:
        v = _verifier_copy(tiny_verifier_dir, tmp_path, lambda c: c.__setitem__("hidden_size", 128))
    code, obj, _ = convert(src, v, tmp_path / "o")
    assert code == 3 and needle in obj["message"], obj
    assert not (tmp_path / "o").exists()


def test_multimodal_verifier_text_config_is_unwrapped(tmp_path, tiny_verifier_dir):
    v = _verifier_copy(tiny_verifier_dir, tmp_path, lambda c: {
        "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
        "text_config": c, "vision_config": {"hidden_size": 32}})
    code, obj, _ = convert(make_source(tmp_path), v, tmp_path / "o")
    assert code == 0, obj


@pytest.mark.parametrize("spec", ["", "nobody-xyz/no-such-model-1234"])
def test_verifier_empty_or_unreachable_hub_id(tmp_path, spec, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, obj, err = convert(make_source(tmp_path), spec, tmp_path / "o")
    assert code == 3 and obj["error"] == "verifier_not_found"
    assert ("empty" in obj["message"]) if spec == "" else (spec in obj["message"])
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- pickles
class _SystemCall:
    """Unpickling this runs a shell command (os.system) that creates a marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _bin_source(tmp_path, payload) -> Path:
    import torch
    from safetensors.torch import load_file

    src = make_source(tmp_path)
    sd = load_file(str(src / "model.safetensors"))
    (src / "model.safetensors").unlink()
    torch.save({**sd, **payload}, src / "pytorch_model.bin")
    return src


def test_malicious_pickle_never_runs_and_is_named(tmp_path, tiny_verifier_dir):
    marker = tmp_path / "PWNED"
    src = _bin_source(tmp_path, {"evil": _SystemCall(marker)})
    code, obj, _ = convert(src, tiny_verifier_dir, tmp_path / "o")
    assert not marker.exists(), "the pickle was executed"
    assert code == 3 and obj["error"] == "unsafe_pickle", obj  # was reported as a generic corrupt file
    assert "pytorch_model.bin" in obj["message"] and "system" in obj["message"]
    assert "weights_only` set to `False`" not in obj["message"]  # torch's advice is not echoed
    code, obj, _ = cli("inspect", src)
    assert not marker.exists() and code == 3


def test_bin_with_non_string_key(tmp_path, tiny_verifier_dir):
    import torch

    src = _bin_source(tmp_path, {})
    torch.save({1: torch.ones(2)}, src / "pytorch_model.bin")
    code, obj, _ = convert(src, tiny_verifier_dir, tmp_path / "o")
    assert code == 3 and "key 1" in obj["message"] and "not a tensor name" in obj["message"]


# -------------------------------------------------------------------- weight files
def _st_bytes(src: Path) -> tuple[bytes, int, dict]:
    raw = (src / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return raw, n, json.loads(raw[8:8 + n])


def _corrupt(src: Path, kind: str) -> None:
    raw, n, hdr = _st_bytes(src)
    p = src / "model.safetensors"
    if kind == "truncated":
        p.write_bytes(raw[: len(raw) // 2])
    elif kind == "tiny":
        p.write_bytes(raw[:7])
    elif kind == "header_too_long":
        p.write_bytes((10**12).to_bytes(8, "little") + raw[8:])
    elif kind == "overlap":
        by_size: dict[int, list[str]] = {}
        for k, v in hdr.items():
            if k != "__metadata__":
                by_size.setdefault(v["data_offsets"][1] - v["data_offsets"][0], []).append(k)
        a, b = next(v for v in by_size.values() if len(v) > 1)[:2]
        hdr[b]["data_offsets"] = hdr[a]["data_offsets"]
        js = json.dumps(hdr).encode()
        js += b" " * (-len(js) % 8)
        p.write_bytes(len(js).to_bytes(8, "little") + js + raw[8 + n:])


@pytest.mark.parametrize("kind", ["truncated", "tiny", "header_too_long", "overlap"])
def test_corrupt_safetensors_inspect_and_convert(tmp_path, tiny_verifier_dir, kind):
    src = make_source(tmp_path)
    _corrupt(src, kind)
    code, obj, _ = cli("inspect", src)  # was exit 0 "supported: true"
    assert code == 3 and obj["supported"] is False and "model.safetensors" in obj["reason"]
    code, obj, _ = convert(src, tiny_verifier_dir, tmp_path / "o")
    assert code == 3 and "model.safetensors" in obj["message"]
    assert not (tmp_path / "o").exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("sub", ["/etc", "../other", "a/../.."])
def test_subfolder_cannot_escape_the_source(tmp_path, tiny_verifier_dir, sub):
    other = make_source(tmp_path / "other")  # a valid checkpoint outside SRC
    src = make_source(tmp_path / "src")
    code, obj, _ = cli("inspect", src, "--subfolder", sub)  # /etc was read as the source
    assert code == 2 and "--subfolder" in obj["message"]
    code, obj, _ = convert(src, tiny_verifier_dir, tmp_path / "o", "--subfolder", sub)
    assert code == 2 and not (tmp_path / "o").exists() and other.exists()


# ------------------------------------------------------------------- output directory
def _precious(d: Path) -> dict[str, str]:
    d.mkdir(parents=True, exist_ok=True)
    (d / "notes.txt").write_text("do not lose me\n")
    return sha_tree(d)


def _earlier_output(d: Path, verifier: Path) -> dict[str, str]:
    """A real earlier conversion (of another source) at ``d``: what --overwrite may replace."""
    code, obj, _ = convert(make_source(d.parent / "earlier-src", seed=1), verifier, d)
    assert code == 0, obj
    return sha_tree(d)


def test_output_is_an_existing_file(tmp_path, tiny_verifier_dir):
    f = tmp_path / "afile"
    f.write_text("precious\n")
    for extra in ((), ("--overwrite",)):  # --overwrite used to replace the file with a dir
        code, obj, _ = convert(make_source(tmp_path), tiny_verifier_dir, f, *extra)
        assert code == 3 and obj["error"] == "output_exists" and "afile" in obj["message"]
        assert f.read_text() == "precious\n"
    assert leftovers(tmp_path) == []


def test_output_parent_is_a_file(tmp_path, tiny_verifier_dir):
    (tmp_path / "pfile").write_text("x")
    for out in (tmp_path / "pfile" / "out", tmp_path / "pfile" / "a" / "b"):
        code, obj, _ = convert(make_source(tmp_path), tiny_verifier_dir, out)  # FileExistsError traceback before
        assert code == 3 and "pfile" in obj["message"]
    assert (tmp_path / "pfile").read_text() == "x"


def test_overwrite_never_replaces_an_input(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path / "models")
    src_hashes = sha_tree(src)
    ver = _verifier_copy(tiny_verifier_dir, tmp_path / "vp", name="v")
    ver_hashes = sha_tree(ver)
    # the source's parent (deleted the source before), the verifier dir and its parent
    for out in (tmp_path / "models", ver, tmp_path / "vp"):
        code, obj, _ = cli("convert", src, "--verifier", ver, "--verifier-name", HUB, "-o", out, "--overwrite")
        assert code == 3 and obj["error"] == "output_is_input", obj
    assert sha_tree(src) == src_hashes and sha_tree(ver) == ver_hashes
    assert leftovers(tmp_path) == [] and leftovers(tmp_path / "vp") == []


def test_overwrite_keeps_existing_output_when_conversion_fails(tmp_path, tiny_verifier_dir):
    out = tmp_path / "out"
    before = _earlier_output(out, tiny_verifier_dir)
    bad = edit_config(make_source(tmp_path / "bad"), lambda c: c.__setitem__("num_attention_heads", 0))
    code, obj, _ = convert(bad, tiny_verifier_dir, out, "--overwrite")
    assert code == 3 and sha_tree(out) == before
    src = make_source(tmp_path / "trunc")
    _corrupt(src, "truncated")
    code, obj, _ = convert(src, tiny_verifier_dir, out, "--overwrite")
    assert code == 3 and sha_tree(out) == before and leftovers(tmp_path) == []


def test_write_failure_is_clean(tmp_path, tiny_verifier_dir, monkeypatch):
    """An OS error while writing (disk full) is a one-line error; the old output stays."""
    import errno

    out = tmp_path / "out"
    before = _earlier_output(out, tiny_verifier_dir)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / ".out.tmp-x" / "config.json"))

    monkeypatch.setattr("specconv.format.dump_config", full)
    code, obj, _ = convert(make_source(tmp_path), tiny_verifier_dir, out, "--overwrite")
    assert code == 3 and obj["error"] == "os_error", obj
    # the -o path and the step first, then the OS's reason and the file it named (issue 24 item 4)
    assert obj["message"] == (f"cannot write output {out}: writing its files failed: No space left on device "
                              f"({tmp_path / '.out.tmp-x' / 'config.json'})"), obj
    assert sha_tree(out) == before and leftovers(tmp_path) == []


def test_ctrl_c_mid_write_leaves_nothing(tmp_path, tiny_verifier_dir, monkeypatch):
    import specconv.tensors.write as t

    out = tmp_path / "out"
    before = _earlier_output(out, tiny_verifier_dir)
    real = t._write_one

    def interrupted(path, ordered):
        real(path, ordered[:1])  # part of the data is on disk
        raise KeyboardInterrupt

    monkeypatch.setattr(t, "_write_one", interrupted)
    code, obj, err = convert(make_source(tmp_path), tiny_verifier_dir, out, "--overwrite")
    assert code == 130 and obj["error"] == "interrupted"
    assert sha_tree(out) == before and leftovers(tmp_path) == []


_SIGTERM_MID_WRITE = """
import os, signal, sys
import specconv.tensors.write as t
real = t._write_one
def killed(path, ordered):
    real(path, ordered[:1])
    os.kill(os.getpid(), signal.SIGTERM)  # what `kill PID` / a scheduler's timeout sends
    real(path, ordered)
t._write_one = killed
from specconv.cli.main import main
sys.argv[0] = "specconv"
main()
"""


@pytest.mark.slow
def test_sigterm_mid_write_removes_temp_dir(tmp_path, tiny_verifier_dir):
    out = tmp_path / "out"
    before = _earlier_output(out, tiny_verifier_dir)
    src = make_source(tmp_path)
    p = subprocess.run([PY, "-c", _SIGTERM_MID_WRITE, "convert", str(src), "--verifier", str(tiny_verifier_dir),
                        "--verifier-name", HUB, "-o", str(out), "--overwrite", "--format", "json"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 128 + signal.SIGTERM, p.stderr  # was killed with the temp dir left behind
    assert sha_tree(out) == before and leftovers(tmp_path) == []


def test_output_appearing_during_conversion_is_not_replaced(tmp_path, tiny_verifier_dir, monkeypatch):
    """Without --overwrite a dir created meanwhile (another run) is never replaced."""
    import specconv.tensors as t

    out = tmp_path / "out"
    real = t.write_safetensors

    def racing(*a, **k):
        r = real(*a, **k)
        _precious(out)
        return r

    monkeypatch.setattr(t, "write_safetensors", racing)
    code, obj, _ = convert(make_source(tmp_path), tiny_verifier_dir, out)  # was silently replaced
    assert code == 3 and obj["error"] == "output_exists"
    assert (out / "notes.txt").read_text() == "do not lose me\n" and leftovers(tmp_path) == []


def test_failed_rename_restores_previous_output(tmp_path, tiny_verifier_dir, monkeypatch):
    import errno

    out = tmp_path / "out"
    before = _earlier_output(out, tiny_verifier_dir)
    real = os.rename

    def failing(a, b, *r, **k):
        if Path(b) == out:
            raise OSError(errno.EXDEV, "Invalid cross-device link", str(a))
        return real(a, b, *r, **k)

    monkeypatch.setattr(os, "rename", failing)
    monkeypatch.setattr("specconv.outdir.exchange", lambda a, b: False)  # the two-rename fallback
    code, obj, _ = convert(make_source(tmp_path), tiny_verifier_dir, out, "--overwrite")
    assert code == 3 and obj["error"] == "os_error"
    assert obj["message"].startswith(f"cannot write output {out}: moving it into place failed: "
                                     "Invalid cross-device link"), obj
    assert sha_tree(out) == before and leftovers(tmp_path) == []


@pytest.mark.slow
def test_two_converts_into_one_output(tmp_path, tiny_verifier_dir):
    """Two processes at once: each either writes a complete output or fails cleanly."""
    src, out = make_source(tmp_path), tmp_path / "out"
    argv = specconv_argv("convert", src, "--verifier", tiny_verifier_dir, "--verifier-name", HUB, "-o", out)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    for rc, so, se in results:
        assert rc in (0, 3) and "Traceback" not in se, se
        obj = json.loads(so)
        assert rc == 0 or obj["error"] == "output_exists"
    assert any(rc == 0 for rc, _, _ in results)
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors", "specconv.json"]
    assert leftovers(tmp_path) == []


# ------------------------------------------------------------------------------ flags
@pytest.mark.parametrize("args, needle", [
    (("--max-shard-size", "garbage"), "--max-shard-size"),  # UsageError traceback from the click callback
    (("--max-shard-size", "0"), "--max-shard-size"),
    (("--aux-layer-ids", "a,b"), "--aux-layer-ids"),
    (("--aux-layer-ids", ","), "--aux-layer-ids"),           # empty list reached the converter
    (("--mask-token-id", "abc"), "--mask-token-id"),
])
def test_bad_flag_values_are_usage_errors(tmp_path, tiny_verifier_dir, args, needle):
    code, obj, _ = convert(make_source(tmp_path), tiny_verifier_dir, tmp_path / "o", *args)
    assert code == 2 and obj["error"] == "usage" and needle in obj["message"], obj
    assert not (tmp_path / "o").exists()


def test_formats_markdown_with_json_is_a_usage_error():
    code, obj, _ = cli("formats", "--markdown")  # printed Markdown under --format json
    assert code == 2 and "--markdown" in obj["message"]


# ------------------------------------------------------------------ deeply nested JSON
def _deep(n: int = 100_000) -> str:
    return '{"a": ' + "[" * n + "]" * n + "}"


def test_deeply_nested_json_everywhere(tmp_path, tiny_verifier_dir):
    """json raises RecursionError (not ValueError) on deep nesting: was a traceback."""
    src = make_source(tmp_path / "a")
    (src / "config.json").write_text(_deep())
    code, obj, _ = cli("inspect", src)
    assert code == 3 and "config.json" in obj["message"]

    src = make_source(tmp_path / "b")
    raw, n, _ = _st_bytes(src)
    js = _deep().encode()
    js += b" " * (-len(js) % 8)
    (src / "model.safetensors").write_bytes(len(js).to_bytes(8, "little") + js + raw[8 + n:])
    code, obj, _ = cli("inspect", src)
    assert code == 3 and "model.safetensors" in obj["reason"]

    src = make_source(tmp_path / "c")
    (src / "model.safetensors").rename(src / "model-00001-of-00001.safetensors")
    (src / "model.safetensors.index.json").write_text(_deep())
    code, obj, _ = convert(src, tiny_verifier_dir, tmp_path / "o")
    assert code == 3 and "index.json" in obj["message"]

    v = _verifier_copy(tiny_verifier_dir, tmp_path)
    (v / "config.json").write_text(_deep())
    code, obj, _ = convert(make_source(tmp_path / "d"), v, tmp_path / "o")
    assert code == 3 and "config.json" in obj["message"]
    assert not (tmp_path / "o").exists()


def test_empty_src_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.chdir(make_source(tmp_path))  # "" used to inspect the current directory
    code, obj, _ = cli("inspect", "")
    assert code == 2 and "SRC" in obj["message"]


@pytest.mark.parametrize("entry", [5, {"stat": "x"}, "stamp-only"])
def test_corrupt_hash_cache_entry_is_ignored(tmp_path, tiny_verifier_dir, monkeypatch, entry):
    import hashlib

    import specconv.writer as w

    src = make_source(tmp_path)
    cfg = src / "config.json"
    if entry == "stamp-only":  # a valid stamp without a digest
        st = os.stat(cfg)
        entry = {"stat": [st.st_size, st.st_mtime_ns, st.st_ino]}
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "sha256.json").write_text(json.dumps({os.path.realpath(cfg): entry}))
    monkeypatch.setenv("SPECCONV_CACHE", str(cache))
    monkeypatch.delenv("SPECCONV_HASH_CACHE", raising=False)
    monkeypatch.setattr(w, "_HASH_CACHE", None)
    code, obj, _ = convert(src, tiny_verifier_dir, tmp_path / "o")  # AttributeError / KeyError before
    assert code == 0, obj
    rec = json.loads((tmp_path / "o" / "specconv.json").read_text())["conversion"]
    assert rec["source"]["files"]["config.json"] == hashlib.sha256(cfg.read_bytes()).hexdigest()


# ------------------------------------------------------- other formats' config values
@pytest.mark.parametrize("key, value, needle", [
    ("layer_types", 5, "layer_types"),                    # TypeError ('in' on an int)
    ("num_hidden_layers", 10**30, "num_hidden_layers"),   # MemoryError (set(range(n)))
])
def test_dflash_family_layer_keys(tmp_path, tiny_verifier_dir, key, value, needle):
    src = edit_config(make_source(tmp_path), lambda c: c.__setitem__(key, value))
    code, obj, _ = convert(src, tiny_verifier_dir, tmp_path / "o")
    assert code == 3 and needle in obj["message"], obj


@pytest.fixture(scope="module")
def speculators_peagle_dir(tiny_llama_verifier_dir, tmp_path_factory):
    import fixtures_peagle as fp

    return fp.build_speculators_peagle(tiny_llama_verifier_dir, tmp_path_factory.mktemp("specpe") / "peagle")


@pytest.mark.peer
@pytest.mark.parametrize("path, value, needle", [
    ("speculators_config.proposal_methods", "x", "proposal_methods"),          # AttributeError
    ("speculators_config.proposal_methods", [True], "proposal_methods"),
    ("speculators_config.verifier", "x", None),                                # AttributeError; rewritten anyway
    ("eagle_aux_hidden_state_layer_ids", 3, "eagle_aux_hidden_state_layer_ids"),  # TypeError
    ("eagle_aux_hidden_state_layer_ids", [], "eagle_aux_hidden_state_layer_ids"),  # was written as []
    ("transformer_layer_config.hidden_size", None, "hidden_size"),            # TypeError
    ("transformer_layer_config.vocab_size", None, "vocab_size"),
    ("transformer_layer_config.num_hidden_layers", 10**30, "num_hidden_layers"),  # never finished (OOM)
])
def test_speculators_trainer_config_values(speculators_peagle_dir, tiny_llama_verifier_dir, tmp_path, path, value,
                                           needle):
    src = tmp_path / "src"
    shutil.copytree(speculators_peagle_dir, src)

    def setk(c):
        *parents, last = path.split(".")
        d = c
        for p in parents:
            d = d[p]
        d[last] = value

    edit_config(src, setk)
    code, obj, _ = convert(src, tiny_llama_verifier_dir, tmp_path / "o")
    if needle is None:
        assert code == 0, obj
    else:
        assert code == 3 and needle in obj["message"], obj
        assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("out", [".", "./", "sub/.."])
def test_output_dot_is_refused(tmp_path, tiny_verifier_dir, monkeypatch, out):
    src = make_source(tmp_path / "src")
    work = tmp_path / "work"
    before = _precious(work)
    monkeypatch.chdir(work)  # `-o . --overwrite` failed with a cryptic EBUSY on the cwd
    code, obj, _ = cli("convert", src, "--verifier", tiny_verifier_dir, "-o", out, "--overwrite")
    assert code == 3 and "must name a directory" in obj["message"]
    assert sha_tree(work) == before and leftovers(work) == [] and leftovers(tmp_path) == []


@pytest.mark.peer
def test_aws_peagle_scalar_lm_head(speculators_peagle_dir, tiny_llama_verifier_dir, tmp_path):
    import torch

    import fixtures_peagle as fp

    src = fp.to_aws(speculators_peagle_dir, tmp_path / "aws")
    t = fp.load_tensors(src)
    t["lm_head.weight"] = torch.tensor(1.0)
    (src / "model.safetensors").unlink()
    fp.save_tensors(src, t)
    code, obj, _ = convert(src, tiny_llama_verifier_dir, tmp_path / "o", "--speculative-tokens", "3")  # IndexError
    assert code == 3 and "lm_head.weight" in obj["message"], obj


# ------------------------------------------------- cases that already held (locked in)
@pytest.mark.parametrize("kind", ["outside", "absolute", "missing_shard"])
def test_index_json_pointing_outside_or_missing(tmp_path, tiny_verifier_dir, kind):
    other = make_source(tmp_path / "other")
    src = make_source(tmp_path / "src")
    names = list(_st_bytes(src)[2].keys() - {"__metadata__"})
    (src / "model.safetensors").rename(src / "model-00001-of-00002.safetensors")
    shard = {"outside": "../../other/zlab_dflash/model.safetensors",
             "absolute": str(other / "model.safetensors"),
             "missing_shard": "model-00002-of-00002.safetensors"}[kind]
    wm = {n: "model-00001-of-00002.safetensors" for n in names}
    wm[names[0]] = shard
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    code, obj, _ = convert(src, tiny_verifier_dir, tmp_path / "o")
    assert code == 3 and "index.json" in obj["message"] and Path(shard).name in obj["message"]
    assert not (tmp_path / "o").exists()


def test_symlink_loops_in_the_checkpoint_dir(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path)
    os.symlink("loop2", src / "loop1")
    os.symlink("loop1", src / "loop2")
    os.symlink(".", src / "self")
    (src / "sub").mkdir()
    os.symlink("..", src / "sub" / "up")
    code, obj, _ = convert(src, tiny_verifier_dir, tmp_path / "o")
    assert code == 0, obj
    rec = json.loads((tmp_path / "o" / "specconv.json").read_text())["conversion"]
    assert sorted(rec["source"]["files"]) == ["config.json", "dflash.py", "model.safetensors"]


def test_paths_with_spaces_and_unicode(tmp_path, tiny_verifier_dir):
    src = make_source(tmp_path / "my models" / "ünïcødé drafter")
    ver = _verifier_copy(tiny_verifier_dir, tmp_path / "vér ifier")
    out = tmp_path / "øut dir" / "convërted"
    code, obj, _ = cli("inspect", src)
    assert code == 0
    code, obj, _ = cli("convert", src, "--verifier", ver, "--verifier-name", HUB, "-o", out)
    assert code == 0 and obj["output"] == str(out) and (out / "model.safetensors").is_file()


def test_read_only_output_parent(tmp_path, tiny_verifier_dir, monkeypatch):
    import errno
    import tempfile

    def denied(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path))

    monkeypatch.setattr(tempfile, "mkdtemp", denied)  # as for a read-only / foreign parent dir
    code, obj, _ = convert(make_source(tmp_path), tiny_verifier_dir, tmp_path / "o")
    assert code == 3 and obj["error"] == "os_error"
    assert obj["message"] == (f"cannot write output {tmp_path / 'o'}: creating its temporary directory beside it "
                              f"failed: Permission denied ({tmp_path})"), obj
    assert not (tmp_path / "o").exists()


@pytest.mark.peer
def test_malicious_vocab_mapping_pickle(speculators_peagle_dir, tiny_llama_verifier_dir, tmp_path):
    import torch

    import fixtures_peagle as fp

    marker = tmp_path / "PWNED"
    evil = tmp_path / "d2t.pt"
    torch.save({"d2t": _SystemCall(marker)}, evil)
    src = fp.to_aws(speculators_peagle_dir, tmp_path / "aws")
    code, obj, _ = convert(src, tiny_llama_verifier_dir, tmp_path / "o", "--speculative-tokens", "3",
                           "--vocab-mapping", evil)
    assert not marker.exists()
    assert code == 3 and obj["error"] == "unsafe_pickle" and "system" in obj["message"]
    assert "weights_only` set to `False" not in obj["message"]  # torch's advice was echoed


@pytest.mark.peer
def test_quantized_speculators_trainer_dir_is_refused(tiny_verifier_dir, tmp_path):
    """The quantized-drafter refusal wins over speculators-trainer detection (§16 note)."""
    from tests.fixtures_peagle import build_speculators_block

    d = build_speculators_block(tiny_verifier_dir, tmp_path / "spec", "dflash")
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8"}
    (d / "config.json").write_text(json.dumps(cfg))
    r = invoke("inspect", d, catch=True)
    assert r.code == 3
    assert json.loads(r.stdout)["format"] == "quantized_drafter"
