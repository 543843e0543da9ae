"""The P-EAGLE mapping shared by every P-EAGLE source: a :class:`PEagleLayout` turned into a Speculators
``peagle`` plan (vllm-project/speculators ``src/speculators/models/peagle/``; tensors: docs/adding_a_converter.md)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specconv.errors import InvalidInputError, UnsupportedFormatError
from specconv.format import names
from specconv.plan import ConversionPlan, LayerIdConversion, TensorPlan
from specconv.values import is_int

from . import _common as common
from ._dflash import SPECULATORS_FORMAT_VERSION, speculators_envelope
from ._vocab import merge_vocab, resolve_vocab
from .base import ConvertOptions, SourceInfo

if TYPE_CHECKING:
    from specconv.format.verifier_facts import VerifierView

#: Output-name patterns a P-EAGLE draft may hold (besides the mapping tensors).
PEAGLE_ACCEPT = names.PEAGLE_PATTERNS

#: Training-only tensors some exports keep (speculators excludes them on save).
TRAINING_ONLY = {
    r"(model\.)?verifier_lm_head\.weight": "training-only copy of the verifier head (speculators never saves it)",
    r"(model\.)?verifier_norm\.weight": "training-only copy of the verifier final norm (speculators never saves it)",
}

#: Source config keys that describe the P-EAGLE wrapper, not the draft decoder layers.
PEAGLE_NON_LAYER_KEYS = (
    "draft_vocab_size", "target_hidden_size", "eagle_config", "pard_token", "ptd_token_id",
    "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output", "embed_requires_grad",
    "num_depths", "parallel_drafting", "eagle_aux_hidden_state_layer_ids", "aux_hidden_state_layer_ids",
    "down_sample_ratio", "down_sample_ratio_min", "para_num", "para_depths", "loss_type",
    "use_aux_hidden_state", "num_aux_hidden_states", "mask_token_id", "layer_types_source",
)


def strip_prefix_rename(prefix: str = "model.", *, keep_top_level: tuple[str, ...] = ()) -> Callable[[str], str]:
    """Rename: drop ``prefix`` and map a single-layer ``midlayer.*`` to ``layers.0.*``."""

    def rename(name: str) -> str:
        if prefix and name.startswith(prefix) and name not in keep_top_level:
            name = name[len(prefix):]
        if name.startswith("midlayer."):
            name = "layers.0." + name[len("midlayer."):]
        return name

    return rename


@dataclass
class PEagleLayout:
    """Where one P-EAGLE source keeps its facts: ``[(label, value)]`` locations of the mask id, aux ids
    (EAGLE-3 convention), ids of unknown convention (named in the error, never used) and trained K;
    mapping tensors outside the weights (``vocab_extra``); source-specific findings ``(level, code, message)``."""

    mask_locations: list[tuple[str, Any]]
    aux_locations: list[tuple[str, Any]]
    k_locations: list[tuple[str, Any]] = field(default_factory=list)
    aux_unknown: list[tuple[str, Any]] = field(default_factory=list)
    rename: Callable[[str], str] = field(default_factory=strip_prefix_rename)
    vocab_extra: Mapping[str, Any] | None = None
    vocab_extra_label: str = ""
    drop: dict[str, str] = field(default_factory=dict)
    layer_drop: tuple[str, ...] = ()
    findings: list[tuple[str, str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    mask_hint: str = "pass the id the drafter was trained with: --mask-token-id N"


#: Where P-EAGLE sources keep the aux ids in the EAGLE-3 convention (top level first).
EAGLE_AUX_KEYS = ("eagle_aux_hidden_state_layer_ids", "eagle_config.eagle_aux_hidden_state_layer_ids")
#: Layer-id keys whose convention no P-EAGLE producer documents (named in the error, never used).
UNKNOWN_AUX_KEYS = ("aux_hidden_state_layer_ids", "target_layer_ids")


def peagle_layout(src: SourceInfo, *, mask_keys: tuple[str, ...] = ("mask_token_id",),
                  aux_keys: tuple[str, ...] = EAGLE_AUX_KEYS, unknown_aux_keys: tuple[str, ...] = UNKNOWN_AUX_KEYS,
                  k_keys: tuple[str, ...] = ("num_depths",), **fields: Any) -> PEagleLayout:
    """A :class:`PEagleLayout` whose locations are the named config keys of ``src``; ``fields``: the rest."""
    return PEagleLayout(mask_locations=src.locations(*mask_keys), aux_locations=src.locations(*aux_keys),
                        aux_unknown=src.locations(*unknown_aux_keys), k_locations=src.locations(*k_keys), **fields)


def _int_list(src: SourceInfo, key: str, v: Any) -> list[int]:
    if not isinstance(v, list) or not v or not all(is_int(i) for i in v):
        raise InvalidInputError(f"{src.path}/config.json: {key} must be a non-empty list of integers, got {v!r}")
    return list(v)


def _missing_aux_ids(src: SourceInfo, layout: PEagleLayout) -> InvalidInputError:
    looked = ", ".join(k for k, _ in layout.aux_locations) or "nothing"
    unknown = [f"{k}={v!r}" for k, v in layout.aux_unknown if v is not None]
    extra = (f"; found {', '.join(unknown)} but its layer-index convention is not known for this producer, "
             "so it is not used") if unknown else ""
    return InvalidInputError(
        f"{src.path}/config.json records no aux hidden-state layer ids (looked at {looked}){extra}. "
        "They are a training-time choice and are never defaulted (e.g. to [2, n//2, n-3])",
        code="missing_layer_ids",
        hint="pass the ids the drafter was trained with, in the speculators/vLLM capture convention "
             "(0 = embeddings, n = final pre-norm hidden state): --aux-layer-ids 2,15,28 "
             "— or add eagle_config.eagle_aux_hidden_state_layer_ids to the source config.json",
    )


def resolve_aux_ids(src: SourceInfo, opts: ConvertOptions, layout: PEagleLayout, verifier: VerifierView | None,
                    findings: list) -> LayerIdConversion:
    """Aux ids from the checkpoint (EAGLE-3 convention = Speculators ids) or ``--aux-layer-ids``.

    Raises InvalidInputError: no ids anywhere (``missing_layer_ids``), disagreeing locations, duplicates,
    or ids outside ``[0, n]`` of the verifier.
    """
    from specconv.format import Finding

    ids, key = common.one_of(src, layout.aux_locations, "aux layer ids")
    if ids is not None:
        assert key is not None  # one_of labels each value it finds
        ids = _int_list(src, key, ids)
    if opts.aux_layer_ids is not None:
        ovr = list(opts.aux_layer_ids)
        if ids is not None and ovr != ids:
            findings.append(Finding(
                "warning", "aux-ids-override", f"--aux-layer-ids {ovr} replaces the checkpoint's {key}={ids}",
                "eagle_aux_hidden_state_layer_ids",
            ))
        conv = LayerIdConversion(key, "override", ids, ovr, "explicit --aux-layer-ids (speculators convention)")
    elif ids is None:
        raise _missing_aux_ids(src, layout)
    else:
        conv = LayerIdConversion(key, "speculators", ids, list(ids),
                                 "EAGLE-3 capture convention = speculators aux ids (unchanged)")
    s_ids = conv.speculators_ids
    if len(set(s_ids)) != len(s_ids):
        raise InvalidInputError(f"aux layer ids {s_ids} are not distinct", code="layer_ids_invalid")
    if any(i < 0 for i in s_ids):
        raise InvalidInputError(f"aux layer ids {s_ids} contain negative ids", code="layer_ids_invalid")
    if verifier is not None:
        n = verifier.num_hidden_layers
        out = [i for i in s_ids if i > n]
        if out:
            raise InvalidInputError(
                f"aux layer ids {out} (from {conv.source_key or '--aux-layer-ids'}) are outside [0, {n}] "
                f"for the verifier's {n} layers",
                code="layer_ids_out_of_range",
            )
    return conv


def _mask_token(src: SourceInfo, opts: ConvertOptions, layout: PEagleLayout, verifier: VerifierView | None,
                V: int) -> tuple[int, str]:
    mask, where = common.resolve_mask_token(src, opts, layout.mask_locations, verifier)
    if mask >= V:
        raise InvalidInputError(f"mask token id {mask} ({where}) ≥ vocab_size {V}", code="mask_token_out_of_vocab")
    return mask, where


#: Why P-EAGLE's ``norm_before_residual`` is never guessed (the error when it is absent).
_NBR_DEFAULTS = ("vLLM's speculators reader defaults it to false for peagle but true for eagle3 and the speculators "
                 "trainer defaults to true")


def resolve_norm_before_residual(where: str, v: Any, flag_val: bool | None, why: str) -> tuple[bool, str]:
    """``(value, where)`` of ``norm_before_residual`` from the config at ``where`` or the flag; never guessed.

    Raises InvalidInputError: not a bool, the flag contradicts the config (``conflicting_flag``), or neither
    gives it (``missing_norm_before_residual``; ``why`` names the defaults that disagree).
    """
    flag = f"--{'' if flag_val else 'no-'}norm-before-residual"
    if v is not None and not isinstance(v, bool):
        raise InvalidInputError(f"{where}: norm_before_residual must be true/false, got {v!r}")
    if v is not None and flag_val is not None and v != flag_val:
        raise InvalidInputError(f"{flag} contradicts the checkpoint's norm_before_residual={str(v).lower()}",
                                code="conflicting_flag")
    if v is not None:
        return v, "config.json norm_before_residual"
    if flag_val is not None:
        return flag_val, flag
    raise InvalidInputError(
        f"{where} has no norm_before_residual and --norm-before-residual/--no-norm-before-residual was not "
        f"given; {why}, so it cannot be guessed",
        code="missing_norm_before_residual",
        hint="pass --norm-before-residual or --no-norm-before-residual (how the drafter was trained)",
    )


#: P-EAGLE producers whose trainer freezes the LM head (``lm_head = verifier_lm_head[t2d]``) or trains it.
LM_HEAD_FROZEN = {
    "speculators_peagle": "speculators `src/speculators/model.py` (`lm_head.weight.requires_grad = False`, rows "
                          "loaded from the verifier by `_load_verifier_weights`)",
}
LM_HEAD_TRAINED = {
    "specforge_peagle": "SpecForge `specforge/modeling/draft/peagle.py` (`lm_head` is a trainable `nn.Linear`)",
}


def lm_head_finding(format_id: str, title: str) -> Any:
    """``lm-head-frozen`` (``validate`` then requires the verifier's rows) or ``lm-head-trainable``."""
    from specconv.format import Finding

    if format_id in LM_HEAD_FROZEN:
        return Finding("info", "lm-head-frozen",
                       f"{title}: the trainer freezes lm_head ({LM_HEAD_FROZEN[format_id]}); it must equal the "
                       "verifier's rows", "lm_head.weight")
    known = f"trains it ({LM_HEAD_TRAINED[format_id]})" if format_id in LM_HEAD_TRAINED else "may train it (not known)"
    return Finding("info", "lm-head-trainable",
                   f"{title} {known}: vLLM uses the file's lm_head; speculators 0.9.0 loads the file's head too "
                   "(`from_pretrained`: checkpoint weights take precedence) but re-initialising from the verifier "
                   "(`_load_verifier_weights(overwrite_lm_head=True)`) would replace it with the verifier's rows",
                   "lm_head.weight")


def _shape_keys(conv: Any, src: SourceInfo, cfg: dict[str, Any], verifier: VerifierView | None,
                findings: list) -> tuple[int, int, int]:
    """``(V, H, L)`` from the source config, checked against the verifier."""
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
        if not isinstance(cfg.get(key), int):
            raise InvalidInputError(f"{src.path}/config.json: missing integer {key!r}", code="missing_key")
    V, H, L = cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]
    ths = cfg.get("target_hidden_size")
    if ths is not None and ths != H:
        raise UnsupportedFormatError(
            f"{src.path}/config.json: target_hidden_size={ths} differs from the draft hidden_size={H}; Speculators "
            "P-EAGLE requires the draft and verifier hidden sizes to be equal",
            format_id=conv.format_id,
        )
    common.check_verifier_shape(src, verifier, H, V, findings)
    return V, H, L


