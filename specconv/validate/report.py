"""Validation report: ``validation.json``, ``validation.md``, ``acceptance.png`` and the
``validation`` section of the drafter dir's ``specconv.json`` (:mod:`specconv.record`).

The JSON keeps the field names of speculators' ``acceptance.csv`` / vLLM's counters
(``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens``, ``acceptance_length``,
``acceptance_at_pos``) at the top level so GPU runs through vLLM and the torch harness
compare row by row (``docs/validate.md``, "Metrics").
"""

from __future__ import annotations

import json
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
#: z-lab's reference package (``pip install dflash``, ``validate/zlab_reference.py``): a
#: package name that happens to spell an algorithm's, recorded with the library versions.
ZLAB_PACKAGE = "dflash"


def library_versions() -> dict[str, str | None]:
    """Versions of the libraries the numbers depend on (None when not installed). vLLM is
    not among them: it runs in its own venv, and what ran is reported as ``vllm_load`` /
    ``vllm_serve``."""
    from ..versions import library_versions as versions

    return versions(("torch", "transformers", "accelerate", "safetensors", "numpy", ZLAB_PACKAGE, "speculators"))


def torch_backend_flags() -> dict[str, Any]:
    """``torch.backends`` flags that change numerics (recorded so runs can be compared)."""
    import torch

    flags: dict[str, Any] = {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "num_threads": torch.get_num_threads(),
    }
    try:
        flags["cuda_matmul_allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
        flags["cudnn_allow_tf32"] = torch.backends.cudnn.allow_tf32
        flags["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    except AttributeError:  # pragma: no cover
        pass
    return flags


def _nvidia_smi_driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=False,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def device_info(device: str) -> dict[str, Any]:
    """Device description: CPU model/threads, or GPU name, compute capability, memory,
    driver and torch/CUDA versions."""
    import torch

    info: dict[str, Any] = {"device": device, "torch": torch.__version__}
    if str(device).startswith("cuda") and torch.cuda.is_available():
        idx = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(idx)
        free, total = torch.cuda.mem_get_info(idx)
        info.update(
            {
                "gpu_name": props.name,
                "compute_capability": f"{props.major}.{props.minor}",
                "gpu_memory_total_bytes": int(total),
                "gpu_memory_free_bytes_at_start": int(free),
                "gpu_count": torch.cuda.device_count(),
                "cuda_version": torch.version.cuda,
                "cudnn_version": torch.backends.cudnn.version(),
                "driver_version": _nvidia_smi_driver(),
            }
        )
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
        f"- backend: {report.get('backend')}, device: {report.get('device', {}).get('gpu_name') or report.get('device', {}).get('device')}, dtype: {report.get('dtype')}",
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
        f"- drafts: {m.get('num_drafts')}, draft tokens: {m.get('num_draft_tokens')}, accepted: {m.get('num_accepted_tokens')}",
        f"- TPOT spec / plain: {_fmt(m.get('tpot_ms'), 1)} / {_fmt(m.get('tpot_ar_ms'), 1)} ms, speedup {_fmt(m.get('speedup'), 2)}",
        "",
        "| position | p_i | c_i |",
        "| --- | --- | --- |",
    ]
    for i, (p, c) in enumerate(zip(m.get("acceptance_at_pos", []), m.get("conditional_acceptance_at_pos", [])), 1):
        lines.append(f"| {i} | {p:.3f} | {c:.3f} |")
    return lines


def _md_dspark(cal: dict) -> list[str]:
    lines = ["", "## DSpark confidence head (reported, not gated)", ""]
    c = cal.get("calibration")
    if c:
        lines.append(f"- mean |σ(c) − accepted|: {c['mean_abs_error']:.3f}, ECE: {c['ece']:.3f}, cumprod bias: {_fmt(c.get('cumprod_bias'))}")
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


def write_report(report, report_dir: str | Path) -> dict[str, str]:
    """Write ``validation.json`` (+ ``.md`` and the PNG) into ``report_dir``.

    ``report`` is a :class:`~specconv.results.ValidationReport` (or its dict); its ``plot``
    key is set to the PNG's file name.

    Returns:
        ``{"json": path, "markdown": path, "plot": path | None}``.
    """
    from ..fileio import atomic_write
    from ..results import jsonable

    d = Path(report_dir)
    d.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    if report.get("metrics"):
        png = plot_acceptance(report["metrics"], d / REPORT_PNG, source_metrics=report.get("source_metrics"))
        if png is not None:
            report["plot"] = png.name
            files["plot"] = str(png)
    atomic_write(d / REPORT_MD, render_markdown(report).encode())
    files["markdown"] = str(d / REPORT_MD)
    atomic_write(d / REPORT_JSON, (json.dumps(report, indent=2, sort_keys=True, default=jsonable) + "\n").encode())
    files["json"] = str(d / REPORT_JSON)
    return files
