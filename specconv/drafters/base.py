"""Drafter base class, result types, draft-vocabulary mapping and weight loading.

Every per-algorithm fact comes from the algorithm's description (:mod:`specconv.format.algorithms`).
Aux ids follow the speculators / vLLM capture convention (``docs/validate.md``, "Harness";
speculators ``src/speculators/models/eagle3/core.py``, vLLM ``vllm/model_executor/models/llama_eagle3.py``);
``d2t`` offsets: :class:`VocabMap` (vLLM ``llama_eagle3.py`` ``combine_hidden_states`` /
``compute_logits``). The one step (:meth:`Drafter.step`) and its stateless, cached and exported
paths: ``docs/architecture.md`` (``specconv/drafters/``) and ``docs/validate.md`` ("Harness").
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..errors import InvalidInputError, UnsupportedFormatError, UsageError
from ..format.algorithms import Algorithm, algorithm
from .layers import DecoderLayer, Linear, RMSNorm, Rotary, WeightTaker, attend, check_layers
from .step import StepBatch, StepOutput, StepShape, request_inputs, sample_pick

if TYPE_CHECKING:  # pragma: no cover
    from ..format import SpeculatorsDraftConfig
    from ..verifier import Verifier
    from .step import Pick

__all__ = ["DraftProposal", "BlockOutput", "Drafter", "VocabMap", "open_verifier", "SUPPORTED_DTYPES"]

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Tensors that may appear in a Speculators dir and that no drafting step reads.
_IGNORABLE = ("t2d", "verifier_lm_head.weight", "verifier_norm.weight")


@dataclass
class DraftProposal:
    """What one drafting step proposes.

    Attributes:
        tokens: LongTensor ``[k]`` — draft tokens as **target** (verifier) ids, ``d2t``
            applied.
        logits: FloatTensor ``[k, Vt]`` — target-vocab logits the tokens were picked
            from (before temperature; a pruned draft vocab is scattered into a
            ``-inf``-filled row). For DSpark these are the Markov-biased logits.
            The draft distribution used at temperature ``T > 0`` is
            ``softmax(logits / T)``.
        confidence: FloatTensor ``[k]`` (DSpark with a confidence head): predicted
            per-position acceptance probability (sigmoid of the head's logit); else None.
    """

    tokens: torch.Tensor
    logits: torch.Tensor
    confidence: torch.Tensor | None = None


@dataclass
class BlockOutput:
    """Full result of one drafting pass (what parity tests compare).

    ``S`` is the number of rows the pass computes: DFlash/DSpark the ``B`` block slots;
    P-EAGLE the ``T`` context entries followed by the ``K-1`` mask entries.

    Attributes:
        positions: LongTensor ``[S]`` — RoPE position of each row.
        hidden: ``[S, H]`` — final-normed hidden state (``norm(h)``) of each row.
        slot_logits: ``[S, Vd]`` — ``lm_head(norm(h))`` of each row (draft vocab, no
            Markov bias).
        draft_slots: LongTensor ``[k]`` — rows the drafts come from, in draft order
            (DFlash sfa=false: ``1..B-1``; sfa=true: ``0..B-1``; P-EAGLE:
            ``T-1, T, ..., T+K-2``).
        draft_logits: ``[k, Vd]`` — logits the drafts were picked from (DSpark:
            Markov-biased).
        target_logits: ``[k, Vt]`` — ``draft_logits`` in target vocab (``-inf`` outside
            the draft vocab).
        draft_ids: LongTensor ``[k]`` — picked draft-vocab ids.
        tokens: LongTensor ``[k]`` — picked target ids (``d2t`` applied).
        confidence_logits / confidence: ``[k]`` DSpark confidence head logit /
            sigmoid, else None.
    """

    positions: torch.Tensor
    hidden: torch.Tensor
    slot_logits: torch.Tensor
    draft_slots: torch.Tensor
    draft_logits: torch.Tensor
    target_logits: torch.Tensor
    draft_ids: torch.Tensor
    tokens: torch.Tensor
    confidence_logits: torch.Tensor | None = None
    confidence: torch.Tensor | None = None


class VocabMap(nn.Module):
    """Draft→target vocabulary mapping (vLLM ``vllm/model_executor/models/llama_eagle3.py``).

    ``d2t`` holds offsets: ``target_id = draft_id + d2t[draft_id]``. With ``Vd == Vt``
    (no pruning) the map is the identity.

    Args:
        d2t: int64 ``[Vd]`` offsets, or None for the identity.
        target_vocab_size: ``Vt``.
        draft_vocab_size: ``Vd``.

    Raises:
        InvalidInputError: ``d2t`` maps outside ``[0, Vt)`` or two draft ids to one
            target id.
    """

    def __init__(self, d2t: torch.Tensor | None, target_vocab_size: int, draft_vocab_size: int,
                 source: str = "d2t"):
        super().__init__()
        self.target_vocab_size = int(target_vocab_size)
        self.draft_vocab_size = int(draft_vocab_size)
        if d2t is None:
            if draft_vocab_size != target_vocab_size:
                raise InvalidInputError(
                    f"{source}: draft_vocab_size {draft_vocab_size} != vocab_size "
                    f"{target_vocab_size} but no d2t tensor", code="missing_tensor")
            self.register_buffer("draft_to_target", None, persistent=False)
            return
        d2t = d2t.to(torch.int64).reshape(-1)
        if d2t.numel() != draft_vocab_size:
            raise InvalidInputError(
                f"{source}: d2t has {d2t.numel()} entries, expected draft_vocab_size "
                f"{draft_vocab_size}", code="tensor_shape")
        ids = torch.arange(draft_vocab_size, dtype=torch.int64) + d2t
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= target_vocab_size):
            raise InvalidInputError(
                f"{source}: d2t maps draft ids outside the target vocabulary "
                f"[0, {target_vocab_size})", code="d2t_range")
        if torch.unique(ids).numel() != ids.numel():
            raise InvalidInputError(f"{source}: d2t maps two draft ids to the same target id",
                                    code="d2t_duplicate")
        self.register_buffer("draft_to_target", ids, persistent=False)

    @property
    def identity(self) -> bool:
        return self.draft_to_target is None

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocab ids (any shape) to target ids."""
        if self.draft_to_target is None:
            return draft_ids
        return self.draft_to_target[draft_ids]

    def to_target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Scatter ``[..., Vd]`` logits into ``[..., Vt]`` (``-inf`` elsewhere)."""
        if self.draft_to_target is None:
            return logits
        out = logits.new_full((*logits.shape[:-1], self.target_vocab_size), float("-inf"))
        out[..., self.draft_to_target] = logits
        return out


def open_verifier(verifier: Verifier | str | Path | None) -> Verifier | None:
    """The :class:`~specconv.verifier.Verifier` for a drafter (None stays None).

    Args:
        verifier: a resolved ``Verifier``, or a local directory / Hub id for
            :func:`specconv.verifier.resolve_verifier`.

    Raises:
        InvalidInputError: see :func:`specconv.verifier.resolve_verifier`.
    """
    from ..verifier import Verifier, resolve_verifier

    if verifier is None or isinstance(verifier, Verifier):
        return verifier
    return resolve_verifier(str(verifier))


def _need_verifier(verifier: Verifier | None, what: str) -> Verifier:
    if verifier is None:
        raise InvalidInputError(f"the drafter needs the verifier's {what} but no verifier was given",
                                code="verifier_required")
    return verifier


def check_dtype(dtype: torch.dtype) -> None:
    if dtype not in SUPPORTED_DTYPES:
        raise UsageError(f"dtype {dtype} is not supported (float32, bfloat16, float16)")


def aux_ids_from_config(cfg: SpeculatorsDraftConfig, alg: Algorithm, verifier: Verifier | None,
                        source: str) -> list[int]:
    """Aux hidden-state layer ids (speculators / vLLM capture convention: 0 = embeddings).

    A null list resolves to ``[2, n//2, n-3]`` from the verifier's ``num_hidden_layers``
    where the description says so (``aux_ids_default_from_verifier``: P-EAGLE), as
    speculators' ``src/speculators/models/eagle3/core.py`` does.

    Raises:
        InvalidInputError: ids absent (and not derivable), empty or negative.
    """
    key, ids = alg.aux_ids_key, cfg.aux_layer_ids
    if ids is None:
        if alg.aux_ids_default_from_verifier and verifier is not None:
            n = verifier.num_hidden_layers
            warnings.warn(f"{source}: {key} is null; using speculators' default "
                          f"[2, {n // 2}, {n - 3}] from the verifier", stacklevel=3)
            return [2, n // 2, n - 3]
        raise InvalidInputError(f"{source}: {key!r} is required", code="config_key")
    if not ids or any(i < 0 for i in ids):
        raise InvalidInputError(f"{source}: {key!r} must be a non-empty list of ints >= 0, "
                                f"got {ids!r}", code="config_key")
    return list(ids)


class Drafter(nn.Module):
    """Base class of the reference drafters: the weights every algorithm shares and the one
    drafting step (:meth:`step`) the stateless, cached and exported paths run.

    Subclasses take their own weights (``fc``, ``hidden_norm``, heads) after this
    constructor and implement :meth:`_backbone` (the step's layers) and, for a sequential
    head stage, :meth:`_draft`.

    Attributes:
        algorithm: ``speculators_model_type``; ``alg`` its description.
        block_size: ``B`` (DFlash/DSpark); P-EAGLE: ``K`` (entries drafted per pass).
        num_draft_tokens: ``k`` drafts returned per :meth:`propose` (``B-1``/``B`` by
            ``sample_from_anchor``; P-EAGLE: ``speculative_tokens``).
        aux_layer_ids: verifier aux layer ids (speculators convention: 0 = embeddings,
            N = final pre-norm hidden), in ``aux_hidden`` concat order.
        mask_token_id, sample_from_anchor (P-EAGLE: False), vocab_size (``Vt``),
        draft_vocab_size (``Vd``), hidden_size (``H``), aux_hidden_size (``Ht``:
        ``target_hidden_size`` or ``H``; ``aux_hidden`` is ``[1, T, A*Ht]``), config
        (the typed :class:`~specconv.format.SpeculatorsDraftConfig`).
        windows: per draft layer, its sliding window or None (full attention).
        tied_head: the LM head weight is the embedding (a tied verifier's): the logits are
            one GEMM on the embedding (an export stores it once).

    Raises:
        InvalidInputError / UnsupportedFormatError: see :func:`specconv.drafters.load_drafter`.
    """

    algorithm: str = ""

    def __init__(self, config: SpeculatorsDraftConfig, w: WeightTaker, verifier: Verifier | None, source: str):
        super().__init__()
        alg = self.alg = algorithm(config.speculators_model_type)
        layer = config.transformer_layer_config
        self.config, self.source = config, source
        if not alg.qk_norm_always and layer.model_type not in alg.layer_model_types:  # the model type picks the layer
            raise UnsupportedFormatError(
                f"{source}: {alg.display_name} transformer_layer_config.model_type must be one of "
                f"{list(alg.layer_model_types)} (speculators and vLLM know only these), got {layer.model_type!r}")
        self.windows = check_layers(layer, f"{source}: transformer_layer_config")
        H = self.hidden_size = layer.hidden_size
        self.vocab_size = layer.vocab_size
        self.draft_vocab_size = require_int(config, "draft_vocab_size", source, minimum=1)
        self.mask_token_id = require_int(config, "mask_token_id", source)
        if self.mask_token_id >= self.vocab_size:
            raise InvalidInputError(f"{source}: mask_token_id {self.mask_token_id} >= vocab_size "
                                    f"{self.vocab_size}", code="config_key")
        self.aux_layer_ids = aux_ids_from_config(config, alg, verifier, source)
        self.aux_hidden_size = target_hidden(config, H, source)
        self.block_size = self.num_draft_tokens = 0
        self.sample_from_anchor = False
        self.tied_head = False
        self.embed_tokens = nn.Parameter(build_embedding(w, verifier, vocab_size=self.vocab_size, hidden=H),
                                         requires_grad=False)
        qk_norm = alg.qk_norm_always or layer.model_type == "qwen3"
        self.layers = nn.ModuleList([DecoderLayer(w, i, layer, qk_norm=qk_norm,
                                                  attn_in=alg.layer0_input_width(H) if i == 0 else H)
                                     for i in range(layer.num_hidden_layers)])
        self.norm = RMSNorm(w.take("norm.weight", (H,)), layer.rms_norm_eps)
        self.lm_head = build_lm_head(w, verifier, vocab_size=self.vocab_size, draft_vocab_size=self.draft_vocab_size,
                                     hidden=H, algorithm=alg.name)
        self.vocab = build_vocab(w, vocab_size=self.vocab_size, draft_vocab_size=self.draft_vocab_size)
        self.rotary = Rotary(layer.rope(), layer.head_dim, source=f"{source}: transformer_layer_config")

    # -- helpers --------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device

    @property
    def shape(self) -> StepShape:
        """The step's static shape (what building its inputs needs)."""
        return StepShape(algorithm=self.algorithm, block_size=int(self.block_size),
                         num_draft_tokens=int(self.num_draft_tokens), mask_token_id=int(self.mask_token_id),
                         vocab_size=int(self.vocab_size), draft_vocab_size=int(self.draft_vocab_size),
                         aux_width=len(self.aux_layer_ids) * int(self.aux_hidden_size),
                         draft_slots=self.draft_slots, dtype=self.dtype)

    @property
    def draft_slots(self) -> tuple[int, ...]:
        """Block rows the drafts come from (block drafters; P-EAGLE: none, its draft rows follow the context)."""
        return ()

    def _check_inputs(self, context_tokens: torch.Tensor, aux_hidden: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens [T+1], features [T, A·Ht])`` on the drafter's device and dtype."""
        if context_tokens.dim() == 1:
            context_tokens = context_tokens[None]
        if aux_hidden.dim() == 2:
            aux_hidden = aux_hidden[None]
        if context_tokens.dim() != 2 or context_tokens.shape[0] != 1:
            raise UsageError(f"context_tokens must be [1, T+1], got {tuple(context_tokens.shape)}")
        width = len(self.aux_layer_ids) * self.aux_hidden_size
        if aux_hidden.dim() != 3 or aux_hidden.shape[0] != 1 or aux_hidden.shape[2] != width:
            raise UsageError(f"aux_hidden must be [1, T, {width}] (A*H), got "
                             f"{tuple(aux_hidden.shape)}")
        if context_tokens.shape[1] != aux_hidden.shape[1] + 1:
            raise UsageError(
                f"context_tokens has {context_tokens.shape[1]} tokens but aux_hidden has "
                f"{aux_hidden.shape[1]} positions; expected T+1 tokens for T positions")
        return context_tokens[0].to(self.device, torch.long), aux_hidden[0].to(self.device, self.dtype)

    def _request(self, tokens: torch.Tensor, g: torch.Tensor) -> StepBatch:
        """The step's batch-1 inputs of one request checked by :meth:`_check_inputs`."""
        return request_inputs(self.shape, tokens, g)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens[ids.to(torch.int64)]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head of ``hidden [B, R, H]`` → ``[B, R, Vd]``. Tied: ``linear`` on a 2-D view of
        the embedding itself, which the exporter emits as ``Gemm(transB=1)`` (a 3-D ``linear``
        becomes ``MatMul`` with a folded, second, transposed copy of the weight)."""
        if not self.tied_head:
            return self.lm_head(hidden)
        flat = torch.nn.functional.linear(hidden.reshape(-1, hidden.shape[-1]), self.embed_tokens)
        return flat.reshape(*hidden.shape[:-1], flat.shape[-1])

    def tie_head(self) -> None:
        """Set :attr:`tied_head` when the LM head weight is the embedding (after a dtype cast
        too, which un-shares their storage)."""
        emb, head = self.embed_tokens, self.lm_head
        self.tied_head = head.bias is None and head.weight.shape == emb.shape and (
            head.weight.data_ptr() == emb.data_ptr() or bool(torch.equal(head.weight, emb)))

    # -- the drafting step ------------------------------------------------------------
    def _backbone(self, batch: StepBatch, attention, all_rows: bool) -> StepOutput:  # pragma: no cover - abstract
        raise NotImplementedError

    def _draft(self, out: StepOutput, batch: StepBatch, pick: Pick, confidence: bool,
               prev_tokens: torch.Tensor | None) -> StepOutput:
        """Pick the drafts from rows ``first_row..`` (independent rows; DSpark overrides)."""
        if prev_tokens is not None:
            raise UsageError(f"prev_tokens: {self.alg.display_name} has no Markov head to condition")
        first = out.first_row
        out.draft_logits = out.slot_logits[:, first:first + int(self.num_draft_tokens)]
        out.draft_ids = pick(out.draft_logits, None)
        return out

    def step(self, batch: StepBatch, *, pick: Pick | None = None, attention=attend, all_rows: bool = False,
             confidence: bool = True, prev_tokens: torch.Tensor | None = None) -> StepOutput:
        """One batched drafting step (the export I/O contract, :mod:`specconv.drafters.step`).

        Args:
            batch: the step's inputs (left-padded).
            pick: how drafts are picked (default greedy); :func:`~.step.noise_pick` /
                :func:`~.step.sample_pick`.
            attention: :func:`~.layers.attend` (eager) or the exporter's attention op.
            all_rows: run the LM head on every row (P-EAGLE's context entries too), not
                only the rows the drafts come from.
            confidence: compute a confidence head where the drafter has one.
            prev_tokens: DSpark teacher forcing: int ``[B, N]`` target ids as ``prev_s``.

        Returns:
            :class:`~.step.StepOutput`.
        """
        out = self._backbone(batch, attention, all_rows)
        return self._draft(out, batch, pick or sample_pick(0.0, None), confidence, prev_tokens)

    def _block_output(self, out: StepOutput) -> BlockOutput:
        """Row 0 of a step's output as a :class:`BlockOutput`."""
        first, cl = out.first_row, out.confidence_logits
        draft_logits, draft_ids = out.draft_logits[0], out.draft_ids[0]
        return BlockOutput(
            positions=out.positions[0].long(), hidden=out.hidden[0], slot_logits=out.slot_logits[0],
            draft_slots=torch.arange(first, first + draft_ids.shape[0], device=draft_ids.device),
            draft_logits=draft_logits, target_logits=self.vocab.to_target_logits(draft_logits),
            draft_ids=draft_ids, tokens=self.vocab.to_target_ids(draft_ids),
            confidence_logits=None if cl is None else cl[0], confidence=None if cl is None else torch.sigmoid(cl[0]))

    # -- API ------------------------------------------------------------------------
    @torch.no_grad()
    def forward_block(self, context_tokens: torch.Tensor, aux_hidden: torch.Tensor, *,
                      temperature: float = 0.0, generator: torch.Generator | None = None,
                      prev_tokens: torch.Tensor | None = None) -> BlockOutput:
        """One drafting pass at batch 1 (:meth:`step`), every row through the LM head.

        Args:
            context_tokens, aux_hidden, temperature, generator: as :meth:`propose`; a
                sequential head (DSpark) samples inside its loop, so each slot conditions on
                the token actually drawn.
            prev_tokens: DSpark only: LongTensor ``[N]`` of target ids to use as ``prev_s``
                (teacher forcing, as in training); default: anchor, then own picks.

        Returns:
            :class:`BlockOutput` (``S`` rows: DFlash/DSpark the ``B`` block slots; P-EAGLE
            the ``T`` context entries then the ``K-1`` mask entries).

        Raises:
            UsageError: wrong shapes; ``prev_tokens`` for a drafter without a Markov head.
        """
        prev = None if prev_tokens is None else prev_tokens.reshape(1, -1).to(self.device, torch.long)
        out = self.step(self._request(*self._check_inputs(context_tokens, aux_hidden)),
                        pick=sample_pick(temperature, generator),
                        all_rows=True, prev_tokens=prev)
        return self._block_output(out)

    @torch.no_grad()
    def propose(self, context_tokens: torch.Tensor, aux_hidden: torch.Tensor, *,
                temperature: float = 0.0, generator: torch.Generator | None = None
                ) -> DraftProposal:
        """One drafting step from the accepted context (full recompute, no cache).

        Args:
            context_tokens: LongTensor ``[1, T+1]`` — every token so far; index ``T`` is
                the bonus/anchor token the verifier just sampled (no features yet).
            aux_hidden: ``[1, T, A*H]`` — the verifier's aux hidden states of positions
                ``0..T-1`` concatenated in ``aux_layer_ids`` order (any float dtype; cast
                to the drafter's dtype).
            temperature: 0 = greedy (argmax); > 0 samples from ``softmax(logits / T)``.
            generator: optional ``torch.Generator`` for sampling.

        Returns:
            :class:`DraftProposal` with ``k = num_draft_tokens`` tokens (target ids).

        Raises:
            UsageError: wrong shapes.
        """
        out = self.forward_block(context_tokens, aux_hidden, temperature=temperature,
                                 generator=generator)
        return DraftProposal(tokens=out.tokens, logits=out.target_logits,
                             confidence=out.confidence)


def build_lm_head(w: WeightTaker, verifier: Verifier | None, *, vocab_size: int,
                  draft_vocab_size: int, hidden: int, algorithm: str) -> Linear:
    """``lm_head.weight [Vd, H]`` from the drafter dir, else (full vocab only) the
    verifier's head (tied → embedding). Pruned drafts must ship it (speculators
    ``src/speculators/model.py::load_verifier_weights`` would slice the verifier's head by
    ``t2d``; vLLM reads the drafter's own)."""
    if w.has("lm_head.weight"):
        return Linear(w.take("lm_head.weight", (draft_vocab_size, hidden)))
    if draft_vocab_size != vocab_size:
        raise InvalidInputError(
            f"{w.source}: lm_head.weight is required for a pruned draft vocabulary "
            f"({algorithm}, draft_vocab_size {draft_vocab_size} < vocab_size {vocab_size})",
            code="missing_tensor")
    head = _need_verifier(verifier, "LM head").lm_head()
    if tuple(head.shape) != (vocab_size, hidden):
        raise InvalidInputError(
            f"verifier LM head has shape {tuple(head.shape)}, expected ({vocab_size}, {hidden})",
            code="verifier_mismatch")
    return Linear(head)


def build_embedding(w: WeightTaker, verifier: Verifier | None, *, vocab_size: int,
                    hidden: int) -> torch.Tensor:
    """``embed_tokens.weight [Vt, H]`` from the drafter dir, else the verifier's."""
    if w.has("embed_tokens.weight"):
        return w.take("embed_tokens.weight", (vocab_size, hidden))
    emb = _need_verifier(verifier, "embedding").embedding()
    if tuple(emb.shape) != (vocab_size, hidden):
        raise InvalidInputError(
            f"verifier embedding has shape {tuple(emb.shape)}, expected ({vocab_size}, {hidden})",
            code="verifier_mismatch")
    return emb


def build_vocab(w: WeightTaker, *, vocab_size: int, draft_vocab_size: int) -> VocabMap:
    """d2t offsets (required when pruned); ``t2d`` is cross-checked when present."""
    d2t = w.take_opt("d2t")
    if draft_vocab_size == vocab_size:
        if d2t is not None and bool((d2t != 0).any()):
            raise InvalidInputError(f"{w.source}: non-zero d2t for an unpruned vocabulary",
                                    code="d2t_range")
        w.ignore("t2d")
        return VocabMap(None, vocab_size, draft_vocab_size, source=w.source)
    if d2t is None:
        raise InvalidInputError(
            f"{w.source}: d2t is required when draft_vocab_size ({draft_vocab_size}) != "
            f"vocab_size ({vocab_size})", code="missing_tensor")
    vm = VocabMap(d2t, vocab_size, draft_vocab_size, source=w.source)
    t2d = w.take_opt("t2d")
    if t2d is not None:
        expect = torch.zeros(vocab_size, dtype=torch.bool)
        expect[vm.draft_to_target] = True
        if t2d.shape != expect.shape or not torch.equal(t2d.to(torch.bool), expect):
            warnings.warn(f"{w.source}: t2d disagrees with d2t (d2t is what drafting uses)",
                          stacklevel=3)
    return vm


def refuse_unused(w: WeightTaker) -> None:
    """Raise for tensors no drafting step reads (unsupported variant or stray keys)."""
    for n in _IGNORABLE:
        w.ignore(n)
    left = w.unused()
    if not left:
        return
    gated = [n for n in left if ".g_proj." in n or ("self_attn" in n and "gate" in n)]
    if gated:
        raise UnsupportedFormatError(
            f"{w.source}: gated attention tensors ({', '.join(gated[:3])}) are not supported "
            "by the Speculators drafters", format_id="gated_attention")
    raise UnsupportedFormatError(
        f"{w.source}: unexpected tensors the drafter cannot use: "
        f"{', '.join(left[:8])}{' ...' if len(left) > 8 else ''}")


def target_hidden(cfg: SpeculatorsDraftConfig, hidden: int, source: str) -> int:
    """``target_hidden_size`` (verifier width of each aux chunk), default ``H``."""
    v = cfg.target_hidden_size
    if v is None:
        return hidden
    if v <= 0:
        raise InvalidInputError(f"{source}: target_hidden_size must be a positive integer or "
                                f"null, got {v!r}", code="config_key")
    return v


def require_int(cfg: SpeculatorsDraftConfig, key: str, source: str, *, minimum: int = 0) -> int:
    """An integer key of the typed config (its parser decides defaults); None or too small raises."""
    v = getattr(cfg, key, None)
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise InvalidInputError(f"{source}: {key!r} must be an integer >= {minimum}, got {v!r}",
                                code="config_key")
    return v