def _plan_tensors(conv: Any, src: SourceInfo, opts: ConvertOptions, layout: PEagleLayout, A: int, H: int):
    """Tensor plans with ``mask_hidden`` reshaped to ``[1, 1, A·H]``."""
    names = src.store.names()
    mh_src = next((n for n in names if layout.rename(n) == "mask_hidden"), None)
    if mh_src is None:
        raise InvalidInputError(
            f"{src.path}: no mask_hidden tensor — the learned stand-in for the aux features at depth ≥ 1 is "
            "required by vLLM and speculators would silently random-initialise it",
            code="missing_tensor",
        )
    mh_shape = src.shape(mh_src)
    if math.prod(mh_shape) != A * H:
        raise InvalidInputError(
            f"{mh_src} has shape {list(mh_shape)} ({math.prod(mh_shape)} values) but {A} aux layers × hidden {H} "
            f"needs {A * H} ([1, 1, {A * H}])",
            code="mask_hidden_shape",
        )
    plans, dropped = common.tensor_plan(
        src, opts, accept=PEAGLE_ACCEPT, rename=layout.rename, drop={**TRAINING_ONLY, **layout.drop},
        reshape={"mask_hidden": (1, 1, A * H)}, format_title=conv.title,
    )
    mh = common.get(plans, "mask_hidden")
    assert mh is not None  # found above and accepted
    if mh.fate == "reshaped":
        mh.note = f"{list(mh_shape)} → [1, 1, {A * H}] (same values)"
    return plans, dropped


