"""``specconv export onnx DIR``: a Speculators dir → ``onnx/`` (graph, fp32 twin, meta) through the
generic export lifecycle (docs/engines.md, "Files", "Prepare for TensorRT").
"""

from __future__ import annotations

import json
import logging
import shutil
from functools import partial
from pathlib import Path
from typing import Any

from ...errors import GateFailedError, UsageError
from ..base import Exporter, OptionSpec, PushVerdict, Surface
from .reuse import keep_previous_export

log = logging.getLogger("specconv.export")

__all__ = ["DTYPES", "GRAPH_NAME", "META_FORMAT_VERSION", "META_NAME", "OnnxExporter", "check_meta_format", "graph_for_dtype"]

#: the one ``format_version`` every reader accepts (:func:`check_meta_format`): standard ONNX graphs,
#: each written once (no fp32 twin for ``--dtype float32``).
META_FORMAT_VERSION = 2
#: the export dir's meta file (what marks it as an ONNX export)
META_NAME = "onnx_meta.json"
GRAPH_NAME = "drafter.onnx"
#: the fp32 twin of a float16 / bfloat16 export
TWIN_NAME = "fp32/" + GRAPH_NAME
DTYPES = ("float32", "float16", "bfloat16")
_OUTPUTS = ("ids", "logprobs", "topk", "logits", "confidence")


def check_meta_format(meta: Any, where: str | Path) -> None:
    """Refuse an ``onnx_meta.json`` (parsed; ``where`` its path) of another format or version.

    Raises:
        InvalidInputError: ``onnx_format_version`` (exit 3); the message says to re-export.
    """
    from ..exportdir import check_meta
    from . import ENGINE

    check_meta(meta, where, ENGINE.export, shown="ONNX export format",
               note=" (standard ONNX graphs, TensorRT attributes added by build-engine)")


def graph_for_dtype(meta: dict, dtype: str | None) -> str:
    """The graph of an export dir (relative path) to run at ``dtype``: the one whose
    recorded dtype is ``dtype`` (``drafter.onnx`` or the fp32 twin), else ``drafter.onnx``."""
    graphs = meta.get("graphs") or {}
    return next((rel for rel, g in sorted(graphs.items()) if (g or {}).get("dtype") == dtype), GRAPH_NAME)


def parse_outputs(value: str) -> tuple[str, ...]:
    """``--outputs``: a comma list of :data:`_OUTPUTS` (``ids`` required).

    Raises:
        UsageError: an unknown name or none (exit 2).
    """
    items = tuple(x.strip() for x in str(value).split(",") if x.strip())
    bad = [x for x in items if x not in _OUTPUTS]
    if bad or not items:
        raise UsageError(f"--outputs: choose from {','.join(_OUTPUTS)} (got {value!r})")
    return items


def _baked_from_verifier(d: Path) -> list[str]:
    """Which verifier tensors the graph bakes in (the drafter dir lacks them)."""
    from ...tensors import open_store

    names = set(open_store(d).names())
    return [t for t in ("embed_tokens", "lm_head") if f"{t}.weight" not in names]


def _example(shape, settings):
    """Export example: batch 2, context ``min(7, max_context)`` (≥ 3, ≠ batch: no axis
    specialises or merges with another)."""
    import torch

    from ...drafters.step import batch_inputs

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


def _settings(options: dict[str, Any]) -> Any:
    """The :class:`~.onnx_export.ExportSettings` of the command's options, checked (exit 2)."""
    from .onnx_export import ExportSettings

    outputs = options.get("outputs", "ids,logprobs")
    s = ExportSettings(opset=int(options.get("opset", 23)), max_batch=options.get("max_batch", 8),
                       max_context=options.get("max_context", 4096),
                       outputs=parse_outputs(outputs) if isinstance(outputs, str) else outputs,
                       top_k=options.get("top_k", 4), sampling_noise=bool(options.get("sampling_noise", False)))
    dtype = options.get("dtype", "float16")
    if dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}")
    if s.opset not in (23, 24):
        raise UsageError("--opset must be 23 or 24")
    if s.max_batch < 1 or s.max_context < 4 or s.top_k < 1:
        raise UsageError("--max-batch >= 1, --max-context >= 4 and --top-k >= 1 are required")
    if "ids" not in s.outputs:
        raise UsageError("--outputs must include ids")
    return s


