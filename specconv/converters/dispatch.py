"""Detection by discriminator: which converters a source is tried against, and in what order (the rules:
:func:`routes_markdown`, rendered into ``docs/formats.md``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from specconv.format.algorithms import algorithm_names

from .base import PROJECTOR_DFLASH, PROJECTOR_DOMINO, PROJECTOR_DSPARK

if TYPE_CHECKING:  # pragma: no cover
    from .base import Converter, SourceInfo

#: Tried first on every source (quantization is a property of any layout).
FIRST = ("quantized_drafter",)

#: Tried on every source without ``speculators_model_type``, before any route: targets that
#: embed a drafter, directories with no draft body.
CHECKPOINT = ("deepseek_v4_dspark", "no_draft_body")

#: Tried last on every source without ``speculators_model_type``: formats recognised by config keys or
#: tensor names only.
LAST = ("laguna_dflash", "aws_peagle", "modelopt_eagle_parallel_heads", "eagle3")

#: DFlash-family refusals, in the order they must run before any supported DFlash / DSpark
#: converter (each looks at ``dflash_config`` keys or tensor names).
_DFLASH_REFUSALS = ("dflash2_variant", "domino", "mla_dspark", "laguna_dflash", "mimo_dflash", "causal_dflash")
_DSPARK_EXPORTS = ("modelopt_dspark", "specforge_dspark")
#: DSpark exports run before the refusals that look at tensor names / layout flags.
_DSPARK_FAMILY = _DFLASH_REFUSALS[:3] + _DSPARK_EXPORTS + _DFLASH_REFUSALS[3:]

#: Converters tried before ``speculators_<algorithm>`` on a Speculators dir of that algorithm:
#: early speculators P-EAGLE branches (PRs #327–#480) carry the same discriminator.
SPECULATORS_EARLY: dict[str, tuple[str, ...]] = {"speculators_peagle": ("speculators_peagle_early",)}


def _speculators_routes() -> dict[str, tuple[str, ...]]:
    """``speculators_model_type`` → candidates: ``speculators_<name>`` per described algorithm, else refused."""
    routes = {name: (*SPECULATORS_EARLY.get(f"speculators_{name}", ()), f"speculators_{name}")
              for name in algorithm_names()}
    return {**routes, "*": ("speculators_other",)}


#: discriminator → value → candidate format ids, in order (``*``: any other value).
ROUTES: dict[str, dict[str, tuple[str, ...]]] = {
    "speculators_model_type": _speculators_routes(),
    "projector_type": {
        PROJECTOR_DFLASH: _DFLASH_REFUSALS + ("modelopt_dflash",),
        PROJECTOR_DSPARK: _DSPARK_FAMILY,
        PROJECTOR_DOMINO: ("domino",),
    },
    "architectures[0]": {
        "DFlashDraftModel": _DFLASH_REFUSALS + ("modelopt_dflash", "specforge_dflash", "zlab_dflash"),
        "Qwen3DFlashDraftModel": _DFLASH_REFUSALS + ("nemo_dflash",),
        "DFlash2DraftModel": ("zlab_dflash2",),
        "Qwen3DFlash2DraftModel": ("zlab_dflash2",),
        "DFlash2BeamDraftModel": ("dflash2_variant",),
        "MiniMaxDFlash2DraftModel": ("dflash2_variant",),
        "LiLiCorrDraftModel": ("lilicorr",),
        "DominoDraftModel": ("domino",),
        "DSparkDraftModel": _DSPARK_FAMILY,
        "Qwen3DSparkModel": _DFLASH_REFUSALS[:3] + ("deepspec_dflash", "deepspec_dspark"),
        "Gemma4DSparkModel": ("gemma4_dspark",),
        "Glm5DSparkForCausalLM": ("mla_dspark",),
        "MuseGlimmerAssistantModel": _DFLASH_REFUSALS + ("muse_glimmer_dflash",),
        "PEagleDraftModel": ("specforge_peagle",),
        "LlamaEagle3DraftModel": ("nemo_peagle",),
    },
    "marker": {
        "dflash_config": _DFLASH_REFUSALS,
        "mask_embedding.pt": ("mimo_dflash",),
        "training_state.pt": ("specforge_training",),
    },
}

#: Config objects that count as markers (the other markers are file names).
CONFIG_MARKERS = ("dflash_config",)


def discriminators(src: SourceInfo) -> list[tuple[str, str]]:
    """The source's ``(discriminator, value)`` pairs that have a route, in precedence order."""
    keys: list[tuple[str, str]] = []
    smt = src.cfg("speculators_model_type")
    if smt is not None:
        routes = ROUTES["speculators_model_type"]
        return [("speculators_model_type", smt if isinstance(smt, str) and smt in routes else "*")]
    pt = src.projector_type  # the algorithm: a stronger signal than the class name
    if isinstance(pt, str) and pt in ROUTES["projector_type"]:
        keys.append(("projector_type", pt))
    archs = src.architectures
    if archs and archs[0] in ROUTES["architectures[0]"]:
        keys.append(("architectures[0]", archs[0]))
    for m in ROUTES["marker"]:
        present = isinstance(src.cfg(m), dict) if m in CONFIG_MARKERS else m in src.files
        if present:
            keys.append(("marker", m))
    return keys


