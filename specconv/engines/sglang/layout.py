"""SGLang's layout of a Speculators drafter: the config rewrite, the refusals, the serve line
(docs/sglang.md; SGLang facts from :class:`specconv.format.algorithms.SglangFacts`). Config and tensor
names only (no torch): refusals are decided before any weight is read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import InvalidInputError
from ...values import is_int

__all__ = ["LAUNCHER", "TARGET_SUPPLIED", "SglangLayout", "launch_argv", "launch_command", "layer_causality",
           "sglang_layout"]

#: the tensors SGLang's DFlash / DSpark classes take from the target, never from the draft
#: checkpoint (their ``load_weights`` skips them without a word)
TARGET_SUPPLIED = ("embed_tokens.weight", "lm_head.weight")
#: how SGLang's server is started (``sglang/launch_server.py``)
LAUNCHER = ("python", "-m", "sglang.launch_server")
#: the DSpark confidence head's tensors (``srt/models/dspark.py`` ``DSparkConfidenceHead``)
_CONFIDENCE_PREFIX = "confidence_head."
#: Speculators top-level keys whose meaning the SGLang config carries in its own keys
_TRANSLATED = ("architectures", "aux_hidden_state_layer_ids", "block_size", "dtype", "draft_vocab_size",
               "mask_token_id", "sample_from_anchor", "sliding_window_non_causal", "speculators_config",
               "speculators_model_type", "speculators_version", "target_hidden_size", "tie_word_embeddings",
               "transformer_layer_config")


@dataclass
class SglangLayout:
    """A Speculators drafter as SGLang reads it: ``config`` (flat), ``env`` the serve command (and
    the check) needs, ``expected``: what SGLang must resolve from it (docs/sglang.md), ``notes``:
    what the export could not prove or did not carry."""

    algorithm: str
    config: dict[str, Any]
    env: dict[str, str]
    expected: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def _refuse(code: str, message: str, hint: str | None = None) -> InvalidInputError:
    return InvalidInputError(message, code=code, hint=hint)


def layer_causality(layer_cfg: Mapping[str, Any], sliding_window_non_causal: bool) -> list[bool]:
    """Per draft layer, whether the block attends causally, as the Speculators reference does: a
    sliding-window layer unless ``sliding_window_non_causal``, never a full-attention one.

    Raises:
        InvalidInputError: ``sglang_layer_types``: a ``sliding_attention`` layer without a window.
    """
    from ...format.schema import effective_window, resolve_layer_types

    types = resolve_layer_types(layer_cfg)
    if "sliding_attention" in types and not effective_window(layer_cfg):
        raise _refuse("sglang_layer_types", "transformer_layer_config.layer_types has sliding_attention layers but "
                      "no window the drafter uses (sliding_window is null, or a qwen3 config without "
                      "use_sliding_window): Speculators runs them as full attention, SGLang would apply a window "
                      "or refuse them (srt/speculative/dflash_utils.py get_dflash_attention_sliding_window_size)")
    return [t == "sliding_attention" and not sliding_window_non_causal for t in types]


def _sglang_causal(types: Sequence[str], is_causal: bool | None) -> list[bool]:
    """SGLang's per-layer causality (``srt/models/dflash.py`` ``_get_dflash_layer_attention_params``)."""
    return [is_causal if is_causal is not None else t == "sliding_attention" for t in types]


def _is_causal(layer_cfg: Mapping[str, Any], causal: list[bool]) -> bool | None:
    """The ``is_causal`` to write: the layers' common value; None (omitted) when SGLang's
    per-layer-type default reproduces them.

    Raises:
        InvalidInputError: ``sglang_mixed_causality``: neither reproduces every layer.
    """
    from ...format.schema import resolve_layer_types

    if causal and (all(causal) or not any(causal)):
        return causal[0]
    if _sglang_causal(resolve_layer_types(layer_cfg), None) == causal:
        return None
    raise _refuse("sglang_mixed_causality", f"draft layers differ in causality ({causal}) in a way SGLang's one "
                  "global is_causal and its per-layer-type default cannot reproduce (srt/models/dflash.py)")


def _sglang_ids(aux: list[int] | None, offset: int, n_layers: int, key: str) -> list[int]:
    """The Speculators aux ids in SGLang's convention (``id + offset``); refuses none, id 0 and an id ≥
    the verifier's layer count (exit 3)."""
    if not aux:
        raise _refuse("sglang_aux_ids_missing", f"{key} is not set: SGLang needs the verifier layers to capture")
    if 0 in aux:
        raise _refuse("sglang_aux_id_embedding", f"{key} {aux} holds 0 (the embedding output): SGLang id = "
                      f"Speculators id {offset:+d} would be -1, which SGLang refuses "
                      "(srt/speculative/dflash_utils.py resolve_target_layer_ids)")
    final = [a for a in aux if a >= n_layers]
    if final:
        raise _refuse("sglang_aux_id_final_state", f"{key} {aux} holds {final[0]}, the final state of the "
                      f"{n_layers}-layer verifier: SGLang captures the input of layer id + 1 "
                      "(srt/models/llama.py, qwen3.py) and never the final state")
    return [a + offset for a in aux]