_OPTIONS = (
    OptionSpec(("--dtype",), "dtype", "Dtype of drafter.onnx (float16/bfloat16: an fp32 twin is also written under fp32/).",
               kind="choice", choices=DTYPES, default="float16", show_default=True),
    OptionSpec(("--opset",), "opset", "", kind="choice", choices=("23", "24"), default="23", show_default=True),
    OptionSpec(("--outputs",), "outputs", "Comma list of ids,logprobs,topk,logits,confidence (ids required).",
               default="ids,logprobs", show_default=True),
    OptionSpec(("--top-k",), "top_k", "k of the topk outputs.", kind="int", minimum=1, default=4, show_default=True),
    OptionSpec(("--sampling-noise/--no-sampling-noise",), "sampling_noise",
               "Add a sampling_noise input (Gumbel-max sampling with caller-supplied noise).", kind="flag",
               default=False, show_default=True),
    OptionSpec(("--max-batch",), "max_batch", "", kind="int", minimum=1, default=8, show_default=True),
    OptionSpec(("--max-context",), "max_context", "Longest context the graph accepts (a longer prompt is refused, exit 3).",
               kind="int", minimum=4, default=4096, show_default=True),
    OptionSpec(("--no-check",), "no_check", "Skip the ONNX Runtime parity check.", kind="flag", default=False),
)


