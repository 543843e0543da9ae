"""Speculators trainer output, normalised not converted (vllm-project/speculators
``src/speculators/train/checkpointer.py``), and early speculators P-EAGLE branches (PRs #327–#480)."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specconv.errors import InvalidInputError
from specconv.format.algorithms import Algorithm, algorithm_names, find_algorithm
from specconv.format.algorithms import algorithm as describe
from specconv.format.facts import SPECULATORS_VERSION
from specconv.plan import ConversionPlan, LayerIdConversion
from specconv.values import is_int

from . import _common as common
from ._vocab import merge_vocab, resolve_vocab
from .base import Converter, ConvertOptions, RefusedFormat, SourceInfo, register

if TYPE_CHECKING:
    from specconv.format.verifier_facts import VerifierView

#: Files a trainer checkpoint holds that are never published (speculators ``train/checkpointer.py``).
TRAINING_FILES = (
    "optimizer_state_dict.pt", "scheduler_state_dict.pt", "training_state.json", "val_metrics.json",
    "train_command.txt", "run.yaml", "config.py",
)

#: Legacy training-only config keys of trainer output (block drafters, P-EAGLE), dropped with a note.
BLOCK_LEGACY_DROP = {"max_anchors": "training-only anchor budget (≤ v0.6); speculators and vLLM ignore it"}
PEAGLE_LEGACY_DROP = {
    "down_sample_ratio": "COD training knob (moved out of the config in speculators #707)",
    "down_sample_ratio_min": "COD training knob (moved out of the config in speculators #707)",
    "loss_type": "training-only loss selector of early P-EAGLE branches",
    "max_anchors": "training-only anchor budget",
}

#: First speculators release with the DSpark Markov prev-token alignment fix (PR #806, 2026-07-17).
DSPARK_MARKOV_FIX = "0.7.0"

#: F10 mask-token aliases, in the order vLLM reads them (speculators PRs #327–#480).
EARLY_MASK_KEYS = ("ptd_token_id", "unused_token_id")
EARLY_DEPTH_KEYS = ("para_num", "para_depths")

#: ``transformer_layer_config`` keys the typed config requires (specconv.format).
REQUIRED_LAYER_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps",
)


def _version_before(v: Any, ref: str) -> bool | None:
    """``v < ref`` by PEP 440 (pre-releases of ``ref`` count as before); ``None`` if unknown."""
    if not isinstance(v, str) or not v:
        return None
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:  # pragma: no cover - packaging ships with transformers
        return None
    try:
        return Version(v) < Version(ref)
    except InvalidVersion:
        return None


def _fill_layer_config(src: SourceInfo, layer_config: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """Fill keys ``to_diff_dict`` omitted with transformers' defaults for the model type."""
    where = f"{src.path}/config.json"
    missing = [k for k in REQUIRED_LAYER_KEYS if k not in layer_config]
    no_theta = common.rope_theta_of(layer_config, where) is None
    if not missing and not no_theta:
        return layer_config
    mt = layer_config.get("model_type")
    if not isinstance(mt, str):
        raise InvalidInputError(f"{where}: transformer_layer_config.model_type is missing")
    auto_config = common.auto_config()  # outside the try: a missing transformers is exit 2, not a bad input
    try:
        full = auto_config.for_model(mt, **{k: v for k, v in layer_config.items() if k != "model_type"}).to_dict()
    except Exception as e:  # unknown model type or inconsistent keys
        raise InvalidInputError(
            f"{where}: transformer_layer_config lacks {missing + (['rope_theta'] if no_theta else [])} "
            f"and transformers cannot rebuild a {mt!r} config to fill them ({type(e).__name__}: {e})"
        ) from e
    out = dict(layer_config)
    filled = []
    for k in missing:
        v = full.get(k)
        if k == "head_dim" and v is None:
            v = out["hidden_size"] // out["num_attention_heads"]
        if v is None:
            raise InvalidInputError(f"{where}: transformer_layer_config.{k} is missing and has no default")
        out[k] = v
        filled.append(f"{k}={v!r}")
    if no_theta:
        theta = common.rope_theta_of(full, f"transformers' {mt} defaults")
        if theta is None:
            raise InvalidInputError(f"{where}: transformer_layer_config has no rope_theta and {mt} no default")
        rp = dict(out.get("rope_parameters") or full.get("rope_parameters") or {"rope_type": "default"})
        rp["rope_theta"] = theta
        out["rope_parameters"] = rp
        filled.append(f"rope_parameters.rope_theta={theta!r}")
    notes.append(
        f"transformer_layer_config: filled {', '.join(filled)} from transformers' {mt} config defaults "
        "(the values speculators rebuilds on load; omitted by to_diff_dict)"
    )
    return out