def _check_servable(alg: Any, cfg: Any, raw: Mapping[str, Any], names: Sequence[str]) -> None:
    """The refusals that need no verifier: the algorithm, the vocabulary, the block layout,
    the required keys, the fc width and the confidence head (exit 3, nothing written)."""
    facts = alg.sglang
    if facts.refusal or not facts.speculative_algorithm:
        raise _refuse("sglang_unsupported_algorithm", f"{alg.display_name}: {facts.refusal or 'no SGLang algorithm'}")
    if cfg.is_pruned or any(n in ("d2t", "t2d") for n in names):
        head = "; a pruned markov_head.markov_w2 fails SGLang's shape check" if alg.markov_head else ""
        raise _refuse("sglang_pruned_vocab", f"draft_vocab_size {cfg.draft_vocab_size} < vocab_size "
                      f"{cfg.vocab_size} (d2t/t2d): SGLang drafts over the target's LM head and has no draft "
                      f"vocabulary map{head}")
    if facts.sample_from_anchor is not None and cfg.sample_from_anchor != facts.sample_from_anchor:
        raise _refuse("sglang_block_layout", f"sample_from_anchor is {str(cfg.sample_from_anchor).lower()}: SGLang's "
                      f"{facts.speculative_algorithm} path drafts from block rows 1.. (row 0 is the anchor), i.e. "
                      f"sample_from_anchor {str(facts.sample_from_anchor).lower()} "
                      "(srt/speculative/dflash_worker_v2.py)")
    for key in facts.required_keys:
        if key not in raw:
            raise _refuse("sglang_missing_key", f"config.json has no {key}: SGLang requires it and the Speculators "
                          "default is not guessed; write it explicitly",
                          hint=f"add \"{key}\" to config.json and validate")
    for key in facts.positive_keys:
        if not is_int(getattr(cfg, key), minimum=1):
            raise _refuse("sglang_key_not_positive", f"{key} is {getattr(cfg, key)}: SGLang requires {key} > 0 "
                          "(srt/models/dspark.py)")
    if cfg.target_hidden_size is not None and cfg.target_hidden_size != cfg.hidden_size:
        raise _refuse("sglang_target_hidden_size", f"target_hidden_size {cfg.target_hidden_size} != hidden_size "
                      f"{cfg.hidden_size}: SGLang builds fc for len(target_layer_ids) x hidden_size inputs")
    _check_confidence_head(cfg, names)


def _check_confidence_head(cfg: Any, names: Sequence[str]) -> None:
    """SGLang builds the head whenever it may (never reading ``enable_confidence_head``), so
    the flag and the tensors must agree."""
    has = any(n.startswith(_CONFIDENCE_PREFIX) for n in names)
    enabled = bool(getattr(cfg, "enable_confidence_head", has))
    if has != enabled:
        raise _refuse("sglang_confidence_head", f"enable_confidence_head is {str(enabled).lower()} but the checkpoint "
                      f"{'holds' if has else 'lacks'} confidence_head.* tensors: SGLang builds the head from the "
                      "tensors' presence and the serve mode, not from the flag (srt/models/dspark.py)")