def _check_body(src: SourceInfo, plans: list[TensorPlan], L: int, A: int, H: int, ids_key: str) -> None:
    """Layers, ``fc``, the first layer's ``hidden_norm`` and the q/k/v input widths."""
    common.check_layers(src, plans, L)
    common.check_fc_width(src, plans, A, H, ids_key)
    for p in plans:
        m = re.fullmatch(r"layers\.(\d+)\.hidden_norm\.weight", p.out)
        if m and m.group(1) != "0":
            raise InvalidInputError(f"{p.source}: only the first P-EAGLE layer has a hidden_norm",
                                    code="unexpected_tensor")
    if common.get(plans, "layers.0.hidden_norm.weight") is None:
        raise InvalidInputError(f"{src.path}: no layers.0.hidden_norm.weight (the first P-EAGLE "
                                "layer's fc-feature norm)",
                                code="missing_tensor")
    for layer in range(L):
        want = 2 * H if layer == 0 else H
        for proj in ("q", "k", "v"):
            n = f"layers.{layer}.self_attn.{proj}_proj.weight"
            proj_plan = common.get(plans, n)
            if proj_plan is None:
                raise InvalidInputError(f"{src.path}: missing {n}", code="missing_tensor")
            d = int(proj_plan.shape[-1])
            if d != want:
                raise InvalidInputError(
                    f"{proj_plan.source} takes {d} inputs, expected {want} "
                    + ("(layer 0 attends over cat(embedding, fc feature) = 2·hidden)" if layer == 0 else "(hidden)"),
                    code="tensor_shape",
                )