@dataclass
class _Normalising:
    """The config being normalised and what the steps found (one conversion)."""

    raw: dict[str, Any]
    algo: str
    alg: Algorithm
    where: str
    legacy_drop: dict[str, str]
    findings: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _envelope(n: _Normalising) -> None:
    """Drop what hides the envelope from vLLM or nobody reads; legacy training keys."""
    from specconv.format import Finding

    raw = n.raw
    if "model_type" in raw:
        n.findings.append(Finding("warning", "top-level-model-type-removed",
                                  f"top-level model_type={raw['model_type']!r} removed: it hides "
                                  "speculators_config from "
                                  "vLLM", "model_type"))
        raw.pop("model_type")
    if "auto_map" in raw:
        raw.pop("auto_map")
        n.notes.append("auto_map (and config.py) are save_pretrained artefacts nobody reads: not carried")
    if "torch_dtype" in raw:
        raw.setdefault("dtype", raw["torch_dtype"])
        raw.pop("torch_dtype")
    for key, why in n.legacy_drop.items():
        if key in raw:
            n.notes.append(f"legacy key {key}={raw.pop(key)!r} dropped: {why}")


def _layer_config(n: _Normalising, src: SourceInfo) -> dict[str, Any]:
    """``transformer_layer_config``: checked, omitted keys filled, RoPE resolved."""
    layer_config = n.raw.get("transformer_layer_config")
    if not isinstance(layer_config, dict):
        raise InvalidInputError(f"{n.where}: transformer_layer_config is missing or not an object")
    for k in ("vocab_size", "hidden_size", "num_hidden_layers"):
        v = layer_config.get(k)
        if k in layer_config and not is_int(v, minimum=1):
            raise InvalidInputError(f"{n.where}: transformer_layer_config.{k} must be a positive integer, got {v!r}")
    before = len(n.notes)
    layer_config = _fill_layer_config(src, layer_config, n.notes)
    if len(n.notes) > before:  # keys to_diff_dict omitted, filled from transformers' defaults
        from specconv.format import Finding

        n.findings.append(Finding("info", "layer-config-filled", n.notes[-1], "transformer_layer_config"))
    before = len(n.findings)
    rp = common.resolve_rope(layer_config, f"{n.where} transformer_layer_config", n.findings)
    if rp is not None and len(n.findings) > before:  # M-RoPE keys stripped: write the one resolved RoPE, in both forms
        layer_config = {k: v for k, v in layer_config.items() if k != "rope_scaling"}
        layer_config["rope_parameters"] = rp
        if "rope_theta" in layer_config:
            layer_config["rope_theta"] = rp["rope_theta"]
    n.raw["transformer_layer_config"] = layer_config
    return layer_config


def _mask_token(n: _Normalising, src: SourceInfo, opts: ConvertOptions, verifier: VerifierView | None, V: int,
                early: bool) -> tuple[int, str]:
    raw = n.raw
    locs = [("mask_token_id", raw.get("mask_token_id"))]
    if early:
        locs += [(k, raw.get(k)) for k in EARLY_MASK_KEYS]
    mask, mask_where = common.resolve_mask_token(src, opts, locs, verifier)
    for k in EARLY_MASK_KEYS:
        if k in raw:
            raw.pop(k)
            n.notes.append(f"legacy {k} → mask_token_id")
    raw["mask_token_id"] = mask
    if mask >= V:
        raise InvalidInputError(f"{n.where}: mask token id {mask} ({mask_where}) ≥ vocab_size {V}",
                                code="mask_token_out_of_vocab")
    return mask, mask_where


