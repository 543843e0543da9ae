"""``specconv export gguf DIR``: a Speculators DFlash / DSpark dir → ``OUT/drafter-<dtype>.gguf`` and
``OUT/gguf_meta.json`` through the one export lifecycle; the check serves the very bytes shipped
(docs/llamacpp.md).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ...errors import GateFailedError, InvalidInputError
from ...results import ExportGgufResult
from . import META_FORMAT, META_FORMAT_VERSION, META_NAME
from .server import LLAMA_SERVER_ENV
from .target import VERIFIER_GGUF_ENV

log = logging.getLogger("specconv.engines.llamacpp")

__all__ = ["META_FORMAT", "META_FORMAT_VERSION", "META_NAME", "check_meta", "export_gguf_dir", "find_export",
           "verify_export"]

def check_meta(meta: Any, where: str | Path) -> None:
    """Refuse a ``gguf_meta.json`` of another format or version (exit 3, ``gguf_format_version``;
    :func:`specconv.engines.exportdir.check_meta`)."""
    from ..exportdir import check_meta as check_format
    from . import ENGINE

    check_format(meta, where, ENGINE.export)


def recorded_verifier_name(d: Path) -> str | None:
    """The verifier's name the conversion recorded (``conversion.verifier.name_or_path``), or None."""
    from ...record import read_record

    conv = read_record(d, missing_ok=True).conversion
    return conv.verifier.name_or_path if conv is not None and conv.verifier is not None else None


def export_gguf_dir(drafter_dir: str | Path, out: str | Path | None = None, *, verifier: str | None = None,
                    dtype: str = "keep", overwrite: bool = False, check: bool = True, llama_server: str | None = None,
                    verifier_gguf: str | None = None) -> ExportGgufResult:
    """``specconv export gguf`` (``out`` default ``DIR/gguf``; ``check`` False: ``--no-check``).

    Raises:
        UnsupportedFormatError: exit 3, ``gguf_*``: what llama.cpp cannot represent (nothing written).
        InvalidInputError: not a Speculators dir, an existing output, a missing verifier.
        GateFailedError: the check failed (exit 4, nothing written).
        MissingExtraError: ``gguf`` or ``validate`` extra missing (exit 2).
    """
    from ..exportdir import export
    from . import ENGINE

    return export(ENGINE.export, drafter_dir, out, overwrite=overwrite, verifier=verifier, dtype=dtype,
                  no_check=not check, llama_server=llama_server, verifier_gguf=verifier_gguf)


def check_options(options: Any) -> None:
    """The ``gguf`` extra, transformers (the verifier's tokenizer) and torch (exit 2)."""
    from ...extras import require, require_extra

    require_extra("gguf", feature="specconv export gguf")
    require("transformers", "validate", feature="specconv export gguf (the verifier's tokenizer)")
    require("torch", "validate", feature="specconv export gguf")


def prepare(job: Any) -> None:
    """The plan and every refusal before anything is written: the verifier, what llama.cpp cannot
    represent, a verifier GGUF that is not the verifier; the llama-server (unless ``--no-check``)."""
    from ...format import load_config
    from ...tensors import open_store
    from .layout import plan_gguf
    from .server import resolve_server
    from .target import default_verifier_gguf, read_target, refuse_target

    d, opts = job.drafter_dir, job.options
    v = job.verifier()
    cfg, store = load_config(d), open_store(d)
    plan = plan_gguf(cfg, store, v, opts.get("dtype") or "keep")
    tpath, trepo = default_verifier_gguf(v, opts.get("verifier_gguf"), (recorded_verifier_name(d),))
    target = read_target(tpath) if tpath is not None else None
    if target is not None:
        refuse_target(target, v)
    server = None if opts.get("no_check") else resolve_server(opts.get("llama_server"))
    job.state.update(cfg=cfg, store=store, plan=plan, target=(tpath, trepo, target), server=server)


def write(job: Any, tmp: Path) -> dict[str, Any]:
    """The GGUF in ``tmp``; returns the meta's engine keys (the lifecycle adds format, files, drafter files)."""
    from ...versions import library_versions
    from .layout import _layer_config
    from .writer import write_gguf

    cfg, plan, v = job.state["cfg"], job.state["plan"], job.verifier()
    log.info("writing %s (%d tensors) ...", plan.file_name, len(plan.tensors))
    write_gguf(plan, tmp / plan.file_name, store=job.state["store"], verifier=v, name=job.drafter_dir.resolve().name,
               vocab_size=int(_layer_config(cfg)["vocab_size"]))
    return {"created": job.created, "algorithm": cfg.speculators_model_type, "architecture": plan.arch,
            "file": plan.file_name, "dtype": plan.file_type,
            "versions": library_versions(("gguf", "transformers", "torch")),
            "tensors": {t.gguf_name: {"source": t.source, "type": t.ggml_type} for t in plan.tensors},
            "keys": sorted(k for k, _, _ in plan.keys), "not_written": plan.not_written,
            "target_layers": plan.target_layers, "spec_type": plan.spec_type,
            "spec_draft_n_max": plan.spec_draft_n_max, "verifier": v.spec,
            "contains_verifier_weights": bool(plan.from_verifier), "verifier_weights": plan.from_verifier}