def _model_type(src: SourceInfo, cfg: dict[str, Any], plans: list[TensorPlan], L: int, findings: list) -> str:
    """``qwen3`` when the layers have per-head q/k norms (all of them), else ``llama``."""
    from specconv.format import Finding

    has_qk_norm = any(re.fullmatch(r"layers\.\d+\.self_attn\.(q|k)_norm\.weight", p.out) for p in plans)
    model_type = "qwen3" if has_qk_norm else "llama"
    if cfg.get("model_type") not in (None, model_type):
        findings.append(Finding(
            "info", "peagle-model-type-from-tensors",
            f"source model_type {cfg.get('model_type')!r}; the layers {'have' if has_qk_norm else 'lack'} per-head "
            f"q/k norms, so transformer_layer_config.model_type is {model_type!r}",
            "transformer_layer_config.model_type",
        ))
    if has_qk_norm:
        for layer in range(L):
            for q in ("q", "k"):
                if common.get(plans, f"layers.{layer}.self_attn.{q}_norm.weight") is None:
                    raise InvalidInputError(f"{src.path}: layer {layer} lacks self_attn.{q}_norm "
                                            "(other layers have it)",
                                            code="missing_tensor")
    return model_type


def norm_flags_from_tensors(src: SourceInfo, cfg: dict[str, Any], plans: list[TensorPlan], A: int) -> tuple[bool, bool]:
    """``(norm_before_fc, fc_norm)`` from the tensors (``input_norm`` / ``fc_norm.{i}``); config must agree."""
    has_input_norm = common.get(plans, "input_norm.weight") is not None
    has_fc_norm = any(re.fullmatch(r"fc_norm\.\d+\.weight", p.out) for p in plans)
    for key, have, what in (("norm_before_fc", has_input_norm, "input_norm.weight is"),
                            ("fc_norm", has_fc_norm, "fc_norm.* tensors are")):
        v = cfg.get(key)
        if v is not None and bool(v) != have:
            raise InvalidInputError(
                f"{src.path}/config.json: {key}={str(v).lower()} but {what} {'present' if have else 'absent'}",
                code="conflicting_keys",
            )
    if has_input_norm and has_fc_norm:
        raise InvalidInputError(f"{src.path}: both input_norm (norm_before_fc) and fc_norm.* "
                                "tensors; they are exclusive")
    if has_fc_norm:
        got = sorted(int(p.out.split(".")[1]) for p in plans if p.out.startswith("fc_norm."))
        if got != list(range(A)):
            raise InvalidInputError(f"{src.path}: fc_norm.* indices {got} do not match {A} aux layers",
                                    code="tensor_shape")
    return has_input_norm, has_fc_norm


