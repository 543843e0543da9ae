"""Drafter context cache: the projected context K/V kept between drafting steps (``docs/validate.md``,
"Harness"). DFlash / DSpark rows depend on the features only; P-EAGLE entry ``i`` also on tokens
``t_1..t_{i+1}``, so the cache crops at the first changed token. Features of a kept prefix are
assumed unchanged (not compared: that would cost ``O(T)``).
"""

from __future__ import annotations

import torch

from .base import BlockOutput, Drafter

__all__ = ["KVBuffer", "ContextCache", "DraftSession"]


class KVBuffer:
    """Keys and values of one draft layer, ``[1, nKV, capacity, D]`` (capacity doubles), with a committed
    length; scratch rows go past it (:meth:`with_tail`) without a ``torch.cat`` of the context."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.length = 0

    def _reserve(self, like: torch.Tensor, rows: int) -> None:
        cap = 0 if self.k is None else self.k.shape[2]
        if rows <= cap:
            return
        new_cap = max(rows, 2 * cap, 64)
        shape = (*like.shape[:2], new_cap, like.shape[3])
        k = like.new_empty(shape)
        v = like.new_empty(shape)
        if self.k is not None and self.v is not None and self.length:
            k[:, :, : self.length] = self.k[:, :, : self.length]
            v[:, :, : self.length] = self.v[:, :, : self.length]
        self.k, self.v = k, v

    def _write(self, k: torch.Tensor, v: torch.Tensor) -> int:
        """Write rows ``k, v [1, nKV, s, D]`` after the committed length; return the end."""
        end = self.length + k.shape[2]
        self._reserve(k, end)
        assert self.k is not None and self.v is not None
        self.k[:, :, self.length: end] = k
        self.v[:, :, self.length: end] = v
        return end

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Commit rows ``k, v [1, nKV, s, D]`` after the current length."""
        if k.shape[2]:
            self.length = self._write(k, v)

    def with_tail(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Views ``(K, V)`` ``[1, nKV, length + s, D]``: committed then scratch rows (valid until the next write)."""
        end = self._write(k, v)
        assert self.k is not None and self.v is not None
        return self.k[:, :, :end], self.v[:, :, :end]

    def crop(self, n: int) -> None:
        """Keep the first ``n`` committed rows (no-op when ``n >= length``)."""
        self.length = max(0, min(self.length, int(n)))


class ContextCache:
    """Per-layer :class:`KVBuffer` s plus the entry tokens the cached rows depend on."""

    def __init__(self, num_layers: int) -> None:
        self.layers = [KVBuffer() for _ in range(num_layers)]
        self.tokens: torch.Tensor | None = None  # P-EAGLE entry tokens of the cached rows

    @property
    def length(self) -> int:
        """Cached context positions (rows committed in every layer)."""
        return self.layers[0].length if self.layers else 0

    def crop(self, n: int) -> None:
        """Drop cached rows from position ``n`` on (a rewind after rejected drafts)."""
        for buf in self.layers:
            buf.crop(n)
        if self.tokens is not None:
            self.tokens = self.tokens[: self.length]

    def reuse(self, ctx_len: int, entry_tokens: torch.Tensor | None = None, *,
              keep: int | None = None) -> int:
        """Crop to what is valid for ``ctx_len`` rows; return the first row the call must compute.

        ``entry_tokens`` long ``[T]`` (P-EAGLE ``t_{i+1}``): crop at the first changed token; ``keep``:
        at most this many rows (P-EAGLE recomputes row ``T-1``, whose hidden state drafts depth 1).
        """
        n = min(self.length, ctx_len, ctx_len if keep is None else keep)
        if entry_tokens is not None and self.tokens is not None and n:
            diff = (self.tokens[:n] != entry_tokens[:n]).nonzero()
            if diff.numel():
                n = int(diff[0, 0])
        self.crop(n)
        if entry_tokens is not None:
            self.tokens = entry_tokens[:ctx_len].clone()
        return n


class DraftSession:
    """A drafter plus its :class:`ContextCache` for one request (``drafter.new_session()``), with the
    DrafterBackend surface; equal to the stateless path up to float rounding."""

    def __init__(self, drafter: Drafter) -> None:
        self.drafter = drafter
        self.cache = ContextCache(len(drafter.layers))
        self.algorithm = drafter.algorithm
        self.num_draft_tokens = drafter.num_draft_tokens
        self.aux_layer_ids = list(drafter.aux_layer_ids)

    @property
    def length(self) -> int:
        """Context positions held in the cache."""
        return self.cache.length

    @property
    def device(self) -> torch.device:
        return self.drafter.device

    @property
    def dtype(self) -> torch.dtype:
        return self.drafter.dtype

    def crop(self, n: int) -> None:
        """Forget cached context from position ``n`` on."""
        self.cache.crop(n)

    @torch.no_grad()
    def forward_block(self, context_tokens: torch.Tensor, aux_hidden: torch.Tensor, *,
                      temperature: float = 0.0, generator: torch.Generator | None = None
                      ) -> BlockOutput:
        """:meth:`Drafter.forward_block` through the cache, over the rows computed this call (P-EAGLE:
        the new context entries then the mask entries)."""
        return self.drafter.forward_cached(context_tokens, aux_hidden, self.cache,
                                           temperature=temperature, generator=generator)

    propose = Drafter.propose  # it only calls self.forward_block
