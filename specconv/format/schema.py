"""Typed Speculators ``config.json`` models (P-EAGLE, DFlash, DSpark): the only parser of one.

Schemas build on first use (``defer_build``) so the CLI starts fast. Facts: speculators 0.9.0
``src/speculators/config.py``, ``src/speculators/models/{peagle,dflash,dspark}/config.py``;
vLLM 0.33 ``vllm/transformers_utils/configs/speculators/algos.py``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_serializer, model_validator

from ..errors import InvalidInputError
from ..fileio import read_json_object
from ..values import is_int
from .algorithms import algorithm as describe
from .facts import (
    MAX_DRAFT_LAYERS,
    NEVER_WRITTEN,
    SPECULATORS_VERSION,
    legacy_sample_from_anchor,
    speculative_tokens_for,
)

if TYPE_CHECKING:  # pragma: no cover
    from .tensors import TensorSpec

__all__ = [
    "BlockDraftConfig",
    "DFlash2Config",
    "DFlashConfig",
    "DSparkConfig",
    "GreedyProposal",
    "PEagleConfig",
    "SpeculatorsDraftConfig",
    "SpeculatorsSection",
    "TransformerLayerConfig",
    "VerifierRef",
    "config_class",
    "config_to_dict",
    "dump_config",
    "effective_window",
    "expected_speculative_tokens",
    "load_config",
    "parse_config",
    "read_config",
    "resolve_layer_types",
    "rope_theta_of",
    "speculators_default",
    "speculators_model_type_of",
    "validation_message",
]

#: Integer keys ``transformer_layer_config`` must carry, besides an explicit rope θ.
_LAYER_KEYS_INT = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)


class _Model(BaseModel):
    """Shared pydantic settings: unknown keys are kept so legacy keys round-trip."""

    model_config = ConfigDict(extra="allow", validate_assignment=False, defer_build=True)


class GreedyProposal(_Model):
    """One ``proposal_methods`` entry (speculators ``src/speculators/proposals/greedy.py``).

    vLLM reads only ``[0].speculative_tokens``. Bounds (speculators: tokens, accept_k >= 1,
    tolerance >= 0) are left to the lint."""

    proposal_type: Literal["greedy"] = "greedy"
    speculative_tokens: int = 5
    verifier_accept_k: int = 1
    accept_tolerance: float = 0.0


class VerifierRef(_Model):
    """``speculators_config.verifier``: ``name_or_path`` should be a Hub repo id (vLLM 0.33
    rejects local paths); ``architectures`` copied from the verifier's config.json."""

    name_or_path: str | None
    architectures: list[str]


class SpeculatorsSection(_Model):
    """``speculators_config`` (speculators ``src/speculators/config.py: SpeculatorsConfig``)."""

    algorithm: str
    proposal_methods: list[GreedyProposal] = Field(min_length=1)
    default_proposal_method: str = "greedy"
    verifier: VerifierRef

    @model_validator(mode="after")
    def _default_method_exists(self) -> SpeculatorsSection:
        types = [p.proposal_type for p in self.proposal_methods]
        if self.default_proposal_method not in types:
            raise ValueError(
                f"default_proposal_method {self.default_proposal_method!r} must equal the "
                f"proposal_type of one of proposal_methods {types}"
            )
        return self


def _check_positive_ints(prefix: str, value: Mapping[str, Any]) -> None:
    for key in _LAYER_KEYS_INT:
        if key not in value:
            raise ValueError(f"{prefix}.{key}: missing")
        v = value[key]
        if not is_int(v, minimum=1):
            raise ValueError(f"{prefix}.{key}: must be a positive integer, got {v!r}")
        if key == "num_hidden_layers" and v > MAX_DRAFT_LAYERS:  # the lint enumerates every layer's tensors
            raise ValueError(f"{prefix}.{key}: {v} draft layers is not a drafter (at most {MAX_DRAFT_LAYERS})")


