"""The lint rule registry: a rule gets a :class:`LintContext` and returns ``None``, one ``(message, key)``
hit or a list of them; its code and level (on :func:`rule`) must match :data:`~specconv.format.findings.CODES`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal, NamedTuple, TypeVar

from ..algorithms import Algorithm, algorithm
from ..findings import CODES, Finding, Level
from ..schema import SpeculatorsDraftConfig, resolve_layer_types
from ..tensors import TensorSpec, expected_tensors
from ..verifier_facts import VerifierFacts

__all__ = ["RULES", "Hit", "LintContext", "Rule", "rule", "run_rules"]

Hit = tuple[str, str | None]
RuleResult = Hit | list[Hit] | None
Needs = Literal["config", "tensors", "verifier", "serve_method"]
_RuleFn = TypeVar("_RuleFn", bound=Callable[["LintContext"], RuleResult])


@dataclass
class LintContext:
    """Inputs of one lint run (see :func:`~specconv.format.rules.lint`) plus views several rules share."""

    cfg: SpeculatorsDraftConfig
    tensors: Mapping[str, tuple[tuple[int, ...], str]] | None = None
    verifier: VerifierFacts | None = None
    serve_method: str | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def algo(self) -> str:
        """``speculators_model_type``."""
        return self.cfg.speculators_model_type

    @property
    def alg(self) -> Algorithm:
        """The algorithm's description (:mod:`specconv.format.algorithms`)."""
        return algorithm(self.algo)

    @property
    def layer(self) -> dict:
        """``transformer_layer_config``."""
        return self.cfg.transformer_layer_config.written()

    @cached_property
    def names(self) -> set[str]:
        """Tensor names (empty without tensors)."""
        return set(self.tensors or {})

    @cached_property
    def expected(self) -> dict[str, TensorSpec]:
        """:func:`specconv.format.expected_tensors` of the config."""
        return expected_tensors(self.cfg)

    @cached_property
    def layer_types(self) -> list[str]:
        """Per-layer attention kinds (:func:`specconv.format.resolve_layer_types`)."""
        return resolve_layer_types(self.layer)


class Rule(NamedTuple):
    """One registered rule."""

    code: str
    level: Level
    needs: tuple[Needs, ...]
    fn: Callable[[LintContext], RuleResult]


#: Every rule, in registration (report) order.
RULES: list[Rule] = []


def rule(code: str, level: Level, *, needs: tuple[Needs, ...] = ()) -> Callable[[_RuleFn], _RuleFn]:
    """Register a lint rule, skipped when an input of ``needs`` is missing; ValueError when ``code`` /
    ``level`` do not match the registry."""
    info = CODES.get(code)
    if info is None or info.level != level:
        raise ValueError(f"lint rule {code!r} ({level}) does not match the finding-code registry ({info})")

    def deco(fn: _RuleFn) -> _RuleFn:
        RULES.append(Rule(code, level, tuple(needs), fn))
        return fn

    return deco


def _has(ctx: LintContext, need: Needs) -> bool:
    return {"tensors": ctx.tensors, "verifier": ctx.verifier, "serve_method": ctx.serve_method}.get(need) is not None


def run_rules(ctx: LintContext) -> list[Finding]:
    """Run every registered rule whose inputs are present; findings in rule order."""
    out: list[Finding] = []
    for r in RULES:
        if not all(_has(ctx, n) for n in r.needs):
            continue
        res = r.fn(ctx)
        hits = [] if res is None else [res] if isinstance(res, tuple) else res
        out.extend(Finding(r.level, r.code, message, key) for message, key in hits)
    return out
