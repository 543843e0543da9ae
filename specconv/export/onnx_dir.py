"""``specconv export onnx DIR``: a Speculators dir → ``onnx/`` (graph, fp32 twin, meta), written
through a temp dir renamed at the end. The layout, what ``onnx_meta.json`` holds and why every
graph is standard ONNX: ``docs/engines.md`` ("Files", "Prepare for TensorRT"). The export section
of ``DIR/specconv.json`` records the result and the parity numbers.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import shutil
from functools import partial
from pathlib import Path
from typing import Any

from ..errors import GateFailedError, InvalidInputError, UsageError
from ..outdir import (KINDS, OutputTemp, check_format_version, check_output, clean_stale, move_into_place,
                      public_modes)
from ..results import ExportOnnxResult
from ..versions import library_versions

log = logging.getLogger("specconv.export")

__all__ = ["export_onnx_dir", "META_NAME", "META_FORMAT", "META_FORMAT_VERSION", "DTYPES",
           "check_speculators_dir", "check_meta_format", "graph_for_dtype"]

#: the record of an export dir and its ``format`` (owned by :data:`specconv.outdir.KINDS`)
META_NAME, META_FORMAT = KINDS["onnx"].record, KINDS["onnx"].format
#: the one ``format_version`` every reader accepts (``validate --onnx``, ``build-engine``,
#: ``push``, ``release``'s re-use), through :func:`check_meta_format`. Version 2: standard
#: ONNX graphs (no TensorRT-only attributes in the file), each graph written once (no fp32
#: twin for ``--dtype float32``).
META_FORMAT_VERSION = 2
GRAPH_NAME = "drafter.onnx"
#: the fp32 twin of a float16 / bfloat16 export
TWIN_NAME = "fp32/" + GRAPH_NAME
DTYPES = ("float32", "float16", "bfloat16")


def check_meta_format(meta: Any, where: str | Path) -> None:
    """Refuse an ``onnx_meta.json`` (parsed; ``where`` its path) that is not :data:`META_FORMAT`
    version :data:`META_FORMAT_VERSION` (:func:`specconv.outdir.check_format_version`).

    Raises:
        InvalidInputError: ``onnx_format_version`` (exit 3); the message says to re-export.
    """
    check_format_version(meta, where, "onnx", META_FORMAT_VERSION, shown="ONNX export format",
                         note=" (standard ONNX graphs, TensorRT attributes added by build-engine)")


def check_drafter_files(recorded: Any, drafter_dir: Path, artifact: str | Path, *, built: str, code: str) -> None:
    """Refuse an artifact of ``drafter_dir`` whose recorded ``drafter_files`` (what :func:`_meta`
    records, copied into ``build.json``) are not :func:`specconv.record.file_hashes` of it now.

    Raises:
        InvalidInputError: ``code`` (exit 3): "``artifact`` was ``built`` from a different drafter".
    """
    from ..record import file_hashes

    if recorded != file_hashes(drafter_dir):
        raise InvalidInputError(f"{artifact} was {built} from a different drafter than {drafter_dir} (the sha256 "
                                "of config.json / weights differ)", code=code)


def graph_for_dtype(meta: dict, dtype: str | None) -> str:
    """The graph of an export dir (relative path) to run at ``dtype``: the one whose
    recorded dtype is ``dtype`` (``drafter.onnx`` or the fp32 twin), else ``drafter.onnx``."""
    graphs = meta.get("graphs") or {}
    return next((rel for rel, g in sorted(graphs.items()) if (g or {}).get("dtype") == dtype), GRAPH_NAME)


def check_speculators_dir(d: Path) -> None:
    """Refuse ``d`` unless its ``config.json`` has a ``speculators_model_type`` (what an export reads).

    Raises:
        InvalidInputError: ``not_speculators_dir`` (exit 3), the hint to convert it first.
    """
    from ..format import speculators_model_type_of

    if speculators_model_type_of(d) is None:
        raise InvalidInputError(
            f"{d} is not a Speculators-format directory (no config.json with speculators_model_type)",
            code="not_speculators_dir", hint=f"convert it first: specconv convert {d} --verifier V -o OUT")


def _drafter_loader(d: Path, vspec: str | None):
    """``load(dtype=...)``: the drafter at a torch dtype, from one resolved verifier and one
    parse of ``d/config.json`` (however many dtypes are loaded)."""
    from ..drafters import load_drafter
    from ..format import load_config

    ver = None
    if vspec:
        from ..verifier import resolve_verifier

        ver = resolve_verifier(vspec)
    return partial(load_drafter, d, ver, config=load_config(d))


def default_verifier(d: Path) -> str | None:
    """The verifier recorded in ``DIR/specconv.json`` (its ``spec``, else ``name_or_path``;
    a local one is recorded relative to DIR)."""
    from ..record import read_record, resolve_record_path

    conv = read_record(d, missing_ok=True).conversion
    v = conv.verifier if conv is not None else None
    if v is None:
        return None
    return resolve_record_path(v.spec or v.name_or_path, d)


def _baked_from_verifier(d: Path) -> list[str]:
    """Which verifier tensors the graph bakes in (the drafter dir lacks them)."""
    from ..tensors import open_store

    names = set(open_store(d).names())
    baked = []
    if "embed_tokens.weight" not in names:
        baked.append("embed_tokens")
    if "lm_head.weight" not in names:
        baked.append("lm_head")
    return baked


def _example(shape, settings):
    """Export example: batch 2, context ``min(7, max_context)`` (≥ 3, ≠ batch: no axis
    specialises or merges with another)."""
    import torch

    from ..drafters.step import batch_inputs

    C = min(7, settings.max_context)
    g = torch.Generator().manual_seed(0)
    reqs = [(torch.randint(0, shape.vocab_size, (T + 1,), generator=g), torch.randn(T, shape.aux_width, generator=g))
            for T in (2, C)]
    return batch_inputs(shape, reqs, sampling_noise=settings.sampling_noise)


def _export_one(drafter, dtype: str, dst: Path, settings, workdir: Path, check: bool) -> dict:
    """Export the drafter at ``dtype`` to ``dst`` and (unless not ``check``) run parity."""
    from .onnx_export import export_graph, io_spec
    from .parity import check_parity
    from .wrappers import OUTPUT_CHOICES, make_wrapper

    kw = dict(top_k=settings.top_k, sampling_noise=settings.sampling_noise)
    wrapper = make_wrapper(drafter, outputs=settings.outputs, onnx_attention=True, **kw)
    example = _example(wrapper.shape, settings)
    log.info("exporting %s graph (%s) ...", dtype, dst)
    info = export_graph(wrapper, example, dst, settings, workdir)
    info.update(io_spec(dst))
    if check:
        ref = make_wrapper(drafter, outputs=OUTPUT_CHOICES, **kw)
        log.info("parity of the %s graph ...", dtype)
        info["parity"] = check_parity(dst, ref, wrapper.output_names, wrapper.input_names, dtype,
                                      sampling_noise=settings.sampling_noise,
                                      max_context=settings.max_context)
    return info


def export_onnx_dir(drafter_dir: str | Path, out: str | Path | None = None, *,
                    verifier: str | None = None, dtype: str = "float16", settings=None,
                    overwrite: bool = False, check: bool = True) -> "ExportOnnxResult":
    """Export a Speculators drafter dir to ONNX (graph at ``dtype``, fp32 twin if not fp32, meta).

    Args:
        drafter_dir: Speculators-format dir (P-EAGLE, DFlash or DSpark).
        out: output dir (default ``DIR/onnx``).
        verifier: verifier dir or Hub id (default: the one in ``DIR/specconv.json``);
            needed when the drafter borrows the verifier's embedding / LM head.
        dtype: ``float32`` | ``float16`` | ``bfloat16`` of the main graph.
        settings: :class:`~specconv.export.onnx_export.ExportSettings`.
        overwrite: replace an existing output.
        check: run parity (ONNX Runtime / reference evaluator vs the torch wrapper).

    Returns:
        :class:`~specconv.results.ExportOnnxResult` (also the ``export.onnx`` section of
        ``DIR/specconv.json``, :class:`~specconv.results.OnnxExport`); with ``out`` unset the
        drafter dir's card is refreshed (it lists the graphs).

    Raises:
        InvalidInputError: not a Speculators dir, missing verifier, export/check failure,
            existing output without ``overwrite``.
        UsageError: bad settings.
        GateFailedError: parity failed (nothing written).
    """
    import torch

    from .onnx_export import ExportSettings

    d = Path(drafter_dir)
    check_speculators_dir(d)
    s = settings or ExportSettings()
    _check_settings(s, dtype)
    out_dir = Path(out) if out is not None else d / "onnx"
    check_output(out_dir, "onnx", overwrite, drafter_dir=d)
    vspec = verifier or default_verifier(d)
    load = _drafter_loader(d, vspec)
    ref32 = load(dtype=torch.float32)
    if s.top_k > ref32.draft_vocab_size:
        raise UsageError(f"--top-k {s.top_k} exceeds the draft vocabulary ({ref32.draft_vocab_size})")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(out_dir)
    tmp = OutputTemp(out_dir)
    try:
        graphs = _export_graphs(tmp.path, load, ref32, s, dtype, check)
        meta = _meta(d, ref32.shape, ref32.aux_layer_ids, s, dtype, graphs, _baked_from_verifier(d), vspec,
                     tmp.path)
        result = _result(meta, graphs, out_dir, check)
        if check and result["parity_passed"] is False:
            raise GateFailedError(f"ONNX parity failed: {json.dumps(result['parity'])[:800]}",
                                  hint="inspect with --no-check (writes the graphs without the gate)")
        (tmp.path / META_NAME).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        public_modes(tmp.path)
        move_into_place(tmp, out_dir, overwrite, "onnx")
    finally:
        tmp.release()
    result["files"] = sorted([*meta["files"], META_NAME])
    finish_export(d, result, card=out is None)
    return ExportOnnxResult.of(result)


def finish_export(d: Path, result: dict[str, Any], *, card: bool, key: str = "onnx") -> None:
    """Record the export under ``export.<key>`` (:func:`record_export`; a read-only drafter dir
    only warns); with ``card`` (the export inside the drafter dir) refresh the drafter's card,
    which lists it."""
    try:
        record_export(d, result, key=key)
    except OSError as e:  # read-only drafter dir: the export itself is complete
        log.warning("could not record the export in %s/specconv.json: %s", d, e)
    if card:
        from ..record import card_function

        card_function("refresh_local_card")(d)


def _check_settings(s, dtype: str) -> None:
    if dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}")
    if s.opset not in (23, 24):
        raise UsageError("--opset must be 23 or 24")
    if s.max_batch < 1 or s.max_context < 4 or s.top_k < 1:
        raise UsageError("--max-batch >= 1, --max-context >= 4 and --top-k >= 1 are required")
    if "ids" not in s.outputs:
        raise UsageError("--outputs must include ids")


def _export_graphs(tmp: Path, load, ref32, s, dtype: str, check: bool) -> dict[str, Any]:
    """The graph at ``dtype``; for float16 / bfloat16 first the fp32 twin under ``fp32/``.
    Each graph is written once (float32: ``drafter.onnx`` alone, no link, no copy).
    ``load(dtype=...)`` loads the drafter at that torch dtype."""
    import torch

    work = tmp / ".work"
    work.mkdir(parents=True)
    graphs: dict[str, Any] = {}
    if dtype == "float32":
        graphs[GRAPH_NAME] = _export_one(ref32, "float32", tmp / GRAPH_NAME, s, work, check)
    else:
        (tmp / "fp32").mkdir()
        graphs[TWIN_NAME] = _export_one(ref32, "float32", tmp / TWIN_NAME, s, work, check)
        refd = load(dtype=getattr(torch, dtype))
        graphs[GRAPH_NAME] = _export_one(refd, dtype, tmp / GRAPH_NAME, s, work, check)
    shutil.rmtree(work)
    return graphs


def _meta(d: Path, shape, aux_layer_ids: list[int], s, dtype: str, graphs: dict, baked: list[str], vspec,
          tmp: Path) -> dict:
    from ..record import file_hashes
    from ..tensors import sha256_file

    files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
    main = graphs[GRAPH_NAME]
    return {
        "format": META_FORMAT, "format_version": META_FORMAT_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "algorithm": shape.algorithm, "io_contract": "stateless-v1",
        "dtype": dtype, "opset": main["opset"], "ir_version": main["ir_version"],
        "versions": library_versions(("torch", "onnx", "onnxscript", "onnx-ir", "onnxruntime")),
        "block_size": shape.block_size, "num_draft_tokens": shape.num_draft_tokens,
        "draft_slots": list(shape.draft_slots), "mask_token_id": shape.mask_token_id,
        "aux_layer_ids": list(aux_layer_ids), "aux_width": shape.aux_width,
        "vocab_size": shape.vocab_size, "draft_vocab_size": shape.draft_vocab_size,
        "padding": "left", "outputs": list(s.outputs), "top_k": s.top_k if "topk" in s.outputs else None,
        "sampling_noise": s.sampling_noise,
        "dynamic": {"batch": {"min": 1, "max": s.max_batch}, "context": {"min": 1, "max": s.max_context}},
        "graphs": {k: {"dtype": "float32" if k == TWIN_NAME else dtype,
                       "inputs": g["inputs"], "outputs": g["outputs"], "census": g["census"],
                       "attention_nodes": g["attention_nodes"]} for k, g in graphs.items()},
        "files": {f: sha256_file(tmp / f) for f in files},
        "drafter_files": file_hashes(d),
        "verifier": vspec,
        "contains_verifier_weights": bool(baked), "verifier_weights": baked,
    }


def _result(meta: dict, graphs: dict, out_dir: Path, check: bool) -> dict:
    parity = {k: g.get("parity") for k, g in graphs.items()} if check else None
    passed = None
    if check:
        flags = [p["passed"] for p in parity.values() if p and p.get("passed") is not None]
        passed = all(flags) if flags else None
    return {"output": str(out_dir), "algorithm": meta["algorithm"], "dtype": meta["dtype"],
            "opset": meta["opset"], "ir_version": meta["ir_version"],
            "contains_verifier_weights": meta["contains_verifier_weights"],
            "dynamic": meta["dynamic"], "block_size": meta["block_size"],
            "census": meta["graphs"][GRAPH_NAME]["census"], "parity": parity,
            "parity_passed": passed, "checked": check, "created": meta["created"]}


def record_export(d: Path, payload: dict, key: str = "onnx") -> None:
    """Set ``export.<key>`` in ``DIR/specconv.json`` (other export keys, e.g. ``trt``, kept;
    atomic, through :func:`specconv.record.update_section_key`).

    Raises:
        InvalidInputError: the existing file is not a valid record.
    """
    from ..record import as_record_path, update_section_key

    output = as_record_path(payload.get("output"), d)  # relative to DIR
    update_section_key(d, "export", key, {**payload, "output": output})