class OnnxExporter(Exporter):
    """``specconv export onnx``: one drafting step as ONNX graphs, parity-checked with ONNX Runtime."""

    kind = "onnx"
    dir_name = "onnx"
    record_key = "onnx"
    meta_version = META_FORMAT_VERSION
    release_key = "export"
    surface = Surface(
        command=("export", "onnx"), options=_OPTIONS,
        flag=OptionSpec(("--export-onnx",), "export_onnx", "After validate, export onnx/ (re-used when the drafter "
                        "bytes are unchanged).", kind="flag", default=False),
        help="""Export one drafting step of the drafter in DIR as ONNX (TensorRT-ready).

    Writes drafter.onnx + drafter.onnx.data (standard ONNX), for float16/bfloat16 the fp32
    twin under fp32/, and onnx_meta.json; checks parity with ONNX Runtime on the written
    graphs (exit 4 when it fails, nothing written) and records the result under "export"
    in DIR/specconv.json.
    """)

    @property
    def result_type(self) -> Any:
        from ...results import ExportOnnxResult

        return ExportOnnxResult

    def check_options(self, options: Any) -> None:
        _settings(dict(options))

    def prepare(self, job: Any) -> None:
        """The extra, the drafter at fp32 from one resolved verifier."""
        import torch

        from ...drafters import load_drafter
        from ...extras import require_extra
        from ...format import load_config
        from ..exportdir import default_verifier

        require_extra("onnx", feature="specconv export onnx")
        s = _settings(dict(job.options))
        has_verifier = job.verifier_spec or default_verifier(job.drafter_dir)
        ver = job.verifier() if has_verifier else None
        load = partial(load_drafter, job.drafter_dir, ver, config=load_config(job.drafter_dir))
        ref32 = load(dtype=torch.float32)
        if s.top_k > ref32.draft_vocab_size:
            raise UsageError(f"--top-k {s.top_k} exceeds the draft vocabulary ({ref32.draft_vocab_size})")
        job.state.update(settings=s, load=load, ref32=ref32, dtype=job.options.get("dtype", "float16"),
                         check=not job.options.get("no_check", False), vspec=ver.spec if ver is not None else None)

    def write(self, job: Any, tmp: Path) -> dict[str, Any]:
        """The graphs (parity-checked unless ``--no-check``: a failure refuses them) and the meta's keys."""
        st = job.state
        graphs = _export_graphs(tmp, st["load"], st["ref32"], st["settings"], st["dtype"], st["check"])
        st["graphs"] = graphs
        meta = _meta(st["ref32"].shape, st["ref32"].aux_layer_ids, st["settings"], st["dtype"], graphs,
                     _baked_from_verifier(job.drafter_dir), st["vspec"], job.created)
        passed = _parity_passed(graphs) if st["check"] else None
        if st["check"] and passed is False:
            parity = {k: g.get("parity") for k, g in graphs.items()}
            raise GateFailedError(f"ONNX parity failed: {json.dumps(parity)[:800]}",
                                  hint="inspect with --no-check (writes the graphs without the gate)")
        return meta

    def result(self, job: Any, meta: dict[str, Any]) -> dict[str, Any]:
        check, graphs = job.state["check"], job.state["graphs"]
        return {"output": str(job.out_dir), "algorithm": meta["algorithm"], "dtype": meta["dtype"],
                "opset": meta["opset"], "ir_version": meta["ir_version"],
                "contains_verifier_weights": meta["contains_verifier_weights"],
                "dynamic": meta["dynamic"], "block_size": meta["block_size"],
                "census": meta["graphs"][GRAPH_NAME]["census"],
                "parity": {k: g.get("parity") for k, g in graphs.items()} if check else None,
                "parity_passed": _parity_passed(graphs) if check else None, "checked": check,
                "created": meta["created"], "files": sorted([*meta["files"], META_NAME])}

    # ------------------------------------------------------------------------ push
    def push_verdict(self, d: Path, rec: Any, rel: str) -> PushVerdict:
        """A file of ``onnx/`` is pushable with a passed export check of these bytes (docs/cli.md,
        "Gates"; the ``onnx/fp32/`` twin stays local).

        Raises:
            InvalidInputError: a meta of another format version (exit 3, "re-export").
        """
        from ...tensors import sha256_file
        from ..exportdir import read_meta

        if rel.startswith("onnx/fp32/"):
            return PushVerdict(covered=False, stays_local=True)
        meta = read_meta(d, self)
        if meta is not None:
            check_meta_format(meta, d / "onnx" / META_NAME)
        meta = meta if isinstance(meta, dict) else {}
        onnx = rec.export.onnx if rec.export is not None else None
        validated = (rec.validation.files or {}) if rec.validation is not None else {}
        passed = bool(onnx and (onnx.parity_passed or (onnx.model_extra or {}).get("passed")))
        if not passed or (meta.get("drafter_files") and meta["drafter_files"] != validated):
            return PushVerdict(covered=False)
        if rel != "onnx/" + META_NAME and (meta.get("files") or {}).get(rel[len("onnx/"):]) != sha256_file(d / rel):
            return PushVerdict(covered=False)
        return PushVerdict(covered=True, verifier_weights=verifier_weights(rec, meta))

    def holds_verifier_weights(self, d: Path, rec: Any, rels: list[str]) -> bool:
        from ..exportdir import read_meta

        meta = read_meta(d, self)
        return any(self.owns(d, rec, r) for r in rels) and verifier_weights(rec, meta if isinstance(meta, dict) else {})

    # ------------------------------------------------------------------------ card
    def card_rows(self, files: Any) -> list[tuple[str, str]]:
        return [(p, "ONNX") for p in files if p.startswith("onnx/") and p.endswith((".onnx", ".plan", ".engine"))]

    def local_files(self, d: Path) -> list[str]:
        """The files of ``onnx/`` the local card lists (the fp32 twin stays local, as in push)."""
        root = d / "onnx"
        return sorted(f.relative_to(d).as_posix() for f in root.rglob("*")
                      if f.is_file() and not f.relative_to(d).as_posix().startswith("onnx/fp32/")) if root.is_dir() else []

    # ---------------------------------------------------------------------- release
    def release_preflight(self, options: Any, value: Any) -> None:
        from ...extras import require_extra

        require_extra("onnx", feature="specconv release --export-onnx")

    before_reconvert = staticmethod(keep_previous_export)

    def release_step(self, drafter: Path, work: Path, options: Any, value: Any) -> dict[str, Any]:
        from .reuse import export_step

        return export_step(drafter, work, options.get("verifier"))


def verifier_weights(rec: Any, meta: dict[str, Any]) -> bool:
    """Whether the ``onnx/`` graphs embed verifier tensors (their meta or ``export.onnx`` says so)."""
    onnx = rec.export.onnx if rec.export is not None else None
    return bool(meta.get("contains_verifier_weights") or (onnx and onnx.contains_verifier_weights))


def _parity_passed(graphs: dict[str, Any]) -> bool | None:
    flags = [g["parity"]["passed"] for g in graphs.values() if g.get("parity") and g["parity"].get("passed") is not None]
    return all(flags) if flags else None


def _meta(shape: Any, aux_layer_ids: list[int], s: Any, dtype: str, graphs: dict, baked: list[str], vspec: str | None,
          created: str) -> dict:
    from ...versions import library_versions

    main = graphs[GRAPH_NAME]
    return {
        "created": created, "algorithm": shape.algorithm, "io_contract": "stateless-v1",
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
        "verifier": vspec, "contains_verifier_weights": bool(baked), "verifier_weights": baked,
    }
