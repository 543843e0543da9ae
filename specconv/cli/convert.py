"""``specconv convert SRC --verifier V -o OUT``: source checkpoint → Speculators dir."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from .common import run_command
from .options import (
    checkpoint_option,
    endpoint_option,
    output_format_option,
    revision_option,
    subfolder_option,
    verifier_name_option,
    verifier_option,
)


def _ids(ctx, param, value):
    if value is None:
        return None
    try:
        ids = [int(x) for x in value.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise click.BadParameter("expected comma-separated integers, e.g. 2,15,28") from None
    if not ids:
        raise click.BadParameter("no layer ids given; expected comma-separated integers, e.g. 2,15,28")
    return ids


def _size(ctx, param, value):
    if value is None:
        return None
    from specconv.errors import UsageError
    from specconv.tensors import parse_size

    try:
        return parse_size(value)
    except UsageError as e:
        raise click.BadParameter(e.message) from e
    except (ValueError, TypeError) as e:
        raise click.BadParameter(str(e)) from e


def _algorithms() -> list[str]:
    from specconv.converters import algorithms

    return algorithms()


class _AlgoChoice(click.Choice):
    """Choices generated from the converter registry, resolved lazily."""

    def __init__(self) -> None:
        super().__init__([], case_sensitive=False)

    @property
    def choices(self) -> tuple[str, ...]:  # noqa: D401
        return tuple(_algorithms())

    @choices.setter
    def choices(self, value: Sequence[str]) -> None:
        pass

    def get_metavar(self, param, ctx=None):  # --help must not import the converter registry
        return "ALGORITHM"


@click.command("convert")
@click.argument("src")
@verifier_option()
@verifier_name_option()
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Output directory (written atomically).")
@click.option("--algorithm", type=_AlgoChoice(), help="Refuse unless the detected source has this target algorithm "
                                                      "(dflash, dflash2, dspark, peagle: see `specconv formats`).")
@click.option("--mask-token-id", type=int,
              help="Mask token the drafter was trained with (when the checkpoint lacks it).")
@click.option("--aux-layer-ids", callback=_ids,
              help="Override aux layer ids (speculators convention: 0 = embeddings), e.g. 2,15,28.")
@click.option("--speculative-tokens", type=int, help="Drafts per step (P-EAGLE trained K when the config lacks it).")
@click.option("--sample-from-anchor/--no-sample-from-anchor", default=None,
              help="Block layout when the checkpoint cannot tell, or when its readings disagree (a missing key "
              "whose K rule and speculators' default differ).")
@click.option("--sliding-window-non-causal", is_flag=True,
              help="DFlash whose layers are all full attention: write sliding_window_non_causal: true (a no-op "
              "for speculators; vLLM then runs the layers bidirectionally, as trained). Refused elsewhere.")
@click.option("--norm-before-residual/--no-norm-before-residual", default=None,
              help="P-EAGLE flag when the source config lacks it.")
@click.option("--vocab-mapping", type=click.Path(path_type=Path, exists=True),
              help="d2t/t2d side file (.pt/.npy/.safetensors dir).")
@click.option("--draft-config", type=click.Path(path_type=Path, exists=True),
              help="Draft config for sources without config.json.")
@click.option("--allow-unpickle", is_flag=True,
              help="Explicitly allow unpickling a trusted training_state.pt (SpecForge).")
@checkpoint_option
@subfolder_option
@revision_option
@endpoint_option
@click.option("--dtype", type=click.Choice(["keep", "bfloat16", "float16", "float32"]), default="keep",
              show_default=True,
              help="Cast float tensors; a cast that overflows (a value the dtype cannot hold) is refused (exit 3).")
@click.option("--max-shard-size", callback=_size,
              help="Shard above this size (e.g. 5GB); default: one model.safetensors.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output directory (atomically) that is empty or an "
              "earlier specconv conversion; anything else is refused (exit 3).")
@click.option("--dry-run", is_flag=True, help="Plan and lint only; write nothing.")
@click.option("--allow-nonfinite", is_flag=True,
              help="Convert even if a source tensor holds NaN/Inf (recorded as a finding); never covers ±inf "
                   "a --dtype cast would create.")
@output_format_option
@run_command
def convert_cmd(src: str, verifier: str, verifier_name, output, algorithm, mask_token_id, aux_layer_ids,
                speculative_tokens, sample_from_anchor, sliding_window_non_causal, norm_before_residual, vocab_mapping,
                draft_config,
                allow_unpickle, checkpoint, subfolder, revision, endpoint, dtype, max_shard_size, overwrite, dry_run,
                output_format, allow_nonfinite):
    """Convert the drafter checkpoint SRC into a Speculators-format directory.

    SRC is a local dir or a Hub id. Every source tensor is mapped or refused by name; every
    meaning-bearing value comes from the checkpoint or an explicit flag. Lint errors fail (exit 3).
    """
    from specconv.convert import convert
    from specconv.converters import ConvertOptions
    from specconv.errors import UsageError

    if output is None and not dry_run:
        raise UsageError("-o/--output is required unless --dry-run")
    opts = ConvertOptions(
        mask_token_id=mask_token_id, aux_layer_ids=aux_layer_ids, dtype=dtype, speculative_tokens=speculative_tokens,
        sample_from_anchor=sample_from_anchor, vocab_mapping=vocab_mapping, draft_config=draft_config,
        allow_unpickle=allow_unpickle, checkpoint=checkpoint, algorithm=algorithm,
        norm_before_residual=norm_before_residual,
        sliding_window_non_causal=sliding_window_non_causal,
    )
    return convert(src, verifier=verifier, output=output, options=opts, verifier_name=verifier_name,
                   subfolder=subfolder, revision=revision, max_shard_size=max_shard_size, overwrite=overwrite,
                   dry_run=dry_run, allow_nonfinite=allow_nonfinite, endpoint=endpoint)