def _check_layer_config(value: Any) -> Any:
    """Check the ``transformer_layer_config`` keys the lint and vLLM rely on; ValueError names the dotted key."""
    if isinstance(value, TransformerLayerConfig):
        return value
    if not isinstance(value, Mapping):
        raise ValueError("Input should be a valid dictionary")
    prefix = "transformer_layer_config"
    mt = value.get("model_type")
    if not isinstance(mt, str) or not mt:
        raise ValueError(f"{prefix}.model_type: missing or not a non-empty string")
    _check_positive_ints(prefix, value)
    eps = value.get("rms_norm_eps")
    if "rms_norm_eps" not in value:
        raise ValueError(f"{prefix}.rms_norm_eps: missing")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps <= 0:
        raise ValueError(f"{prefix}.rms_norm_eps: must be a positive number, got {eps!r}")
    if rope_theta_of(value) is None:
        raise ValueError(
            f"{prefix}.rope_parameters.rope_theta: missing (write rope θ explicitly, as "
            "`rope_theta` or `rope_parameters.rope_theta`: vLLM's DFlash layer falls back "
            "to 1e6 while transformers' Qwen3 default is 1e4)"
        )
    lt = value.get("layer_types")
    if lt is not None and (not isinstance(lt, list) or not all(isinstance(t, str) for t in lt)):
        raise ValueError(f"{prefix}.layer_types: must be a list of strings, got {lt!r}")
    return value


class TransformerLayerConfig(_Model):
    """``transformer_layer_config``: the HF decoder config of the draft layers, typed.

    Defaults are transformers' Qwen3 / Llama config classes'; ``model_type`` is ``llama`` |
    ``qwen3``; ``vocab_size`` is ``Vt``. Unknown keys are kept and the object serialises to
    exactly the mapping it was read from (:meth:`written`), so ``config.json`` round-trips.
    Fields hold values as written (None: absent); :attr:`resolved_layer_types`, :attr:`window`
    and :meth:`rope` give what speculators / vLLM build.
    """

    model_config = ConfigDict(extra="allow", frozen=True, defer_build=True)

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False
    layer_types: list[str] | None = None
    sliding_window: int | None = None
    rope_theta: float | int | None = None
    rope_parameters: dict[str, Any] | None = None
    rope_scaling: dict[str, Any] | None = None
    partial_rotary_factor: float | int | None = None

    _written: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _read(cls, data: Any, handler: Any) -> TransformerLayerConfig:
        layer = handler(_check_layer_config(data))
        if isinstance(data, Mapping):
            layer._written = dict(data)
        return layer

    @model_serializer(mode="plain")
    def _as_written(self) -> dict[str, Any]:
        return dict(self._written)

    def written(self) -> dict[str, Any]:
        """The keys and values exactly as the config holds them (a copy)."""
        return dict(self._written)

    @property
    def resolved_layer_types(self) -> list[str]:
        """Per-layer attention kinds as speculators / vLLM build them (:func:`resolve_layer_types`)."""
        return resolve_layer_types(self._written)

    @property
    def window(self) -> int | None:
        """The sliding window the HF config class sees (:func:`effective_window`)."""
        return effective_window(self._written)

    def layer_window(self, layer: int) -> int | None:
        """Sliding window of draft layer ``layer``, or None when it attends fully (a
        ``sliding_attention`` layer without a window attends fully, as in speculators)."""
        kind = self.resolved_layer_types[layer]
        return self.window if kind == "sliding_attention" else None

    def rope(self) -> dict[str, Any]:
        """The rope parameters in one mapping: ``rope_scaling`` then ``rope_parameters`` (per
        layer type nested, as Laguna writes it: speculators keeps ``sliding_attention``'s),
        with ``rope_theta`` the explicit θ (:func:`rope_theta_of`) and ``rope_type`` /
        ``partial_rotary_factor`` where given."""
        rp: Mapping[str, Any] | None = self.rope_parameters
        if isinstance(rp, Mapping) and any(isinstance(v, Mapping) for v in rp.values()):
            rp = rp.get("sliding_attention") or next(v for v in rp.values() if isinstance(v, Mapping))
        params: dict[str, Any] = {}
        if self.partial_rotary_factor is not None:
            params["partial_rotary_factor"] = self.partial_rotary_factor
        for part in (self.rope_scaling, rp):
            if isinstance(part, Mapping):
                params.update(part)
        params["rope_theta"] = rope_theta_of({"rope_parameters": params, "rope_theta": self.rope_theta})
        return params