def _proposal(n: _Normalising) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """``(speculators_config, proposal_methods[0], its speculative_tokens)``."""
    sc = n.raw.get("speculators_config")
    if not isinstance(sc, dict) or not sc.get("proposal_methods"):
        raise InvalidInputError(f"{n.where}: speculators_config.proposal_methods is missing")
    if not isinstance(sc["proposal_methods"], list) or not isinstance(sc["proposal_methods"][0], dict):
        raise InvalidInputError(f"{n.where}: speculators_config.proposal_methods must be a list of objects, "
                                f"got {sc['proposal_methods']!r}")
    pm0 = sc["proposal_methods"][0]
    return sc, pm0, pm0.get("speculative_tokens")


def _peagle_depths(n: _Normalising, src: SourceInfo, opts: ConvertOptions, pm0: dict[str, Any], k_file: Any) -> None:
    """Trained depths (``num_depths``, legacy ``para_num``/``para_depths``) bound K."""
    raw, where, notes = n.raw, n.where, n.notes
    depth_locs = [("num_depths", raw.get("num_depths"))] + [(k, raw.get(k)) for k in EARLY_DEPTH_KEYS]
    for k, v in depth_locs:
        if v is not None and not is_int(v, minimum=1):
            raise InvalidInputError(
                f"{where}: {k}={v!r} is not a depth count; specconv reads it as the number of trained depths "
                "(low confidence for the early speculators P-EAGLE keys)",
                code="legacy_key_unknown",
                hint="remove the key, or pass --speculative-tokens with the trained K",
            )
    depths, dk = common.one_of(src, depth_locs, "trained number of depths")
    for k in EARLY_DEPTH_KEYS:
        if k in raw:
            raw.pop(k)
            notes.append(f"legacy {k} → num_depths")
    if depths is not None:
        raw["num_depths"] = depths
    K = opts.speculative_tokens if opts.speculative_tokens is not None else k_file
    if depths is not None and isinstance(K, int) and K > depths:
        raise InvalidInputError(
            f"speculative_tokens {K} exceeds the {depths} depths the drafter was trained with ({dk})",
            code="conflicting_speculative_tokens",
        )
    if opts.speculative_tokens is not None:
        pm0["speculative_tokens"] = opts.speculative_tokens
        notes.append(f"speculative_tokens {k_file} → {opts.speculative_tokens} (--speculative-tokens)")


def _peagle_norm_before_residual(n: _Normalising, opts: ConvertOptions) -> None:
    """``norm_before_residual`` from the checkpoint or ``--(no-)norm-before-residual`` (a finding), never defaulted."""
    from specconv.format import Finding

    from ._peagle import resolve_norm_before_residual

    value, source = resolve_norm_before_residual(
        n.where, n.raw.get("norm_before_residual"), opts.norm_before_residual,
        "speculators' config defaults it to false but its trainer to true")
    if n.raw.get("norm_before_residual") is not None:
        return
    n.raw["norm_before_residual"] = value
    n.findings.append(Finding("info", "norm-before-residual-from-flag",
                              f"norm_before_residual was absent; written as {str(value).lower()} ({source})",
                              "norm_before_residual"))


def _peagle_norm_flags(n: _Normalising, src: SourceInfo, plans: list, final_ids: list[int] | None) -> None:
    """Absent ``norm_before_fc`` / ``fc_norm`` filled from the tensors, each a finding."""
    from specconv.format import Finding

    from ._peagle import norm_flags_from_tensors

    nbf, fcn = norm_flags_from_tensors(src, n.raw, plans, len(final_ids) if final_ids else 3)
    for key, have, what in (("norm_before_fc", nbf, "input_norm.weight"), ("fc_norm", fcn, "fc_norm.* tensors")):
        if key not in n.raw:
            n.raw[key] = have
            n.findings.append(Finding("info", "peagle-norm-flag-from-tensors",
                                      f"{key} was absent; written as {str(have).lower()} ({what} "
                                      f"{'present' if have else 'absent'})", key))


#: DSpark head keys the class would otherwise default (speculators ``src/speculators/models/dspark/config.py``).
DSPARK_HEAD_KEYS = ("markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov")


