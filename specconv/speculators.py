"""Typed Speculators target config (P-EAGLE, DFlash, DSpark), its reader/writer and a
servability lint.

This module is the single place that knows what a Speculators ``config.json`` for the
algorithms ``peagle``, ``dflash`` and ``dspark`` must contain and what vLLM needs to
serve such a directory. It imports only pydantic and the standard library (tensor
headers are read lazily through :mod:`specconv.tensors` in :func:`lint_dir`), so the CLI
can import it without torch.

Format facts come from ``shared/reference/speculators_format.md`` (speculators 0.9.0
config classes ``src/speculators/config.py``, ``models/{eagle3,peagle,dflash,dspark}/
config.py``, ``proposals/greedy.py``; vLLM 0.33 ``transformers_utils/config.py`` and
``transformers_utils/configs/speculators/algos.py``). Section numbers in the docstrings
(§2.2, §8.4 ...) refer to that document.

Public API:

* config models :class:`SpeculatorsDraftConfig` (base), :class:`PEagleConfig`,
  :class:`DFlashConfig`, :class:`DSparkConfig` (both subclasses of
  :class:`BlockDraftConfig`; DSpark is *not* a subclass of DFlash here, so
  ``isinstance(cfg, DFlashConfig)`` means DFlash only), plus the nested
  :class:`GreedyProposal`, :class:`VerifierRef`, :class:`SpeculatorsSection`;
* :func:`make_config`, :func:`config_to_dict`, :func:`dump_config`, :func:`load_config`,
  :func:`parse_config`, :func:`expected_speculative_tokens`,
  :func:`resolve_layer_types`, :func:`expected_tensors`;
* :class:`VerifierFacts`, :class:`Finding`, :data:`LINT_RULES`, :func:`lint`,
  :func:`lint_dir`, :func:`has_errors`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import InvalidInputError, UnsupportedFormatError

__all__ = [
    "ALGORITHMS",
    "ARCHITECTURES",
    "SPECULATORS_VERSION",
    "BlockDraftConfig",
    "DFlashConfig",
    "DSparkConfig",
    "Finding",
    "GreedyProposal",
    "LINT_RULES",
    "PEagleConfig",
    "SpeculatorsDraftConfig",
    "SpeculatorsSection",
    "TensorSpec",
    "VerifierFacts",
    "VerifierRef",
    "config_class",
    "config_to_dict",
    "dump_config",
    "expected_speculative_tokens",
    "expected_tensors",
    "has_errors",
    "is_hub_repo_id",
    "lint",
    "lint_dir",
    "load_config",
    "make_config",
    "parse_config",
    "resolve_layer_types",
]

#: Algorithms (``speculators_model_type`` values) this module models.
ALGORITHMS: tuple[str, ...] = ("peagle", "dflash", "dspark")

#: ``architectures`` that speculators' ``save_pretrained`` writes (§2; the pydantic
#: defaults ``PEagleSpeculator`` ... are never seen on disk).
ARCHITECTURES: dict[str, str] = {
    "peagle": "PEagleDraftModel",
    "dflash": "DFlashDraftModel",
    "dspark": "DSparkDraftModel",
}

#: ``speculators_version`` written by default (the reference release, §0).
SPECULATORS_VERSION = "0.9.0"

#: Keys that must never be written at the top level (§1, §2): a top-level
#: ``model_type`` sends vLLM down the plain AutoConfig path; ``auto_map`` is a
#: ``save_pretrained`` artifact nobody reads.
_NEVER_WRITTEN = ("model_type", "auto_map")

#: Keys ``transformer_layer_config`` must carry (§2.1), besides an explicit rope θ.
#: Sanity bound on draft decoder layers (drafters have 1-8; the lint enumerates every layer).
MAX_DRAFT_LAYERS = 1024

_LAYER_KEYS_INT = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)

_FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2"})
_CONFIG_DTYPE_TO_ST = {
    "bfloat16": "BF16",
    "float16": "F16",
    "float32": "F32",
    "float64": "F64",
    "half": "F16",
    "float": "F32",
}


# ----------------------------------------------------------------------------------
# Config models
# ----------------------------------------------------------------------------------


class _Model(BaseModel):
    """Shared pydantic settings: unknown keys are kept so legacy keys round-trip."""

    model_config = ConfigDict(extra="allow", validate_assignment=False, defer_build=True)


class GreedyProposal(_Model):
    """One entry of ``speculators_config.proposal_methods`` (speculators
    ``proposals/greedy.py``).

    vLLM reads only ``proposal_methods[0].speculative_tokens`` (→
    ``num_speculative_tokens``). Bounds are not enforced here so that :func:`lint`
    can report them; speculators itself requires ``speculative_tokens >= 1``,
    ``verifier_accept_k >= 1`` and ``accept_tolerance >= 0``.
    """

    proposal_type: Literal["greedy"] = "greedy"
    speculative_tokens: int = 5
    verifier_accept_k: int = 1
    accept_tolerance: float = 0.0


class VerifierRef(_Model):
    """``speculators_config.verifier``: the verifier the draft was trained against.

    ``name_or_path`` should be a Hub repo id (vLLM 0.33 ``vllm serve <dir>`` rejects
    local paths, §8.1); ``architectures`` is copied from the verifier's config.json.
    """

    name_or_path: str | None
    architectures: list[str]


class SpeculatorsSection(_Model):
    """``speculators_config`` (speculators ``config.py: SpeculatorsConfig``)."""

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


def _check_layer_config(value: dict[str, Any]) -> dict[str, Any]:
    """Validate the keys of ``transformer_layer_config`` that the lint and vLLM rely on.

    Raises:
        ValueError: naming the full dotted key that is missing or has the wrong type.
    """
    prefix = "transformer_layer_config"
    mt = value.get("model_type")
    if not isinstance(mt, str) or not mt:
        raise ValueError(f"{prefix}.model_type: missing or not a non-empty string")
    for key in _LAYER_KEYS_INT:
        if key not in value:
            raise ValueError(f"{prefix}.{key}: missing")
        v = value[key]
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{prefix}.{key}: must be a positive integer, got {v!r}")
        if key == "num_hidden_layers" and v > MAX_DRAFT_LAYERS:  # the lint enumerates every layer's tensors
            raise ValueError(f"{prefix}.{key}: {v} draft layers is not a drafter (at most {MAX_DRAFT_LAYERS})")
    eps = value.get("rms_norm_eps")
    if "rms_norm_eps" not in value:
        raise ValueError(f"{prefix}.rms_norm_eps: missing")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps <= 0:
        raise ValueError(f"{prefix}.rms_norm_eps: must be a positive number, got {eps!r}")
    if _rope_theta_of(value) is None:
        raise ValueError(
            f"{prefix}.rope_parameters.rope_theta: missing (write rope θ explicitly, as "
            "`rope_theta` or `rope_parameters.rope_theta`: vLLM's DFlash layer falls back "
            "to 1e6 while transformers' Qwen3 default is 1e4)"
        )
    lt = value.get("layer_types")
    if lt is not None and (not isinstance(lt, list) or not all(isinstance(t, str) for t in lt)):
        raise ValueError(f"{prefix}.layer_types: must be a list of strings, got {lt!r}")
    return value


def _rope_theta_of(layer_cfg: Mapping[str, Any]) -> float | None:
    """Return the explicit rope θ (``rope_theta`` or ``rope_parameters.rope_theta``)."""
    for src in (layer_cfg.get("rope_parameters"), layer_cfg):
        if isinstance(src, Mapping):
            t = src.get("rope_theta")
            if isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0:
                return float(t)
    return None


class SpeculatorsDraftConfig(_Model):
    """Common envelope of a Speculators ``config.json`` (§2).

    Subclasses add the per-algorithm keys. Unknown keys are preserved in
    ``model_extra`` and written back by :func:`dump_config` (except a top-level
    ``model_type`` or ``auto_map``, which are never written).

    Attributes:
        speculators_model_type: ``"peagle"`` | ``"dflash"`` | ``"dspark"``; the
            discriminator speculators and vLLM switch on.
        speculators_version: informational; never validated by speculators or vLLM.
        architectures: the draft model class (``ARCHITECTURES[algorithm]``).
        dtype: float dtype of the tensors on disk (e.g. ``"bfloat16"``); informational.
        tie_word_embeddings: always ``False`` in speculators drafts.
        draft_vocab_size: ``Vd``; equal to ``transformer_layer_config.vocab_size`` (Vt)
            means no vocabulary pruning.
        target_hidden_size: vLLM-only fc input hint; keep ``None`` (§2).
        mask_token_id: target-vocab id fed to the masked slots; required by vLLM for all
            three algorithms.
        transformer_layer_config: HF decoder config dict of the draft layers (§2.1),
            containing ``model_type`` and an explicit rope θ.
        speculators_config: algorithm, proposal methods and verifier reference.
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
    transformer_layer_config: dict[str, Any]
    speculators_config: SpeculatorsSection

    @field_validator("transformer_layer_config", mode="after")
    @classmethod
    def _validate_layer_config(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _check_layer_config(value)

    @model_validator(mode="before")
    @classmethod
    def _default_architectures(cls, data: Any) -> Any:
        if isinstance(data, dict) and "architectures" not in data and cls.algorithm:
            data = {**data, "architectures": [ARCHITECTURES[cls.algorithm]]}
        return data

    # ---- convenience views (not fields; never serialized) -------------------------

    @property
    def vocab_size(self) -> int:
        """Target/verifier vocabulary ``Vt`` (``transformer_layer_config.vocab_size``)."""
        return int(self.transformer_layer_config["vocab_size"])

    @property
    def hidden_size(self) -> int:
        """Draft hidden size ``H`` (must equal the verifier's)."""
        return int(self.transformer_layer_config["hidden_size"])

    @property
    def num_layers(self) -> int:
        """Number of draft decoder layers ``L``."""
        return int(self.transformer_layer_config["num_hidden_layers"])

    @property
    def rope_theta(self) -> float:
        """The explicit rope θ of the draft layers."""
        theta = _rope_theta_of(self.transformer_layer_config)
        if theta is None:
            raise InvalidInputError("transformer_layer_config: no explicit rope_theta")
        return theta

    @property
    def is_pruned(self) -> bool:
        """True when the draft vocabulary is a pruned subset (``Vd < Vt``, §2.3)."""
        return self.draft_vocab_size < self.vocab_size

    @property
    def speculative_tokens(self) -> int:
        """``proposal_methods[0].speculative_tokens`` (what vLLM uses as K)."""
        return self.speculators_config.proposal_methods[0].speculative_tokens

    @property
    def aux_layer_ids(self) -> list[int] | None:
        """Aux hidden-state layer ids in speculators/vLLM capture convention (§2.2)."""
        raise NotImplementedError

    @property
    def num_aux(self) -> int | None:
        """``A``: number of aux layers (P-EAGLE: 3 when the ids are ``null``)."""
        ids = self.aux_layer_ids
        return len(ids) if ids else None


class PEagleConfig(SpeculatorsDraftConfig):
    """P-EAGLE draft config (§3.1; speculators ``models/peagle/config.py``, a subclass
    of the EAGLE-3 config).

    Attributes:
        eagle_aux_hidden_state_layer_ids: aux ids (§2.2); ``None`` means 3 aux inputs
            resolved from the verifier as ``[2, n//2, n-3]`` — write them explicitly.
        norm_before_residual: first layer uses the normalised fc feature as residual
            (config default false, trainer default true; vLLM default false).
        norm_before_fc: RMSNorm over the ``A·H`` concat before ``fc`` (``input_norm``).
        fc_norm: per-chunk RMSNorm before ``fc``; not forwarded by vLLM.
        norm_output: EAGLE-3.1 option, unused by P-EAGLE.
        embed_requires_grad: training-only (P-EAGLE trains its embeddings).
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
    """Keys shared by the block drafters DFlash and DSpark (§4.1).

    Attributes:
        aux_hidden_state_layer_ids: aux ids (§2.2); effectively required.
        block_size: ``B`` query slots per drafting pass, anchor included.
        sample_from_anchor: false → slot 0 is the bonus token, ``B-1`` drafts;
            true → all ``B`` slots predict.
        sliding_window_non_causal: speculators: SWA layers are bidirectional inside the
            block; vLLM >= 0.27 (DFlash only): ``causal = not flag`` for *every* layer.
    """

    aux_hidden_state_layer_ids: list[int] | None = None
    block_size: int = 8
    sample_from_anchor: bool = False
    sliding_window_non_causal: bool = False

    @property
    def aux_layer_ids(self) -> list[int] | None:
        return self.aux_hidden_state_layer_ids


class DFlashConfig(BlockDraftConfig):
    """DFlash draft config (§4; speculators ``models/dflash/config.py``)."""

    algorithm: ClassVar[str] = "dflash"

    speculators_model_type: Literal["dflash"] = "dflash"


class DSparkConfig(BlockDraftConfig):
    """DSpark draft config (§5; speculators ``models/dspark/config.py``).

    Attributes:
        sample_from_anchor: default **true** here (DeepSpec convention) but vLLM's
            updater defaults to false when absent — always written.
        markov_rank: ``r``; 0 disables the Markov head in speculators (vLLM always
            builds it).
        markov_head_type: ``"vanilla"`` | ``"gated"`` | ``"rnn"``; vLLM: vanilla only.
        enable_confidence_head: per-position acceptance-probability head.
        confidence_head_with_markov: confidence input ``cat(out, markov_w1[prev])``;
            requires ``markov_rank > 0``.
    """

    algorithm: ClassVar[str] = "dspark"

    speculators_model_type: Literal["dspark"] = "dspark"
    sample_from_anchor: bool = True
    markov_rank: int = 256
    markov_head_type: Literal["vanilla", "gated", "rnn"] = "vanilla"
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True


_CLASSES: dict[str, type[SpeculatorsDraftConfig]] = {
    "peagle": PEagleConfig,
    "dflash": DFlashConfig,
    "dspark": DSparkConfig,
}


def config_class(algorithm: str) -> type[SpeculatorsDraftConfig]:
    """Return the config class for ``algorithm`` (``peagle``/``dflash``/``dspark``).

    Raises:
        UnsupportedFormatError: for any other ``speculators_model_type``.
    """
    try:
        return _CLASSES[algorithm]
    except KeyError:
        raise UnsupportedFormatError(
            f"speculators_model_type {algorithm!r} is not supported by specconv "
            f"(supported: {', '.join(ALGORITHMS)})",
            format_id=f"speculators-{algorithm}",
        ) from None


def expected_speculative_tokens(cfg: SpeculatorsDraftConfig) -> int | None:
    """Number of drafts per pass the trained layout produces (§8.4 rule 7).

    DFlash and DSpark: ``B`` when ``sample_from_anchor`` else ``B-1``. P-EAGLE: ``None``
    — K must not exceed the number of depths trained, which the config does not record.

    Args:
        cfg: a loaded or constructed config.

    Returns:
        The expected ``speculative_tokens``, or ``None`` when it cannot be derived.
    """
    if isinstance(cfg, BlockDraftConfig):
        return cfg.block_size if cfg.sample_from_anchor else cfg.block_size - 1
    return None


def resolve_layer_types(layer_cfg: Mapping[str, Any]) -> list[str]:
    """Per-layer attention kinds of the draft as speculators and vLLM will build them.

    ``layer_types`` when present; otherwise transformers' Qwen3Config rule
    (``sliding_attention`` for layers ``i >= max_window_layers`` when
    ``use_sliding_window`` and ``sliding_window`` are set), all ``full_attention`` for
    other model types.

    Args:
        layer_cfg: the ``transformer_layer_config`` dict.

    Returns:
        A list of ``"full_attention"`` / ``"sliding_attention"`` (other strings are
        passed through unchanged) of length ``num_hidden_layers`` when derived.
    """
    lt = layer_cfg.get("layer_types")
    if isinstance(lt, list):
        return list(lt)
    n = int(layer_cfg.get("num_hidden_layers", 0))
    window = _effective_window(layer_cfg)
    mwl = layer_cfg.get("max_window_layers", 28)
    if layer_cfg.get("model_type") == "qwen3" and window is not None:
        return ["sliding_attention" if i >= mwl else "full_attention" for i in range(n)]
    return ["full_attention"] * n


def _effective_window(layer_cfg: Mapping[str, Any]) -> int | None:
    """``sliding_window`` as the HF config class will see it (Qwen3 nulls it unless
    ``use_sliding_window``; its default when the key is absent is 4096)."""
    if layer_cfg.get("model_type") == "qwen3":
        if not layer_cfg.get("use_sliding_window", False):
            return None
        return layer_cfg.get("sliding_window", 4096)
    return layer_cfg.get("sliding_window")


# ----------------------------------------------------------------------------------
# Construction, (de)serialisation
# ----------------------------------------------------------------------------------


def _validation_message(err: ValidationError, limit: int = 8) -> tuple[str, str | None]:
    """Render a pydantic error as ``key: reason`` lines; return (text, first key)."""
    lines = []
    first_key = None
    for e in err.errors()[:limit]:
        loc = ".".join(str(p) for p in e.get("loc", ()))
        msg = e.get("msg", "invalid")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        # our own messages already start with the dotted key
        if loc and msg.startswith(loc + "."):
            text = msg
            key = msg.split(":", 1)[0]
        else:
            key = loc or None
            text = f"{loc}: {msg}" if loc else msg
        if e.get("type") == "missing":
            text = f"{loc}: missing"
        lines.append(text)
        first_key = first_key or key
    more = len(err.errors()) - limit
    if more > 0:
        lines.append(f"... and {more} more")
    return "; ".join(lines), first_key


def parse_config(data: Mapping[str, Any], *, source: str = "config.json") -> SpeculatorsDraftConfig:
    """Validate a parsed ``config.json`` mapping into the right config class.

    Types are checked strictly (JSON types: ``8`` is not ``"8"``, ``0`` is not
    ``false``).

    Args:
        data: the decoded JSON object.
        source: file name used in error messages.

    Returns:
        A :class:`PEagleConfig`, :class:`DFlashConfig` or :class:`DSparkConfig`.

    Raises:
        InvalidInputError: a key is missing or invalid; the message names the dotted key
            and ``source``.
        UnsupportedFormatError: ``speculators_model_type`` is not one of
            :data:`ALGORITHMS`.
    """
    if not isinstance(data, Mapping):
        raise InvalidInputError(f"{source}: top level must be a JSON object")
    if "speculators_model_type" not in data:
        raise InvalidInputError(
            f"{source}: key 'speculators_model_type' is missing: not a Speculators config",
            hint="convert the checkpoint first (`specconv convert`)",
        )
    algo = data["speculators_model_type"]
    cls = config_class(algo if isinstance(algo, str) else repr(algo))
    try:
        return cls.model_validate(dict(data), strict=True)
    except ValidationError as err:
        text, key = _validation_message(err)
        raise InvalidInputError(
            f"{source}: invalid Speculators {algo} config: {text}",
            hint=f"fix key {key!r}" if key else None,
        ) from None


def load_config(path: str | os.PathLike[str]) -> SpeculatorsDraftConfig:
    """Read a Speculators ``config.json`` (a directory or the file itself).

    Args:
        path: draft directory containing ``config.json``, or the JSON file.

    Returns:
        The typed config (see :func:`parse_config`).

    Raises:
        InvalidInputError: the file is missing, is not JSON, or a key is missing or
            invalid (the message names the key and the file).
    """
    p = Path(path)
    cfg_path = p / "config.json" if p.is_dir() else p
    if not cfg_path.is_file():
        raise InvalidInputError(f"{cfg_path}: config.json not found")
    try:
        data = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # UnicodeDecodeError, JSONDecodeError, nesting
        raise InvalidInputError(f"{cfg_path}: cannot read JSON: {exc}") from None
    return parse_config(data, source=str(cfg_path))


def config_to_dict(cfg: SpeculatorsDraftConfig) -> dict[str, Any]:
    """Plain-JSON dict of ``cfg`` with every field written explicitly.

    Extra (legacy) keys are kept; a top-level ``model_type`` and ``auto_map`` are
    dropped (§2: a top-level ``model_type`` breaks vLLM's speculators detection).
    """
    d = cfg.model_dump(mode="json")
    for key in _NEVER_WRITTEN:
        d.pop(key, None)
    return d


def dump_config(cfg: SpeculatorsDraftConfig) -> bytes:
    """Deterministic ``config.json`` bytes: sorted keys, indent 2, trailing newline, UTF-8.

    Every meaning-bearing key (``mask_token_id``, ``block_size``,
    ``sample_from_anchor``, ``sliding_window_non_causal``, aux ids,
    ``norm_before_residual``, ``draft_vocab_size``, rope θ, ``speculative_tokens`` ...)
    is written explicitly; never a top-level ``model_type`` or ``auto_map``.

    Raises:
        ValueError: a value is not representable in strict JSON (NaN/inf).
    """
    text = json.dumps(config_to_dict(cfg), sort_keys=True, indent=2, allow_nan=False)
    return (text + "\n").encode("utf-8")


def make_config(
    algorithm: str,
    *,
    transformer_layer_config: Mapping[str, Any],
    verifier_name_or_path: str | None = None,
    verifier_architectures: list[str] | tuple[str, ...] | None = None,
    speculative_tokens: int | None = None,
    **fields: Any,
) -> SpeculatorsDraftConfig:
    """Build a config for ``algorithm`` with the speculators defaults filled in.

    ``draft_vocab_size`` defaults to ``transformer_layer_config["vocab_size"]`` (no
    pruning); ``architectures`` to ``[ARCHITECTURES[algorithm]]``;
    ``speculators_config`` is built from the ``verifier_*`` arguments and
    ``speculative_tokens`` (default for DFlash/DSpark: :func:`expected_speculative_tokens`)
    unless passed in ``fields``. All fields count as explicitly set (they are all
    written by :func:`dump_config`).

    Args:
        algorithm: ``"peagle"``, ``"dflash"`` or ``"dspark"``.
        transformer_layer_config: draft decoder config dict (§2.1).
        verifier_name_or_path: Hub repo id of the verifier (recorded as
            ``speculators_config.verifier.name_or_path``).
        verifier_architectures: the verifier's ``architectures``.
        speculative_tokens: K; required for P-EAGLE (≤ trained depths).
        **fields: any other top-level key (e.g. ``mask_token_id``, ``block_size``,
            ``aux_hidden_state_layer_ids``, ``dtype``); unknown keys are kept as extras.

    Returns:
        The validated config.

    Raises:
        InvalidInputError: a value is invalid, or P-EAGLE without ``speculative_tokens``.
        UnsupportedFormatError: unknown algorithm.
    """
    cls = config_class(algorithm)
    data: dict[str, Any] = {
        "speculators_model_type": algorithm,
        "transformer_layer_config": dict(transformer_layer_config),
        **fields,
    }
    data.setdefault("draft_vocab_size", transformer_layer_config.get("vocab_size"))
    for key in ("aux_hidden_state_layer_ids", "eagle_aux_hidden_state_layer_ids", "architectures"):
        if isinstance(data.get(key), tuple):
            data[key] = list(data[key])
    if "speculators_config" not in data:
        if speculative_tokens is None:
            if algorithm == "peagle":
                raise InvalidInputError(
                    "make_config: speculative_tokens is required for peagle "
                    "(it must not exceed the number of depths trained; it cannot be derived)"
                )
            block = data.get("block_size", cls.model_fields["block_size"].default)
            sfa = data.get("sample_from_anchor", cls.model_fields["sample_from_anchor"].default)
            speculative_tokens = block if sfa else block - 1
        data["speculators_config"] = {
            "algorithm": algorithm,
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": speculative_tokens,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {
                "name_or_path": verifier_name_or_path,
                "architectures": list(verifier_architectures or []),
            },
        }
    try:
        cfg = cls.model_validate(data)
    except ValidationError as err:
        text, key = _validation_message(err)
        raise InvalidInputError(
            f"make_config({algorithm}): {text}", hint=f"fix key {key!r}" if key else None
        ) from None
    # everything is written by dump_config, so nothing is "implicit"
    object.__setattr__(cfg, "__pydantic_fields_set__", set(type(cfg).model_fields))
    return cfg


# ----------------------------------------------------------------------------------
# Verifier facts and findings
# ----------------------------------------------------------------------------------


@dataclass
class VerifierFacts:
    """What the lint needs to know about the verifier.

    Attributes:
        num_hidden_layers: verifier decoder layers ``n`` (aux ids must lie in ``[0, n]``).
        hidden_size: verifier ``H`` (must equal the draft's).
        vocab_size: verifier vocabulary ``Vt``.
        architectures: the verifier's ``architectures``.
        bos_token_id, eos_token_id, pad_token_id: special ids (``eos`` may be a list);
            ``None`` when unknown.
        name_or_path: the id/path the verifier was resolved from.
        is_local_path: True when ``name_or_path`` is a local directory (not a Hub id).
    """

    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    architectures: list[str] = field(default_factory=list)
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    name_or_path: str | None = None
    is_local_path: bool = False

    @classmethod
    def from_hf_config(
        cls,
        config: Mapping[str, Any],
        *,
        name_or_path: str | None = None,
        is_local_path: bool = False,
    ) -> VerifierFacts:
        """Build facts from a verifier ``config.json`` dict (``text_config`` unwrapped).

        Raises:
            InvalidInputError: ``num_hidden_layers``, ``hidden_size`` or ``vocab_size``
                is missing.
        """
        text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else None
        src = text or config

        def pick(key: str) -> Any:
            v = src.get(key)
            return config.get(key) if v is None else v

        missing = [k for k in ("num_hidden_layers", "hidden_size", "vocab_size") if pick(k) is None]
        if missing:
            raise InvalidInputError(f"verifier config.json: missing {', '.join(missing)}")
        return cls(
            num_hidden_layers=int(pick("num_hidden_layers")),
            hidden_size=int(pick("hidden_size")),
            vocab_size=int(pick("vocab_size")),
            architectures=list(config.get("architectures") or []),
            bos_token_id=pick("bos_token_id"),
            eos_token_id=pick("eos_token_id"),
            pad_token_id=pick("pad_token_id"),
            name_or_path=name_or_path,
            is_local_path=is_local_path,
        )

    def special_token_ids(self) -> dict[int, str]:
        """Map special token id → role (``bos``/``eos``/``pad``)."""
        out: dict[int, str] = {}
        for role, v in (("bos", self.bos_token_id), ("eos", self.eos_token_id), ("pad", self.pad_token_id)):
            for tid in v if isinstance(v, (list, tuple)) else [v]:
                if isinstance(tid, int) and not isinstance(tid, bool):
                    out.setdefault(tid, role)
        return out


Level = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Finding:
    """One lint result.

    Attributes:
        level: ``"error"`` (not servable / not loadable), ``"warning"`` (servable but
            likely wrong or lossy), ``"info"``.
        code: stable slug, one of :data:`LINT_RULES`.
        message: human explanation naming the key/tensor and the fix.
        key: the config key (dotted) or tensor name at fault, if any.
    """

    level: Level
    code: str
    message: str
    key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with keys level, code, message, key."""
        return {"level": self.level, "code": self.code, "message": self.message, "key": self.key}


#: Stable lint codes → one-line description (used for docs; every Finding code is here).
LINT_RULES: dict[str, str] = {
    # envelope
    "top-level-model-type": "a top-level model_type hides speculators_config from vLLM",
    "auto-map": "auto_map/config.py is a save_pretrained artifact nobody reads",
    "tie-word-embeddings": "speculators drafts never tie embeddings",
    "algorithm-mismatch": "speculators_config.algorithm differs from speculators_model_type",
    "architectures-unexpected": "architectures is not the speculators draft class name",
    "multiple-proposal-methods": "vLLM only uses proposal_methods[0]",
    "target-hidden-size": "target_hidden_size should stay null",
    "implicit-key": "a meaning-bearing key is absent and consumers disagree on its default",
    # mask token
    "mask-token-missing": "mask_token_id is required by vLLM",
    "mask-token-out-of-range": "mask_token_id must be a target-vocab id",
    "mask-token-special": "mask_token_id equals a verifier special token",
    # speculative tokens / block layout
    "speculative-tokens-invalid": "speculative_tokens must be >= 1",
    "speculative-tokens-mismatch": "speculative_tokens disagrees with block_size/sample_from_anchor",
    "peagle-depths-exceeded": "speculative_tokens exceeds the recorded trained depths",
    "block-size-invalid": "block_size too small for any draft",
    "dflash-sample-from-anchor": "vLLM's DFlash rejects sample_from_anchor=true",
    "dspark-sample-from-anchor-vllm": "DSpark sample_from_anchor needs a recent vLLM",
    # verifier reference
    "verifier-name-missing": "speculators_config.verifier.name_or_path is null",
    "verifier-not-hub-id": "vLLM >= 0.33 `vllm serve <dir>` needs a Hub repo id",
    "verifier-architectures-mismatch": "recorded verifier architectures differ from the verifier's",
    # attention layout
    "layer-model-type-unsupported": "transformer_layer_config.model_type not supported",
    "layer-model-type-not-qwen3": "DFlash/DSpark always build Qwen3-style layers",
    "layer-types-length": "layer_types length differs from num_hidden_layers",
    "layer-types-unknown": "unknown layer_types entry",
    "layer-types-implicit": "layer_types absent; derived from the HF default rule",
    "swa-disabled": "Qwen3 sliding layers with use_sliding_window=false run as full attention",
    "swa-window-missing": "sliding layers without a sliding_window",
    "swa-window-anchoring": "speculators' anchor-relative SWA window differs from vLLM's",
    "dflash-causal-full-attention": "all-full-attention DFlash needs sliding_window_non_causal=true",
    "dflash-swa-non-causal": "SWA layers run bidirectional in the block; trainer default is causal",
    "dflash-mixed-attention": "mixed full+SWA DFlash is not faithfully servable in vLLM >= 0.27",
    "dflash-vllm-version": "causal SWA DFlash needs vLLM >= 0.27",
    "dspark-swa-non-causal-ignored": "vLLM ignores sliding_window_non_causal for DSpark",
    "gqa-heads": "num_attention_heads not a multiple of num_key_value_heads",
    # DSpark heads
    "dspark-markov-head-type": "vLLM implements the vanilla Markov head only",
    "dspark-markov-rank-zero": "markov_rank 0 disables the head in speculators; vLLM builds it",
    "dspark-confidence-markov-rank-zero": "confidence_head_with_markov needs markov_rank > 0",
    "markov-rank-invalid": "markov_rank must be >= 0",
    # P-EAGLE
    "peagle-fc-norm": "vLLM's peagle updater does not forward fc_norm",
    "norm-flags-exclusive": "norm_before_fc and fc_norm are mutually exclusive",
    "peagle-llama-aux-count": "Llama P-EAGLE with A != 3 needs num_aux_hidden_states",
    # aux ids
    "aux-ids-missing": "aux hidden-state layer ids are required",
    "aux-ids-implicit": "P-EAGLE aux ids null: resolved from the verifier at load time",
    "aux-ids-duplicate": "aux layer ids must be distinct",
    "aux-ids-out-of-range": "aux layer ids must lie in [0, verifier num_hidden_layers]",
    # verifier compatibility
    "hidden-size-mismatch": "draft hidden_size differs from the verifier's",
    "vocab-size-mismatch": "draft vocab_size differs from the verifier's",
    # vocabulary
    "draft-vocab-invalid": "draft_vocab_size must be positive",
    "draft-vocab-padded": "draft vocab larger than the target without embed_tokens",
    "draft-vocab-larger": "draft vocab larger than the target",
    "vocab-map-unneeded": "d2t/t2d present for a full-vocab draft",
    # tensors
    "tensor-missing": "a required tensor is absent",
    "tensor-recommended-missing": "a tensor that should be shipped is absent",
    "lm-head-missing": "pruned / padded draft without lm_head.weight",
    "d2t-missing": "pruned draft without d2t",
    "t2d-missing": "pruned draft without t2d (speculators refuses to load)",
    "mask-hidden-missing": "P-EAGLE without mask_hidden (vLLM raises)",
    "embed-tokens-missing": "P-EAGLE without its trained embed_tokens",
    "markov-head-missing": "DSpark Markov head tensors absent",
    "mask-hidden-present": "DFlash/DSpark must not ship mask_hidden (vLLM asserts)",
    "verifier-tensor": "verifier_* tensors are training-only",
    "fused-tensor": "fused qkv/gate_up tensors; speculators stores them separately",
    "fc-shape": "fc.weight must be [H, A*H]",
    "tensor-shape": "tensor shape disagrees with the config",
    "tensor-dtype": "tensor dtype disagrees with the format",
    "layer-count": "layers.N.* indices disagree with num_hidden_layers",
    "unexpected-tensor": "tensors the format does not define",
    "prefixed-tensor-names": "tensor names carry a 'model.' prefix (vLLM/HF layout)",
    "mixed-float-dtypes": "float tensors use more than one dtype",
    "dtype-mismatch": "config dtype differs from the tensors' dtype",
    # directory
    "weights-missing": "no weights file in the directory",
    "training-leftovers": "optimizer/scheduler/training files should not be published",
}

_LEVEL_ORDER = {"error": 0, "warning": 1, "info": 2}


def has_errors(findings: list[Finding]) -> bool:
    """True when any finding has level ``error``."""
    return any(f.level == "error" for f in findings)


# The one Hub-repo-id predicate lives in the Hub module (bare ``name`` or ``namespace/name``,
# never an existing local path); re-exported here under its historical name.
from .hub import is_hub_id as is_hub_repo_id  # noqa: E402


# ----------------------------------------------------------------------------------
# Expected tensors
# ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    """An expected tensor of a Speculators draft.

    Attributes:
        name: safetensors key (no ``model.`` prefix).
        shape: expected shape.
        kind: ``"float"`` (any float dtype), ``"I64"`` or ``"BOOL"``.
        need: ``"required"`` (error if absent), ``"recommended"`` (warning) or
            ``"optional"``.
        missing_code: lint code used when a required/recommended tensor is absent.
        why: short reason quoted in the finding.
    """

    name: str
    shape: tuple[int, ...]
    kind: str = "float"
    need: str = "required"
    missing_code: str = "tensor-missing"
    why: str = ""


def expected_tensors(cfg: SpeculatorsDraftConfig) -> dict[str, TensorSpec]:
    """Tensors a servable draft for ``cfg`` holds, with shapes (§3.2, §4.2, §5.2, §6).

    ``nn.Linear`` weights are ``[out, in]``; q/k/v and gate/up are separate. DFlash/DSpark
    without aux ids get no ``fc.weight`` entry (its width is unknown).

    Args:
        cfg: the draft config.

    Returns:
        Mapping tensor name → :class:`TensorSpec` (insertion-ordered).
    """
    t = cfg.transformer_layer_config
    H, Vt, Vd, L = cfg.hidden_size, cfg.vocab_size, cfg.draft_vocab_size, cfg.num_layers
    nH, nKV, D, I = (int(t[k]) for k in ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size"))
    Hq, Hkv = nH * D, nKV * D
    attn_bias = bool(t.get("attention_bias", False))
    mlp_bias = bool(t.get("mlp_bias", False))
    algo = cfg.speculators_model_type
    qk_norm = algo != "peagle" or t.get("model_type") == "qwen3"
    A = cfg.num_aux
    out: dict[str, TensorSpec] = {}

    def add(name: str, shape: tuple[int, ...], **kw: Any) -> None:
        out[name] = TensorSpec(name, tuple(int(s) for s in shape), **kw)

    if A:
        add("fc.weight", (H, A * H), why="projects the concatenated aux hidden states")
    add("norm.weight", (H,), why="final norm")
    for i in range(L):
        p = f"layers.{i}."
        d_in = 2 * H if (algo == "peagle" and i == 0) else H
        add(p + "input_layernorm.weight", (H,))
        add(p + "post_attention_layernorm.weight", (H,))
        add(p + "self_attn.q_proj.weight", (Hq, d_in))
        add(p + "self_attn.k_proj.weight", (Hkv, d_in))
        add(p + "self_attn.v_proj.weight", (Hkv, d_in))
        add(p + "self_attn.o_proj.weight", (H, Hq))
        if attn_bias:
            add(p + "self_attn.q_proj.bias", (Hq,))
            add(p + "self_attn.k_proj.bias", (Hkv,))
            add(p + "self_attn.v_proj.bias", (Hkv,))
            add(p + "self_attn.o_proj.bias", (H,))
        if qk_norm:
            add(p + "self_attn.q_norm.weight", (D,))
            add(p + "self_attn.k_norm.weight", (D,))
        add(p + "mlp.gate_proj.weight", (I, H))
        add(p + "mlp.up_proj.weight", (I, H))
        add(p + "mlp.down_proj.weight", (H, I))
        if mlp_bias:
            add(p + "mlp.gate_proj.bias", (I,))
            add(p + "mlp.up_proj.bias", (I,))
            add(p + "mlp.down_proj.bias", (H,))

    differs = Vd != Vt
    if isinstance(cfg, PEagleConfig):
        add("layers.0.hidden_norm.weight", (H,), why="RMSNorm of the fc output in layer 0")
        add("embed_tokens.weight", (Vt, H), missing_code="embed-tokens-missing",
            why="P-EAGLE trains its own embeddings")
        add("lm_head.weight", (Vd, H), missing_code="lm-head-missing",
            why="speculators always saves the P-EAGLE head")
        add("mask_hidden", (1, 1, A * H), missing_code="mask-hidden-missing",
            why="vLLM raises without it; speculators silently random-initialises it")
        if cfg.norm_before_fc:
            add("input_norm.weight", (A * H,), why="norm_before_fc is true")
        if cfg.fc_norm:
            for i in range(A):
                add(f"fc_norm.{i}.weight", (H,), why="fc_norm is true")
    else:
        add("hidden_norm.weight", (H,), why="RMSNorm of fc(aux): the context features")
        add("embed_tokens.weight", (Vt, H), need="optional")
        add("lm_head.weight", (Vd, H), need="required" if differs else "optional",
            missing_code="lm-head-missing",
            why="the verifier head cannot stand in for a pruned/padded draft vocab")
    if Vd < Vt:
        add("d2t", (Vd,), kind="I64", missing_code="d2t-missing",
            why="vLLM maps draft ids to target ids with it (identity when absent)")
        add("t2d", (Vt,), kind="BOOL", missing_code="t2d-missing",
            why="speculators refuses to load a pruned draft without it")
    if isinstance(cfg, DSparkConfig) and cfg.markov_rank > 0:
        r = cfg.markov_rank
        add("markov_head.markov_w1.weight", (Vt, r), missing_code="markov-head-missing",
            why="Markov embedding over target ids")
        add("markov_head.markov_w2.weight", (Vd, r), missing_code="markov-head-missing",
            why="Markov bias projection to draft-vocab logits")
        if cfg.markov_head_type == "gated":
            add("markov_head.gate_proj.weight", (r, H + r), missing_code="markov-head-missing")
            add("markov_head.gate_proj.bias", (r,), missing_code="markov-head-missing")
        elif cfg.markov_head_type == "rnn":
            add("markov_head.joint_proj.weight", (3 * r, 2 * r + H), missing_code="markov-head-missing")
            add("markov_head.joint_proj.bias", (3 * r,), missing_code="markov-head-missing")
    if isinstance(cfg, DSparkConfig) and cfg.enable_confidence_head:
        width = H + (cfg.markov_rank if cfg.confidence_head_with_markov else 0)
        why = "enable_confidence_head is true (vLLM loads it only if present)"
        add("confidence_head.proj.weight", (1, width), need="recommended",
            missing_code="tensor-recommended-missing", why=why)
        add("confidence_head.proj.bias", (1,), need="recommended",
            missing_code="tensor-recommended-missing", why=why)
    return out


# ----------------------------------------------------------------------------------
# Lint
# ----------------------------------------------------------------------------------


class _Collector:
    def __init__(self) -> None:
        self.items: list[Finding] = []

    def __call__(self, level: Level, code: str, message: str, key: str | None = None) -> None:
        if code not in LINT_RULES:  # programming error, not user input
            raise KeyError(f"unregistered lint code {code!r}")
        self.items.append(Finding(level, code, message, key))


def _serve_hint(cfg: SpeculatorsDraftConfig) -> str:
    method = "eagle3" if cfg.speculators_model_type == "peagle" else cfg.speculators_model_type
    extra = ', "parallel_drafting": true' if cfg.speculators_model_type == "peagle" else ""
    return (
        "vllm serve <verifier> --speculative-config "
        f'\'{{"model": "<draft_dir>", "method": "{method}", '
        f'"num_speculative_tokens": {cfg.speculative_tokens}{extra}}}\''
    )


# (key, level when implicit, why) per algorithm; see §4.1, §5.1, §8.2
_IMPLICIT_KEYS: dict[str, list[tuple[str, Level, str]]] = {
    "peagle": [
        ("norm_before_residual", "warning", "the speculators trainer defaults to true, the config class and vLLM to false"),
    ],
    "dflash": [
        ("block_size", "warning", "the config default is 8, the trainer default 16"),
        ("sample_from_anchor", "info", "speculators and vLLM both default to false"),
        ("sliding_window_non_causal", "info", "speculators and vLLM both default to false"),
    ],
    "dspark": [
        ("block_size", "warning", "the config default is 8"),
        ("sample_from_anchor", "warning", "speculators defaults to true, vLLM's updater to false"),
        ("markov_rank", "warning", "speculators defaults to 256; vLLM copies it only when set"),
        ("enable_confidence_head", "warning", "speculators defaults to true, vLLM to false"),
        ("confidence_head_with_markov", "warning", "speculators defaults to true, vLLM to false"),
    ],
}


def _lint_config(cfg: SpeculatorsDraftConfig, add: _Collector, verifier: VerifierFacts | None) -> None:
    algo = cfg.speculators_model_type
    t = cfg.transformer_layer_config
    extra = cfg.model_extra or {}
    Vt, Vd, H, L = cfg.vocab_size, cfg.draft_vocab_size, cfg.hidden_size, cfg.num_layers

    # ---- envelope -------------------------------------------------------------
    if "model_type" in extra:
        add("error", "top-level-model-type",
            f"top-level model_type {extra['model_type']!r} is present: vLLM then treats the "
            "directory as a plain HF model instead of a speculators draft; remove it "
            "(dump_config never writes it)", "model_type")
    if "auto_map" in extra:
        add("info", "auto-map", "auto_map (and config.py) are save_pretrained artifacts that "
            "speculators and vLLM ignore; dump_config drops them", "auto_map")
    if cfg.tie_word_embeddings:
        add("warning", "tie-word-embeddings",
            "tie_word_embeddings is true; speculators drafts always write false", "tie_word_embeddings")
    if cfg.speculators_config.algorithm != algo:
        add("warning", "algorithm-mismatch",
            f"speculators_config.algorithm is {cfg.speculators_config.algorithm!r} but "
            f"speculators_model_type is {algo!r}", "speculators_config.algorithm")
    if cfg.architectures != [ARCHITECTURES[algo]]:
        add("info", "architectures-unexpected",
            f"architectures is {cfg.architectures}; speculators writes [{ARCHITECTURES[algo]!r}]"
            " (vLLM overrides it)", "architectures")
    if len(cfg.speculators_config.proposal_methods) > 1:
        add("info", "multiple-proposal-methods",
            "vLLM only reads proposal_methods[0].speculative_tokens",
            "speculators_config.proposal_methods")
    if cfg.target_hidden_size is not None and cfg.target_hidden_size != H:
        add("warning", "target-hidden-size",
            f"target_hidden_size={cfg.target_hidden_size} differs from hidden_size={H}: vLLM "
            "sizes fc from it while speculators insists draft H == verifier H; keep it null",
            "target_hidden_size")
    for key, level, why in _IMPLICIT_KEYS.get(algo, []):
        if key not in cfg.model_fields_set:
            add(level, "implicit-key",
                f"{key} is absent from the file" + (f" ({why})" if why else "")
                + "; write it explicitly", key)

    # ---- mask token -----------------------------------------------------------
    m = cfg.mask_token_id
    if m is None:
        add("error", "mask-token-missing",
            "mask_token_id is missing: vLLM requires it for peagle (pard_token), dflash and "
            "dspark, and it is a training-time constant (take it from the source "
            "checkpoint or the user, never from a default)", "mask_token_id")
    else:
        if m < 0 or m >= Vt:
            add("error", "mask-token-out-of-range",
                f"mask_token_id={m} is outside the target vocabulary [0, {Vt})", "mask_token_id")
        if verifier is not None:
            role = verifier.special_token_ids().get(m)
            if role:
                add("warning", "mask-token-special",
                    f"mask_token_id={m} equals the verifier's {role} token id; the masked "
                    f"slots then look like real {role} tokens — check the training config",
                    "mask_token_id")

    # ---- speculative tokens / block layout ------------------------------------
    k = cfg.speculative_tokens
    k_key = "speculators_config.proposal_methods.0.speculative_tokens"
    if k < 1:
        add("error", "speculative-tokens-invalid",
            f"speculative_tokens={k}: must be >= 1 (speculators rejects it; vLLM uses it as "
            "num_speculative_tokens)", k_key)
    if isinstance(cfg, BlockDraftConfig):
        exp = expected_speculative_tokens(cfg)
        if cfg.block_size < 1 or (exp is not None and exp < 1):
            add("error", "block-size-invalid",
                f"block_size={cfg.block_size} with sample_from_anchor={cfg.sample_from_anchor} "
                "gives no draft slot", "block_size")
        elif k >= 1 and exp is not None and k != exp:
            add("error", "speculative-tokens-mismatch",
                f"speculative_tokens={k} but the trained layout (block_size={cfg.block_size}, "
                f"sample_from_anchor={str(cfg.sample_from_anchor).lower()}) drafts {exp} tokens "
                "per pass; vLLM does not check this", k_key)
    else:
        depths = extra.get("num_depths")
        if isinstance(depths, int) and not isinstance(depths, bool) and k > depths:
            add("warning", "peagle-depths-exceeded",
                f"speculative_tokens={k} exceeds the recorded num_depths={depths} trained", k_key)

    if algo == "dflash" and cfg.sample_from_anchor:
        add("warning", "dflash-sample-from-anchor",
            "sample_from_anchor is true: vLLM's DFlash rejects it (speculators can run it)",
            "sample_from_anchor")
    if algo == "dspark" and cfg.sample_from_anchor:
        add("info", "dspark-sample-from-anchor-vllm",
            "DSpark with sample_from_anchor=true needs vLLM >= 0.27 (>= 0.30 maps it to "
            "dspark_bonus_anchor=false); some vLLM forks hard-code the bonus-anchor layout — "
            "pin and test the vLLM version", "sample_from_anchor")

    # ---- verifier reference ---------------------------------------------------
    vref = cfg.speculators_config.verifier
    name = vref.name_or_path
    v_key = "speculators_config.verifier.name_or_path"
    if not name:
        add("error", "verifier-name-missing",
            "speculators_config.verifier.name_or_path is empty: vLLM needs it as the target "
            "model and speculators loads the embeddings/head from it", v_key)
    else:
        local = verifier is not None and verifier.is_local_path and verifier.name_or_path == name
        if local or not is_hub_repo_id(name):
            add("warning", "verifier-not-hub-id",
                f"verifier name_or_path {name!r} is a local path or not a valid Hub repo id: "
                "vLLM 0.33 `vllm serve <draft_dir>` requires a remote repo id; record the Hub "
                f"repo id instead, or serve with the long form: {_serve_hint(cfg)}", v_key)
    if verifier is not None and verifier.architectures and vref.architectures \
            and list(vref.architectures) != list(verifier.architectures):
        add("info", "verifier-architectures-mismatch",
            f"recorded verifier architectures {vref.architectures} differ from the verifier's "
            f"{verifier.architectures}", "speculators_config.verifier.architectures")

    # ---- layers / attention ---------------------------------------------------
    mt = t.get("model_type")
    if algo == "peagle" and mt not in ("llama", "qwen3"):
        add("error", "layer-model-type-unsupported",
            f"transformer_layer_config.model_type={mt!r}: P-EAGLE supports only 'llama' or "
            "'qwen3' (vLLM raises ValueError)", "transformer_layer_config.model_type")
    if algo != "peagle" and mt != "qwen3":
        add("warning", "layer-model-type-not-qwen3",
            f"transformer_layer_config.model_type={mt!r}: DFlash/DSpark always build Qwen3-style "
            "layers (per-head q/k norm); use 'qwen3'", "transformer_layer_config.model_type")
    if t["num_attention_heads"] % t["num_key_value_heads"]:
        add("error", "gqa-heads",
            f"num_attention_heads={t['num_attention_heads']} is not a multiple of "
            f"num_key_value_heads={t['num_key_value_heads']}",
            "transformer_layer_config.num_key_value_heads")

    types = resolve_layer_types(t)
    if "layer_types" not in t:
        add("info", "layer-types-implicit",
            f"layer_types is absent; derived {types} from the HF default rule — write it "
            "explicitly", "transformer_layer_config.layer_types")
    if len(types) != L:
        add("error", "layer-types-length",
            f"layer_types has {len(types)} entries but num_hidden_layers={L}",
            "transformer_layer_config.layer_types")
    unknown = sorted({x for x in types if x not in ("full_attention", "sliding_attention")})
    if unknown:
        add("error", "layer-types-unknown",
            f"layer_types contains {unknown}; expected full_attention/sliding_attention",
            "transformer_layer_config.layer_types")
    n_swa_declared = sum(x == "sliding_attention" for x in types)
    window = _effective_window(t)
    if n_swa_declared and mt == "qwen3" and not t.get("use_sliding_window", False):
        add("warning", "swa-disabled",
            f"layer_types lists {n_swa_declared} sliding_attention layer(s) but "
            "use_sliding_window is false: transformers' Qwen3Config then sets sliding_window "
            "to None and those layers run as full attention in speculators and vLLM",
            "transformer_layer_config.use_sliding_window")
    elif n_swa_declared and window is None:
        add("warning", "swa-window-missing",
            "layer_types lists sliding_attention layers but sliding_window is null: they run "
            "as full attention", "transformer_layer_config.sliding_window")
    swa = [x == "sliding_attention" and window is not None for x in types]
    n_swa = sum(swa)
    if n_swa:
        add("info", "swa-window-anchoring",
            f"{n_swa} sliding-window layer(s): speculators restricts context to the W={window} "
            "positions before the block anchor while vLLM uses a per-query window; expect small "
            "differences beyond ~W tokens of context", "transformer_layer_config.sliding_window")

    if algo == "dflash" and types and not unknown:
        flag = cfg.sliding_window_non_causal
        key = "sliding_window_non_causal"
        if n_swa == 0 and not flag:
            add("error", "dflash-causal-full-attention",
                "all draft layers are full attention (trained bidirectional inside the block) "
                "but sliding_window_non_causal is false: vLLM >= 0.27 sets causal = not "
                "sliding_window_non_causal for every layer and would run them block-causal; "
                "set sliding_window_non_causal: true (a no-op for speculators)", key)
        elif 0 < n_swa < len(swa) and not flag:
            add("warning", "dflash-mixed-attention",
                f"mixed full+SWA draft ({len(swa) - n_swa} full, {n_swa} SWA) with "
                "sliding_window_non_causal=false is not faithfully servable in vLLM >= 0.27: "
                "the full-attention layers were trained bidirectional but run causal", key)
        if n_swa and flag:
            add("warning", "dflash-swa-non-causal",
                "sliding_window_non_causal is true, so the SWA layers attend bidirectionally "
                "inside the block; the speculators trainer default is causal (false) — make "
                "sure the draft was trained this way", key)
        if n_swa == len(swa) and n_swa and not flag:
            add("info", "dflash-vllm-version",
                "causal all-SWA DFlash is served faithfully by vLLM >= 0.27 only (0.24 runs "
                "every layer bidirectional)", key)
    if algo == "dspark" and n_swa and cfg.sliding_window_non_causal:
        add("warning", "dspark-swa-non-causal-ignored",
            "sliding_window_non_causal is true but vLLM ignores it for DSpark and runs the SWA "
            "layers causal inside the block", "sliding_window_non_causal")

    # ---- DSpark heads ---------------------------------------------------------
    if isinstance(cfg, DSparkConfig):
        r = cfg.markov_rank
        if r < 0:
            add("error", "markov-rank-invalid", f"markov_rank={r} must be >= 0", "markov_rank")
        elif r == 0:
            add("warning", "dspark-markov-rank-zero",
                "markov_rank is 0: speculators disables the Markov head but vLLM always builds "
                "it (use r > 0 for vLLM)", "markov_rank")
            if cfg.confidence_head_with_markov and cfg.enable_confidence_head:
                add("error", "dspark-confidence-markov-rank-zero",
                    "confidence_head_with_markov is true but markov_rank is 0: the confidence "
                    "input needs markov_w1", "confidence_head_with_markov")
        if cfg.markov_head_type != "vanilla":
            add("warning", "dspark-markov-head-type",
                f"markov_head_type={cfg.markov_head_type!r}: vLLM implements the vanilla head "
                "only; the extra weights have nowhere to load", "markov_head_type")

    # ---- P-EAGLE ----------------------------------------------------------------
    if isinstance(cfg, PEagleConfig):
        if cfg.norm_before_fc and cfg.fc_norm:
            add("error", "norm-flags-exclusive",
                "norm_before_fc and fc_norm are both true; speculators rejects this", "fc_norm")
        if cfg.fc_norm:
            add("warning", "peagle-fc-norm",
                "fc_norm is true but vLLM's peagle updater does not forward it (the per-chunk "
                "norms are not loaded)", "fc_norm")
        A = cfg.num_aux
        if mt == "llama" and A != 3:
            na = t.get("num_aux_hidden_states")
            if na is None:
                add("warning", "peagle-llama-aux-count",
                    f"Llama P-EAGLE with {A} aux layers: vLLM's Llama eagle3 model sizes fc for 3 "
                    f"unless transformer_layer_config.num_aux_hidden_states={A} is set (or use "
                    "qwen3 layers)", "transformer_layer_config.num_aux_hidden_states")
            elif na != A:
                add("error", "peagle-llama-aux-count",
                    f"transformer_layer_config.num_aux_hidden_states={na} but there are {A} aux "
                    "layer ids", "transformer_layer_config.num_aux_hidden_states")

    # ---- aux ids ----------------------------------------------------------------
    ids = cfg.aux_layer_ids
    aux_key = "eagle_aux_hidden_state_layer_ids" if algo == "peagle" else "aux_hidden_state_layer_ids"
    if not ids:
        if algo == "peagle":
            add("warning", "aux-ids-implicit",
                "eagle_aux_hidden_state_layer_ids is null: speculators resolves [2, n//2, n-3] "
                "from the verifier at load time; write the trained ids explicitly", aux_key)
        else:
            add("error", "aux-ids-missing",
                f"{aux_key} is missing or empty: the model cannot be built and vLLM raises "
                "KeyError", aux_key)
    else:
        if len(set(ids)) != len(ids):
            add("error", "aux-ids-duplicate", f"{aux_key}={ids} has duplicate ids", aux_key)
        n = verifier.num_hidden_layers if verifier is not None else None
        bad = [i for i in ids if i < 0 or (n is not None and i > n)]
        if bad:
            rng = f"[0, {n}]" if n is not None else ">= 0"
            add("error", "aux-ids-out-of-range",
                f"{aux_key} contains {bad} outside {rng} (speculators convention: 0 = embeddings, "
                "n = final pre-norm hidden state)", aux_key)

    # ---- verifier compatibility ------------------------------------------------
    if verifier is not None:
        if verifier.hidden_size != H:
            add("error", "hidden-size-mismatch",
                f"draft hidden_size={H} but the verifier's is {verifier.hidden_size}",
                "transformer_layer_config.hidden_size")
        if verifier.vocab_size != Vt:
            add("error", "vocab-size-mismatch",
                f"draft transformer_layer_config.vocab_size={Vt} but the verifier's is "
                f"{verifier.vocab_size}", "transformer_layer_config.vocab_size")

    # ---- vocabulary -------------------------------------------------------------
    if Vd < 1:
        add("error", "draft-vocab-invalid", f"draft_vocab_size={Vd} must be positive", "draft_vocab_size")


def _lint_tensors(
    cfg: SpeculatorsDraftConfig, tensors: Mapping[str, tuple[tuple[int, ...], str]], add: _Collector
) -> None:
    algo = cfg.speculators_model_type
    Vt, Vd, H, L = cfg.vocab_size, cfg.draft_vocab_size, cfg.hidden_size, cfg.num_layers
    names = set(tensors)
    exp = expected_tensors(cfg)

    # forbidden / structural
    vt = sorted(n for n in names if n.startswith("verifier_"))
    if vt:
        add("error", "verifier-tensor",
            f"training-only tensors {vt} must not be shipped (speculators excludes them on save)", vt[0])
    if algo != "peagle" and "mask_hidden" in names:
        add("error", "mask-hidden-present",
            f"{algo} must not contain mask_hidden: vLLM asserts it is absent", "mask_hidden")
    fused = sorted(n for n in names if ".qkv_proj." in n or ".gate_up_proj." in n)
    if fused:
        add("error", "fused-tensor",
            f"fused tensors {fused[:4]}: speculators stores q/k/v and gate/up separately "
            "(vLLM fuses at load)", fused[0])
    prefixed = sorted(n for n in names if n.startswith("model."))
    if prefixed:
        add("error", "prefixed-tensor-names",
            f"tensor names carry a 'model.' prefix ({prefixed[:3]}...): speculators names have none",
            prefixed[0])

    # layer count
    idx = set()
    for n in names:
        mo = re.match(r"^layers\.(\d+)\.", n)
        if mo:
            idx.add(int(mo.group(1)))
    if idx and idx != set(range(L)):
        add("error", "layer-count",
            f"the checkpoint has layers {sorted(idx)} but transformer_layer_config."
            f"num_hidden_layers={L}", "transformer_layer_config.num_hidden_layers")

    # vocabulary
    if Vd > Vt:
        if "embed_tokens.weight" not in names:
            add("warning", "draft-vocab-padded",
                f"draft_vocab_size={Vd} > vocab_size={Vt} (padded vocab) without embed_tokens: "
                "vLLM needs embed_tokens when the draft input vocab exceeds the target's",
                "draft_vocab_size")
        else:
            add("info", "draft-vocab-larger",
                f"draft_vocab_size={Vd} > vocab_size={Vt}: treated as a padded identity vocab",
                "draft_vocab_size")
    if Vd == Vt and ({"d2t", "t2d"} & names):
        add("warning", "vocab-map-unneeded",
            "d2t/t2d present although draft_vocab_size == vocab_size (speculators writes them "
            "only for pruned vocabularies)", "d2t" if "d2t" in names else "t2d")

    # expected tensors: presence, shape, dtype
    for spec in exp.values():
        if spec.name not in names:
            if spec.need == "required":
                why = f" ({spec.why})" if spec.why else ""
                add("error", spec.missing_code, f"tensor {spec.name} {list(spec.shape)} is missing{why}",
                    spec.name)
            elif spec.need == "recommended":
                add("warning", spec.missing_code,
                    f"tensor {spec.name} {list(spec.shape)} is missing ({spec.why})", spec.name)
            continue
        shape, dtype = tensors[spec.name]
        shape = tuple(int(s) for s in shape)
        if shape != spec.shape:
            if spec.name == "fc.weight":
                A = cfg.num_aux
                add("error", "fc-shape",
                    f"fc.weight has shape {list(shape)} but must be [H, A·H] = [{H}, {A}·{H}] = "
                    f"[{H}, {A * H}] for {A} aux layers", spec.name)
            else:
                add("error", "tensor-shape",
                    f"tensor {spec.name} has shape {list(shape)}, expected {list(spec.shape)}", spec.name)
        if spec.kind == "float":
            if dtype not in _FLOAT_DTYPES:
                add("error", "tensor-dtype", f"tensor {spec.name} has dtype {dtype}, expected a float",
                    spec.name)
        elif dtype != spec.kind:
            add("error", "tensor-dtype", f"tensor {spec.name} has dtype {dtype}, expected {spec.kind}",
                spec.name)

    # unexpected
    known_prefixes = ("verifier_",)
    unexpected = sorted(
        n for n in names
        if n not in exp and not n.startswith(known_prefixes) and not n.startswith("model.")
        and n not in ("mask_hidden",) and ".qkv_proj." not in n and ".gate_up_proj." not in n
        and not (re.match(r"^layers\.(\d+)\.", n) and int(n.split(".")[1]) >= L)
    )
    if unexpected:
        add("warning", "unexpected-tensor",
            f"{len(unexpected)} tensor(s) the {algo} format does not define for this config: "
            f"{unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}", unexpected[0])

    # dtypes
    floats = sorted({d for _, d in tensors.values() if d in _FLOAT_DTYPES})
    if len(floats) > 1:
        add("warning", "mixed-float-dtypes",
            f"float tensors use several dtypes {floats}; speculators saves one training dtype", None)
    want = _CONFIG_DTYPE_TO_ST.get(str(cfg.dtype or "").lower())
    if want and len(floats) == 1 and floats[0] != want:
        add("warning", "dtype-mismatch",
            f"config dtype is {cfg.dtype!r} but the float tensors are {floats[0]}", "dtype")


def lint(
    cfg: SpeculatorsDraftConfig,
    tensors: Mapping[str, tuple[tuple[int, ...], str]] | None = None,
    verifier: VerifierFacts | None = None,
) -> list[Finding]:
    """Servability lint of a Speculators draft (§8, §10 of speculators_format.md).

    Checks the config alone, the tensor names/shapes/dtypes against the config when
    ``tensors`` is given, and compatibility with the verifier when ``verifier`` is given.
    Rule codes are listed in :data:`LINT_RULES`.

    Args:
        cfg: the draft config.
        tensors: ``name -> (shape, safetensors dtype string)`` (e.g. ``((64, 192), "BF16")``);
            ``None`` skips the tensor checks.
        verifier: facts about the verifier; ``None`` skips the checks that need it.

    Returns:
        Findings sorted by level (errors first), then in rule order.
    """
    add = _Collector()
    _lint_config(cfg, add, verifier)
    if tensors is not None:
        _lint_tensors(cfg, tensors, add)
    return sorted(add.items, key=lambda f: _LEVEL_ORDER[f.level])


_LEFTOVERS = ("optimizer_state_dict.pt", "scheduler_state_dict.pt", "train_command.txt", "run.yaml")


def _read_tensor_headers(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Names → (shape, safetensors dtype) of a draft directory's weights, headers only
    (:class:`specconv.tensors.TensorStore`; no tensor data is read for safetensors)."""
    from .tensors import TensorStore

    store = TensorStore.open(path)
    return {name: (tuple(store.info(name).shape), store.info(name).dtype) for name in store.names()}


def lint_dir(path: str | os.PathLike[str], verifier: VerifierFacts | None = None) -> list[Finding]:
    """Lint a Speculators draft directory (config.json + tensor headers; no weights read).

    Args:
        path: the draft directory.
        verifier: optional verifier facts.

    Returns:
        Findings as :func:`lint`, plus directory-level ones (``weights-missing``,
        ``training-leftovers``).

    Raises:
        InvalidInputError: ``config.json`` is missing or invalid, or the weights cannot be
            read.
    """
    p = Path(path)
    if not p.is_dir():
        raise InvalidInputError(f"{p}: not a directory")
    cfg = load_config(p)
    has_weights = any(p.glob("*.safetensors")) or any(p.glob("pytorch_model*.bin"))
    extra: list[Finding] = []
    tensors = None
    if has_weights:
        tensors = _read_tensor_headers(p)
    else:
        extra.append(Finding("error", "weights-missing",
                             f"{p}: no model.safetensors (or other weights file) found", None))
    left = [n for n in _LEFTOVERS if (p / n).exists()]
    if left:
        extra.append(Finding("warning", "training-leftovers",
                             f"training leftovers {left} should not be published", left[0]))
    return sorted(lint(cfg, tensors, verifier) + extra, key=lambda f: _LEVEL_ORDER[f.level])