def rope_theta_of(layer_cfg: Mapping[str, Any]) -> float | None:
    """The explicit rope θ (``rope_parameters.rope_theta`` or ``rope_theta``) as a float; None if neither is > 0."""
    for src in (layer_cfg.get("rope_parameters"), layer_cfg):
        if isinstance(src, Mapping):
            t = src.get("rope_theta")
            if isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0:
                return float(t)
    return None


class SpeculatorsDraftConfig(_Model):
    """Common envelope of a Speculators ``config.json`` (speculators ``src/speculators/config.py``).

    Unknown keys are kept and written back (never a top-level ``model_type`` / ``auto_map``).
    ``speculators_version`` and ``dtype`` are informational; ``tie_word_embeddings`` is always
    false; ``draft_vocab_size`` (Vd) == Vt means no pruning; ``target_hidden_size`` is a
    vLLM-only fc hint (keep None); ``mask_token_id`` is required by vLLM for all three.
    """

    algorithm: ClassVar[str] = ""

    speculators_model_type: str
    speculators_version: str = SPECULATORS_VERSION
    architectures: list[str] = Field(default_factory=list)
    dtype: str | None = None
    tie_word_embeddings: bool = False
    draft_vocab_size: int
    target_hidden_size: int | None = None
    mask_token_id: int | None = None
    transformer_layer_config: TransformerLayerConfig
    speculators_config: SpeculatorsSection

    @model_validator(mode="before")
    @classmethod
    def _default_architectures(cls, data: Any) -> Any:
        if isinstance(data, dict) and "architectures" not in data and cls.algorithm:
            data = {**data, "architectures": [describe(cls.algorithm).architecture]}
        return data

    @property
    def vocab_size(self) -> int:
        """Target/verifier vocabulary ``Vt`` (``transformer_layer_config.vocab_size``)."""
        return self.transformer_layer_config.vocab_size

    @property
    def hidden_size(self) -> int:
        """Draft hidden size ``H`` (must equal the verifier's)."""
        return self.transformer_layer_config.hidden_size

    @property
    def num_layers(self) -> int:
        """Number of draft decoder layers ``L``."""
        return self.transformer_layer_config.num_hidden_layers

    @property
    def rope_theta(self) -> float:
        """The explicit rope θ of the draft layers."""
        theta = rope_theta_of(self.transformer_layer_config.written())
        if theta is None:
            raise InvalidInputError("transformer_layer_config: no explicit rope_theta")
        return theta

    def extra_tensors(self) -> list[TensorSpec]:
        """Tensors the algorithm adds beyond the layers, the block / P-EAGLE heads and the vocabulary maps
        (:func:`specconv.format.tensors.expected_tensors` appends them in this order)."""
        return []

    @property
    def is_pruned(self) -> bool:
        """True when the draft vocabulary is a pruned subset (``Vd < Vt``)."""
        return self.draft_vocab_size < self.vocab_size

    @property
    def speculative_tokens(self) -> int:
        """``proposal_methods[0].speculative_tokens`` (what vLLM uses as K)."""
        return self.speculators_config.proposal_methods[0].speculative_tokens

    @property
    def aux_layer_ids(self) -> list[int] | None:
        """Aux layer ids (id ``ℓ`` = the verifier's residual stream after ``ℓ`` decoder layers)."""
        raise NotImplementedError

    @property
    def num_aux(self) -> int | None:
        """``A``: number of aux layers (P-EAGLE: 3 when the ids are ``null``)."""
        ids = self.aux_layer_ids
        return len(ids) if ids else None


class PEagleConfig(SpeculatorsDraftConfig):
    """P-EAGLE draft config (speculators ``src/speculators/models/peagle/config.py``, EAGLE-3's subclass).

    Aux ids ``None`` mean 3 resolved from the verifier as ``[2, n//2, n-3]``.
    ``norm_before_residual``: trainer default true, config and vLLM default false.
    ``norm_before_fc``: RMSNorm over the ``A·H`` concat (``input_norm``); ``fc_norm`` is not
    forwarded by vLLM; ``norm_output`` is unused by P-EAGLE; ``embed_requires_grad`` training-only.
    """

    algorithm: ClassVar[str] = "peagle"

    speculators_model_type: Literal["peagle"] = "peagle"
    eagle_aux_hidden_state_layer_ids: list[int] | None = None
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    embed_requires_grad: bool = True

    @property
    def aux_layer_ids(self) -> list[int] | None:
        return self.eagle_aux_hidden_state_layer_ids

    @property
    def num_aux(self) -> int:
        ids = self.eagle_aux_hidden_state_layer_ids
        return len(ids) if ids else 3