def logical_vocab(verifier: VerifierView | None, V: int) -> int | None:
    """The verifier's config ``vocab_size`` when below the draft's target vocab ``V`` (a padded embedding)."""
    return verifier.vocab_size if verifier is not None and verifier.vocab_size < V else None


def _vocab(src: SourceInfo, opts: ConvertOptions, cfg: dict[str, Any], plans, dropped, layout: PEagleLayout,
           V: int, H: int, verifier: VerifierView | None):
    """Draft vocabulary size (config, else the LM head's rows, else ``V``) and its mapping."""
    lm = common.get(plans, "lm_head.weight")
    if lm is not None and (len(lm.shape) != 2 or lm.shape[1] != H):
        raise InvalidInputError(f"{lm.source} has shape {list(lm.shape)}, expected [draft_vocab_size, {H}]",
                                code="tensor_shape")
    vd_cfg = cfg.get("draft_vocab_size")
    if vd_cfg is not None and not isinstance(vd_cfg, int):
        raise InvalidInputError(f"{src.path}/config.json: draft_vocab_size must be an integer, got {vd_cfg!r}")
    if lm is not None and vd_cfg is not None and lm.shape[0] != vd_cfg:
        raise InvalidInputError(
            f"{lm.source} has {lm.shape[0]} rows but config.json draft_vocab_size is {vd_cfg}", code="tensor_shape"
        )
    Vd = vd_cfg if vd_cfg is not None else (lm.shape[0] if lm is not None else V)
    vocab = resolve_vocab(src, opts, vocab_size=V, draft_vocab_size=Vd, extra=layout.vocab_extra,
                             extra_label=layout.vocab_extra_label, logical_vocab_size=logical_vocab(verifier, V))
    plans, dropped = merge_vocab(plans, dropped, vocab)
    return plans, dropped, vocab, Vd


def _from_verifier(src: SourceInfo, verifier: VerifierView, out: str, role: str, out_dt: str, note: str) -> TensorPlan:
    name = verifier.find_tensor(role)
    if name is None:
        what = "LM head" if role == "lm_head" else "embedding"
        raise InvalidInputError(f"{src.path}: no {out} and the verifier has no {what} tensor", code="missing_tensor")
    info = verifier.tensor_info(name)
    return TensorPlan(out, "from_verifier", "verifier", name, tuple(info.shape), out_dt, info.dtype, note=note)


