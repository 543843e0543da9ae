"""Drafter base class, result types, draft-vocabulary mapping and weight loading.

Aux ids: speculators ``src/speculators/models/eagle3/core.py``; ``d2t``: vLLM
``vllm/model_executor/models/llama_eagle3.py``. Design: ``docs/architecture.md``, ``docs/validate.md``.
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
from .layers import DecoderLayer, DecoderLayers, Linear, RMSNorm, Rotary, WeightTaker, attend, check_layers
from .step import StepBatch, StepOutput, StepShape, request_inputs, sample_pick

if TYPE_CHECKING:  # pragma: no cover
    from ..format import SpeculatorsDraftConfig
    from ..verifier import Verifier
    from .cache import ContextCache
    from .step import Pick

__all__ = ["DraftProposal", "BlockOutput", "Drafter", "VocabMap", "open_verifier", "SUPPORTED_DTYPES"]

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Tensors that may appear in a Speculators dir and that no drafting step reads.
_IGNORABLE = ("t2d", "verifier_lm_head.weight", "verifier_norm.weight")


@dataclass
class DraftProposal:
    """One drafting step's proposal: ``tokens`` long ``[k]`` target ids; ``logits`` float ``[k, Vt]``
    before temperature (``-inf`` outside a pruned vocab; DSpark: Markov-biased); ``confidence``
    ``[k]`` sigmoid of DSpark's confidence head, else None."""

    tokens: torch.Tensor
    logits: torch.Tensor
    confidence: torch.Tensor | None = None