def _dspark_heads_from_tensors(n: _Normalising, src: SourceInfo, H: int) -> None:
    """Fill absent DSpark head keys from the head tensors (``markov_w1 [V, r]``, ``gate_proj`` / ``joint_proj``,
    ``confidence_head.proj [1, H (+r)]``), never the class defaults; each fill a finding."""
    from specconv.format import Finding

    absent = [k for k in DSPARK_HEAD_KEYS if k not in n.raw]
    if not absent:
        return
    names = set(src.tensor_names())
    w1 = "markov_head.markov_w1.weight"
    r = n.raw.get("markov_rank", src.shape(w1)[-1] if w1 in names else 0)
    conf = "confidence_head.proj.weight"
    width = src.shape(conf)[-1] if conf in names else None
    if width is not None and width not in (H, H + r):
        raise InvalidInputError(f"{src.path}: {conf} has width {width}; the hidden size {H} (+ markov_rank {r}) "
                                "does not explain it", code="head_shape_mismatch")
    told = {
        "markov_rank": (r, f"{w1} {'columns' if w1 in names else 'absent'}"),
        "markov_head_type": ("gated" if "markov_head.gate_proj.weight" in names else
                             "rnn" if "markov_head.joint_proj.weight" in names else "vanilla",
                             "gate_proj / joint_proj tensors"),
        "enable_confidence_head": (width is not None, f"{conf} {'present' if width is not None else 'absent'}"),
        "confidence_head_with_markov": (width is not None and r > 0 and width == H + r, f"{conf} width"),
    }
    for k in absent:
        n.raw[k], why = told[k]
        n.findings.append(Finding("info", "dspark-head-from-tensors",
                                  f"{k} was absent; written as {n.raw[k]!r} ({why})", k))


def _absent_layout_refusal(n: _Normalising, B: int, k_file: Any, told: bool | None, default: bool) -> InvalidInputError:
    """The refusal of an absent ``sample_from_anchor`` no reading decides (exit 3)."""
    from specconv.format.facts import disputed_layout, layout_name

    flags = "pass --sample-from-anchor (anchor-first) or --no-sample-from-anchor (1+N): how the drafter was trained"
    if told is None:
        return InvalidInputError(
            f"{n.where}: no sample_from_anchor, and speculative_tokens={k_file!r} is neither block_size-1 "
            f"({B - 1}, 1+N layout) nor block_size ({B}, anchor-first): the block layout cannot be told "
            f"(speculators {SPECULATORS_VERSION} would read its {n.alg.display_name} default "
            f"{str(default).lower()}, {layout_name(default)})",
            code="missing_sample_from_anchor", hint=flags)
    return InvalidInputError(
        f"{n.where}: no sample_from_anchor, and its readings disagree: "
        f"{disputed_layout(B, k_file, told, default, n.alg.display_name)}; the block layout is never guessed "
        "(a flipped layout drafts every token from the wrong slot)",
        code="ambiguous_sample_from_anchor", hint=flags)


def _legacy_sample_from_anchor(n: _Normalising, opts: ConvertOptions, B: int, k_file: Any) -> bool:
    """Fill an absent ``sample_from_anchor`` when the legacy K rule and speculators' class default agree,
    else from ``--(no-)sample-from-anchor`` (``layout-from-flag``), else refuse (exit 3; docs/formats.md)."""
    from specconv.format import Finding, legacy_sample_from_anchor, speculators_default
    from specconv.format.facts import disputed_layout, layout_name

    told = legacy_sample_from_anchor(B, k_file)
    default = speculators_default(n.algo, "sample_from_anchor")
    flag = opts.sample_from_anchor
    if told is not None and told == default:
        rule = f"speculative_tokens {k_file} == block_size{'' if told else '-1'} → {layout_name(told)} layout"
        if flag is not None and flag != told:
            raise InvalidInputError(
                f"--{'' if flag else 'no-'}sample-from-anchor contradicts the legacy rule ({rule}) and "
                f"speculators {SPECULATORS_VERSION}'s {n.alg.display_name} default ({str(default).lower()})",
                code="conflicting_layout")
        n.raw["sample_from_anchor"] = told
        n.findings.append(Finding("info", "sample-from-anchor-filled",
                                  f"sample_from_anchor was absent; written as {str(told).lower()} ({rule})",
                                  "sample_from_anchor"))
        return told
    if flag is None:
        raise _absent_layout_refusal(n, B, k_file, told, default)
    n.raw["sample_from_anchor"] = flag
    readings = (disputed_layout(B, k_file, told, default, n.alg.display_name) if told is not None else
                f"speculative_tokens {k_file!r} is neither block_size-1 nor block_size")
    n.findings.append(Finding("warning", "layout-from-flag",
                              f"sample_from_anchor was absent ({readings}); written as {str(flag).lower()} "
                              f"({layout_name(flag)}) from --{'' if flag else 'no-'}sample-from-anchor",
                              "sample_from_anchor"))
    return flag


