"""``specconv export onnx DIR``: ONNX graphs of one drafting step (docs/engines.md);
``specconv export gguf DIR``: a GGUF drafter for llama.cpp (docs/llamacpp.md)."""

from __future__ import annotations

from pathlib import Path

import click

from ..sglang_check import ENV_PYTHON as SGLANG_LOADER_ENV
from .common import output_format_option, run_command
from .llamacpp_options import llama_server_option, verifier_gguf_option

_OUTPUTS = ("ids", "logprobs", "topk", "logits", "confidence")


def _parse_outputs(value: str) -> tuple[str, ...]:
    items = tuple(x.strip() for x in value.split(",") if x.strip())
    bad = [x for x in items if x not in _OUTPUTS]
    if bad or not items:
        raise click.BadParameter(f"choose from {','.join(_OUTPUTS)} (got {value!r})", param_hint="--outputs")
    return items


@click.group("export")
def export_group() -> None:
    """Export a Speculators drafter to deployment formats."""


@export_group.command("onnx")
@click.argument("drafter_dir", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path),
              help="Output dir [default: DIR/onnx].")
@click.option("--verifier", help="Verifier dir or Hub id [default: the one in DIR/specconv.json].")
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), default="float16",
              show_default=True, help="Dtype of drafter.onnx (float16/bfloat16: an fp32 twin is also written under fp32/).")
@click.option("--opset", type=click.Choice(["23", "24"]), default="23", show_default=True)
@click.option("--outputs", default="ids,logprobs", show_default=True,
              help="Comma list of ids,logprobs,topk,logits,confidence (ids required).")
@click.option("--top-k", type=click.IntRange(min=1), default=4, show_default=True, help="k of the topk outputs.")
@click.option("--sampling-noise/--no-sampling-noise", default=False, show_default=True,
              help="Add a sampling_noise input (Gumbel-max sampling with caller-supplied noise).")
@click.option("--max-batch", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--max-context", type=click.IntRange(min=4), default=4096, show_default=True,
              help="Longest context the graph accepts (a longer prompt is refused, exit 3).")
@click.option("--overwrite", is_flag=True, help="Replace an existing output dir that is empty or an earlier "
              "specconv export; anything else is refused (exit 3).")
@click.option("--no-check", is_flag=True, help="Skip the ONNX Runtime parity check.")
@output_format_option
@run_command
def onnx_cmd(drafter_dir: Path, output: Path | None, verifier: str | None, dtype: str, opset: str,
             outputs: str, top_k: int, sampling_noise: bool, max_batch: int, max_context: int,
             overwrite: bool, no_check: bool, output_format: str):
    """Export one drafting step of the drafter in DIR as ONNX (TensorRT-ready).

    Writes drafter.onnx + drafter.onnx.data (standard ONNX), for float16/bfloat16 the fp32
    twin under fp32/, and onnx_meta.json; checks parity with ONNX Runtime on the written
    graphs (exit 4 when it fails, nothing written) and records the result under "export"
    in DIR/specconv.json.
    """
    from specconv.extras import require_extra

    require_extra("onnx", feature="specconv export onnx")  # export errors would wrap a missing module (exit 3)
    from specconv.export.onnx_dir import export_onnx_dir
    from specconv.export.onnx_export import ExportSettings

    settings = ExportSettings(opset=int(opset), max_batch=max_batch, max_context=max_context,
                              outputs=_parse_outputs(outputs), top_k=top_k, sampling_noise=sampling_noise)
    return export_onnx_dir(drafter_dir, output, verifier=verifier, dtype=dtype, settings=settings,
                           overwrite=overwrite, check=not no_check)


@export_group.command("gguf")
@click.argument("drafter_dir", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path),
              help="Output dir [default: DIR/gguf].")
@click.option("--verifier", help="Verifier dir or Hub id [default: the one in DIR/specconv.json].")
@click.option("--dtype", type=click.Choice(["keep", "bfloat16", "float16", "float32"]), default="keep",
              show_default=True, help="Type of the 2-D weights (1-D tensors and norms are F32; no quantised types).")
@llama_server_option
@verifier_gguf_option
@click.option("--overwrite", is_flag=True, help="Replace an existing output dir that is empty or an earlier "
              "specconv GGUF export; anything else is refused (exit 3).")
@click.option("--no-check", is_flag=True, help="Skip the llama-server check.")
@output_format_option
@run_command
def gguf_cmd(drafter_dir: Path, output: Path | None, verifier: str | None, dtype: str, llama_server: str | None,
             verifier_gguf: str | None, overwrite: bool, no_check: bool, output_format: str):
    """Export the DFlash / DSpark drafter in DIR as a llama.cpp GGUF drafter.

    Writes drafter-<dtype>.gguf (llama.cpp's dflash architecture, the verifier's tokenizer) and
    gguf_meta.json; refuses what llama.cpp cannot represent (exit 3, nothing written); when a
    llama-server and a verifier GGUF are found, serves it with and without the drafter (exit 4
    when the outputs differ or no draft is accepted, nothing written) and records the result
    under "export" in DIR/specconv.json.
    """
    from specconv.gguf.export import export_gguf_dir

    return export_gguf_dir(drafter_dir, output, verifier=verifier, dtype=dtype, overwrite=overwrite,
                           check=not no_check, llama_server=llama_server, verifier_gguf=verifier_gguf)


@export_group.command("sglang")
@click.argument("drafter_dir", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path),
              help="Output dir [default: DIR/sglang].")
@click.option("--verifier", help="Verifier dir or Hub id [default: the one in DIR/specconv.json].")
@click.option("--overwrite", is_flag=True, help="Replace an existing output dir that is empty or an earlier "
              "specconv SGLang export; anything else is refused (exit 3).")
@click.option("--check", is_flag=True, help="Load the files with SGLang's own loader (strict, CPU, its own venv) "
              "before they are moved into place; exit 4 when it refuses them (nothing written).")
@click.option("--sglang-loader-python", metavar="PATH",
              help=f"SGLang 0.5.23 interpreter for --check [default: ${SGLANG_LOADER_ENV}, else .venv-sglang].")
@output_format_option
@run_command
def sglang_cmd(drafter_dir: Path, output: Path | None, verifier: str | None, overwrite: bool, check: bool,
               sglang_loader_python: str | None, output_format: str):
    """Write SGLang's layout of the Speculators drafter in DIR (DFlash, DSpark).

    The weights are copied byte for byte; config.json is rewritten as SGLang 0.5.23 reads it
    (docs/sglang.md). What SGLang would serve wrongly is refused by name (exit 3, nothing
    written): P-EAGLE, a pruned vocabulary, aux ids SGLang cannot capture, another block
    layout. Records the export (and the check) under "export.sglang" in DIR/specconv.json.
    """
    if check:
        from specconv.sglang_check import export_checked

        return export_checked(drafter_dir, output, verifier=verifier, overwrite=overwrite, python=sglang_loader_python)
    from specconv.export.sglang_dir import export_sglang_dir

    return export_sglang_dir(drafter_dir, output, verifier=verifier, overwrite=overwrite)
