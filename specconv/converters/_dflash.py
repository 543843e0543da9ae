"""The DFlash-family mapping shared by every DFlash source (z-lab/dflash ``dflash/model.py``,
deepseek-ai/DeepSpec ``deepspec/modeling/dspark/qwen3/modeling.py``): a :class:`DFlashLayout` to a plan."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specconv.errors import InvalidInputError
from specconv.format.facts import SPECULATORS_VERSION as SPECULATORS_FORMAT_VERSION
from specconv.plan import ConversionPlan

from . import _common as common
from .base import ConvertOptions, SourceInfo

if TYPE_CHECKING:
    from specconv.format.verifier_facts import VerifierView


@dataclass
class DFlashLayout:
    """Where one DFlash-family source keeps its facts: target layer ids (z-lab convention; ``allow_minus_one``:
    -1 is the embedding output), ``[(label, value)]`` mask locations that must agree, the dict that may also
    hold ``block_size``, tensor renames, regex → reason drops / refusals, the block convention (docs/formats.md)."""

    ids_key: str
    ids: Any
    mask_locations: list[tuple[str, Any]]
    sample_from_anchor: bool
    block_nested: dict[str, Any] | None = None
    allow_minus_one: bool = False
    rename: Callable[[str], str] | None = None
    extra_accept: tuple[str, ...] = ()
    drop: dict[str, str] = field(default_factory=dict)
    refuse: dict[str, str] = field(default_factory=dict)
    layer_drop: tuple[str, ...] = ()
    sample_from_anchor_source: str = ""
    #: the source's runtime never reads a ``sample_from_anchor`` key (named with its file); a differing value warns
    runtime_ignores_sample_from_anchor: str = ""
    #: the source runs every draft layer non-causal (Muse-Glimmer, ``is_causal: false``)
    force_non_causal: bool = False
    #: notes/findings a source adds (e.g. an unverified convention)
    extra_findings: list[tuple[str, str, str]] = field(default_factory=list)


#: Keys that rescale embeddings/logits (Muse-Glimmer / MiMo DFlash): a non-neutral value has no Speculators equivalent.
SCALING_KEYS = ("input_embedding_scale", "output_multiplier", "final_logit_softcapping", "attention_value_scale")


def speculators_envelope(algorithm: str, k: int, verifier: VerifierView | None) -> dict[str, Any]:
    """The ``speculators_config`` envelope for ``verifier`` (:func:`specconv.format.facts.speculators_envelope`)."""
    from specconv.format.facts import speculators_envelope as envelope

    return envelope(algorithm, k, getattr(verifier, "name_or_path", None), getattr(verifier, "architectures", None))


def _refuse_scaling(conv: Any, src: SourceInfo, cfg: dict[str, Any]) -> None:
    """Embedding / logit rescaling keys with a non-neutral value have no Speculators equivalent."""
    from specconv.errors import UnsupportedFormatError

    for key in SCALING_KEYS:
        for where, v in ((key, cfg.get(key)), (f"dflash_config.{key}", src.dflash_config.get(key))):
            if v is not None and v not in (1, 1.0):
                raise UnsupportedFormatError(
                    f"{src.path}/config.json: {where}={v!r} rescales embeddings or logits; the Speculators "
                    "DFlash format has no equivalent, so the conversion would not be faithful",
                    format_id=conv.format_id,
                )


def _check_verifier_copies(plans: list, layer_config: dict[str, Any]) -> None:
    """Shipped ``embed_tokens`` / ``lm_head`` must be ``[V, H]`` (the verifier's, kept)."""
    for name in ("embed_tokens.weight", "lm_head.weight"):
        p = common.get(plans, name)
        if p is not None:
            want = (layer_config["vocab_size"], layer_config["hidden_size"])
            if tuple(p.shape) != want:
                raise InvalidInputError(f"{p.source} has shape {list(p.shape)}, expected {list(want)}")
            p.note = "shipped by the source; equals the verifier's (vLLM shares it when equal)"


def _check_body(src: SourceInfo, plans: list, layer_config: dict[str, Any], conv_ids: Any,
                verifier: VerifierView | None,
                findings: list) -> None:
    """``fc`` width, layer count, absent decoder keys from the tensors, KV paging, copies."""
    common.check_fc_width(src, plans, len(conv_ids.speculators_ids), layer_config["hidden_size"],
                          conv_ids.source_key or "--aux-layer-ids")
    common.check_layers(src, plans, layer_config["num_hidden_layers"])
    common.complete_layer_config(src, layer_config, plans, findings)
    common.kv_page_finding(layer_config, verifier, findings)
    _check_verifier_copies(plans, layer_config)


def _ignored_layout_keys(src: SourceInfo, layout: DFlashLayout, findings: list) -> None:
    """A ``sample_from_anchor`` the source's runtime ignores, set otherwise: written as the runtime runs it, warned."""
    from specconv.format import Finding
    from specconv.format.facts import layout_name

    if not layout.runtime_ignores_sample_from_anchor:
        return
    for where, value in src.locations("dflash_config.sample_from_anchor", "sample_from_anchor"):
        if value is not None and value != layout.sample_from_anchor:
            findings.append(Finding(
                "warning", "sample-from-anchor-ignored",
                f"{where}={value!r} in the source config is ignored by its runtime "
                f"({layout.runtime_ignores_sample_from_anchor}); written as "
                f"sample_from_anchor={str(layout.sample_from_anchor).lower()} "
                f"({layout_name(layout.sample_from_anchor)}, "
                "as that runtime drafts) — if the drafter was trained otherwise, acceptance will show it "
                "(`specconv validate --source`)", "sample_from_anchor"))


def _layout_k(conv: Any, opts: ConvertOptions, layout: DFlashLayout, block: int) -> tuple[bool, int]:
    """``(sample_from_anchor, speculative_tokens)`` of the layout; flags may only agree."""
    from specconv.format import speculative_tokens_for

    sample_from_anchor = layout.sample_from_anchor
    if opts.sample_from_anchor is not None and opts.sample_from_anchor != sample_from_anchor:
        raise InvalidInputError(
            f"--{'no-' if not opts.sample_from_anchor else ''}sample-from-anchor contradicts the {conv.title} layout "
            f"({'anchor-first' if sample_from_anchor else '1+N'}: {layout.sample_from_anchor_source})",
            code="conflicting_layout",
        )
    k = speculative_tokens_for(block, sample_from_anchor)
    if opts.speculative_tokens is not None and opts.speculative_tokens != k:
        raise InvalidInputError(
            f"--speculative-tokens {opts.speculative_tokens} contradicts block_size {block} with "
            f"sample_from_anchor={str(sample_from_anchor).lower()} (needs {k})",
            code="conflicting_speculative_tokens",
        )
    return sample_from_anchor, k


def plan_dflash_family(conv: Any, src: SourceInfo, verifier: VerifierView | None, opts: ConvertOptions,
                       layout: DFlashLayout, *, algorithm: str = "dflash",
                       extra_fields: dict[str, Any] | None = None) -> ConversionPlan:
    """Build the plan for a DFlash-family source (raises ``InvalidInputError`` /
    ``UnsupportedFormatError`` naming the key, tensor or flag at fault)."""
    from specconv.format import Finding, make_config

    cfg = src.config or {}
    findings: list = [Finding(lvl, code, msg, None) for lvl, code, msg in layout.extra_findings]
    _refuse_scaling(conv, src, cfg)
    block = common.resolve_block_size(src,
                                      layout.block_nested if layout.block_nested is not None else src.dflash_config)
    mask, mask_where = common.resolve_mask_token(src, opts, layout.mask_locations, verifier)
    conv_ids = common.zlab_to_speculators_ids(src, layout.ids, layout.ids_key, opts, verifier, findings,
                                              allow_minus_one=layout.allow_minus_one)
    layer_config = common.layer_config(src, cfg, model_type="qwen3", extra_drop=layout.layer_drop, findings=findings)
    common.check_verifier_shape(src, verifier, layer_config["hidden_size"], layer_config["vocab_size"], findings)
    if mask >= layer_config["vocab_size"]:
        raise InvalidInputError(f"mask token id {mask} ({mask_where}) ≥ vocab_size {layer_config['vocab_size']}")
    sliding_window_non_causal = (True if layout.force_non_causal
                                 else common.dflash_causality(src, layer_config, findings))
    accept = common.DFLASH_BODY + common.VERIFIER_COPIES + layout.extra_accept
    plans, dropped = common.tensor_plan(
        src, opts, accept=accept, rename=layout.rename, drop=layout.drop, refuse=layout.refuse, format_title=conv.title
    )
    _check_body(src, plans, layer_config, conv_ids, verifier, findings)
    sample_from_anchor, k = _layout_k(conv, opts, layout, block)
    _ignored_layout_keys(src, layout, findings)
    body_dtype = common.source_dtype(src, [p.source for p in plans if p.source])
    fields = dict(
        speculators_version=SPECULATORS_FORMAT_VERSION, dtype=common.dtype_name(common.out_dtype(body_dtype, opts)),
        draft_vocab_size=layer_config["vocab_size"], target_hidden_size=None, mask_token_id=mask,
        aux_hidden_state_layer_ids=conv_ids.speculators_ids, block_size=block, sample_from_anchor=sample_from_anchor,
        sliding_window_non_causal=sliding_window_non_causal, transformer_layer_config=layer_config,
        speculators_config=speculators_envelope(algorithm, k, verifier),
    )
    fields.update(extra_fields or {})
    return ConversionPlan(
        format_id=conv.format_id, algorithm=algorithm, config=make_config(algorithm, **fields), tensors=plans,
        dropped=dropped, source_dir=src.path, source_files=[src.path / f for f in src.files], findings=findings,
        layer_ids=conv_ids, options=opts.to_dict(),
        notes=[f"mask_token_id from {mask_where}",
               f"sample_from_anchor={str(sample_from_anchor).lower()} ({layout.sample_from_anchor_source})"],
    )