def check(job: Any, tmp: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Serve the GGUF in ``tmp`` when a llama-server and a target were found, else say why not.

    Raises:
        GateFailedError: the check failed (exit 4; nothing written).
    """
    (tpath, _, target), server, plan = job.state["target"], job.state["server"], job.state["plan"]
    if server is not None and target is not None:
        checked = _check(tmp / plan.file_name, tpath, server, job.verifier(), plan, target)
        if not checked["passed"]:
            raise GateFailedError(f"llama-server check failed: {json.dumps(_brief(checked))}",
                                  hint="inspect with --no-check (writes the GGUF without the gate)")
    else:
        checked = {"skipped": _skip_reason(not job.options.get("no_check"), server, target)}
    job.state["check"] = checked
    return {"check": _brief(checked)}


def result(job: Any, meta: dict[str, Any]) -> dict[str, Any]:
    """The command's result: the meta's facts, the GGUF's sha256, the target and the whole check."""
    keys = ("algorithm", "architecture", "file", "dtype", "spec_type", "spec_draft_n_max", "target_layers",
            "contains_verifier_weights", "verifier_weights", "not_written", "created")
    res = {"output": str(job.out_dir), **{k: meta[k] for k in keys}, "sha256": meta["files"][meta["file"]]}
    _, repo, target = job.state["target"]
    if target is not None:
        res["verifier_gguf"] = {"name": target["name"], "sha256": target["sha256"],
                                "quantisation": target["quantisation"], "repo": repo}
    return {**res, "check": job.state["check"]}


def record_value(job: Any, result: dict[str, Any], previous: Any) -> dict[str, Any]:
    """``export.gguf``: the result with the check as :func:`_brief` keeps it."""
    return {**{k: v for k, v in result.items() if k != "check"}, "check": _brief(result.get("check") or {})}


def _skip_reason(check: bool, server: Path | None, target: dict | None) -> str:
    if not check:
        return "--no-check"
    if server is None:
        return f"no llama-server (--llama-server, ${LLAMA_SERVER_ENV}, or `make llama-cpp`)"
    return f"no verifier GGUF (--verifier-gguf or ${VERIFIER_GGUF_ENV})"


def _check(gguf: Path, tpath: Path, server: Path, v: Any, plan: Any, target: dict) -> dict[str, Any]:
    """The export's serve check: ``CHECK_PROMPTS`` ``eval`` prompts of ``CHECK_NEW_TOKENS`` tokens."""
    from .check import CHECK_NEW_TOKENS, CHECK_PROMPTS, run_check
    from .target import same_tokenizer

    if not same_tokenizer(gguf, target):
        return {"passed": False, "why": f"the drafter's tokenizer differs from {target['name']}'s"}
    prompts = render_prompts(v, "eval", CHECK_PROMPTS)
    res = run_check(gguf, tpath, server, prompts, n_predict=CHECK_NEW_TOKENS, spec_type=plan.spec_type,
                    n_max=plan.spec_draft_n_max)
    return {k: v for k, v in res.items() if k not in ("plain_outputs", "spec_outputs")}


def render_prompts(v: Any, prompt_set: str, n: int | None) -> list[tuple[str, list[int]]]:
    """``(id, token ids)`` of ``n`` prompts of ``prompt_set`` (evenly spaced, as validate selects
    them), rendered with the verifier's chat template (:func:`specconv.prompts.render`)."""
    from transformers import AutoTokenizer

    from ...prompts import render, select_prompts

    tok = AutoTokenizer.from_pretrained(str(v.local_dir))
    return [(p.id, render(p, tok)) for p in select_prompts(prompt_set, n)]


def _brief(check: dict) -> dict:
    """The check as the meta and the record keep it (no per-token outputs, no host paths)."""
    keep = ("passed", "skipped", "why", "lossless", "exact_match", "divergences", "drafts_accepted", "tau",
            "acceptance_at_pos", "num_drafts", "num_draft_tokens", "num_accepted_tokens", "spec_type",
            "spec_draft_n_max", "n_predict", "prompts")
    out = {k: check[k] for k in keep if k in check}
    srv = check.get("server") or {}
    if srv:
        out["llama_server"] = {"version": srv.get("version"), "commit": srv.get("commit")}
    return out


def find_export(d: Path) -> tuple[Path, dict]:
    """The GGUF export of drafter dir ``d`` (``d/gguf``): ``(gguf file, meta)``.

    Raises:
        InvalidInputError: ``gguf_missing``, another format version, ``gguf_stale``.
    """
    meta_path = d / "gguf" / META_NAME
    if not meta_path.is_file():
        raise InvalidInputError(f"{d}/gguf/{META_NAME} does not exist: export the drafter first",
                                code="gguf_missing", hint=f"specconv export gguf {d}")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    check_meta(meta, meta_path)
    verify_export(d, meta)
    return d / "gguf" / meta["file"], meta


def verify_export(d: Path, meta: dict) -> None:
    """The GGUF's sha256 and the drafter files' equal what ``gguf_meta.json`` recorded.

    Raises:
        InvalidInputError: ``gguf_stale``.
    """
    from ...record import file_hashes
    from ...tensors import sha256_file

    f = d / "gguf" / str(meta.get("file"))
    if not f.is_file() or sha256_file(f) != (meta.get("files") or {}).get(meta.get("file")):
        raise InvalidInputError(f"{f}: missing or not the bytes gguf_meta.json records", code="gguf_stale",
                                hint=f"specconv export gguf {d} --overwrite")
    if meta.get("drafter_files") != file_hashes(d):
        raise InvalidInputError(f"{d}/gguf was exported from other drafter files than {d} holds now",
                                code="gguf_stale", hint=f"specconv export gguf {d} --overwrite")


def pushable(d: Path, rec: Any, rel: str) -> tuple[bool, bool]:
    """``(pushable, contains verifier weights)`` of ``gguf/<file>`` of drafter dir ``d`` (docs/llamacpp.md,
    "Publishing").

    Raises:
        InvalidInputError: a meta of another format version (exit 3, re-export).
    """
    from ...tensors import sha256_file

    meta = _read_meta(d)
    if meta is None:
        return False, False
    check_meta(meta, d / "gguf" / META_NAME)
    export = rec.export.gguf if rec.export is not None else None
    validated = (rec.validation.files or {}) if rec.validation is not None else {}
    if export is None or not (export.check or {}).get("passed") or meta.get("drafter_files") != validated:
        return False, False
    name = rel[len("gguf/"):]
    if name != META_NAME and (meta.get("files") or {}).get(name) != sha256_file(d / rel):
        return False, False
    return True, _holds_verifier_weights(meta)


def _read_meta(d: Path) -> Any:
    """The parsed ``d/gguf/gguf_meta.json`` (not checked), None when absent or unreadable."""
    try:
        return json.loads((d / "gguf" / META_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def holds_verifier_weights(d: Path) -> bool:
    """Whether drafter dir ``d``'s GGUF holds verifier tensors, as its ``gguf_meta.json`` says
    (False without a readable meta object)."""
    return _holds_verifier_weights(_read_meta(d))


def _holds_verifier_weights(meta: Any) -> bool:
    return isinstance(meta, dict) and bool(meta.get("contains_verifier_weights"))


def card_section(d: Path, rec: Any, files: Any, draft_repo: str | None, **_: Any) -> dict[str, Any] | None:
    """The card's llama.cpp section from the record's ``export.gguf``, or None unless its check passed
    on the bytes there (``files`` of the pushed card; the recorded sha256 for the local one,
    ``draft_repo`` None): ``{command, commit, version, verifier_gguf, tau, spec_type, spec_draft_n_max, local}``."""
    from ...tensors import sha256_file
    from ..vllm.serve_line import shell_command
    from .server import launch_argv

    exp = rec.export.gguf if rec.export is not None else None
    if exp is None:
        return None
    check, rel = exp.check or {}, f"gguf/{exp.file}"
    if not check.get("passed") or not (exp.verifier_gguf or {}).get("name"):
        return None
    if not ((rel in files.files) if draft_repo else (d / rel).is_file() and sha256_file(d / rel) == exp.sha256):
        return None
    srv = check.get("llama_server") or {}
    tau = check.get("tau")
    return {"command": shell_command(launch_argv(exp, draft_repo)), "commit": srv.get("commit"),
            "version": srv.get("version"), "verifier_gguf": exp.verifier_gguf,
            "tau": f"{tau:.3f}" if isinstance(tau, (int, float)) else str(tau),
            "spec_type": exp.spec_type, "spec_draft_n_max": exp.spec_draft_n_max, "local": draft_repo is None}
