"""Golden cases, groups ``refusals`` and ``bad_inputs`` (source side).

``refusals``: every trigger of ``tests/fixtures_dspark.REFUSAL_CASES`` through ``inspect``
and ``convert``. ``bad_inputs``: the hostile / careless inputs of ``tests/cli/test_bad_inputs_convert.py``
(source config, verifier, pickles, weight files, subfolders; the output-directory and
flag cases are in :mod:`golden.cases_bad_output`), built with that module's own helpers
and parameter lists. Each records exit code, the JSON error, findings and the files
written under the case dir.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from golden.workspace import HUB, Workspace, run_cli

Runner = Callable[[Workspace, Path], dict[str, Any]]


# ---------------------------------------------------------------------------- helpers
def tbi():
    """tests/cli/test_bad_inputs_convert.py (its input builders and parameter lists)."""
    import test_bad_inputs_convert

    return test_bad_inputs_convert


def params(test_fn) -> list:
    """The ``@pytest.mark.parametrize`` values of a test function (first mark)."""
    marks = [m for m in getattr(test_fn, "pytestmark", []) if m.name == "parametrize"]
    return list(marks[-1].args[1])


def case_id(*parts: Any) -> str:
    """A file-name-safe id from parameter values (as pytest builds ids)."""
    s = "-".join(p if isinstance(p, str) else json.dumps(p, sort_keys=True) for p in parts)
    return re.sub(r"[^A-Za-z0-9._=+-]+", "_", s)[:60] or "empty"


def add(cases: dict[str, Runner], key: str, runner: Runner) -> None:
    """Register a case; two parameter sets mapping to one id is a harness bug."""
    if key in cases:
        raise ValueError(f"duplicate golden case id {key!r}")
    cases[key] = runner


def source(d: Path, **kw) -> Path:
    """The default tiny z-lab DFlash source (tests/fixtures_dflash.make_source) under ``d``."""
    from fixtures_dflash import make_source

    return make_source(d, **kw)


def convert(ws: Workspace, d: Path, src: Path | str, *flags, verifier: Path | str | None = None,
            out: Path | str | None = None) -> dict[str, Any]:
    """``specconv convert SRC --verifier V --verifier-name HUB -o OUT FLAGS`` (files written under ``d``)."""
    v = ws.verifier("qwen3") if verifier is None else verifier
    return run_cli(ws, ["convert", src, "--verifier", v, "--verifier-name", HUB, "-o", out or d / "o", *flags], watch=d)


def inspect(ws: Workspace, d: Path, src: Path | str, *flags) -> dict[str, Any]:
    return run_cli(ws, ["inspect", src, *flags], watch=d)


def set_key(cfg: dict, dotted: str, value: Any) -> None:
    """Set ``a.b.c`` in a config dict."""
    *parents, last = dotted.split(".")
    for p in parents:
        cfg = cfg[p]
    cfg[last] = value


# --------------------------------------------------------------------------- refusals
def refusal(kind: str) -> Runner:
    def run(ws: Workspace, d: Path) -> dict[str, Any]:
        from fixtures_dspark import make_refusal

        src = make_refusal(kind, d / "src", ws.verifier("qwen3"))
        return {"kind": kind, "inspect": inspect(ws, d, src), "convert": convert(ws, d, src, out=d / "out")}
    return run


def speculators_other(ws: Workspace, d: Path) -> dict[str, Any]:
    """A speculators dir of a type specconv does not convert (test_other_speculators_type_refused)."""
    import shutil

    from golden.cases_convert import block_ref

    src = Path(shutil.copytree(block_ref(ws, "default", "dflash"), d / "eagle3"))
    cfg = json.loads((src / "config.json").read_text())
    cfg["speculators_model_type"] = "eagle3"
    (src / "config.json").write_text(json.dumps(cfg, indent=2))
    return {"kind": "speculators_other", "inspect": inspect(ws, d, src), "convert": convert(ws, d, src, out=d / "out")}


def _refusals() -> dict[str, Runner]:
    from fixtures_dspark import REFUSAL_CASES

    cases = {kind.replace(":", "-"): refusal(kind) for kind, _ in REFUSAL_CASES}
    add(cases, "speculators_other", speculators_other)
    return cases


REFUSALS: dict[str, Runner] = _refusals()


# ---------------------------------------------------------------- source config.json
def config_not_utf8(ws: Workspace, d: Path) -> dict[str, Any]:
    src = source(d)
    (src / "config.json").write_bytes(b'{"a": "\xf4\x90\x80"}')
    return {"inspect": inspect(ws, d, src), "convert": convert(ws, d, src)}


def config_nan(ws: Workspace, d: Path) -> dict[str, Any]:
    src = source(d)
    text = (src / "config.json").read_text()
    (src / "config.json").write_text(text.replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": NaN'))
    return {"convert": convert(ws, d, src)}


def architectures(value: Any) -> Runner:
    def run(ws: Workspace, d: Path) -> dict[str, Any]:
        src = tbi().edit_config(source(d), lambda c: c.__setitem__("architectures", value))
        return {"inspect": inspect(ws, d, src)}
    return run


def config_value(key: str, value: Any) -> Runner:
    """test_bad_config_values / test_dflash_family_layer_keys: one meaning-bearing key set badly."""
    def edit(c: dict) -> None:
        set_key(c, key, value)
        if key == "num_attention_heads":
            c.pop("head_dim")
        if key == "rope_parameters" and isinstance(value, list):
            c["rope_theta"] = 1e6  # θ found at the top level, so rope_parameters itself is read

    def run(ws: Workspace, d: Path) -> dict[str, Any]:
        return {"convert": convert(ws, d, tbi().edit_config(source(d), edit))}
    return run


def aux_flag(ws: Workspace, d: Path) -> dict[str, Any]:
    return {"convert": convert(ws, d, source(d), "--aux-layer-ids", "1,3,99")}


# ---------------------------------------------------------------------------- verifier
def bad_verifier(kind: str) -> Runner:
    """test_bad_verifier: a broken verifier config."""
    def run(ws: Workspace, d: Path) -> dict[str, Any]:
        t, tiny = tbi(), ws.verifier("qwen3")
        if kind == "not_utf8":
            v = t._verifier_copy(tiny, d)
            (v / "config.json").write_bytes(b'{"hidden_size": "\xd5\x01"}')
        elif kind == "bool_vocab":
            v = t._verifier_copy(tiny, d, lambda c: c.__setitem__("vocab_size", True))
        elif kind == "no_config":
            v = t._verifier_copy(tiny, d)
            (v / "config.json").unlink()
        else:
            v = t._verifier_copy(tiny, d, lambda c: c.__setitem__("hidden_size", 128))
        return {"convert": convert(ws, d, source(d), verifier=v)}
    return run


def multimodal_verifier(ws: Workspace, d: Path) -> dict[str, Any]:
    v = tbi()._verifier_copy(ws.verifier("qwen3"), d, lambda c: {
        "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
        "text_config": c, "vision_config": {"hidden_size": 32}})
    return {"convert": convert(ws, d, source(d), verifier=v)}


def verifier_spec(spec: str) -> Runner:
    def run(ws: Workspace, d: Path) -> dict[str, Any]:
        return {"convert": convert(ws, d, source(d), verifier=spec)}
    return run


# ----------------------------------------------------------------------------- pickles
def malicious_pickle(ws: Workspace, d: Path) -> dict[str, Any]:
    t = tbi()
    marker = d / "PWNED"
    src = t._bin_source(d, {"evil": t._SystemCall(marker)})
    rec = {"convert": convert(ws, d, src), "inspect": inspect(ws, d, src)}
    rec["pickle_ran"] = marker.exists()
    return rec


def bin_non_string_key(ws: Workspace, d: Path) -> dict[str, Any]:
    import torch

    src = tbi()._bin_source(d, {})
    torch.save({1: torch.ones(2)}, src / "pytorch_model.bin")
    return {"convert": convert(ws, d, src)}


# ------------------------------------------------------------------------ weight files
def corrupt_safetensors(kind: str) -> Runner:
    def run(ws: Workspace, d: Path) -> dict[str, Any]:
        src = source(d)
        tbi()._corrupt(src, kind)
        return {"inspect": inspect(ws, d, src), "convert": convert(ws, d, src)}
    return run


def subfolder(sub: str) -> Runner:
    def run(ws: Workspace, d: Path) -> dict[str, Any]:
        source(d / "other")
        src = source(d / "src")
        return {"inspect": inspect(ws, d, src, "--subfolder", sub),
                "convert": convert(ws, d, src, "--subfolder", sub)}
    return run


def deeply_nested_json(ws: Workspace, d: Path) -> dict[str, Any]:
    """test_deeply_nested_json_everywhere: config, safetensors header, index, verifier config."""
    t = tbi()
    rec: dict[str, Any] = {}
    a = source(d / "a")
    (a / "config.json").write_text(t._deep())
    rec["config"] = inspect(ws, d, a)
    b = source(d / "b")
    raw, n, _ = t._st_bytes(b)
    js = t._deep().encode()
    js += b" " * (-len(js) % 8)
    (b / "model.safetensors").write_bytes(len(js).to_bytes(8, "little") + js + raw[8 + n:])
    rec["safetensors_header"] = inspect(ws, d, b)
    c = source(d / "c")
    (c / "model.safetensors").rename(c / "model-00001-of-00001.safetensors")
    (c / "model.safetensors.index.json").write_text(t._deep())
    rec["index"] = convert(ws, d, c)
    v = t._verifier_copy(ws.verifier("qwen3"), d)
    (v / "config.json").write_text(t._deep())
    rec["verifier_config"] = convert(ws, d, source(d / "d"), verifier=v)
    return rec


def index_json(kind: str) -> Runner:
    """test_index_json_pointing_outside_or_missing."""
    def run(ws: Workspace, d: Path) -> dict[str, Any]:
        other = source(d / "other")
        src = source(d / "src")
        names = list(tbi()._st_bytes(src)[2].keys() - {"__metadata__"})
        (src / "model.safetensors").rename(src / "model-00001-of-00002.safetensors")
        shard = {"outside": "../../other/zlab_dflash/model.safetensors", "absolute": str(other / "model.safetensors"),
                 "missing_shard": "model-00002-of-00002.safetensors"}[kind]
        wm = {n: "model-00001-of-00002.safetensors" for n in sorted(names)}
        wm[sorted(names)[0]] = shard
        (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
        return {"convert": convert(ws, d, src)}
    return run


def symlink_loops(ws: Workspace, d: Path) -> dict[str, Any]:
    import os

    src = source(d / "src")
    os.symlink("loop2", src / "loop1")
    os.symlink("loop1", src / "loop2")
    os.symlink(".", src / "self")
    (src / "sub").mkdir()
    os.symlink("..", src / "sub" / "up")
    return {"convert": convert(ws, d, src)}


def unicode_paths(ws: Workspace, d: Path) -> dict[str, Any]:
    src = source(d / "my models" / "ünïcødé drafter")
    ver = tbi()._verifier_copy(ws.verifier("qwen3"), d / "vér ifier")
    return {"inspect": inspect(ws, d, src),
            "convert": convert(ws, d, src, verifier=ver, out=d / "øut dir" / "convërted")}


def _source_cases() -> dict[str, Runner]:
    t = tbi()
    cases: dict[str, Runner] = {"config_not_utf8": config_not_utf8, "config_nan": config_nan,
                                "aux_layer_ids_flag": aux_flag, "multimodal_verifier": multimodal_verifier,
                                "malicious_pickle": malicious_pickle, "bin_non_string_key": bin_non_string_key,
                                "deeply_nested_json": deeply_nested_json, "symlink_loops": symlink_loops,
                                "unicode_paths": unicode_paths}
    for v in params(t.test_config_architectures_wrong_type):
        add(cases, case_id("architectures", v), architectures(v))
    for key, value, _ in params(t.test_bad_config_values) + params(t.test_dflash_family_layer_keys):
        add(cases, case_id("config", key, value), config_value(key, value))
    for kind, _ in params(t.test_bad_verifier):
        add(cases, case_id("verifier", kind), bad_verifier(kind))
    for spec in params(t.test_verifier_empty_or_unreachable_hub_id):
        add(cases, case_id("verifier_spec", spec), verifier_spec(spec))
    for kind in params(t.test_corrupt_safetensors_inspect_and_convert):
        add(cases, case_id("corrupt_safetensors", kind), corrupt_safetensors(kind))
    for sub in params(t.test_subfolder_cannot_escape_the_source):
        add(cases, case_id("subfolder", sub), subfolder(sub))
    for kind in params(t.test_index_json_pointing_outside_or_missing):
        add(cases, case_id("index_json", kind), index_json(kind))
    return cases


CASES: dict[str, Runner] = _source_cases()