def _block_layout(n: _Normalising, opts: ConvertOptions, pm0: dict[str, Any], k_file: Any) -> None:
    """DFlash / DSpark: ``block_size``, ``sample_from_anchor`` and the K they imply."""
    from specconv.format import Finding, speculative_tokens_for

    raw, where, findings = n.raw, n.where, n.findings
    B = raw.get("block_size")
    if not is_int(B, minimum=2):
        raise InvalidInputError(f"{where}: block_size missing or invalid ({B!r}); it is never defaulted",
                                code="missing_block_size")
    sample_from_anchor = raw.get("sample_from_anchor")
    if sample_from_anchor is None:
        sample_from_anchor = _legacy_sample_from_anchor(n, opts, B, k_file)
    elif opts.sample_from_anchor is not None and opts.sample_from_anchor != sample_from_anchor:
        raise InvalidInputError(
            f"--{'' if opts.sample_from_anchor else 'no-'}sample-from-anchor contradicts the checkpoint's "
            f"sample_from_anchor={str(sample_from_anchor).lower()}", code="conflicting_layout",
        )
    exp = speculative_tokens_for(B, sample_from_anchor)
    if opts.speculative_tokens is not None and opts.speculative_tokens != exp:
        raise InvalidInputError(
            f"--speculative-tokens {opts.speculative_tokens} contradicts block_size {B} with "
            f"sample_from_anchor={str(sample_from_anchor).lower()} (needs {exp})",
            code="conflicting_speculative_tokens",
        )
    if k_file != exp:
        findings.append(Finding("warning", "speculative-tokens-fixed",
                                f"speculative_tokens {k_file!r} → {exp} (block_size {B}, "
                                f"sample_from_anchor={str(sample_from_anchor).lower()})", "speculative_tokens"))
        pm0["speculative_tokens"] = exp
    if n.alg.markov_head and sample_from_anchor:
        _dspark_markov_warning(n)


def _dspark_markov_warning(n: _Normalising) -> None:
    """Anchor-first DSpark written before speculators PR #806 fed the Markov head the wrong token."""
    from specconv.format import Finding

    v = n.raw.get("speculators_version")
    before = _version_before(v, DSPARK_MARKOV_FIX)
    if before is False:
        return
    n.findings.append(Finding(
        "warning", "dspark-markov-misaligned",
        (f"written by speculators {v!r}, which predates" if before else
         f"speculators_version {v!r} cannot be compared, so it may predate" if v else
         "no speculators_version, so it may predate")
        + f" the DSpark Markov prev-token alignment fix (speculators PR #806, 2026-07-17; first released in "
        f"{DSPARK_MARKOV_FIX}): anchor-first checkpoints trained before it fed the Markov head the wrong "
        "previous token — expect low acceptance; re-train or check with `specconv validate`",
        "speculators_version",
    ))


def _aux_ids(n: _Normalising, opts: ConvertOptions) -> tuple[list[int] | None, LayerIdConversion | None]:
    """Aux ids from the checkpoint (already the speculators convention) or ``--aux-layer-ids``."""
    raw = n.raw
    aux_key = n.alg.aux_ids_key
    ids = raw.get(aux_key)
    if ids is not None and (not isinstance(ids, list) or not ids or not all(is_int(i) for i in ids)):
        raise InvalidInputError(f"{n.where}: {aux_key} must be a non-empty list of integers, got {ids!r}",
                                code="layer_ids_invalid")
    if opts.aux_layer_ids is not None:
        if ids is not None and list(ids) != list(opts.aux_layer_ids):
            raise InvalidInputError(
                f"--aux-layer-ids {list(opts.aux_layer_ids)} contradicts the checkpoint's {aux_key}={ids}",
                code="conflicting_layer_ids",
            )
        if ids is None:
            raw[aux_key] = list(opts.aux_layer_ids)
            n.notes.append(f"{aux_key} from --aux-layer-ids (absent from the checkpoint)")
    final_ids = raw.get(aux_key)
    layer_ids = LayerIdConversion(
        aux_key if ids is not None else ("--aux-layer-ids" if final_ids is not None else None),
        "speculators", ids, list(final_ids or []), "already the speculators convention (unchanged)",
    ) if final_ids is not None else None
    return final_ids, layer_ids


