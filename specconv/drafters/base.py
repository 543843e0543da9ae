"""Drafter base class, result types, draft-vocabulary mapping and weight loading.

Shared by the P-EAGLE, DFlash and DSpark reference drafters. Facts from
speculators_format.md: §2.2 (aux ids), §2.3 (``d2t`` offsets: ``target = draft + d2t``),
§3.3 / §4.3 / §5.3 (one drafting step), §6 (which tensors may be omitted).

:meth:`Drafter.propose` / ``forward_block`` keep **no state**: every call recomputes the
whole drafting pass from the accepted context it is given (the path G2 parity and export
use). ``drafter.new_session()`` (:mod:`specconv.drafters.cache`) keeps the projected
context keys/values between calls instead; the validation loop drafts through it.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import InvalidInputError, UnsupportedFormatError, UsageError
from .layers import Linear, WeightTaker, sample_rows

__all__ = ["DraftProposal", "BlockOutput", "Drafter", "VocabMap", "read_tensors",
           "VerifierWeights", "SUPPORTED_DTYPES"]

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

    @property
    def per_depth_logits(self) -> torch.Tensor:
        """Alias of ``draft_logits`` (P-EAGLE: row ``d`` is depth ``d``)."""
        return self.draft_logits


class VocabMap(nn.Module):
    """Draft→target vocabulary mapping (speculators_format.md §2.3).

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
        return self.draft_to_target.to(draft_ids.device)[draft_ids]

    def to_target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Scatter ``[..., Vd]`` logits into ``[..., Vt]`` (``-inf`` elsewhere)."""
        if self.draft_to_target is None:
            return logits
        out = logits.new_full((*logits.shape[:-1], self.target_vocab_size), float("-inf"))
        out[..., self.draft_to_target.to(logits.device)] = logits
        return out


def read_tensors(path: str | Path, names: list[str] | None = None) -> dict[str, torch.Tensor]:
    """Read tensors from a checkpoint dir/file.

    Uses :func:`specconv.tensors.open_store` (the project's loader) when importable, else
    falls back to ``safetensors`` (``model.safetensors``, an index + shards, or a single
    ``*.safetensors``).

    Args:
        path: directory or weight file.
        names: only these (must exist); None = all.

    Raises:
        InvalidInputError: no weights / unknown tensor name (names the path).
    """
    try:
        from ..tensors import open_store
    except ImportError:  # pragma: no cover - project loader always present in-tree
        open_store = None
    if open_store is not None:
        store = open_store(path)
        wanted = store.names() if names is None else names
        for n in wanted:
            if n not in store:
                raise InvalidInputError(f"{path}: tensor {n!r} not found", code="missing_tensor")
        return {n: store.read_tensor(n) for n in wanted}
    return _read_safetensors_fallback(Path(path), names)  # pragma: no cover


def _read_safetensors_fallback(p: Path, names: list[str] | None) -> dict[str, torch.Tensor]:  # pragma: no cover
    from safetensors import safe_open

    files: list[Path]
    if p.is_file():
        files = [p]
    elif (p / "model.safetensors").is_file():
        files = [p / "model.safetensors"]
    elif (p / "model.safetensors.index.json").is_file():
        wm = json.loads((p / "model.safetensors.index.json").read_text())["weight_map"]
        files = sorted({p / f for f in wm.values()})
    else:
        files = sorted(p.glob("*.safetensors"))
        if len(files) != 1:
            raise InvalidInputError(f"{p}: expected one safetensors weight file")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), "pt") as sf:
            for k in sf.keys():
                if names is None or k in names:
                    out[k] = sf.get_tensor(k)
    if names is not None:
        missing = sorted(set(names) - set(out))
        if missing:
            raise InvalidInputError(f"{p}: tensors not found: {missing}")
    return out


class VerifierWeights:
    """Lazy access to the verifier's embedding / LM head (HF checkpoint dir).

    Lookup (as speculators ``utils/loading.py`` and specconv.verifier): exact
    ``model.embed_tokens.weight`` / ``lm_head.weight``, then the shortest name ending in
    ``embed_tokens.weight`` / ``lm_head.weight``; the LM head falls back to the embedding
    for tied verifiers (SmolLM2 is tied).
    """

    _EMBED = ("model.embed_tokens.weight", "embed_tokens.weight", "tok_embeddings.weight")
    _HEAD = ("lm_head.weight", "output.weight")

    def __init__(self, verifier_dir: str | Path | None):
        self.dir = Path(verifier_dir) if verifier_dir is not None else None
        self._store: Any = None
        self._names: list[str] | None = None
        self._cache: dict[str, torch.Tensor] = {}

    def _ensure(self, what: str) -> None:
        if self.dir is None:
            raise InvalidInputError(
                f"the drafter needs the verifier's {what} but no verifier_dir was given",
                code="verifier_required")
        if self._names is None:
            try:
                from ..tensors import open_store
                self._store = open_store(self.dir)
                self._names = self._store.names()
            except ImportError:  # pragma: no cover
                from safetensors import safe_open
                self._store = None
                self._names = []
                for f in sorted(self.dir.glob("*.safetensors")):
                    with safe_open(str(f), "pt") as sf:
                        self._names.extend(sf.keys())

    def _find(self, candidates: tuple[str, ...]) -> str | None:
        assert self._names is not None
        names = set(self._names)
        for c in candidates:
            if c in names:
                return c
        for c in candidates:
            m = [n for n in self._names if n.endswith(c)]
            if m:
                return min(m, key=len)
        return None

    def _read(self, name: str) -> torch.Tensor:
        # cached: a tied verifier's embedding and LM head are one read, one tensor
        if name not in self._cache:
            if self._store is not None:
                self._cache[name] = self._store.read_tensor(name)
            else:  # pragma: no cover
                self._cache[name] = read_tensors(self.dir, [name])[name]
        return self._cache[name]

    def config(self) -> dict:
        """The verifier's ``config.json`` (text config unwrapped)."""
        if self.dir is None or not (self.dir / "config.json").is_file():
            raise InvalidInputError("verifier config.json is needed but missing",
                                    code="verifier_required")
        cfg = json.loads((self.dir / "config.json").read_text())
        for key in ("text_config", "llm_config", "language_config"):
            sub = cfg.get(key)
            if isinstance(sub, dict) and "hidden_size" in sub:
                return sub
        return cfg

    def embedding(self) -> torch.Tensor:
        """``[Vt, H]`` verifier input embedding."""
        self._ensure("embedding")
        name = self._find(self._EMBED)
        if name is None:
            raise InvalidInputError(f"{self.dir}: no embed_tokens.weight in the verifier",
                                    code="missing_tensor")
        return self._read(name)

    def lm_head(self) -> torch.Tensor:
        """``[Vt, H]`` verifier LM head (the embedding when tied)."""
        self._ensure("LM head")
        name = self._find(self._HEAD)
        if name is None:
            return self.embedding()
        return self._read(name)


def check_dtype(dtype: torch.dtype) -> None:
    if dtype not in SUPPORTED_DTYPES:
        raise UsageError(f"dtype {dtype} is not supported (float32, bfloat16, float16)")


def aux_ids_from_config(cfg: Mapping, key: str, verifier: VerifierWeights | None,
                        source: str) -> list[int]:
    """Aux hidden-state layer ids (speculators/vLLM capture convention, §2.2).

    ``eagle_aux_hidden_state_layer_ids: null`` (P-EAGLE) resolves to
    ``[2, n//2, n-3]`` from the verifier's ``num_hidden_layers`` as speculators does.
    """
    ids = cfg.get(key)
    if ids is None:
        if key == "eagle_aux_hidden_state_layer_ids" and verifier is not None and verifier.dir:
            n = verifier.config().get("num_hidden_layers")
            if isinstance(n, int):
                warnings.warn(f"{source}: {key} is null; using speculators' default "
                              f"[2, {n // 2}, {n - 3}] from the verifier", stacklevel=3)
                return [2, n // 2, n - 3]
        raise InvalidInputError(f"{source}: {key!r} is required", code="config_key")
    if (not isinstance(ids, list) or not ids
            or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)):
        raise InvalidInputError(f"{source}: {key!r} must be a non-empty list of ints >= 0, "
                                f"got {ids!r}", code="config_key")
    return list(ids)


class Drafter(nn.Module):
    """Base class of the reference drafters (one drafting step, no KV cache).

    Attributes:
        algorithm: ``"peagle"`` | ``"dflash"`` | ``"dspark"``.
        block_size: ``B`` (DFlash/DSpark); P-EAGLE: ``K`` (entries drafted per pass).
        num_draft_tokens: ``k`` drafts returned per :meth:`propose` (``B-1``/``B`` by
            ``sample_from_anchor``; P-EAGLE: ``speculative_tokens``).
        aux_layer_ids: verifier aux layer ids (speculators convention: 0 = embeddings,
            N = final pre-norm hidden), in ``aux_hidden`` concat order.
        mask_token_id, sample_from_anchor (P-EAGLE: False), vocab_size (``Vt``),
        draft_vocab_size (``Vd``), hidden_size (``H``), aux_hidden_size (``Ht``:
        ``target_hidden_size`` or ``H``; ``aux_hidden`` is ``[1, T, A*Ht]``), config
        (the raw config dict).
    """

    algorithm: str = ""

    def __init__(self, config: Mapping, source: str):
        super().__init__()
        self.config = dict(config)
        self.source = source
        self.block_size = 0
        self.num_draft_tokens = 0
        self.aux_layer_ids: list[int] = []
        self.mask_token_id = 0
        self.sample_from_anchor = False
        self.vocab_size = 0
        self.draft_vocab_size = 0
        self.hidden_size = 0
        self.aux_hidden_size = 0  # verifier hidden size per aux layer (target_hidden_size or H)

    # -- helpers --------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return next(p for p in self.parameters() if p.is_floating_point()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def _check_inputs(self, context_tokens: torch.Tensor, aux_hidden: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
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

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens[tokens]  # type: ignore[index]

    def _finish(self, positions: torch.Tensor, hidden: torch.Tensor, slot_logits: torch.Tensor,
                draft_slots: torch.Tensor, temperature: float,
                generator: torch.Generator | None) -> BlockOutput:
        draft_logits = slot_logits[draft_slots]
        draft_ids = sample_rows(draft_logits, temperature, generator)
        return BlockOutput(
            positions=positions, hidden=hidden, slot_logits=slot_logits,
            draft_slots=draft_slots, draft_logits=draft_logits,
            target_logits=self.vocab.to_target_logits(draft_logits),
            draft_ids=draft_ids, tokens=self.vocab.to_target_ids(draft_ids))

    # -- API ------------------------------------------------------------------------
    def forward_block(self, context_tokens: torch.Tensor, aux_hidden: torch.Tensor, *,
                      temperature: float = 0.0, generator: torch.Generator | None = None,
                      **kwargs: Any) -> BlockOutput:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, *args: Any, **kwargs: Any) -> BlockOutput:
        return self.forward_block(*args, **kwargs)

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


