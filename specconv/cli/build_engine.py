"""``specconv build-engine DIR``: a TensorRT (GPU) or TensorRT-RTX (CPU AOT) engine from
``DIR/onnx`` (docs/engines.md)."""

from __future__ import annotations

from pathlib import Path

import click

from .common import output_format_option, run_command


@click.command("build-engine")
@click.argument("drafter_dir", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@click.option("--onnx", "onnx_path", type=click.Path(path_type=Path),
              help="Exported graph or export dir [default: DIR/onnx/drafter.onnx].")
@click.option("--builder", type=click.Choice(["tensorrt", "rtx"]), default="tensorrt", show_default=True,
              help="tensorrt: full TensorRT on a GPU; rtx: TensorRT-RTX (builds ahead of time; on a CPU "
              "with --compute-capability).")
@click.option("--profile", help="Optimization profile, e.g. batch=1:4:8,context=16:1024:4096 [default: the graph's range].")
@click.option("--hardware-compat", type=click.Choice(["none", "ampere+"]), default="none", show_default=True)
@click.option("--version-compatible", is_flag=True, help="Engine loadable by later TensorRT runtimes.")
@click.option("--timing-cache", type=click.Path(dir_okay=False, path_type=Path), help="Read/write this timing cache.")
@click.option("--builder-opt-level", type=click.IntRange(0, 5), help="0-5 (TensorRT's default when unset).")
@click.option("--compute-capability", "ccs", help="TensorRT-RTX targets, comma list (e.g. 8.9,12.0).")
@click.option("--workspace-mb", type=click.IntRange(min=64), default=4096, show_default=True)
@click.option("--overwrite", is_flag=True, help="Replace an existing variant dir that is empty or an earlier "
              "specconv build; anything else is refused (exit 3).")
@output_format_option
@run_command
def build_engine_cmd(drafter_dir: Path, onnx_path: Path | None, builder: str, profile: str | None,
                     hardware_compat: str, version_compatible: bool, timing_cache: Path | None,
                     builder_opt_level: int | None, ccs: str | None, workspace_mb: int, overwrite: bool,
                     output_format: str):
    """Build DIR/trt/<key>/drafter.plan + build.json and update DIR/trt/manifest.json.

    The GPU is checked before TensorRT is imported: exit 3 when --builder tensorrt
    finds no CUDA GPU, 2 when --builder rtx has no GPU and no --compute-capability;
    then exit 2 when the builder's TensorRT is not installed.
    """
    from specconv.export.engine import BuildOptions, build_engine_dir

    opts = BuildOptions(builder=builder, profile=profile or "", hardware_compat=hardware_compat,
                        version_compatible=version_compatible,
                        timing_cache=str(timing_cache) if timing_cache else None,
                        builder_opt_level=builder_opt_level,
                        compute_capabilities=[c.strip() for c in (ccs or "").split(",") if c.strip()],
                        workspace_mb=workspace_mb, overwrite=overwrite)
    return build_engine_dir(drafter_dir, onnx_path, opts)
