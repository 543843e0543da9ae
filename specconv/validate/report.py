"""Validation report files and the ``validation`` section of ``specconv.json`` (``docs/validate.md``, "Outputs")."""

from __future__ import annotations

import logging
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

log = logging.getLogger("specconv.validate")

REPORT_JSON = "validation.json"
REPORT_MD = "validation.md"
REPORT_PNG = "acceptance.png"
ENGINES_PNG = "engines.png"
#: z-lab's reference package (``pip install dflash``), recorded with the library versions.
ZLAB_PACKAGE = "dflash"


def library_versions() -> dict[str, str | None]:
    """Versions of the libraries the numbers depend on (None: not installed; vLLM runs in its own venv)."""
    from ..versions import library_versions as versions

    return versions(("torch", "transformers", "accelerate", "safetensors", "numpy", ZLAB_PACKAGE, "speculators"))


def torch_backend_flags() -> dict[str, Any]:
    """``torch.backends`` flags that change numerics (recorded so runs can be compared)."""
    import torch

    flags: dict[str, Any] = {"deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
                             "num_threads": torch.get_num_threads()}
    try:
        flags["cuda_matmul_allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
        flags["cudnn_allow_tf32"] = torch.backends.cudnn.allow_tf32
        flags["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    except AttributeError:  # pragma: no cover
        pass
    return flags


def _nvidia_smi_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=False)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def device_info(device: str) -> dict[str, Any]:
    """Device description: CPU model/threads, or GPU name, capability, memory, driver and CUDA versions."""
    import torch

    info: dict[str, Any] = {"device": device, "torch": torch.__version__}
    if str(device).startswith("cuda") and torch.cuda.is_available():
        idx = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(idx)
        free, total = torch.cuda.mem_get_info(idx)
        info.update({"gpu_name": props.name, "compute_capability": f"{props.major}.{props.minor}",
                     "gpu_memory_total_bytes": int(total), "gpu_memory_free_bytes_at_start": int(free),
                     "gpu_count": torch.cuda.device_count(), "cuda_version": torch.version.cuda,
                     "cudnn_version": torch.backends.cudnn.version(), "driver_version": _nvidia_smi_driver()})
    else:
        info.update({"cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()})
    return info


def _fmt(x: Any, nd: int = 3) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def render_markdown(report: dict) -> str:
    """A short Markdown summary of a validation report."""
    m = report.get("metrics") or {}
    lines = [
        f"# specconv validate — {report.get('algorithm', '?')} drafter",
        "",
        f"- drafter: `{report.get('drafter')}`",
        f"- verifier: `{report.get('verifier')}`",
        f"- backend: {report.get('backend')}, device: "
        f"{report.get('device', {}).get('gpu_name') or report.get('device', {}).get('device')}, dtype: "
        f"{report.get('dtype')}",
        f"- prompts: {report.get('prompts', {}).get('set')} × {report.get('prompts', {}).get('n')}, "
        f"max new tokens {report.get('max_new_tokens')}, temperature {report.get('temperature')}",
        "",
        "## Gates",
        "",
        "| gate | result | notes |",
        "| --- | --- | --- |",
    ]
    for g in report.get("gate_results", []):
        status = g["status"]
        notes = "; ".join(g["errors"][:2]) or (g.get("skipped_reason") or "") or "; ".join(g["warnings"][:1])
        lines.append(f"| {g['name']} | {status} | {notes.replace('|', '/')} |")
    if m:
        lines += _md_acceptance(m)
    src = report.get("source_metrics")
    if src:
        lines += ["", f"Source drafter τ (same harness): {_fmt(src.get('acceptance_length'))}"]
    if report.get("dspark"):
        lines += _md_dspark(report["dspark"])
    if report.get("engines"):
        lines += _md_engines(report["engines"])
    if report.get("plot"):
        lines += ["", f"![per-position acceptance]({report['plot']})"]
    return "\n".join(lines) + "\n"


def _md_acceptance(m: dict) -> list[str]:
    ci = m.get("tau_ci95")
    lines = [
        "",
        "## Acceptance (vLLM convention: τ = 1 + accepted / drafts)",
        "",
        f"- τ pooled: **{_fmt(m.get('acceptance_length'))}**"
        + (f" (95% CI {ci[0]:.3f}–{ci[1]:.3f})" if ci else ""),
        f"- τ per-request mean: {_fmt(m.get('tau_request_mean'))}",
        f"- acceptance rate: {_fmt(m.get('acceptance_rate'))}",
        f"- drafts: {m.get('num_drafts')}, draft tokens: {m.get('num_draft_tokens')}, accepted: "
        f"{m.get('num_accepted_tokens')}",
        f"- TPOT spec / plain: {_fmt(m.get('tpot_ms'), 1)} / {_fmt(m.get('tpot_ar_ms'), 1)} ms, speedup "
        f"{_fmt(m.get('speedup'), 2)}",
        "",
        "| position | p_i | c_i |",
        "| --- | --- | --- |",
    ]
    for i, (p, c) in enumerate(zip(m.get("acceptance_at_pos", []), m.get("conditional_acceptance_at_pos", []),
                                   strict=True), 1):
        lines.append(f"| {i} | {p:.3f} | {c:.3f} |")
    return lines


def _md_engines(section: dict) -> list[str]:
    """One row per engine: version, runner, τ with its CI, verdict (and where and why it departs)."""
    ref = section.get("reference") or {}
    ci = ref.get("tau_ci95")
    lines = ["", "## Engines (same token ids, greedy; reference: specconv's loop)", "",
             "| engine | version | runner | τ (95% CI) | verdict |", "| --- | --- | --- | --- | --- |",
             f"| {ref.get('engine')} (reference) | | | {_fmt(ref.get('tau'))}"
             + (f" ({ci[0]:.3f}–{ci[1]:.3f})" if ci else "") + " | |"]
    for r in section.get("rows", []):
        lo, hi = r.get("tau_ci") or (None, None)
        verdict = r["verdict"] + (f" at {r['position'] or 'τ'} ({r['direction']}, {r['cause']})"
                                  if r["verdict"] == "departs" else "")
        lines.append(f"| {r['engine']} | {r.get('version') or '?'} | {str(r.get('runner') or '?').replace('|', '/')} | "
                     f"{_fmt(r.get('tau'))} ({_fmt(lo)}–{_fmt(hi)}) | {verdict} |")
    if section.get("counts_file"):
        lines += ["", f"Per-request counts: `{section['counts_file']}`; curves: `{ENGINES_PNG}`. "
                      + str(section.get("method", ""))]
    notes = section.get("notes") or []
    return lines + (["", *[f"- {n}" for n in notes]] if notes else [])


def _md_dspark(cal: dict) -> list[str]:
    lines = ["", "## DSpark confidence head (reported, not gated)", ""]
    c = cal.get("calibration")
    if c:
        lines.append(f"- mean |σ(c) − accepted|: {c['mean_abs_error']:.3f}, ECE: {c['ece']:.3f}, cumprod bias: "
                     f"{_fmt(c.get('cumprod_bias'))}")
    t = cal.get("truncated")
    if t:
        lines.append(
            f"- truncating at cumulative confidence ≥ {t['threshold']}: τ {t['acceptance_length']:.3f}, "
            f"mean drafts verified per step {_fmt(t.get('mean_draft_tokens_per_step'))}"
        )
    return lines


def plot_acceptance(metrics: dict, path: Path, *, source_metrics: dict | None = None, title: str = "") -> Path | None:
    """Bar plot of per-position acceptance ``p_i`` (and the source's when given)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        log.warning("matplotlib is not installed: no acceptance plot")
        return None
    p = metrics.get("acceptance_at_pos") or []
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    xs = list(range(1, len(p) + 1))
    w = 0.4 if source_metrics else 0.8
    ax.bar([x - (w / 2 if source_metrics else 0) for x in xs], p, width=w, label="converted")
    if source_metrics:
        ps = source_metrics.get("acceptance_at_pos") or []
        ax.bar([x + w / 2 for x in range(1, len(ps) + 1)], ps, width=w, label="source")
        ax.legend()
    ax.set_xlabel("draft position i")
    ax.set_ylabel("p_i (fraction of drafts)")
    ax.set_ylim(0, 1)
    ax.set_xticks(xs)
    tau = metrics.get("acceptance_length")
    ax.set_title(title or (f"per-position acceptance, τ = {tau:.3f}" if tau else "per-position acceptance"))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_engines(section: dict, path: Path) -> Path | None:
    """The engines' conditional acceptance c_i per position overlaid on the reference's (``--compare``),
    each engine's departing position marked."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        log.warning("matplotlib is not installed: no engine plot")
        return None
    fig, ax = plt.subplots(figsize=(6.5, 3.8), dpi=100)
    ref = section.get("reference") or {}
    curves = [(f"{ref.get('engine', 'reference')} (reference)", ref.get("c") or [], None)]
    curves += [(f"{r['engine']}: {r['verdict']}", r.get("c") or [], r.get("position")) for r in section.get("rows", [])]
    for n, (label, c, pos) in enumerate(curves):
        xs = [i + 1 for i, v in enumerate(c) if v is not None]
        line = ax.plot(xs, [c[x - 1] for x in xs], marker="os^vD"[n % 5], linestyle="-" if n == 0 else "--",
                       label=label)[0]
        if pos is not None and pos <= len(c) and c[pos - 1] is not None:
            ax.scatter([pos], [c[pos - 1]], s=160, facecolors="none", edgecolors=line.get_color())
    ax.set_xlabel("draft position i")
    ax.set_ylabel("c_i = a_i / a_(i-1)")
    ax.set_ylim(0, 1)
    ax.set_title("conditional acceptance per position, per engine")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def write_report(report, report_dir: str | Path) -> dict[str, str]:
    """Write a ValidationReport's ``validation.json`` / ``.md`` / PNG (its ``plot`` key set to the PNG's name)
    into ``report_dir``; returns ``{"json", "markdown", "plot"}`` paths."""
    from ..fileio import atomic_write

    d = Path(report_dir)
    d.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    counts = (report.__pydantic_extra__ or {}).pop("engine_counts", None)
    if counts and report.engines is not None:  # --compare: the per-request counts and the overlaid curves
        from .compare_run import write_counts

        files["engine_counts"] = str(write_counts(d, counts))
        report.engines["counts_file"] = Path(files["engine_counts"]).name
        png = plot_engines(report.engines, d / ENGINES_PNG)
        if png is not None:
            files["engines_plot"] = str(png)
    metrics = report.extra("metrics")
    if metrics:
        png = plot_acceptance(metrics, d / REPORT_PNG, source_metrics=report.source_metrics)
        if png is not None:
            report.plot = png.name
            files["plot"] = str(png)
    atomic_write(d / REPORT_MD, render_markdown(report.to_dict()).encode())
    files["markdown"] = str(d / REPORT_MD)
    atomic_write(d / REPORT_JSON, (report.to_json() + "\n").encode())
    files["json"] = str(d / REPORT_JSON)
    return files


def vllm_summaries(report: dict[str, Any]) -> dict[str, Any]:
    """What vLLM / llama.cpp checked, for the ``validation`` section: ``vllm_load`` (a passed load check),
    ``vllm_serve``, ``llamacpp_serve``; absent when not checked."""
    out: dict[str, Any] = {}
    vl = report.get("vllm_load") or {}
    if vl.get("ok"):
        out["vllm_load"] = {"distribution": vl.get("distribution"), "version": vl.get("version")}
    vs = report.get("vllm_serve") or {}
    if vs:
        out["vllm_serve"] = {k: v for k, v in vs.items() if k != "server"}
    ls = report.get("llamacpp_serve") or {}  # --backend llamacpp (specconv/validate/served.py)
    if ls:
        out["llamacpp_serve"] = {k: ls.get(k) for k in ("commit", "verifier_gguf", "tau", "tau_torch", "lossless",
                                                        "prompt_tokens")}
    return out


def parity_kl_max(report: dict[str, Any]) -> float | None:
    """G2's largest KL(source ‖ converted) from the report's gate results (None: no parity ran)."""
    gr = next((g for g in report.get("gate_results") or [] if g.get("name") == "parity"), None)
    return (gr.get("details") or {}).get("kl_max") if gr else None


def validation_section(report, drafter_dir: str | Path):
    """The ``validation`` section (paths relative to ``drafter_dir``, sha256 of every drafter file) of a
    written ValidationReport; InvalidInputError when a drafter file cannot be read."""
    from ..record import ValidationSection, as_record_path, file_hashes, relative_to_dir

    r = report.to_dict()
    dev, prompts, files = r.get("device") or {}, r.get("prompts") or {}, r.get("report_files") or {}
    return ValidationSection.model_validate(dict(  # report data, validated into the section's models
        passed=r.get("passed"), gates=r.get("gates"), acceptance_length=r.get("acceptance_length"),
        tau_ci95=r.get("tau_ci95"), acceptance_at_pos=r.get("acceptance_at_pos"),
        source_acceptance_length=(r.get("source_metrics") or {}).get("acceptance_length"),
        parity_kl_max=parity_kl_max(r), lossless_exact_match=(r.get("lossless") or {}).get("exact_match"),
        verifier=as_record_path(r.get("verifier"), drafter_dir), backend=r.get("backend"),
        device=dev.get("gpu_name") or dev.get("device"), dtype=r.get("dtype"),
        prompts={**{k: prompts.get(k) for k in ("set", "n")},
                 **{k: prompts[k] for k in ("rendered_sha256",) if k in prompts}},
        max_new_tokens=r.get("max_new_tokens"),
        **({"chat_template": _chat_template(r["chat_template"], drafter_dir)} if r.get("chat_template") else {}),
        **({"findings": r["findings"]} if r.get("findings") else {}),
        temperature=r.get("temperature"), specconv_version=r.get("specconv_version"), versions=r.get("versions"),
        files=file_hashes(drafter_dir), **_engine_rows(r),
        report=relative_to_dir(files["json"], drafter_dir) if files.get("json") else None, **vllm_summaries(r)))


def _engine_rows(r: dict[str, Any]) -> dict[str, Any]:
    """``engines`` of the section: one row per ``--compare`` engine (absent without a comparison)."""
    rows = (r.get("engines") or {}).get("rows")
    if not rows:
        return {}
    keys = ("engine", "version", "runner", "tau", "tau_ci", "verdict", "position", "direction", "cause")
    return {"engines": [{k: row.get(k) for k in keys} for row in rows]}


def _chat_template(facts: dict[str, Any], drafter_dir: str | Path) -> dict[str, Any]:
    """The report's ``chat_template`` as recorded: a ``--chat-template FILE`` relative to the drafter dir."""
    from ..record import as_record_path

    return {**facts, "path": as_record_path(facts["path"], drafter_dir) if facts.get("path") else None}


def finish_report(report, drafter_dir: Path, report_dir: Path) -> None:
    """Write the report files, record :func:`validation_section` and refresh the card (an unwritable
    drafter dir is logged)."""
    from ..engines.card import refresh_local_card
    from ..engines.vllm.remote import record_section
    from ..record import update_record

    report.report_files = write_report(report, report_dir)
    try:
        section = record_section(drafter_dir, validation_section(report, drafter_dir))  # --server-url: apart
        update_record(drafter_dir, "validation", section)
    except OSError as e:  # read-only drafter dir
        log.warning("could not record the validation summary in %s/specconv.json: %s", drafter_dir, e)
    refresh_local_card(drafter_dir)  # the card's validation table, from the record just written
