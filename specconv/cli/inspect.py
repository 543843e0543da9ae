"""``specconv inspect SRC``: detect a source checkpoint (headers only) and lint it."""

from __future__ import annotations

import click

from .common import emit, output_format_option, run_command


def _human(r: dict) -> str:
    lines = [
        f"path:      {r['path']}" + (f"  (selected {r['selected']})" if r.get("selected") else ""),
        f"format:    {r['format']}" + (f"  — {r['title']}" if r.get("title") else ""),
        f"algorithm: {r.get('algorithm')}",
        f"supported: {'yes' if r['supported'] else 'no'}",
    ]
    if r.get("reason"):
        lines.append(f"reason:    {r['reason']}")
    plan = r.get("plan")
    if plan:
        cfg = plan["config"]
        k = cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
        lines.append(f"plan:      {plan['tensors']} tensors ({', '.join(f'{a} {b}' for a, b in plan['fates'].items())}), "
                     f"{plan['bytes'] / 1e6:.1f} MB; speculative_tokens {k}, mask_token_id {cfg.get('mask_token_id')}")
        if plan.get("layer_ids"):
            li = plan["layer_ids"]
            lines.append(f"           aux layer ids {li['source_ids']} ({li['source_convention']}) → {li['speculators_ids']}")
    errors = sum(f["level"] == "error" for f in r.get("findings", []))
    if r.get("findings"):
        lines.append(f"lint:      {errors} error(s), {len(r['findings']) - errors} other finding(s)")
    for f in r.get("findings", []):
        lines.append(f"  {f['level']:7} [{f['code']}] {f['message']}")
    if "nonfinite" in r:
        lines.append(f"scan:      {len(r['nonfinite'])} tensor(s) with NaN/Inf")
        lines += [f"  {n['tensor']}: {n['count']} of {n['numel']}, first at {n['first_index']}" for n in r["nonfinite"]]
    return "\n".join(lines)


@click.command("inspect")
@click.argument("src")
@click.option("--verifier", help="Verifier (local dir or Hub id): also dry-run the conversion plan.")
@click.option("--verifier-name", help="Hub id to record when --verifier is a local dir.")
@click.option("--subfolder", help="Subfolder of SRC holding the checkpoint.")
@click.option("--checkpoint", help="Trainer save dir: best | latest | a child name.")
@click.option("--scan", is_flag=True, help="Also read every float tensor and report NaN/Inf (exit 3 if any).")
@output_format_option
@run_command
def inspect_cmd(src: str, verifier: str | None, verifier_name: str | None, subfolder: str | None,
                checkpoint: str | None, output_format: str, scan: bool = False) -> None:
    """Detect SRC's format without reading tensor data; lint Speculators dirs.

    Exit 0 when the source is supported (and lint has no errors), 3 otherwise.
    """
    from specconv.convert import inspect_source
    from specconv.errors import EXIT_INVALID_INPUT

    r = inspect_source(src, verifier=verifier, verifier_name=verifier_name, subfolder=subfolder, checkpoint=checkpoint)
    if scan:
        from specconv.tensors import open_store
        from specconv.tensors.onepass import scan_report

        r["nonfinite"] = scan_report(open_store(r["path"]))
    emit(r, output_format, _human)
    if not r["supported"] or any(f["level"] == "error" for f in r.get("findings", [])) or r.get("nonfinite"):
        raise SystemExit(EXIT_INVALID_INPUT)