def _tensors(conv: Any, n: _Normalising, src: SourceInfo, opts: ConvertOptions, layer_config: dict[str, Any],
             final_ids: list[int] | None, verifier: VerifierView | None):
    """Every tensor copied (``verifier_*`` copies dropped), the vocabulary mapping checked."""
    names = set(src.tensor_names())
    if not names:
        raise InvalidInputError(f"{src.path}: no weights (model.safetensors or shards) next to config.json",
                                code="missing_weights")
    reshape: dict[str, tuple[int, ...]] = {}
    H = layer_config["hidden_size"]
    if n.alg.mask_hidden and "mask_hidden" in names:
        A = len(final_ids) if final_ids else 3
        if math.prod(src.shape("mask_hidden")) == A * H:
            reshape["mask_hidden"] = (1, 1, A * H)
    plans, dropped = common.tensor_plan(
        src, opts, accept=(r".+",),
        drop={r"verifier_(lm_head|norm)\.weight": "training-only verifier copy (speculators never saves it)"},
        reshape=reshape, format_title=conv.title,
    )
    Vd = n.raw.get("draft_vocab_size")
    if not isinstance(Vd, int):
        raise InvalidInputError(f"{n.where}: draft_vocab_size missing (the class default 32000 is never assumed)",
                                code="missing_key")
    from ._peagle import logical_vocab

    vocab = resolve_vocab(src, opts, vocab_size=layer_config["vocab_size"], draft_vocab_size=Vd, side_files=False,
                             logical_vocab_size=logical_vocab(verifier, layer_config["vocab_size"]))
    plans, dropped = merge_vocab(plans, dropped, vocab)
    n.findings += vocab.findings
    n.notes += vocab.notes
    body_names = [p.source for p in plans if p.origin == "source" and p.source is not None and p.source in src.store]
    body_dtype = common.source_dtype(src, body_names)
    n.raw["dtype"] = common.dtype_name(common.out_dtype(body_dtype, opts))
    return plans, dropped


def _verifier_ref(n: _Normalising, sc: dict[str, Any], verifier: VerifierView | None) -> None:
    """Record the verifier given on the command line (the trainer recorded its own path)."""
    old = sc["verifier"].get("name_or_path") if isinstance(sc.get("verifier"), dict) else None
    if verifier is not None:
        sc["verifier"] = {"name_or_path": verifier.name_or_path, "architectures": verifier.architectures}
        if old != verifier.name_or_path:
            n.notes.append(f"speculators_config.verifier.name_or_path {old!r} → {verifier.name_or_path!r}")
    n.raw.setdefault("speculators_version", SPECULATORS_VERSION)


def _typed_config(n: _Normalising, plans: list) -> Any:
    """The typed config, every field written explicitly; pruned DSpark heads checked."""
    from specconv.format import DSparkConfig, parse_config

    cfg = parse_config(n.raw, source=n.where)
    object.__setattr__(cfg, "__pydantic_fields_set__", set(type(cfg).model_fields))
    Vd = n.raw["draft_vocab_size"]
    if isinstance(cfg, DSparkConfig) and cfg.is_pruned:
        w2 = common.get(plans, "markov_head.markov_w2.weight")
        if w2 is not None and w2.shape[0] != Vd:
            raise InvalidInputError(f"markov_head.markov_w2.weight has {w2.shape[0]} rows, expected "
                                    f"draft_vocab_size {Vd}")
    return cfg