def _head_and_embedding(src: SourceInfo, verifier: VerifierView | None, plans: list[TensorPlan], V: int, Vd: int,
                        H: int,
                        out_dt: str, findings: list) -> None:
    """``lm_head [Vd, H]`` and ``embed_tokens [V, H]`` from the source, else the verifier's."""
    from specconv.format import Finding

    lm = common.get(plans, "lm_head.weight")
    if lm is None:
        if Vd != V or verifier is None:
            raise InvalidInputError(
                f"{src.path}: no lm_head.weight; a draft-vocabulary ({Vd}) head cannot be taken from the verifier",
                code="missing_tensor",
            )
        plans.append(_from_verifier(src, verifier, "lm_head.weight", "lm_head", out_dt,
                                    "the source has no LM head: the verifier's is what the runtime shares"))
        findings.append(Finding("warning", "lm-head-from-verifier",
                                "the source ships no lm_head; the verifier's LM head is written (vLLM "
                                "shares it when absent)",
                                "lm_head.weight"))
    elif tuple(lm.shape) != (Vd, H):
        raise InvalidInputError(f"{lm.source} has shape {list(lm.shape)}, expected [{Vd}, {H}]", code="tensor_shape")
    emb = common.get(plans, "embed_tokens.weight")
    if emb is None:
        if verifier is None:
            raise InvalidInputError(f"{src.path}: no embed_tokens.weight", code="missing_tensor")
        plans.append(_from_verifier(src, verifier, "embed_tokens.weight", "embed", out_dt,
                                    "the source has no embedding: the runtime shares the verifier's"))
        findings.append(Finding("info", "embed-from-verifier",
                                "the source ships no embed_tokens (vLLM then shares the target's); the "
                                "verifier's embedding "
                                "is written so speculators uses the same one", "embed_tokens.weight"))
    elif tuple(emb.shape) != (V, H):
        raise InvalidInputError(f"{emb.source} has shape {list(emb.shape)}, expected [{V}, {H}]", code="tensor_shape")


def _speculative_tokens(src: SourceInfo, opts: ConvertOptions, layout: PEagleLayout,
                        notes: list[str]) -> tuple[int, int | None]:
    """``(K, trained depths)``: K = ``--speculative-tokens`` or the trained depths (never more)."""
    trained, k_key = common.one_of(src, layout.k_locations, "trained number of depths")
    if trained is not None and not is_int(trained, minimum=1):
        raise InvalidInputError(f"{src.path}/config.json: {k_key} must be a positive integer, got {trained!r}")
    k = opts.speculative_tokens
    if k is not None and k < 1:
        raise InvalidInputError(f"--speculative-tokens must be ≥ 1, got {k}")
    if trained is not None and k is not None and k > trained:
        raise InvalidInputError(
            f"--speculative-tokens {k} exceeds the {trained} depths the drafter was trained with ({k_key})",
            code="conflicting_speculative_tokens",
        )
    if k is None:
        if trained is None:
            raise InvalidInputError(
                f"{src.path}/config.json does not record the number of depths the drafter was trained with "
                f"(looked at {', '.join(key for key, _ in layout.k_locations) or 'nothing'})",
                code="missing_speculative_tokens",
                hint="pass --speculative-tokens K (the trained K, e.g. from the model card; never more than "
                     "trained)",
            )
        notes.append(f"speculative_tokens = {trained} (trained depths, {k_key})")
        return trained, trained
    notes.append(f"speculative_tokens = {k} (--speculative-tokens"
                 + (f"; trained {trained} per {k_key})" if trained else ")"))
    return k, trained


def _peagle_layer_config(src: SourceInfo, cfg: dict[str, Any], layout: PEagleLayout, model_type: str, L: int, A: int,
                         plans: list[TensorPlan], notes: list[str], findings: list) -> dict[str, Any]:
    layer_config = common.layer_config(src, cfg, model_type=model_type,
                                       extra_drop=PEAGLE_NON_LAYER_KEYS + layout.layer_drop,
                          findings=findings)
    common.complete_layer_config(src, layer_config, plans, findings)
    if ("layer_types" not in layer_config and layer_config.get("sliding_window") in (None, 0)
            and not layer_config.get("use_sliding_window")):
        layer_config["layer_types"] = ["full_attention"] * L
    if model_type == "llama" and A != 3:
        layer_config["num_aux_hidden_states"] = A
        notes.append(f"transformer_layer_config.num_aux_hidden_states = {A} (vLLM's Llama eagle3 "
                     "sizes fc for 3 otherwise)")
    return layer_config


