"""Mapping helpers shared by converters (layer ids, mask token, block size, tensors; docs/adding_a_converter.md)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from specconv.errors import InvalidInputError, UnsupportedFormatError
from specconv.format import names
from specconv.plan import DroppedTensor, Fate, LayerIdConversion, TensorPlan
from specconv.values import is_int

from .base import ConvertOptions, SourceInfo

if TYPE_CHECKING:
    from specconv.format.verifier_facts import VerifierView

FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}
INT32_MAX = 2**31 - 1
DTYPE_FLAG = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}

#: Qwen3-style decoder layer tensors shared by DFlash, DSpark and P-EAGLE bodies.
LAYER_PATTERNS = names.LAYER_PATTERNS
DFLASH_BODY = names.BLOCK_BODY_PATTERNS
#: Present in some sources; identical to the verifier's (full vocab) — kept, vLLM shares them.
VERIFIER_COPIES = names.VERIFIER_SHARED_PATTERNS
DSPARK_HEADS = names.DSPARK_HEAD_PATTERNS
#: Buffers recomputed from the config at load time (never trained).
RECOMPUTED = {r"(.*\.)?rotary_emb\.inv_freq": "RoPE inverse frequencies are recomputed from rope_theta"}

#: Source config keys that are not part of the draft decoder config.
NON_LAYER_KEYS = {
    "architectures", "auto_map", "block_size", "dflash_config", "num_target_layers",
    "dtype", "torch_dtype", "transformers_version", "_name_or_path", "mask_token_id",
    "target_layer_ids", "speculators_model_type", "speculators_config", "quantization_config",
    "num_anchors", "markov_rank", "markov_head_type", "enable_confidence_head",
    "confidence_head_with_markov", "sample_from_anchor", "target_model_type",
    "target_text_model_type", "is_causal", "use_cache",
}


def fullmatch_any(name: str, patterns: Iterable[str]) -> bool:
    return any(re.fullmatch(p, name) for p in patterns)


# --------------------------------------------------------------------------- config
def one_of(src: SourceInfo, keys: list[tuple[str, Any]], what: str) -> tuple[Any, str | None]:
    """The single value found under several (label, value) locations, and its label; raises
    InvalidInputError (``conflicting_keys``) when two disagree."""
    found = [(k, v) for k, v in keys if v is not None]
    if not found:
        return None, None
    first_k, first_v = found[0]
    for k, v in found[1:]:
        if v != first_v:
            raise InvalidInputError(
                f"{src.path}/config.json: {what} disagrees between {first_k}={first_v!r} and {k}={v!r}",
                code="conflicting_keys",
            )
    return first_v, first_k


def resolve_block_size(src: SourceInfo, nested: dict[str, Any] | None = None) -> int:
    """``block_size`` from top level and/or ``dflash_config`` (must agree; never defaulted)."""
    nested = src.dflash_config if nested is None else nested
    v, _ = one_of(src, [("block_size", src.cfg("block_size")), ("dflash_config.block_size", nested.get("block_size"))],
                  "block_size")
    if v is None:
        raise InvalidInputError(
            f"{src.path}/config.json has no block_size (top level or dflash_config); it is never defaulted",
            code="missing_block_size",
        )
    if not is_int(v, minimum=2):
        raise InvalidInputError(f"{src.path}/config.json: block_size must be an integer ≥ 2, got {v!r}")
    limit = src.cfg("max_position_embeddings")
    limit = limit if is_int(limit, minimum=1) else INT32_MAX
    if v > min(limit, INT32_MAX):
        raise InvalidInputError(
            f"{src.path}/config.json: block_size {v} exceeds "
            + (f"max_position_embeddings {limit}" if limit < INT32_MAX else "the int32 range")
        )
    return v


def resolve_mask_token(
    src: SourceInfo, opts: ConvertOptions, locations: list[tuple[str, Any]], verifier: VerifierView | None
) -> tuple[int, str]:
    """``(id, where)`` of the mask token from the checkpoint (all locations must agree) or ``--mask-token-id``.

    Raises InvalidInputError when absent everywhere, when the flag contradicts the checkpoint, or
    when the id is outside the verifier vocab (a special-token id is the lint's ``mask-token-special``).
    """
    ckpt, where = one_of(src, locations, "mask token id")
    if ckpt is not None and opts.mask_token_id is not None and ckpt != opts.mask_token_id:
        raise InvalidInputError(
            f"--mask-token-id {opts.mask_token_id} contradicts the checkpoint's {where}={ckpt}",
            code="conflicting_mask_token",
        )
    mask = ckpt if ckpt is not None else opts.mask_token_id
    where = where if ckpt is not None and where is not None else "--mask-token-id"
    if mask is None:
        raise InvalidInputError(
            f"{src.path}/config.json records no mask token id (looked at {', '.join(k for k, _ in locations)})",
            code="missing_mask_token",
            hint="pass the id the drafter was trained with: --mask-token-id N",
        )
    if not is_int(mask, minimum=0):
        raise InvalidInputError(f"mask token id must be a non-negative integer, got {mask!r} ({where})")
    if verifier is not None and mask >= verifier.vocab_size:
        raise InvalidInputError(
            f"mask token id {mask} ({where}) is outside the verifier vocab ({verifier.vocab_size})",
            code="mask_token_out_of_vocab",
        )
    return mask, where


def zlab_to_speculators_ids(
    src: SourceInfo, ids: Any, key: str, opts: ConvertOptions, verifier: VerifierView | None, findings: list, *,
    allow_minus_one: bool = False
) -> LayerIdConversion:
    """Convert z-lab-convention target layer ids to Speculators aux ids (+1; -1 → 0; docs/adding_a_converter.md);
    ``--aux-layer-ids`` overrides and is recorded."""
    from specconv.format import Finding

    if ids is not None:
        if not isinstance(ids, list) or not all(is_int(i) for i in ids) or not ids:
            raise InvalidInputError(f"{src.path}/config.json: {key} must be a non-empty list of integers, got {ids!r}")
        lo = -1 if allow_minus_one else 0
        bad = [i for i in ids if i < lo]
        if bad:
            raise InvalidInputError(f"{src.path}/config.json: {key} has invalid ids {bad}")
        converted = [0 if i == -1 else i + 1 for i in ids]
    if opts.aux_layer_ids is not None:
        ovr = list(opts.aux_layer_ids)
        if ids is not None and ovr != converted:
            findings.append(Finding(
                "warning", "aux-ids-override",
                f"--aux-layer-ids {ovr} replaces the checkpoint's {key}={ids} (→ {converted})",
                "aux_hidden_state_layer_ids",
            ))
        conv = LayerIdConversion(key if ids is not None else None, "override", ids, ovr,
                                 "explicit --aux-layer-ids (speculators convention)")
    elif ids is None:
        raise InvalidInputError(
            f"{src.path}/config.json has no {key}; layer ids are never recomputed from a formula",
            code="missing_layer_ids",
            hint="pass the ids the drafter was trained with (speculators convention, 0 = embeddings): "
                 "--aux-layer-ids 2,15,28",
        )
    else:
        rule = ("+1 (z-lab 0-based layer outputs → speculators capture ids)"
                + ("; -1 (embeddings) → 0" if allow_minus_one else ""))
        conv = LayerIdConversion(key, "z-lab", list(ids), converted, rule)
    _check_converted_ids(conv.speculators_ids, "--aux-layer-ids" if opts.aux_layer_ids is not None else key, verifier)
    return conv


def _check_converted_ids(s_ids: list[int], origin: str, verifier: VerifierView | None) -> None:
    """Non-empty, distinct, inside ``[0, n]`` of the verifier."""
    if not s_ids:
        raise InvalidInputError(f"aux layer ids (from {origin}) are empty")
    if len(set(s_ids)) != len(s_ids):
        raise InvalidInputError(f"aux layer ids {s_ids} (from {origin}) are not distinct")
    if verifier is None:
        return
    n = verifier.num_hidden_layers
    out = [i for i in s_ids if not 0 <= i <= n]
    if out:
        raise InvalidInputError(
            f"aux layer ids {out} (speculators convention, from {origin}) "
            f"are outside [0, {n}] for the verifier's {n} layers",
            code="layer_ids_out_of_range",
        )


def require_layer_types_for_swa(src: SourceInfo) -> None:
    """Refuse ``dflash_config.use_swa`` without ``layer_types`` (ModelOpt exports; NVIDIA/Model-Optimizer
    ``modelopt/torch/export/plugins/hf_spec_export.py``): which layers slide cannot be known."""
    if src.dflash_config.get("use_swa") and not src.cfg("layer_types"):
        raise InvalidInputError(
            f"{src.path}/config.json: dflash_config.use_swa is set but there is no layer_types list; "
            "which layers slide cannot be known",
            code="missing_layer_types",
        )


#: M-RoPE keys: vLLM's drafters use 1-D RoPE, equal to M-RoPE for text (transformers ``modeling_rope_utils.py``).
MROPE_KEYS = ("mrope_section", "mrope_interleaved")


def _check_theta(where_file: str, where: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise InvalidInputError(f"{where_file}: {where} must be a positive number, got {v!r}",
                                code="invalid_rope_theta")
    return float(v)


def rope_theta_of(cfg: dict[str, Any], where_file: str = "config.json") -> float | None:
    """``rope_theta`` from ``rope_parameters`` and/or the top level (``None`` when absent).

    Raises InvalidInputError: not a positive finite number (``invalid_rope_theta``), or the two
    locations disagree (``conflicting_rope``).
    """
    rp = cfg.get("rope_parameters")
    found = [(where, _check_theta(where_file, where, v)) for where, v in (
        ("rope_parameters.rope_theta", rp.get("rope_theta") if isinstance(rp, dict) else None),
        ("rope_theta", cfg.get("rope_theta"))) if v is not None]
    if len(found) == 2 and found[0][1] != found[1][1]:
        raise InvalidInputError(
            f"{where_file}: {found[0][0]}={found[0][1]!r} and {found[1][0]}={found[1][1]!r} disagree; "
            "which one the drafter was trained with cannot be told", code="conflicting_rope",
        )
    return found[0][1] if found else None


def _rope_dict(cfg: dict[str, Any], key: str, where_file: str) -> dict[str, Any]:
    v = cfg.get(key)
    if v is not None and not isinstance(v, dict):
        raise InvalidInputError(f"{where_file}: {key} must be an object or null, got {v!r}")
    return dict(v or {})


def resolve_rope(cfg: dict[str, Any], where_file: str, findings: list | None = None) -> dict[str, Any] | None:
    """One ``rope_parameters`` dict (with ``rope_type``, ``rope_theta``) from ``rope_theta`` /
    ``rope_parameters`` / ``rope_scaling``, ``None`` without a θ; M-RoPE keys stripped with a finding.

    Raises InvalidInputError: ``conflicting_rope`` naming both keys, or a malformed value.
    """
    theta = rope_theta_of(cfg, where_file)
    rp = _rope_dict(cfg, "rope_parameters", where_file)
    for k, v in _rope_dict(cfg, "rope_scaling", where_file).items():
        k = "rope_type" if k == "type" else k
        if k in rp and rp[k] != v:
            raise InvalidInputError(
                f"{where_file}: rope_scaling.{k}={v!r} and rope_parameters.{k}={rp[k]!r} disagree",
                code="conflicting_rope",
            )
        rp[k] = v
    if theta is None:
        return None
    if "rope_theta" in rp and rp["rope_theta"] != theta:
        raise InvalidInputError(f"{where_file}: rope_scaling.rope_theta={rp['rope_theta']!r} and rope θ {theta!r} "
                                "disagree", code="conflicting_rope")
    _strip_mrope(rp, where_file, findings)
    rp.setdefault("rope_type", "default")
    rp["rope_theta"] = theta
    return rp


def _strip_mrope(rp: dict[str, Any], where_file: str, findings: list | None) -> None:
    stripped = {k: rp.pop(k) for k in MROPE_KEYS if k in rp}
    if rp.get("rope_type") == "mrope":
        stripped["rope_type"] = rp.pop("rope_type")
    if not stripped:
        return
    if findings is None:
        raise InvalidInputError(f"{where_file}: M-RoPE keys {sorted(stripped)} in the drafter's RoPE config; "
                                "vLLM's drafters use 1-D RoPE", code="mrope_unsupported")
    from specconv.format import Finding

    findings.append(Finding(
        "warning", "mrope-stripped",
        f"{where_file}: M-RoPE keys {stripped} removed from the drafter's RoPE config: vLLM's drafter classes use "
        "1-D RoPE and reject them; for text positions the three M-RoPE sections are equal, so 1-D RoPE computes "
        "the same rotation", "transformer_layer_config.rope_parameters",
    ))


def _check_layer_ints(src: SourceInfo, out: dict[str, Any]) -> None:
    for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if not is_int(out.get(k)):
            raise InvalidInputError(f"{src.path}/config.json: missing integer {k!r}", code="missing_key")
    for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim"):
        v = out.get(k)
        if k in out and v is not None and not is_int(v, minimum=1):
            raise InvalidInputError(f"{src.path}/config.json: {k} must be a positive integer, got {v!r}",
                                    code="invalid_key")
    lt = out.get("layer_types")
    if lt is not None and (not isinstance(lt, list) or not all(isinstance(t, str) for t in lt)):
        raise InvalidInputError(f"{src.path}/config.json: layer_types must be a list of strings, got {lt!r}")


def layer_config(src: SourceInfo, cfg: dict[str, Any], *, model_type: str, extra_drop: Iterable[str] = (),
                 findings: list | None = None) -> dict[str, Any]:
    """``transformer_layer_config`` from a flat HF decoder config: wrapper keys dropped, RoPE as
    ``rope_parameters`` plus ``rope_theta`` (never defaulted: vLLM falls back to 1e6, transformers to 1e4).

    Raises InvalidInputError: no rope_theta, conflicting RoPE values, or a required shape key missing.
    """
    drop = NON_LAYER_KEYS | set(extra_drop)
    out = {k: v for k, v in cfg.items() if k not in drop}
    out["model_type"] = model_type
    rp = resolve_rope(cfg, f"{src.path}/config.json", findings)
    if rp is None:
        raise InvalidInputError(
            f"{src.path}/config.json has no rope_theta (top level or rope_parameters); it is never defaulted",
            code="missing_rope_theta",
        )
    out["rope_parameters"] = rp
    out["rope_theta"] = rp["rope_theta"]
    out.pop("rope_scaling", None)
    out["tie_word_embeddings"] = False
    _check_layer_ints(src, out)
    return out


def auto_config() -> Any:
    """transformers' ``AutoConfig``; MissingExtraError (exit 2) without the ``validate`` extra."""
    from specconv.extras import require

    return require("transformers", "validate", feature="filling omitted decoder-config keys from transformers' "
                   "config defaults").AutoConfig


def _class_default(model_type: str, key: str) -> Any:
    return auto_config().for_model(model_type).to_dict().get(key)


def complete_layer_config(src: SourceInfo, layer_config: dict[str, Any], plans: list[TensorPlan],
                          findings: list) -> None:
    """Fill the decoder keys a flat source config may omit (docs/adding_a_converter.md), each fill a finding.

    Raises InvalidInputError: a projection's rows do not divide by the head count.
    """
    from specconv.format import Finding

    filled = []
    nq, H = layer_config["num_attention_heads"], layer_config["hidden_size"]
    q, k = get(plans, "layers.0.self_attn.q_proj.weight"), get(plans, "layers.0.self_attn.k_proj.weight")
    if layer_config.get("head_dim") is None:
        if q is None:
            layer_config["head_dim"], why = H // nq, "hidden_size / num_attention_heads (no q_proj)"
        elif q.shape[0] % nq:
            raise InvalidInputError(f"{q.source} has {q.shape[0]} rows, not a multiple of num_attention_heads {nq}")
        else:
            layer_config["head_dim"], why = q.shape[0] // nq, f"{q.source} rows / num_attention_heads"
        filled.append(f"head_dim={layer_config['head_dim']} ({why})")
    if layer_config.get("num_key_value_heads") is None:
        hd = layer_config["head_dim"]
        layer_config["num_key_value_heads"] = nq if k is None else k.shape[0] // hd
        filled.append(f"num_key_value_heads={layer_config['num_key_value_heads']} "
                      + ("(= num_attention_heads, no k_proj)" if k is None else f"({k.source} rows / head_dim)"))
    if layer_config.get("attention_bias") is None:
        layer_config["attention_bias"] = get(plans, "layers.0.self_attn.q_proj.bias") is not None
        filled.append(f"attention_bias={str(layer_config['attention_bias']).lower()} (q_proj.bias "
                      f"{'present' if layer_config['attention_bias'] else 'absent'})")
    for key in ("rms_norm_eps", "hidden_act"):
        if layer_config.get(key) is None:
            layer_config[key] = _class_default(layer_config["model_type"], key)
            filled.append(f"{key}={layer_config[key]!r} (transformers' {layer_config['model_type']} config default)")
    if filled:
        findings.append(Finding("info", "layer-config-filled",
                                f"{src.path}/config.json omits decoder keys; filled " + "; ".join(filled),
                                "transformer_layer_config"))


def kv_page_finding(layer_config: dict[str, Any], verifier: VerifierView | None, findings: list) -> None:
    """Warn when the drafter's and the verifier's per-token KV widths do not divide (vLLM
    ``vllm/v1/core/kv_cache_utils.py`` ``unify_kv_cache_spec_page_size``; docs/adding_a_converter.md)."""
    if verifier is None:
        return
    vc = verifier.config
    v_hd = vc.get("head_dim") or (vc.get("hidden_size", 0) // max(int(vc.get("num_attention_heads") or 1), 1))
    v_kv = vc.get("num_key_value_heads") or vc.get("num_attention_heads")
    if not all(isinstance(x, int) and x > 0 for x in (v_hd, v_kv)):
        return
    d = layer_config["num_key_value_heads"] * layer_config["head_dim"]
    v = v_kv * v_hd
    if max(d, v) % min(d, v):
        from specconv.format import Finding

        findings.append(Finding(
            "warning", "kv-page-size-mismatch",
            f"drafter KV width {layer_config['num_key_value_heads']}×{layer_config['head_dim']} = {d} per token "
            f"and the verifier's {v_kv}×{v_hd} = {v} do not divide: vLLM's KV cache may not page them together "
            "(unify_kv_cache_spec_page_size raises NotImplementedError unless the attention backend pads pages)",
            "transformer_layer_config.head_dim",
        ))


def source_dtype(src: SourceInfo, names: Iterable[str]) -> str:
    """The float dtype of the draft body (first float tensor), e.g. ``BF16``."""
    for n in names:
        dt = src.store.info(n).dtype
        if dt in FLOAT_DTYPES:
            return dt
    return "BF16"


def dtype_name(st_dtype: str) -> str:
    return {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}.get(st_dtype, st_dtype.lower())


# --------------------------------------------------------------------------- tensors
def out_dtype(src_dtype: str, opts: ConvertOptions) -> str:
    if opts.dtype == "keep" or src_dtype not in FLOAT_DTYPES:
        return src_dtype
    return DTYPE_FLAG[opts.dtype]


def tensor_plan(
    src: SourceInfo, opts: ConvertOptions, *, accept: Iterable[str], rename: Callable[[str], str] | None = None,
    drop: dict[str, str] | None = None, refuse: dict[str, str] | None = None,
    reshape: dict[str, tuple[int, ...]] | None = None, format_title: str = "",
) -> tuple[list[TensorPlan], list[DroppedTensor]]:
    """Plan every source tensor: accepted (``accept`` regexes full-match the output name after ``rename``),
    dropped (``drop``: source-name regex → reason), refused (``refuse`` regex → reason, or unmatched);
    ``reshape``: output name → new shape (same bytes).

    Raises:
        UnsupportedFormatError: one or more tensors refused (all are listed).
    """
    rename, drop, refuse = rename or (lambda n: n), {**RECOMPUTED, **(drop or {})}, refuse or {}
    plans: list[TensorPlan] = []
    dropped: list[DroppedTensor] = []
    refused: list[str] = []
    seen: dict[str, str] = {}
    for name in src.store.names():
        reason = next((r for p, r in refuse.items() if re.fullmatch(p, name)), None)
        if reason:
            refused.append(f"{name} ({reason})")
            continue
        reason = next((r for p, r in drop.items() if re.fullmatch(p, name)), None)
        if reason:
            dropped.append(DroppedTensor(name, reason))
            continue
        out = rename(name)
        if not fullmatch_any(out, accept):
            refused.append(f"{name} (no Speculators equivalent)")
            continue
        if out in seen:
            raise InvalidInputError(f"tensors {seen[out]!r} and {name!r} both map to {out!r}")
        seen[out] = name
        plans.append(_source_plan(src, opts, name, out, (reshape or {}).get(out)))
    if refused:
        raise _refused(refused, format_title)
    return plans, dropped


def _refused(refused: list[str], format_title: str) -> UnsupportedFormatError:
    title = f" ({format_title})" if format_title else ""
    return UnsupportedFormatError(
        f"{len(refused)} source tensor(s){title} cannot be converted faithfully and are refused: "
        + "; ".join(refused[:20]) + (" ..." if len(refused) > 20 else ""),
        code="refused_tensors",
    )


def _source_plan(src: SourceInfo, opts: ConvertOptions, name: str, out: str, new_shape: Any) -> TensorPlan:
    """One accepted source tensor: copied, renamed, or reshaped (same bytes) to ``new_shape``."""
    info = src.store.info(name)
    shape = tuple(info.shape)
    fate: Fate = "copied" if out == name else "renamed"
    if new_shape is not None and tuple(new_shape) != shape:
        new = tuple(new_shape)
        if math.prod(new) != math.prod(shape):
            raise InvalidInputError(f"cannot reshape {name} {list(shape)} to {list(new)}")
        shape, fate = new, "reshaped"
    return TensorPlan(out=out, fate=fate, origin="source", source=name, shape=shape,
                      dtype=out_dtype(info.dtype, opts), src_dtype=info.dtype)


def get(plans: list[TensorPlan], out: str) -> TensorPlan | None:
    return next((p for p in plans if p.out == out), None)


def check_fc_width(src: SourceInfo, plans: list[TensorPlan], n_aux: int, hidden: int, ids_key: str) -> None:
    """``fc.weight`` must be ``[H, A·H]``; error naming both numbers otherwise."""
    fc = get(plans, "fc.weight")
    if fc is None:
        raise InvalidInputError(f"{src.path}: no fc.weight tensor (draft body incomplete)", code="missing_tensor")
    if tuple(fc.shape) != (hidden, n_aux * hidden):
        raise InvalidInputError(
            f"fc.weight has shape {list(fc.shape)} but {n_aux} aux layer ids ({ids_key}) × hidden {hidden} "
            f"needs [{hidden}, {n_aux * hidden}]",
            code="fc_width_mismatch",
        )


def check_layers(src: SourceInfo, plans: list[TensorPlan], n_layers: int) -> None:
    idx = {int(m.group(1)) for p in plans if (m := re.match(r"layers\.(\d+)\.", p.out))}
    if len(idx) != n_layers or idx != set(range(n_layers)):  # len first: never build a huge range
        raise InvalidInputError(
            f"{src.path}: config says num_hidden_layers={n_layers} but tensors hold layers {sorted(idx)}",
            code="layer_count_mismatch",
        )
    if not any(p.out == "norm.weight" for p in plans):
        raise InvalidInputError(f"{src.path}: no norm.weight (final norm) tensor", code="missing_tensor")


def verifier_embedding_rows(verifier: VerifierView) -> int | None:
    """Rows of the verifier's input embedding (``None`` when it has none): the padded
    vocabulary size when ``vocab_size`` in its config is the logical one."""
    name = verifier.find_tensor("embed")
    return None if name is None else int(verifier.tensor_info(name).shape[0])


def check_verifier_shape(src: SourceInfo, verifier: VerifierView | None, hidden: int, vocab: int,
                         findings: list | None = None) -> None:
    """The draft's hidden size and target vocabulary must be the verifier's (its config ``vocab_size``, or
    the rows of a padded embedding: an info finding).

    Raises InvalidInputError: ``verifier_mismatch`` naming both numbers.
    """
    if verifier is None:
        return
    if hidden != verifier.hidden_size:
        raise InvalidInputError(
            f"draft hidden_size {hidden} != verifier hidden_size {verifier.hidden_size} ({verifier.spec})",
            code="verifier_mismatch",
        )
    if vocab == verifier.vocab_size:
        return
    rows = verifier_embedding_rows(verifier)
    if rows != vocab:
        raise InvalidInputError(
            f"draft target vocab_size {vocab} != verifier vocab_size {verifier.vocab_size}"
            + (f" (and its embedding's {rows} rows)" if rows is not None else "") + f" ({verifier.spec})",
            code="verifier_mismatch",
        )
    if findings is not None:
        from specconv.format import Finding

        findings.append(Finding(
            "info", "verifier-vocab-padded",
            f"draft target vocab_size {vocab} equals the rows of the verifier's embedding; its config vocab_size "
            f"{verifier.vocab_size} is the logical vocabulary (the embedding is padded)", "vocab_size",
        ))


def dflash_causality(src: SourceInfo, layer_config: dict[str, Any], findings: list) -> bool:
    """Return ``sliding_window_non_causal`` for a DFlash-family source (vLLM
    ``vllm/model_executor/models/qwen3_dflash.py``; z-lab ``dflash/model.py``; docs/adding_a_converter.md)."""
    from specconv.format import Finding

    causal, where = one_of(src, [("is_causal", src.cfg("is_causal")),
                                 ("dflash_config.causal", src.dflash_config.get("causal"))], "causality")
    if causal is not None and not isinstance(causal, bool):
        raise InvalidInputError(f"{src.path}/config.json: {where} must be true or false, got {causal!r}")
    n = layer_config["num_hidden_layers"]
    types = layer_config.get("layer_types") or ["full_attention"] * min(n, 1)  # absent: all full attention
    if causal is True:
        raise UnsupportedFormatError(
            f"{src.path}: {where}=true makes every draft layer block-causal (JetSpec-style causal DFlash); "
            "Speculators DFlash full-attention layers are always bidirectional, so the conversion would not be "
            "faithful",
            format_id="causal_dflash",
        )
    if causal is False:
        return True
    if "sliding_attention" in types and "full_attention" in types:
        findings.append(Finding(
            "warning", "mixed-attention-layers",
            "draft mixes full and sliding layers: vLLM ≥ 0.27 applies one causality to all layers, so it "
            "cannot serve it faithfully",
            "layer_types",
        ))
    return "sliding_attention" not in types