class BlockDraftConfig(SpeculatorsDraftConfig):
    """Keys shared by DFlash and DSpark (speculators ``src/speculators/models/dflash/config.py``).

    A missing ``sample_from_anchor`` is told by the legacy rule (K == B-1 → false, K == B →
    true) yet still counts as absent (``model_fields_set``); else the class default stays.
    ``sliding_window_non_causal``: speculators makes SWA layers bidirectional in the block;
    vLLM >= 0.27 (DFlash only) sets ``causal = not flag`` for every layer.
    """

    aux_hidden_state_layer_ids: list[int] | None = None
    block_size: int = 8
    sample_from_anchor: bool = False
    sliding_window_non_causal: bool = False

    _sample_from_anchor_legacy: bool = PrivateAttr(default=False)

    @model_validator(mode="after")
    def _legacy_sample_from_anchor(self) -> BlockDraftConfig:
        if "sample_from_anchor" not in self.model_fields_set:
            told = legacy_sample_from_anchor(self.block_size, self.speculative_tokens)
            if told is not None:
                self.sample_from_anchor = told
                self.__pydantic_fields_set__.discard("sample_from_anchor")  # still absent from the file
                self._sample_from_anchor_legacy = True
        return self

    @property
    def sample_from_anchor_from_legacy(self) -> bool:
        """True when ``sample_from_anchor`` was absent and told by the legacy rule."""
        return self._sample_from_anchor_legacy

    @property
    def aux_layer_ids(self) -> list[int] | None:
        return self.aux_hidden_state_layer_ids


class DFlashConfig(BlockDraftConfig):
    """DFlash draft config (speculators ``src/speculators/models/dflash/config.py``)."""

    algorithm: ClassVar[str] = "dflash"

    speculators_model_type: Literal["dflash"] = "dflash"


class DFlash2Config(BlockDraftConfig):
    """DFlash2 draft config (speculators 0.9.0 ``src/speculators/models/dflash2/config.py``
    ``DFlash2SpeculatorConfig``): DFlash plus per-layer grouped dynamic causal convolutions
    (``conv_kernel_size`` taps, ``conv_group_size`` channels per dynamic group) and a low-rank
    candidate selector (``selector_rank``, ``selector_top_k``). The defaults are speculators';
    z-lab, SGLang and vLLM have none or others, so specconv writes all four and
    ``sliding_window_non_causal`` (true here, false for DFlash) explicitly.
    """

    algorithm: ClassVar[str] = "dflash2"

    speculators_model_type: Literal["dflash2"] = "dflash2"
    sliding_window_non_causal: bool = True
    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 256
    selector_top_k: int = 16

    def extra_tensors(self) -> list[TensorSpec]:
        """The convolution and selector tensors (speculators ``models/dflash2/model_definitions.py``), codebooks
        under their bare names (vLLM raises on ``….weight``)."""
        from .tensors import TensorSpec

        H, k, R, V = self.hidden_size, self.conv_kernel_size, self.selector_rank, self.vocab_size
        G = H // self.conv_group_size if self.conv_group_size > 0 else 0
        out = []
        for i in range(self.num_layers):
            for conv in ("attention_conv", "mlp_conv"):
                out.append(TensorSpec(f"layers.{i}.{conv}.base_kernel", (2, k, H), why="static convolution taps"))
                out.append(TensorSpec(f"layers.{i}.{conv}.kernel_projection.weight", (2 * k * G, H),
                                      why="dynamic convolution taps per group"))
        out.append(TensorSpec("candidate_selector.hidden_projection.weight", (R, H), why="selector hidden projection"))
        out.append(TensorSpec("candidate_selector.predecessor_codebook", (V, R), why="selector predecessor codebook"))
        out.append(TensorSpec("candidate_selector.successor_codebook", (V, R), why="selector successor codebook"))
        return out


