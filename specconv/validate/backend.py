"""The two seams of ``specconv validate``: drafter backends and validation backends (``docs/validate.md``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

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

    A backend may also offer ``new_session()``: a per-request object with the same ``propose``
    keeping state between steps (the loop uses it unless told not to).
    """

    algorithm: str
    num_draft_tokens: int
    aux_layer_ids: Sequence[int]

    def propose(self, context_tokens: torch.Tensor, aux_hidden: torch.Tensor, *, temperature: float = 0.0,
                generator: torch.Generator | None = None) -> DraftProposal:
        """Draft ``k`` tokens as :meth:`specconv.drafters.base.Drafter.propose` (a ``DraftProposal``)."""
        ...  # pragma: no cover


class PlacedDrafter(DrafterBackend, Protocol):
    """A :class:`DrafterBackend` that names where its inputs go: what the compared-runtime gate
    (:func:`specconv.validate.runtimes.compare_runtime`) moves the reference's inputs to."""

    @property
    def device(self) -> torch.device:
        """The device its inputs are moved to."""
        ...  # pragma: no cover

    @property
    def dtype(self) -> torch.dtype:
        """The float dtype of its ``aux_hidden``."""
        ...  # pragma: no cover


@dataclass
class ValidationRun:
    """State of one ``validate_drafter`` call, passed from step to step.

    ``verifier_spec``: the verifier's ``model_ref`` (Hub id, else absolute dir) the load checks name;
    ``config``: parsed once (None: it did not parse; G1 says why); ``rendered``: ``[(prompt id,
    token ids)]`` every backend gets; ``spec_requests``: the torch loop's speculative requests
    (``RequestResult``), the reference of ``--compare``.
    """

    drafter_dir: Path
    verifier: Verifier
    verifier_spec: str
    config: SpeculatorsDraftConfig | None
    options: ValidateOptions
    progress: Progress
    report: dict[str, Any] = field(default_factory=dict)
    results: list[GateResult] = field(default_factory=list)
    source: dict[str, Any] | None = None
    source_config: SpeculatorsDraftConfig | None = None
    prompts: list = field(default_factory=list)
    rendered: list[tuple[str, list[int]]] = field(default_factory=list)
    chat: TemplateFacts | None = None
    spec_requests: list = field(default_factory=list)


class ValidationBackend(Protocol):
    """Runs the prompts once G1 passed; appends gate results and fills report keys."""

    name: str

    def run(self, run: ValidationRun) -> None:
        """Run the backend's gates on ``run`` (mutates ``run.report`` / ``run.results``)."""
        ...  # pragma: no cover


#: the ``--backend`` of this harness (every other one is a registered engine's ``Serve``)
TORCH_BACKEND = "torch"


def backends() -> dict[str, str]:
    """``--backend`` value → its help: torch, then each engine's ``Serve`` (no torch imported: ``--help``)."""
    from ..engines import serves

    out = {TORCH_BACKEND: "this harness"}
    for _, serve in serves():
        out[serve.backend] = serve.help
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
    """The validation backend registered as ``name``; UsageError for an unknown one."""
    from ..engines import serves
    from ..errors import UsageError

    if name == TORCH_BACKEND:
        from .torch_backend import TorchBackend

        return TorchBackend()
    for _, serve in serves():
        if serve.backend == name:
            from .served import ServedBackend

            return ServedBackend(serve)
    raise UsageError(f"unknown backend {name!r} (known: {', '.join(backends())})")
