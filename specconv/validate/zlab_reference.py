"""Source reference forward for z-lab DFlash checkpoints (G2 parity, ``docs/validate.md``).

Wraps z-lab's ``dflash.model.DFlashDraftModel`` (the MIT ``dflash`` 0.1.0 wheel) behind ``propose``.
Facts used (z-lab ``dflash/model.py``):

* z-lab's ``target_layer_ids`` index decoder-layer *outputs*; the hidden state used is
  ``hidden_states[id + 1]``, i.e. Speculators id ``id + 1`` — so this adapter declares
  ``aux_layer_ids = [i + 1 for i in target_layer_ids]`` from the *source* config, and
  the verifier runner captures those features independently of the converted config;
* the block is ``[anchor, mask × (B−1)]`` embedded with the verifier's input embedding
  (times ``input_embedding_scale`` when present) at positions ``T … T+B−1``; the context
  features occupy positions ``0 … T−1``; drafts are slots ``1 … B−1`` through the
  verifier's LM head (``compute_logits`` applies ``output_multiplier`` / softcapping). No KV cache.
* DFlash2 (``DFlash2DraftModel``): the drafts are z-lab's ``propose`` (``CandidateSelector.select``: the greedy
  walk over the top-K candidates from the anchor at T = 0, a draw from its ``q`` at T > 0); each draft's
  logits row holds the selector's scores on the candidates along that path (``-inf`` elsewhere), as
  specconv's drafter reports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError
from ..extras import quiet_library_bars


@dataclass
class _Proposal:
    tokens: Any
    logits: Any
    confidence: Any = None


def _selector_rows(selector, hidden, unary_logits, anchor, path):
    """z-lab's selector scores ``[N, V]`` along ``path`` (``-inf`` off the candidates; z-lab ``select``'s terms)."""
    import torch

    unary, candidates = torch.topk(unary_logits, selector.top_k, dim=-1, sorted=False)
    projected = selector.hidden_projection(hidden)
    rows = torch.full_like(unary_logits, float("-inf"))
    prev = anchor
    for j in range(hidden.shape[1]):
        scores = unary[:, j] + torch.einsum("br,bkr->bk", selector.predecessor_codebook(prev) * projected[:, j],
                                            selector.successor_codebook(candidates[:, j]))
        rows[:, j].scatter_(-1, candidates[:, j], scores)
        prev = path[:, j]
    return rows


class ZLabDFlashReference:
    """``propose``-compatible wrapper of z-lab's ``DFlashDraftModel`` over the loaded verifier's embedding and
    LM head (as ``dflash_generate``); InvalidInputError without ``dflash`` or a loadable checkpoint."""

    algorithm = "dflash"
    sample_from_anchor = False

    def __init__(self, source_dir: str | Path, verifier_model, *, dtype=None, device="cpu",
                 model_class: str = "dflash.model:DFlashDraftModel"):
        import torch

        try:
            from dflash.model import _draft_value

            from ..format.algorithms import import_object

            cls = import_object(model_class)
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise InvalidInputError(
                "the z-lab reference forward needs the `dflash` package (pip install --no-deps dflash)"
            ) from e
        dtype = dtype or torch.float32
        quiet_library_bars()
        try:
            self.model = cls.from_pretrained(str(source_dir), dtype=dtype).to(device).eval()
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise InvalidInputError(f"z-lab DFlashDraftModel cannot load {source_dir}: {e}") from e
        cfg = self.model.config
        self.block_size = int(self.model.block_size)
        self.mask_token_id = int(self.model.mask_token_id)
        self.num_draft_tokens = self.block_size - 1
        self.aux_layer_ids = [int(i) + 1 for i in self.model.target_layer_ids]
        self.embed_scale = float(_draft_value(cfg, "input_embedding_scale", 1.0))
        self.verifier = verifier_model
        self.device = torch.device(device)
        self.dtype = dtype

    def propose(self, context_tokens, aux_hidden, *, temperature: float = 0.0, generator=None):
        """One drafting pass; see the module docstring. T > 0 samples ``softmax(logits / T)``."""
        import torch
        import torch.nn.functional as F

        ctx = context_tokens.reshape(-1).to(self.device)
        aux = aux_hidden.reshape(1, -1, aux_hidden.shape[-1]).to(self.device, self.dtype)
        T = aux.shape[1]
        B = self.block_size
        block = torch.full((B,), self.mask_token_id, dtype=torch.long, device=self.device)
        block[0] = ctx[-1]
        emb = self.verifier.get_input_embeddings().weight
        noise = F.embedding(block.to(emb.device), emb).to(self.device, self.dtype)[None] * self.embed_scale
        pos = torch.arange(0, T + B, device=self.device)[None]
        with torch.inference_mode():
            h = self.model(
                target_hidden=aux,
                noise_embedding=noise,
                position_ids=pos,
                past_key_values=None,
                use_cache=False,
            )[:, 1:, :]
            head = getattr(self.verifier, "lm_head", None) or self.verifier.get_output_embeddings()
            h = h.to(head.weight.device, head.weight.dtype)
            logits = self.model.compute_logits(h, head)[0].float()
            if hasattr(self.model, "propose"):  # DFlash2: the selector walk
                path, _, _ = self.model.propose(h, block[:1], head, float(temperature))
                rows = _selector_rows(self.model.candidate_selector, h, logits[None].to(h.dtype), block[:1], path)
                return _Proposal(tokens=path[0], logits=rows[0].float())
        if temperature > 0:
            probs = torch.softmax(logits / float(temperature), -1)
            gen = generator if generator is not None and generator.device == probs.device else None
            tokens = torch.multinomial(probs, 1, generator=gen)[:, 0]
        else:
            tokens = torch.argmax(logits, -1)
        return _Proposal(tokens=tokens, logits=logits)