class DSparkConfig(BlockDraftConfig):
    """DSpark draft config (speculators ``src/speculators/models/dspark/config.py``).

    ``sample_from_anchor`` defaults true here but false in vLLM's updater: always written.
    ``markov_rank`` 0 disables the Markov head in speculators (vLLM always builds it); vLLM
    supports only ``vanilla`` heads; ``confidence_head_with_markov`` (input
    ``cat(out, markov_w1[prev])``) requires ``markov_rank > 0``.
    """

    algorithm: ClassVar[str] = "dspark"

    speculators_model_type: Literal["dspark"] = "dspark"
    sample_from_anchor: bool = True
    markov_rank: int = 256
    markov_head_type: Literal["vanilla", "gated", "rnn"] = "vanilla"
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True

    def extra_tensors(self) -> list[TensorSpec]:
        """The Markov head (``markov_rank > 0``; gated / rnn extras) and the confidence head."""
        from .tensors import TensorSpec

        H, Vt, Vd, r = self.hidden_size, self.vocab_size, self.draft_vocab_size, self.markov_rank
        mk = "markov-head-missing"
        out = []
        if r > 0:
            out += [TensorSpec("markov_head.markov_w1.weight", (Vt, r), missing_code=mk,
                               why="Markov embedding over target ids"),
                    TensorSpec("markov_head.markov_w2.weight", (Vd, r), missing_code=mk,
                               why="Markov bias projection to draft-vocab logits")]
            extra = {"gated": (("gate_proj", (r, H + r), (r,)),),
                     "rnn": (("joint_proj", (3 * r, 2 * r + H), (3 * r,)),)}.get(self.markov_head_type, ())
            for name, weight, bias in extra:
                out += [TensorSpec(f"markov_head.{name}.weight", weight, missing_code=mk),
                        TensorSpec(f"markov_head.{name}.bias", bias, missing_code=mk)]
        if self.enable_confidence_head:
            width = H + (r if self.confidence_head_with_markov else 0)
            why = "enable_confidence_head is true (vLLM loads it only if present)"
            out += [TensorSpec(f"confidence_head.proj.{n}", shape, need="recommended",
                               missing_code="tensor-recommended-missing", why=why)
                    for n, shape in (("weight", (1, width)), ("bias", (1,)))]
        return out


def config_class(algorithm: str) -> type[SpeculatorsDraftConfig]:
    """The config class of ``algorithm``; UnsupportedFormatError for another one."""
    return describe(algorithm).config_type()


def speculators_default(algorithm: str, key: str) -> Any:
    """The value speculators 0.9.0 reads for an omitted top-level ``key`` (the class default).

    Raises KeyError (no such field) or UnsupportedFormatError (unknown algorithm)."""
    field = config_class(algorithm).model_fields.get(key)
    if field is None:
        raise KeyError(f"{key!r} is not a field of the {algorithm} config")
    return field.default


def expected_speculative_tokens(cfg: SpeculatorsDraftConfig) -> int | None:
    """Drafts per pass of the trained layout: ``B`` or ``B-1`` for block drafters; None for
    P-EAGLE (the trained depth count is not recorded)."""
    if isinstance(cfg, BlockDraftConfig):
        return speculative_tokens_for(cfg.block_size, cfg.sample_from_anchor)
    return None


def resolve_layer_types(layer_cfg: Mapping[str, Any]) -> list[str]:
    """Per-layer attention kinds as speculators / vLLM build them: ``layer_types`` when present,
    else transformers' Qwen3Config rule (sliding for ``i >= max_window_layers`` when a window is
    in effect), else all ``full_attention``."""
    lt = layer_cfg.get("layer_types")
    if isinstance(lt, list):
        return list(lt)
    n = int(layer_cfg.get("num_hidden_layers", 0))
    window = effective_window(layer_cfg)
    mwl = layer_cfg.get("max_window_layers", 28)
    if layer_cfg.get("model_type") == "qwen3" and window is not None:
        return ["sliding_attention" if i >= mwl else "full_attention" for i in range(n)]
    return ["full_attention"] * n


def effective_window(layer_cfg: Mapping[str, Any]) -> int | None:
    """``sliding_window`` as the HF config class will see it (transformers
    ``models/qwen3/configuration_qwen3.py`` nulls it unless ``use_sliding_window``; its
    default when the key is absent is 4096)."""
    if layer_cfg.get("model_type") == "qwen3":
        if not layer_cfg.get("use_sliding_window", False):
            return None
        return layer_cfg.get("sliding_window", 4096)
    return layer_cfg.get("sliding_window")