@dataclass
class BlockOutput:
    """Full result of one drafting pass (what parity tests compare).

    ``S`` rows: DFlash/DSpark the ``B`` block slots; P-EAGLE ``T`` context then ``K-1`` mask entries.
    ``positions`` long ``[S]``; ``hidden`` ``[S, H]`` (``norm(h)``); ``slot_logits`` ``[S, Vd]`` (no
    Markov bias); ``draft_slots`` long ``[k]`` (sfa=false ``1..B-1``, true ``0..B-1``, P-EAGLE
    ``T-1..T+K-2``); ``draft_logits`` ``[k, Vd]`` / ``target_logits`` ``[k, Vt]``; ``draft_ids`` /
    ``tokens`` long ``[k]``; ``confidence_logits`` / ``confidence`` ``[k]`` (DSpark) or None.
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
    """Draft→target vocabulary map (vLLM ``vllm/model_executor/models/llama_eagle3.py``).

    ``d2t``: int64 ``[Vd]`` offsets (``target = draft + d2t[draft]``), None for the identity.
    Raises InvalidInputError when it maps outside ``[0, Vt)`` or two draft ids to one target id.
    """

    draft_to_target: torch.Tensor | None  # a registered buffer

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
    """The :class:`~specconv.verifier.Verifier` of a Verifier, local dir or Hub id (None stays None)."""
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
    """Aux layer ids (0 = embeddings); null → ``[2, n//2, n-3]`` of the verifier where the description
    says so (speculators ``src/speculators/models/eagle3/core.py``). InvalidInputError: absent, empty, < 0."""
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
    """Base of the reference drafters: shared weights and the one drafting step (:meth:`step`).

    Subclasses take their own weights after this constructor and implement :meth:`_backbone` (and
    :meth:`_draft` for a sequential head). ``block_size``: ``B`` (P-EAGLE: ``K``);
    ``num_draft_tokens``: ``k`` per :meth:`propose`; ``aux_hidden_size``: ``Ht``
    (``target_hidden_size`` or ``H``; ``aux_hidden`` is ``[1, T, A*Ht]``); ``windows``: per layer
    window or None; ``tied_head``: LM head is the embedding (one GEMM; an export stores it once).
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
        self.layers = DecoderLayers([DecoderLayer(w, i, layer, qk_norm=qk_norm,
                                                  attn_in=alg.layer0_input_width(H) if i == 0 else H)
                                     for i in range(layer.num_hidden_layers)])
        self.norm = RMSNorm(w.take("norm.weight", (H,)), layer.rms_norm_eps)
        self.lm_head = build_lm_head(w, verifier, vocab_size=self.vocab_size, draft_vocab_size=self.draft_vocab_size,
                                     hidden=H, algorithm=alg.name)
        self.vocab = build_vocab(w, vocab_size=self.vocab_size, draft_vocab_size=self.draft_vocab_size)
        self.rotary = Rotary(layer.rope(), layer.head_dim, source=f"{source}: transformer_layer_config")

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

    def _backbone(self, batch: StepBatch, attention, all_rows: bool) -> StepOutput:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward_cached(self, context_tokens: torch.Tensor, aux_hidden: torch.Tensor, cache: ContextCache, *,
                       temperature: float = 0.0, generator: torch.Generator | None = None
                       ) -> BlockOutput:  # pragma: no cover - abstract
        """:meth:`forward_block` through ``cache`` (a :class:`~.cache.DraftSession`'s step)."""
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
        """One batched drafting step on left-padded ``batch`` (the export I/O contract).

        ``pick`` default greedy; ``attention`` eager or the exporter's op; ``all_rows`` runs the LM
        head on every row; ``prev_tokens``: DSpark teacher forcing, int ``[B, N]`` target ids.
        """
        out = self._backbone(batch, attention, all_rows)
        return self._draft(out, batch, pick or sample_pick(0.0, None), confidence, prev_tokens)

    def _block_output(self, out: StepOutput) -> BlockOutput:
        """Row 0 of a step's output as a :class:`BlockOutput`."""
        first, cl = out.first_row, out.confidence_logits
        assert out.draft_logits is not None and out.draft_ids is not None, "a step's output before _draft"
        draft_logits, draft_ids = out.draft_logits[0], out.draft_ids[0]
        return BlockOutput(
            positions=out.positions[0].long(), hidden=out.hidden[0], slot_logits=out.slot_logits[0],
            draft_slots=torch.arange(first, first + draft_ids.shape[0], device=draft_ids.device),
            draft_logits=draft_logits, target_logits=self.vocab.to_target_logits(draft_logits),
            draft_ids=draft_ids, tokens=self.vocab.to_target_ids(draft_ids),
            confidence_logits=None if cl is None else cl[0], confidence=None if cl is None else torch.sigmoid(cl[0]))

    @torch.no_grad()
    def forward_block(self, context_tokens: torch.Tensor, aux_hidden: torch.Tensor, *,
                      temperature: float = 0.0, generator: torch.Generator | None = None,
                      prev_tokens: torch.Tensor | None = None) -> BlockOutput:
        """One drafting pass at batch 1, every row through the LM head (args as :meth:`propose`).

        ``prev_tokens``: DSpark only, long ``[N]`` target ids as ``prev_s`` (teacher forcing).
        Raises UsageError: wrong shapes; ``prev_tokens`` without a Markov head.
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

        ``context_tokens`` long ``[1, T+1]`` (index ``T``: the anchor, no features yet);
        ``aux_hidden`` ``[1, T, A*H]`` in ``aux_layer_ids`` order (any float dtype); ``temperature``
        0 = argmax. Returns ``k = num_draft_tokens`` target ids. Raises UsageError: wrong shapes.
        """
        out = self.forward_block(context_tokens, aux_hidden, temperature=temperature,
                                 generator=generator)
        return DraftProposal(tokens=out.tokens, logits=out.target_logits,
                             confidence=out.confidence)


def build_lm_head(w: WeightTaker, verifier: Verifier | None, *, vocab_size: int,
                  draft_vocab_size: int, hidden: int, algorithm: str) -> Linear:
    """``lm_head.weight [Vd, H]`` from the drafter dir, else (full vocab only) the verifier's; pruned
    drafts must ship it (vLLM reads the drafter's own)."""
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
        assert vm.draft_to_target is not None  # d2t given
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
