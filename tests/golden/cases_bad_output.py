"""Golden cases, group ``bad_inputs`` (output side, flags, failures mid-write, trainer dirs):
the rest of ``tests/cli/test_bad_inputs_convert.py``, built with its helpers and parameter lists.

Not covered here (subprocesses, timing-dependent): the SIGTERM-mid-write and the
two-concurrent-converts cases; they keep their own tests.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from golden.cases_bad import add, case_id, convert, inspect, params, set_key, source, tbi
from golden.cases_convert import at_root
from golden.workspace import Workspace, run_cli

Runner = Callable[[Workspace, Path], dict[str, Any]]


# ------------------------------------------------------------------- output directory
def output_is_a_file(ws: Workspace, d: Path) -> dict[str, Any]:
    f = d / "afile"
    f.write_text("precious\n")
    src = source(d / "src")
    return {"plain": convert(ws, d, src, out=f), "overwrite": convert(ws, d, src, "--overwrite", out=f)}


def output_parent_is_a_file(ws: Workspace, d: Path) -> dict[str, Any]:
    (d / "pfile").write_text("x")
    src = source(d / "src")
    return {"child": convert(ws, d, src, out=d / "pfile" / "out"),
            "grandchild": convert(ws, d, src, out=d / "pfile" / "a" / "b")}


def overwrite_never_replaces_an_input(ws: Workspace, d: Path) -> dict[str, Any]:
    src = source(d / "models")
    ver = tbi()._verifier_copy(ws.verifier("qwen3"), d / "vp", name="v")
    return {name: convert(ws, d, src, "--overwrite", verifier=ver, out=out)
            for name, out in (("source_parent", d / "models"), ("verifier", ver), ("verifier_parent", d / "vp"))}


def overwrite_keeps_output_on_failure(ws: Workspace, d: Path) -> dict[str, Any]:
    t = tbi()
    out = d / "out"
    t._earlier_output(out, ws.verifier("qwen3"))  # what --overwrite may replace
    bad = t.edit_config(source(d / "bad"), lambda c: c.__setitem__("num_attention_heads", 0))
    rec = {"bad_config": convert(ws, d, bad, "--overwrite", out=out)}
    trunc = source(d / "trunc")
    t._corrupt(trunc, "truncated")
    rec["truncated"] = convert(ws, d, trunc, "--overwrite", out=out)
    return rec


def write_failure(ws: Workspace, d: Path) -> dict[str, Any]:
    """An OS error while writing (disk full)."""
    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(d / ".out.tmp-x" / "config.json"))

    tbi()._earlier_output(d / "out", ws.verifier("qwen3"))  # what --overwrite may replace
    src = source(d / "src")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("specconv.format.dump_config", full)
        return {"convert": convert(ws, d, src, "--overwrite", out=d / "out")}


def ctrl_c_mid_write(ws: Workspace, d: Path) -> dict[str, Any]:
    import specconv.tensors.write as t

    real = t._write_one

    def interrupted(path, ordered):
        real(path, ordered[:1])
        raise KeyboardInterrupt

    tbi()._earlier_output(d / "out", ws.verifier("qwen3"))  # what --overwrite may replace
    src = source(d / "src")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(t, "_write_one", interrupted)
        return {"convert": convert(ws, d, src, "--overwrite", out=d / "out")}


def output_appearing_during_conversion(ws: Workspace, d: Path) -> dict[str, Any]:
    import specconv.tensors as t

    real, out = t.write_safetensors, d / "out"

    def racing(*a, **k):
        r = real(*a, **k)
        tbi()._precious(out)
        return r

    src = source(d / "src")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(t, "write_safetensors", racing)
        return {"convert": convert(ws, d, src, out=out)}


def failed_rename(ws: Workspace, d: Path) -> dict[str, Any]:
    out, real = d / "out", os.rename

    def failing(a, b, *r, **k):
        if Path(b) == out:
            raise OSError(errno.EXDEV, "Invalid cross-device link", str(a))
        return real(a, b, *r, **k)

    tbi()._earlier_output(out, ws.verifier("qwen3"))  # what --overwrite may replace
    src = source(d / "src")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "rename", failing)
        mp.setattr("specconv.outdir.exchange", lambda a, b: False)
        return {"convert": convert(ws, d, src, "--overwrite", out=out)}


def read_only_parent(ws: Workspace, d: Path) -> dict[str, Any]:
    import tempfile

    def denied(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", str(d))

    src = source(d / "src")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, "mkdtemp", denied)
        return {"convert": convert(ws, d, src)}


def output_dot(out: str) -> Runner:
    def run(ws: Workspace, d: Path) -> dict[str, Any]:
        src = source(d / "src")
        work = d / "work"
        tbi()._precious(work)
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(work)
            argv = ["convert", src, "--verifier", ws.verifier("qwen3"), "-o", out, "--overwrite"]
            return {"convert": run_cli(ws, argv, watch=d)}
    return run


# ------------------------------------------------------------------------------ flags
def bad_flag(args: tuple) -> Runner:
    def run(ws: Workspace, d: Path) -> dict[str, Any]:
        return {"convert": convert(ws, d, source(d), *args)}
    return run


def formats_markdown_json(ws: Workspace, d: Path) -> dict[str, Any]:
    return {"formats": run_cli(ws, ["formats", "--markdown"], watch=d)}


def empty_src(ws: Workspace, d: Path) -> dict[str, Any]:
    src = source(d)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(src)
        return {"inspect": inspect(ws, d, "")}


def corrupt_hash_cache(entry: Any) -> Runner:
    """test_corrupt_hash_cache_entry_is_ignored (the sha256 cache on, in the case dir)."""
    def run(ws: Workspace, d: Path) -> dict[str, Any]:
        import specconv.writer as w

        src = source(d / "src")
        cfg = src / "config.json"
        value = entry
        if entry == "stamp-only":
            st = os.stat(cfg)
            value = {"stat": [st.st_size, st.st_mtime_ns, st.st_ino]}
        cache = d / "cache"
        cache.mkdir()
        (cache / "sha256.json").write_text(json.dumps({os.path.realpath(cfg): value}))
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("SPECCONV_CACHE", str(cache))
            mp.delenv("SPECCONV_HASH_CACHE", raising=False)
            mp.setattr(w, "_HASH_CACHE", None)
            rec = {"convert": convert(ws, d, src, out=d / "o")}
        rec["written"] = sorted(p.name for p in (d / "o").iterdir()) if (d / "o").is_dir() else []
        return rec
    return run


# ---------------------------------------------------------------- other formats' inputs
def _speculators_peagle(ws: Workspace) -> Path:
    import fixtures_peagle as fp

    return ws.shared("peagle-default", lambda d: at_root(ws, fp.build_speculators_peagle, "llama", d / "peagle"))


def trainer_config(path: str, value: Any) -> Runner:
    """test_speculators_trainer_config_values: a speculators P-EAGLE dir with one bad key."""
    def run(ws: Workspace, d: Path) -> dict[str, Any]:
        src = Path(shutil.copytree(_speculators_peagle(ws), d / "src"))
        tbi().edit_config(src, lambda c: set_key(c, path, value))
        return {"convert": convert(ws, d, src, verifier=ws.verifier("llama"))}
    return run


def aws_scalar_lm_head(ws: Workspace, d: Path) -> dict[str, Any]:
    import torch

    import fixtures_peagle as fp

    src = fp.to_aws(_speculators_peagle(ws), d / "aws")
    t = fp.load_tensors(src)
    t["lm_head.weight"] = torch.tensor(1.0)
    (src / "model.safetensors").unlink()
    fp.save_tensors(src, t)
    return {"convert": convert(ws, d, src, "--speculative-tokens", "3", verifier=ws.verifier("llama"))}


def malicious_vocab_mapping(ws: Workspace, d: Path) -> dict[str, Any]:
    import torch

    import fixtures_peagle as fp

    marker, evil = d / "PWNED", d / "d2t.pt"
    torch.save({"d2t": tbi()._SystemCall(marker)}, evil)
    src = fp.to_aws(_speculators_peagle(ws), d / "aws")
    rec = {"convert": convert(ws, d, src, "--speculative-tokens", "3", "--vocab-mapping", evil,
                              verifier=ws.verifier("llama"))}
    rec["pickle_ran"] = marker.exists()
    return rec


def quantized_trainer_dir(ws: Workspace, d: Path) -> dict[str, Any]:
    import fixtures_peagle as fp

    spec = at_root(ws, fp.build_speculators_block, "qwen3", d / "spec", "dflash")
    cfg = json.loads((spec / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8"}
    (spec / "config.json").write_text(json.dumps(cfg))
    return {"inspect": inspect(ws, d, spec)}


def _cases() -> dict[str, Runner]:
    t = tbi()
    cases: dict[str, Runner] = {
        "output_is_a_file": output_is_a_file, "output_parent_is_a_file": output_parent_is_a_file,
        "overwrite_never_replaces_an_input": overwrite_never_replaces_an_input,
        "overwrite_keeps_output_on_failure": overwrite_keeps_output_on_failure, "write_failure": write_failure,
        "ctrl_c_mid_write": ctrl_c_mid_write, "output_appearing_during_conversion": output_appearing_during_conversion,
        "failed_rename": failed_rename, "read_only_parent": read_only_parent,
        "formats_markdown_json": formats_markdown_json, "empty_src": empty_src,
        "aws_scalar_lm_head": aws_scalar_lm_head, "malicious_vocab_mapping": malicious_vocab_mapping,
        "quantized_trainer_dir": quantized_trainer_dir,
    }
    for out in params(t.test_output_dot_is_refused):
        add(cases, case_id("output_dot", out), output_dot(out))
    for args, _ in params(t.test_bad_flag_values_are_usage_errors):
        add(cases, case_id("flag", *args), bad_flag(args))
    for entry in params(t.test_corrupt_hash_cache_entry_is_ignored):
        add(cases, case_id("hash_cache", entry), corrupt_hash_cache(entry))
    for path, value, _ in params(t.test_speculators_trainer_config_values):
        add(cases, case_id("trainer_config", path, value), trainer_config(path, value))
    return cases


CASES: dict[str, Runner] = _cases()