def candidates(src: SourceInfo) -> list[str]:
    """Format ids to try on ``src``, in order (each at most once)."""
    keys = discriminators(src)
    smt = bool(keys) and keys[0][0] == "speculators_model_type"
    ids: list[str] = list(FIRST)
    if not smt:
        ids += CHECKPOINT
    for kind, value in keys:
        ids += ROUTES[kind][value]
    if not smt:
        ids += LAST
    return list(dict.fromkeys(ids))


def all_ids() -> list[str]:
    """Every format id the routes reach, in first-appearance order (the listing order of ``specconv formats``)."""
    ids: list[str] = list(FIRST)
    ids += [i for v in ROUTES["speculators_model_type"].values() for i in v]
    ids += CHECKPOINT
    for kind in ("projector_type", "architectures[0]", "marker"):
        ids += [i for v in ROUTES[kind].values() for i in v]
    ids += LAST
    return list(dict.fromkeys(ids))


def detect(src: SourceInfo, registry: dict[str, type[Converter]]) -> type[Converter] | None:
    """The first candidate converter whose ``detect`` matches ``src`` (``None``: unknown)."""
    for fid in candidates(src):
        cls = registry.get(fid)
        if cls is not None and cls.detect(src):
            return cls
    return None


def _cell(ids: Iterable[str]) -> str:
    return " → ".join(f"`{i}`" for i in ids)


def routes_markdown() -> list[str]:
    """The detection table of ``docs/formats.md`` (Markdown lines), rendered from :data:`ROUTES`."""
    out = [
        "## Detection order",
        "",
        "A source is tried only against the candidates its discriminators select (generated from",
        "`specconv/converters/dispatch.py`); the first whose detection matches wins. Lists are concatenated",
        "in the order of the rows: first, then `speculators_model_type` (alone, when present),",
        "otherwise checkpoint refusals, `projector_type`, `architectures[0]`, markers, last.",
        "",
        "| discriminator | value | candidates, in order |",
        "|---|---|---|",
        f"| every source | — | {_cell(FIRST)} |",
    ]
    out += [f"| `speculators_model_type` | `{v}` | {_cell(ids)} |"
            for v, ids in ROUTES["speculators_model_type"].items()]
    out.append(f"| no `speculators_model_type` | — | {_cell(CHECKPOINT)} |")
    for kind in ("projector_type", "architectures[0]", "marker"):
        out += [f"| `{kind}` | `{v}` | {_cell(ids)} |" for v, ids in ROUTES[kind].items()]
    out.append(f"| no `speculators_model_type`, after the rest | — | {_cell(LAST)} |")
    return out