def _files_not_carried(n: _Normalising, src: SourceInfo) -> None:
    left = sorted(f for f in src.files if f.split("/")[-1] in TRAINING_FILES)
    if left:
        n.notes.append("training files not carried (never published): " + ", ".join(left))
    keep = {"config.json"} | {p.name for p in src.store.files}
    unknown = sorted(f for f in src.files if f not in keep and f not in left and "/" not in f)
    if unknown:
        n.notes.append("other files not carried: " + ", ".join(unknown))


def normalise(conv: Any, src: SourceInfo, verifier: VerifierView | None, opts: ConvertOptions, *,
              early: bool = False) -> ConversionPlan:
    """Plan the normalised copy of a speculators trainer checkpoint; an absent meaning-bearing key is filled
    only from the checkpoint's evidence, a legacy rule or a flag, each fill a finding.

    Raises:
        InvalidInputError: a missing/contradictory key, an invalid vocabulary mapping, or an invalid config.
    """
    raw = copy.deepcopy(src.config or {})
    alg = describe(raw.get("speculators_model_type"))  # UnsupportedFormatError unless an algorithm's name
    n = _Normalising(raw=raw, algo=alg.name, alg=alg, where=f"{src.path}/config.json",
                     legacy_drop=conv.legacy_drop)
    _envelope(n)
    layer_config = _layer_config(n, src)
    mask, mask_where = _mask_token(n, src, opts, verifier, layer_config["vocab_size"], early)
    sc, pm0, k_file = _proposal(n)
    if n.alg.parallel_drafting:
        _peagle_depths(n, src, opts, pm0, k_file)
        _peagle_norm_before_residual(n, opts)
    if n.alg.block_drafter:
        _block_layout(n, opts, pm0, k_file)
    if n.alg.markov_head:
        _dspark_heads_from_tensors(n, src, layer_config["hidden_size"])
    final_ids, layer_ids = _aux_ids(n, opts)
    plans, dropped = _tensors(conv, n, src, opts, layer_config, final_ids, verifier)
    if n.alg.parallel_drafting:
        _peagle_norm_flags(n, src, plans, final_ids)
        if common.get(plans, "lm_head.weight") is not None:
            from ._peagle import lm_head_finding

            n.findings.append(lm_head_finding(conv.format_id, conv.title))
    _verifier_ref(n, sc, verifier)
    cfg = _typed_config(n, plans)
    _files_not_carried(n, src)
    n.notes.insert(0, f"normalised speculators {n.algo} checkpoint (speculators_version "
                      f"{raw.get('speculators_version')!r}); tensors copied unchanged")
    return ConversionPlan(
        format_id=conv.format_id, algorithm=n.algo, config=cfg, tensors=plans, dropped=dropped,
        source_dir=src.path, source_files=[src.path / "config.json", *src.store.files], findings=n.findings,
        layer_ids=layer_ids, options=opts.to_dict(), notes=[f"mask_token_id from {mask_where}"] + n.notes,
    )


class _SpeculatorsTrainer(Converter):
    algorithm = ""
    #: legacy training-only config keys this algorithm's trainer output may hold (dropped)
    legacy_drop: dict[str, str] = {}
    spec_ref = "vllm-project/speculators `src/speculators/train/checkpointer.py`, `src/speculators/models/*/config.py`"
    mapping = (
        "normalise, don't convert: tensors copied unchanged (verifier_* copies dropped), vocab mapping validated, "
        "missing `sample_from_anchor` filled by the legacy rule (K == B-1 → false, K == B → true) when speculators "
        "0.9.0's default for the algorithm (DFlash false, DSpark true) agrees, else refused unless "
        "`--sample-from-anchor` / `--no-sample-from-anchor` decides (recorded, warned `layout-from-flag`), legacy "
        "`max_anchors`/COD keys dropped with a note, verifier reference rewritten, optimizer/scheduler/training "
        "files never carried; DSpark anchor-first checkpoints older than speculators 0.7.0 (PR #806) warned"
    )

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        return src.cfg("speculators_model_type") == cls.algorithm

    def plan(self, src, verifier, opts):
        return normalise(self, src, verifier, opts)


def is_early_peagle(src: SourceInfo) -> bool:
    """``peagle`` with an early mask-token alias / COD key and no ``mask_token_id``."""
    return (src.cfg("speculators_model_type") == SpeculatorsEarlyPEagle.algorithm and src.cfg("mask_token_id") is None
            and any(src.cfg(k) is not None for k in EARLY_MASK_KEYS + EARLY_DEPTH_KEYS))