def _one_error(e: Mapping[str, Any]) -> tuple[str, str | None]:
    loc = ".".join(str(p) for p in e.get("loc", ()))
    msg = e.get("msg", "invalid")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if loc and msg.startswith(loc + "."):  # our own messages already start with the dotted key
        text, key = msg, msg.split(":", 1)[0]
    else:
        key = loc or None
        text = f"{loc}: {msg}" if loc else msg
    if e.get("type") == "missing":
        text = f"{loc}: missing"
    return text, key


def validation_message(err: ValidationError, limit: int = 8) -> tuple[str, str | None]:
    """Render a pydantic error as ``key: reason`` lines; return (text, first key)."""
    lines: list[str] = []
    first_key = None
    for e in err.errors()[:limit]:
        text, key = _one_error(e)
        lines.append(text)
        first_key = first_key or key
    more = len(err.errors()) - limit
    if more > 0:
        lines.append(f"... and {more} more")
    return "; ".join(lines), first_key


def parse_config(data: Mapping[str, Any], *, source: str = "config.json") -> SpeculatorsDraftConfig:
    """Validate a decoded ``config.json`` strictly (``8`` is not ``"8"``) into its config class.

    Raises:
        InvalidInputError: a key is missing or invalid (names the dotted key and ``source``).
        UnsupportedFormatError: ``speculators_model_type`` is not one of the algorithms.
    """
    if not isinstance(data, Mapping):
        raise InvalidInputError(f"{source}: top level must be a JSON object")
    if "speculators_model_type" not in data:
        raise InvalidInputError(
            f"{source}: key 'speculators_model_type' is missing: not a Speculators config",
            hint="convert the checkpoint first (`specconv convert`)",
            code="config_key",
        )
    algo = data["speculators_model_type"]
    cls = config_class(algo if isinstance(algo, str) else repr(algo))
    try:
        return cls.model_validate(dict(data), strict=True)
    except ValidationError as err:
        text, key = validation_message(err)
        raise InvalidInputError(
            f"{source}: invalid Speculators {algo} config: {text}",
            hint=f"fix key {key!r}" if key else None,
        ) from None


def _config_path(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    return p / "config.json" if p.is_dir() else p


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The raw JSON object of ``path`` (a draft dir or its ``config.json``), no schema check.

    Raises InvalidInputError: missing, not JSON, or not an object."""
    cfg_path = _config_path(path)
    if not cfg_path.is_file():
        raise InvalidInputError(f"{cfg_path}: config.json not found")
    return read_json_object(cfg_path, unreadable="{path}: cannot read JSON: {error}",
                            not_object="{path}: top level must be a JSON object")


def speculators_model_type_of(path: str | os.PathLike[str]) -> str | None:
    """The string ``speculators_model_type`` of ``path``'s config (any algorithm), without a schema
    check; None when the file is absent, unreadable, not an object, or lacks it."""
    try:
        data = read_config(path)
    except InvalidInputError:
        return None
    algo = data.get("speculators_model_type")
    return algo if isinstance(algo, str) else None


def load_config(path: str | os.PathLike[str]) -> SpeculatorsDraftConfig:
    """The typed config of ``path`` (a draft dir or its ``config.json``); raises as :func:`parse_config`
    and :func:`read_config`."""
    return parse_config(read_config(path), source=str(_config_path(path)))


def config_to_dict(cfg: SpeculatorsDraftConfig) -> dict[str, Any]:
    """Plain-JSON dict of ``cfg``, every field explicit, extra keys kept; no top-level ``model_type``
    (it breaks vLLM's speculators detection) or ``auto_map``."""
    d = cfg.model_dump(mode="json")
    for key in NEVER_WRITTEN:
        d.pop(key, None)
    return d


def dump_config(cfg: SpeculatorsDraftConfig) -> bytes:
    """Deterministic ``config.json`` bytes (sorted keys, indent 2, trailing newline, UTF-8), every
    field explicit; ValueError on NaN/inf."""
    text = json.dumps(config_to_dict(cfg), sort_keys=True, indent=2, allow_nan=False)
    return (text + "\n").encode("utf-8")