def sglang_layout(raw: Mapping[str, Any], names: Sequence[str], verifier_layers: int, *,
                  source: str = "config.json") -> SglangLayout:
    """SGLang's layout of the drafter whose ``config.json`` is ``raw`` (``names``: its tensor names).

    Raises:
        InvalidInputError: a refusal by name (exit 3; docs/sglang.md), or the config does not parse.
    """
    from ...format import expected_speculative_tokens, parse_config
    from ...format.algorithms import algorithm

    cfg = parse_config(raw, source=source)
    alg = algorithm(cfg.speculators_model_type)
    _check_servable(alg, cfg, raw, names)
    facts = alg.sglang
    ids = _sglang_ids(cfg.aux_layer_ids, facts.aux_id_offset, verifier_layers, alg.aux_ids_key)
    causal = layer_causality(cfg.transformer_layer_config.written(), cfg.sliding_window_non_causal)
    is_causal = _is_causal(cfg.transformer_layer_config.written(), causal)
    k = int(expected_speculative_tokens(cfg))
    config = _flat_config(cfg, raw, facts, ids, verifier_layers, is_causal, k)
    head = any(n.startswith(_CONFIDENCE_PREFIX) for n in names)
    env = dict(facts.confidence_head_env) if head else {}
    expected: dict[str, Any] = {
        "architecture": facts.architecture, "captured_layer_ids": ids, "capture_layer_inputs": list(cfg.aux_layer_ids),
        "verifier_layers": int(verifier_layers), "mask_token_id": cfg.mask_token_id, "block_slots": cfg.block_size,
        "drafts_per_block": k, "sample_from_anchor": cfg.sample_from_anchor, "layer_causal": causal}
    if alg.markov_head:
        expected.update(markov_rank=cfg.markov_rank, markov_head_type=cfg.markov_head_type, confidence_head=head)
    expected.update({key: getattr(cfg, key) for key in facts.dflash_config_keys})
    return SglangLayout(alg.name, config, env, expected, _notes(cfg, raw, facts, k))


def _flat_config(cfg: Any, raw: Mapping[str, Any], facts: Any, ids: list[int], n_layers: int,
                 is_causal: bool | None, k: int) -> dict[str, Any]:
    """The flat config: the layer config at the top level plus SGLang's keys."""
    from ...format.schema import resolve_layer_types

    tl = dict(cfg.transformer_layer_config.written())
    out: dict[str, Any] = {**tl, "architectures": [facts.architecture], "layer_types": resolve_layer_types(tl)}
    if raw.get("dtype") is not None:
        out["dtype"] = raw["dtype"]
    out["block_size"] = k if facts.block_size_counts == "drafts" else cfg.block_size
    out["dflash_config"] = {"mask_token_id": cfg.mask_token_id, "target_layer_ids": ids,
                            **{key: getattr(cfg, key) for key in facts.dflash_config_keys}}
    out["num_target_layers"] = int(n_layers)
    if is_causal is not None:
        out["is_causal"] = is_causal
    if "sliding_attention" in out["layer_types"]:
        out["use_sliding_window"] = True  # transformers' Qwen3 config drops sliding_window otherwise
    for key in facts.explicit_keys:
        out[key] = getattr(cfg, key)
    out.pop("target_hidden_size", None)  # SGLang tests hasattr(): a null key would be read as set
    return out


def _notes(cfg: Any, raw: Mapping[str, Any], facts: Any, k: int) -> list[str]:
    """What the layout does not prove or carry: sliding windows, keys it drops, a K that differs."""
    from ...format.schema import resolve_layer_types

    notes = []
    if "sliding_attention" in resolve_layer_types(cfg.transformer_layer_config.written()):
        notes.append("sliding_window: SGLang applies it per query row with window_left = sliding_window - 1 "
                     "(srt/speculative/dflash_utils.py); that the masks equal the Speculators reference's is not "
                     "proven here (loading and configuration only)")
    carried = (*_TRANSLATED, *facts.explicit_keys, *facts.dflash_config_keys)
    extra = sorted(key for key in raw if key not in carried)
    if extra:
        notes.append(f"config.json keys SGLang has no counterpart for, not written: {', '.join(extra)}")
    if cfg.speculative_tokens != k:
        notes.append(f"speculative_tokens {cfg.speculative_tokens} != {k} implied by block_size and "
                     f"sample_from_anchor: SGLang drafts {k}")
    return notes


def launch_argv(verifier: str, draft: str, algorithm_name: str) -> list[str]:
    """``python -m sglang.launch_server`` serving ``draft`` (a dir or a Hub repo id: SGLang's
    ``--speculative-draft-model-path`` takes no subfolder) next to ``verifier``.

    Raises:
        InvalidInputError: SGLang has no algorithm for ``algorithm_name``.
    """
    from ...format.algorithms import algorithm

    alg = algorithm(algorithm_name)
    if not alg.sglang.speculative_algorithm:
        raise _refuse("sglang_unsupported_algorithm", f"{alg.display_name}: {alg.sglang.refusal}")
    return [*LAUNCHER, "--model-path", verifier, "--speculative-algorithm", alg.sglang.speculative_algorithm,
            "--speculative-draft-model-path", draft]


def launch_command(verifier: str, draft: str, algorithm_name: str, env: Mapping[str, str]) -> str:
    """:func:`launch_argv` as one POSIX shell line, ``NAME=value`` assignments first
    (``shlex.split`` gives the assignments and the argv back)."""
    import shlex

    from ..vllm.serve_line import shell_command

    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in sorted(env.items()))
    return prefix + shell_command(launch_argv(verifier, draft, algorithm_name))