@register
class SpeculatorsEarlyPEagle(_SpeculatorsTrainer):
    format_id = "speculators_peagle_early"
    algorithm = "peagle"
    legacy_drop = PEAGLE_LEGACY_DROP
    title = "early speculators P-EAGLE branch (PRs #327–#480)"
    detection = "`speculators_model_type: peagle` with `ptd_token_id` (or `para_num`) and no `mask_token_id`"
    mapping = (
        "`ptd_token_id` (or `unused_token_id`) → `mask_token_id`; integer `para_num`/`para_depths` → `num_depths` "
        "(trained depths, must agree); COD keys dropped; otherwise as speculators_peagle"
    )
    spec_ref = ("vllm-project/speculators PRs #327/#343/#393/#480 "
                "(`PEagleSpeculatorConfig` with `ptd_token_id`, `para_num`)")

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        return is_early_peagle(src)

    def plan(self, src, verifier, opts):
        from specconv.format import Finding

        plan = normalise(self, src, verifier, opts, early=True)
        plan.findings.append(Finding(
            "info", "early-peagle-low-confidence",
            "early speculators P-EAGLE layout (speculators PRs #327–#480, low confidence): check the converted drafter "
            "with `specconv validate`", None,
        ))
        return plan


@register
class SpeculatorsPEagle(_SpeculatorsTrainer):
    format_id = "speculators_peagle"
    algorithm = "peagle"
    legacy_drop = PEAGLE_LEGACY_DROP
    title = "Speculators-format dir (speculators trainer output or a conversion) — P-EAGLE"
    detection = "`speculators_model_type: peagle` (trainer `save_path/<epoch>/` dirs or a published dir)"

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        return super().detect(src) and not is_early_peagle(src)


@register
class SpeculatorsDFlash(_SpeculatorsTrainer):
    format_id = "speculators_dflash"
    algorithm = "dflash"
    legacy_drop = BLOCK_LEGACY_DROP
    title = "Speculators-format dir (speculators trainer output or a conversion) — DFlash"
    detection = "`speculators_model_type: dflash`"


@register
class SpeculatorsDSpark(_SpeculatorsTrainer):
    format_id = "speculators_dspark"
    algorithm = "dspark"
    legacy_drop = BLOCK_LEGACY_DROP
    title = "Speculators-format dir (speculators trainer output or a conversion) — DSpark"
    detection = "`speculators_model_type: dspark`"


@register
class SpeculatorsDFlash2(_SpeculatorsTrainer):
    format_id = "speculators_dflash2"
    algorithm = "dflash2"
    legacy_drop = BLOCK_LEGACY_DROP
    title = "Speculators-format dir (speculators trainer output or a conversion) — DFlash2"
    detection = "`speculators_model_type: dflash2`"


#: other ``speculators_model_type`` values the speculators 0.9.0 registry knows, named as examples
#: in the refusal's detection text while no description covers them.
_OTHER_TYPES = tuple(t for t in ("eagle3", "mtp", "xpress") if find_algorithm(t) is None)


@register
class SpeculatorsOther(RefusedFormat):
    format_id = "speculators_other"
    algorithm = "other"
    title = "speculators drafter of another algorithm"
    detection = (f"`speculators_model_type` not in {{{', '.join(algorithm_names())}}} (the algorithms "
                 "`specconv/format/algorithms.py` describes)"
                 + (f", e.g. {', '.join(_OTHER_TYPES)}" if _OTHER_TYPES else ""))
    spec_ref = ("vllm-project/speculators 0.9.0 `src/speculators/config.py` (`speculators_model_type` registry), "
                "`src/speculators/models/{eagle3,mtp,xpress}/config.py` (`SpeculatorModelConfig.register`)")
    refusal = (
        f"specconv describes only {', '.join(algorithm_names())} (`specconv/format/algorithms.py`), so it neither "
        "converts nor validates this type; the directory is already a Speculators drafter of another algorithm — "
        "use it as it is (speculators loads it, and vLLM serves the types it knows)"
    )

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:
        t = src.cfg("speculators_model_type")
        return t is not None and find_algorithm(t) is None