def _peagle_config(fields: dict[str, Any]) -> Any:
    """The typed ``peagle`` config (``target_hidden_size`` none: equal to the verifier's; trainable embedding)."""
    from specconv.format import make_config

    return make_config("peagle", speculators_version=SPECULATORS_FORMAT_VERSION, target_hidden_size=None,
                       embed_requires_grad=True, **fields)


def plan_peagle_family(conv: Any, src: SourceInfo, verifier: VerifierView | None, opts: ConvertOptions,
                       layout: PEagleLayout) -> ConversionPlan:
    """Build the Speculators ``peagle`` plan for a P-EAGLE source.

    Raises:
        InvalidInputError: a missing/contradictory fact, naming the key, tensor or flag.
        UnsupportedFormatError: tensors with no Speculators equivalent, or ``target_hidden_size`` ≠ hidden size.
    """
    from specconv.format import Finding

    cfg = src.config or {}
    findings: list = [Finding(lvl, code, msg, None) for lvl, code, msg in layout.findings]
    notes: list[str] = list(layout.notes)
    V, H, L = _shape_keys(conv, src, cfg, verifier, findings)
    mask, mask_where = _mask_token(src, opts, layout, verifier, V)
    ids = resolve_aux_ids(src, opts, layout, verifier, findings)
    A = len(ids.speculators_ids)
    plans, dropped = _plan_tensors(conv, src, opts, layout, A, H)
    _check_body(src, plans, L, A, H, ids.source_key or "--aux-layer-ids")
    model_type = _model_type(src, cfg, plans, L, findings)
    norm_before_residual, norm_before_residual_where = resolve_norm_before_residual(
        f"{src.path}/config.json", cfg.get("norm_before_residual"), opts.norm_before_residual, _NBR_DEFAULTS)
    has_input_norm, has_fc_norm = norm_flags_from_tensors(src, cfg, plans, A)
    plans, dropped, vocab, Vd = _vocab(src, opts, cfg, plans, dropped, layout, V, H, verifier)
    findings += vocab.findings
    notes += vocab.notes
    out_dt = common.out_dtype(common.source_dtype(src, [p.source for p in plans
                                                        if p.origin == "source" and p.source in src.store]),
                         opts)
    if common.get(plans, "lm_head.weight") is not None:
        findings.append(lm_head_finding(conv.format_id, conv.title))
    _head_and_embedding(src, verifier, plans, V, Vd, H, out_dt, findings)
    k, trained = _speculative_tokens(src, opts, layout, notes)
    layer_config = _peagle_layer_config(src, cfg, layout, model_type, L, A, plans, notes, findings)
    common.kv_page_finding(layer_config, verifier, findings)
    fields: dict[str, Any] = dict(
        dtype=common.dtype_name(out_dt), draft_vocab_size=Vd, mask_token_id=mask,
        eagle_aux_hidden_state_layer_ids=ids.speculators_ids, norm_before_residual=norm_before_residual,
        norm_before_fc=has_input_norm, fc_norm=has_fc_norm, norm_output=bool(cfg.get("norm_output", False)),
        transformer_layer_config=layer_config, speculators_config=speculators_envelope("peagle", k, verifier),
    )
    if trained is not None:
        fields["num_depths"] = trained
    notes[:0] = [f"mask_token_id from {mask_where}", f"norm_before_residual from {norm_before_residual_where}"]
    return ConversionPlan(
        format_id=conv.format_id, algorithm="peagle", config=_peagle_config(fields), tensors=plans,
        dropped=dropped, source_dir=src.path, source_files=[src.path / f for f in src.files], findings=findings,
        layer_ids=ids, options=opts.to_dict(), notes=notes,
    )


__all__ = ["PEagleLayout", "peagle_layout", "plan_peagle_family", "resolve_aux_ids", "strip_prefix_rename",
           "PEAGLE_ACCEPT"]
