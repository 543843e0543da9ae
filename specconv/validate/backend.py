"""The two seams of ``specconv validate``: drafter backends and validation backends.

* :class:`DrafterBackend` — one drafting step. The speculative loop
  (:func:`specconv.validate.loop.speculative_generate`) and G2 parity
  (:func:`specconv.validate.gates.gate_parity`) only call :meth:`DrafterBackend.propose`
  and read its four attributes, so the torch reference drafters
  (``specconv.drafters``), z-lab's own forward (:mod:`.zlab_reference`), the tests' harness
  stand-ins (``tests/validate/drafter_doubles.py``) and the runtimes registered in
  :mod:`.runtimes` (ONNX Runtime, TensorRT) are interchangeable.
* :class:`ValidationBackend` — what runs the prompts after G1 passed: ``torch`` (this
  harness, :mod:`.torch_backend`: G2–G4 and τ) or a served engine (:mod:`.served`: ``vllm``,
  τ from a real ``vllm serve``'s spec-decode counters, G2 skipped; ``llamacpp``, the torch
  gates and then ``llama-server``'s τ and losslessness).
  Each appends its gate results to the :class:`ValidationRun` and fills its report keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    import torch

    from ..drafters.base import DraftProposal
    from ..format import SpeculatorsDraftConfig
    from ..prompts import TemplateFacts
    from ..verifier import Verifier
    from .gates import GateResult
    from .run import ValidateOptions

Progress = Callable[[str, int, int], None]


@runtime_checkable
class DrafterBackend(Protocol):
    """One drafting step from the accepted context (no KV cache).

    A backend may also offer ``new_session()`` returning a per-request object with the
    same ``propose`` that keeps state between steps (the reference drafters' context
    cache, :mod:`specconv.drafters.cache`); the loop uses it unless told not to.

    Attributes:
        algorithm: ``peagle`` | ``dflash`` | ``dspark``.
        num_draft_tokens: ``k`` drafts per :meth:`propose`.
        aux_layer_ids: verifier aux layer ids (speculators convention: 0 = embeddings) in
            the concat order of ``aux_hidden``.
    """

    algorithm: str
    num_draft_tokens: int
    aux_layer_ids: Sequence[int]

    def propose(self, context_tokens: "torch.Tensor", aux_hidden: "torch.Tensor", *, temperature: float = 0.0,
                generator: "torch.Generator | None" = None) -> "DraftProposal":
        """Draft ``k`` tokens.

        Args:
            context_tokens: LongTensor ``[1, T+1]`` — every token so far; index ``T`` is
                the anchor (the token the verifier just emitted, no features yet).
            aux_hidden: float tensor ``[1, T, A*H]`` — verifier aux hidden states of
                positions ``0…T−1`` concatenated in ``aux_layer_ids`` order.
            temperature: 0 = greedy; > 0 samples from ``softmax(logits / T)``.
            generator: ``torch.Generator`` for sampling.

        Returns:
            A proposal with ``tokens`` (LongTensor ``[k]``, verifier ids), ``logits``
            (float ``[k, V]``, verifier vocab, before temperature) and ``confidence``
            (float ``[k]`` probabilities for DSpark's confidence head, else ``None``) —
            :class:`specconv.drafters.base.DraftProposal`.
        """
        ...  # pragma: no cover


@dataclass
class ValidationRun:
    """State of one ``validate_drafter`` call, passed from step to step.

    Attributes:
        drafter_dir: the Speculators directory under test.
        verifier: the resolved :class:`specconv.verifier.Verifier`.
        verifier_spec: what the vLLM and SGLang load checks name: the resolved verifier's
            :attr:`~specconv.verifier.Verifier.model_ref` (its Hub id, else its absolute dir).
        config: the drafter's typed ``config.json``, parsed once by ``validate_drafter``
            and handed to G1 and the drafter loader (None: it did not parse; G1 says why).
        options: :class:`specconv.validate.run.ValidateOptions`.
        progress: ``progress(phase, done, total)``.
        report: the report keys filled so far (becomes a ValidationReport at the end).
        results: the gate results so far.
        source: ``prepare_source``'s answer (with ``--source``), else None.
        source_config: the typed config of the source converted afresh, else None.
        prompts: the selected prompts (after G1).
        rendered: ``[(prompt id, token ids)]``, rendered once for every backend.
        chat: how they were rendered (:class:`specconv.prompts.TemplateFacts`).
    """

    drafter_dir: Path
    verifier: "Verifier"
    verifier_spec: str
    config: "SpeculatorsDraftConfig | None"
    options: "ValidateOptions"
    progress: Progress
    report: dict[str, Any] = field(default_factory=dict)
    results: "list[GateResult]" = field(default_factory=list)
    source: dict[str, Any] | None = None
    source_config: "SpeculatorsDraftConfig | None" = None
    prompts: list = field(default_factory=list)
    rendered: list[tuple[str, list[int]]] = field(default_factory=list)
    chat: "TemplateFacts | None" = None


class ValidationBackend(Protocol):
    """Runs the prompts once G1 passed; appends gate results and fills report keys."""

    name: str

    def run(self, run: ValidationRun) -> None:
        """Run the backend's gates on ``run`` (mutates ``run.report`` / ``run.results``)."""
        ...  # pragma: no cover


#: the ``--backend`` of this harness (every other one is a registered engine's ``Serve``)
TORCH_BACKEND = "torch"


def backends() -> dict[str, str]:
    """``--backend`` value → its help: :data:`TORCH_BACKEND`, then each registered engine's
    :class:`~specconv.engines.base.Serve` in registry order (read when ``specconv --help`` runs:
    no torch imported)."""
    from ..engines import with_capability

    out = {TORCH_BACKEND: "this harness"}
    for e in with_capability("serve"):
        out[e.serve.backend] = e.serve.help  # type: ignore[union-attr]
    return out

#: metric keys copied to the top level of the report (vLLM / speculators counter names)
TOP_LEVEL_METRICS = (
    "acceptance_length", "acceptance_at_pos", "conditional_acceptance_at_pos", "acceptance_rate",
    "num_drafts", "num_draft_tokens", "num_accepted_tokens", "tau_pooled", "tau_request_mean", "tau_ci95",
    "histogram", "tpot_ms", "tpot_ar_ms", "draft_ms", "verify_ms", "speedup",
)


def copy_top(report: dict[str, Any], metrics: dict[str, Any]) -> None:
    """Copy the :data:`TOP_LEVEL_METRICS` present in ``metrics`` to the report's top level."""
    for key in TOP_LEVEL_METRICS:
        if key in metrics:
            report[key] = metrics[key]


def get_backend(name: str) -> ValidationBackend:
    """The validation backend registered as ``name``.

    Raises:
        UsageError: unknown backend.
    """
    from ..engines import with_capability
    from ..errors import UsageError

    if name == TORCH_BACKEND:
        from .torch_backend import TorchBackend

        return TorchBackend()
    for e in with_capability("serve"):
        if e.serve.backend == name:  # type: ignore[union-attr]
            from .served import ServedBackend

            return ServedBackend(e.serve)  # type: ignore[arg-type]
    raise UsageError(f"unknown backend {name!r} (known: {', '.join(backends())})")