def build_lm_head(w: WeightTaker, verifier: VerifierWeights, *, vocab_size: int,
                  draft_vocab_size: int, hidden: int, algorithm: str) -> Linear:
    """``lm_head.weight [Vd, H]`` from the drafter dir, else (full vocab only) the
    verifier's head (tied → embedding). Pruned drafts must ship it (§6)."""
    if w.has("lm_head.weight"):
        return Linear(w.take("lm_head.weight", (draft_vocab_size, hidden)))
    if draft_vocab_size != vocab_size:
        raise InvalidInputError(
            f"{w.source}: lm_head.weight is required for a pruned draft vocabulary "
            f"({algorithm}, draft_vocab_size {draft_vocab_size} < vocab_size {vocab_size})",
            code="missing_tensor")
    head = verifier.lm_head()
    if tuple(head.shape) != (vocab_size, hidden):
        raise InvalidInputError(
            f"verifier LM head has shape {tuple(head.shape)}, expected ({vocab_size}, {hidden})",
            code="verifier_mismatch")
    return Linear(head)


def build_embedding(w: WeightTaker, verifier: VerifierWeights, *, vocab_size: int,
                    hidden: int) -> torch.Tensor:
    """``embed_tokens.weight [Vt, H]`` from the drafter dir, else the verifier's."""
    if w.has("embed_tokens.weight"):
        return w.take("embed_tokens.weight", (vocab_size, hidden))
    emb = verifier.embedding()
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


def speculative_tokens(cfg: Mapping) -> int | None:
    try:
        v = cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    except (KeyError, IndexError, TypeError):
        return None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def target_hidden(cfg: Mapping, hidden: int, source: str) -> int:
    """``target_hidden_size`` (verifier width of each aux chunk), default ``H``."""
    v = cfg.get("target_hidden_size")
    if v is None:
        return hidden
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise InvalidInputError(f"{source}: target_hidden_size must be a positive integer or "
                                f"null, got {v!r}", code="config_key")
    return v


def require_int(cfg: Mapping, key: str, source: str, *, minimum: int = 0) -> int:
    v = cfg.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise InvalidInputError(f"{source}: {key!r} must be an integer >= {minimum}, got {v!r}",
                                code="config_key")
    return v
