"""Harness sanity stand-ins (test doubles): a tiny random Llama verifier and toy drafters.

Importable by name from every room (``from drafter_doubles import tiny_verifier``). They
check the harness itself: an *oracle* drafter (proposes the verifier's own greedy
continuation) must reach τ = k + 1 up to end effects, a *random* drafter τ ≈ 1
(``tests/validate/test_validate_loop.py`` checks both).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Proposal:
    tokens: torch.Tensor
    logits: torch.Tensor
    confidence: torch.Tensor | None = None


def tiny_verifier(num_layers: int = 3, vocab: int = 96, seed: int = 0, dtype=torch.float64, aux=(1, 3)):
    """A random LlamaForCausalLM wrapped in a VerifierRunner (float64 → no near-tie noise)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specconv.validate.verifier_runner import VerifierRunner

    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    # Large init so greedy continuations are not a single repeated token.
    cfg.initializer_range = 0.3
    model = LlamaForCausalLM(cfg).to(dtype).eval()
    return VerifierRunner(model, None, aux_layer_ids=aux, device="cpu")


class OracleDrafter:
    """Proposes the verifier's own greedy continuation (stateless full forwards)."""

    def __init__(self, runner, k: int):
        self.runner = runner
        self.num_draft_tokens = k
        self.aux_layer_ids = list(runner.aux_layer_ids)
        self.calls = 0

    def propose(self, context_tokens, aux_hidden, *, temperature=0.0, generator=None):
        self.calls += 1
        ids = context_tokens[0].tolist()
        out, logits = [], []
        m = self.runner.model
        with torch.inference_mode():
            for _ in range(self.num_draft_tokens):
                lg = m(torch.tensor([ids])).logits[0, -1].float()
                t = int(lg.argmax())
                out.append(t)
                logits.append(lg)
                ids.append(t)
        return Proposal(torch.tensor(out), torch.stack(logits))


class RandomDrafter:
    """Uniformly random drafts (τ ≈ 1 + 1/V)."""

    def __init__(self, vocab: int, k: int, aux_layer_ids, seed: int = 0):
        self.vocab = vocab
        self.num_draft_tokens = k
        self.aux_layer_ids = list(aux_layer_ids)
        self.gen = torch.Generator().manual_seed(seed)

    def propose(self, context_tokens, aux_hidden, *, temperature=0.0, generator=None):
        t = torch.randint(0, self.vocab, (self.num_draft_tokens,), generator=self.gen)
        return Proposal(t, torch.zeros(self.num_draft_tokens, self.vocab))


class SpyDrafter:
    """Wraps a drafter and records what it was shown."""

    def __init__(self, inner):
        self.inner = inner
        self.num_draft_tokens = inner.num_draft_tokens
        self.aux_layer_ids = inner.aux_layer_ids
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def propose(self, context_tokens, aux_hidden, **kw):
        self.seen.append((context_tokens.clone(), aux_hidden.clone()))
        return self.inner.propose(context_tokens, aux_hidden, **kw)


class MixedDrafter:
    """Oracle for the first ``good`` slots, then deliberately wrong tokens (partial acceptance)."""

    def __init__(self, runner, k: int, good: int):
        self.oracle = OracleDrafter(runner, k)
        self.num_draft_tokens = k
        self.aux_layer_ids = list(runner.aux_layer_ids)
        self.good = good
        self.vocab = runner.vocab_size

    def propose(self, context_tokens, aux_hidden, **kw):
        p = self.oracle.propose(context_tokens, aux_hidden)
        t = p.tokens.clone()
        t[self.good :] = (t[self.good :] + 1) % self.vocab
        return Proposal(t, p.logits)
