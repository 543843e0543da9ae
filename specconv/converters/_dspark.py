"""DSpark head fields and tensor checks shared by the DSpark sources (docs/adding_a_converter.md)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from specconv.errors import InvalidInputError
from specconv.plan import ConversionPlan

from .base import SourceInfo

if TYPE_CHECKING:
    from specconv.format.verifier_facts import VerifierView

MARKOV_TYPES = ("vanilla", "gated", "rnn")


@dataclass
class DSparkHeads:
    """Resolved DSpark head hyper-parameters (``markov_head_type`` one of :data:`MARKOV_TYPES`), with
    ``where`` each value came from (field → source location or rule, recorded in the plan notes)."""

    markov_rank: int
    markov_head_type: str
    enable_confidence_head: bool
    confidence_head_with_markov: bool
    where: dict[str, str] = field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        """The Speculators ``dspark`` config keys (always all four, written explicitly)."""
        return {k: v for k, v in asdict(self).items() if k != "where"}

    def notes(self) -> list[str]:
        return [f"{k}={_fmt(getattr(self, k))} ({v})" for k, v in self.where.items()]


def _fmt(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def require_int(src: SourceInfo, value: Any, key: str, *, lo: int = 0) -> int:
    if value is None:
        raise InvalidInputError(f"{src.path}/config.json has no {key}; the DSpark Markov rank is never defaulted",
                                code="missing_key")
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise InvalidInputError(f"{src.path}/config.json: {key} must be an integer ≥ {lo}, got {value!r}")
    return value


def require_bool(src: SourceInfo, value: Any, key: str, why: str) -> bool:
    if value is None:
        raise InvalidInputError(f"{src.path}/config.json has no {key} ({why})", code="missing_key")
    if not isinstance(value, bool):
        raise InvalidInputError(f"{src.path}/config.json: {key} must be true or false, got {value!r}")
    return value


def require_type(src: SourceInfo, value: Any, key: str, rank: int) -> str:
    if rank == 0:
        return "vanilla" if value is None else _check_type(src, value, key)
    if value is None:
        raise InvalidInputError(
            f"{src.path}/config.json has no {key} although markov_rank={rank} > 0 "
            f"(the producer requires it; one of {', '.join(MARKOV_TYPES)})",
            code="missing_key",
        )
    return _check_type(src, value, key)


def _check_type(src: SourceInfo, value: Any, key: str) -> str:
    v = str(value).lower()
    if v not in MARKOV_TYPES:
        raise InvalidInputError(
            f"{src.path}/config.json: {key}={value!r} is not a Speculators Markov head type ({', '.join(MARKOV_TYPES)})"
        )
    return v


def check_head_tensors(src: SourceInfo, plan: ConversionPlan, heads: DSparkHeads, *, hidden: int, vocab: int) -> None:
    """Cross-check the head hyper-parameters against the planned head tensors (shapes: docs/adding_a_converter.md).

    Raises:
        InvalidInputError: a tensor is missing, unexpected, or has the wrong shape; the
            message names the tensor (source name) and the config key it contradicts.
    """
    have = {t.out: t for t in plan.tensors}
    r, H, V = heads.markov_rank, hidden, vocab
    want, forbid = _expected_heads(heads, H, V)
    for name, shape in want.items():
        t = have.get(name)
        if t is None:
            key = "markov_rank/markov_head_type" if name.startswith("markov_head") else "enable_confidence_head"
            raise InvalidInputError(
                f"{src.path}: the config ({key}: {heads.where.get(key.split('/')[0], '?')}) needs tensor {name} "
                f"{list(shape)} but the checkpoint has none",
                code="missing_tensor",
            )
        if tuple(t.shape) != shape:
            hint = ""
            if name == "confidence_head.proj.weight" and r > 0 and tuple(t.shape) in ((1, H), (1, H + r)):
                implied = tuple(t.shape) == (1, H + r)
                hint = f" (its width implies confidence_head_with_markov={str(implied).lower()})"
            raise InvalidInputError(
                f"{src.path}: tensor {t.source} has shape {list(t.shape)} but the config "
                f"(markov_rank={r}, markov_head_type={heads.markov_head_type}, "
                f"enable_confidence_head={_fmt(heads.enable_confidence_head)}, "
                f"confidence_head_with_markov={_fmt(heads.confidence_head_with_markov)}, hidden {H}, vocab {V}) "
                f"needs {list(shape)}{hint}",
                code="head_shape_mismatch",
            )
    for pat, why in forbid.items():
        extra = sorted(t.source or t.out for t in plan.tensors if re.fullmatch(pat, t.out))
        if extra:
            raise InvalidInputError(
                f"{src.path}: the config says {why} but the checkpoint has head tensors {extra}; "
                "config and weights disagree",
                code="head_tensors_unexpected",
            )


def _expected_heads(heads: DSparkHeads, H: int, V: int) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """``(name → shape the config needs, regex → why such tensors must be absent)``."""
    r = heads.markov_rank
    want: dict[str, tuple[int, ...]] = {}
    forbid: dict[str, str] = {}
    if r > 0:
        want["markov_head.markov_w1.weight"] = (V, r)
        want["markov_head.markov_w2.weight"] = (V, r)
        if heads.markov_head_type == "gated":
            want["markov_head.gate_proj.weight"] = (r, H + r)
            want["markov_head.gate_proj.bias"] = (r,)
        else:
            forbid[r"markov_head\.gate_proj\..*"] = f"markov_head_type={heads.markov_head_type}"
        if heads.markov_head_type == "rnn":
            want["markov_head.joint_proj.weight"] = (3 * r, 2 * r + H)
            want["markov_head.joint_proj.bias"] = (3 * r,)
        else:
            forbid[r"markov_head\.joint_proj\..*"] = f"markov_head_type={heads.markov_head_type}"
    else:
        forbid[r"markov_head\..*"] = "markov_rank=0"
    if heads.enable_confidence_head:
        width = H + (r if heads.confidence_head_with_markov else 0)
        want["confidence_head.proj.weight"] = (1, width)
        want["confidence_head.proj.bias"] = (1,)
    else:
        forbid[r"confidence_head\..*"] = "enable_confidence_head=false"
    return want, forbid


def plan_dspark_family(conv: Any, src: SourceInfo, verifier: VerifierView | None, opts: Any, layout: Any,
                       heads: DSparkHeads,
                       notes: Callable[[ConversionPlan], list[str]] | None = None) -> ConversionPlan:
    """The Speculators ``dspark`` plan of a DSpark source: its DFlash-family body with ``heads.fields()``, the
    head tensors checked, ``--vocab-mapping`` pruning, then notes (head fields, the source's ``notes(plan)``).

    Raises:
        InvalidInputError / UnsupportedFormatError: as the DFlash family, a head tensor that
            contradicts ``heads``, or an invalid ``--vocab-mapping``.
    """
    from . import _common as common
    from ._dflash import plan_dflash_family

    layout = replace(layout, extra_accept=layout.extra_accept + common.DSPARK_HEADS)
    plan = plan_dflash_family(conv, src, verifier, opts, layout, algorithm="dspark", extra_fields=heads.fields())
    layer_config = plan.config.transformer_layer_config
    check_head_tensors(src, plan, heads, hidden=layer_config.hidden_size, vocab=layer_config.vocab_size)
    own = notes(plan) if notes is not None else []
    plan = maybe_prune(conv, plan, src, verifier, opts)
    plan.notes.extend(heads.notes())
    plan.notes.extend(own)
    return plan


def maybe_prune(conv: Any, plan: ConversionPlan, src: SourceInfo, verifier: VerifierView | None,
                opts: Any) -> ConversionPlan:
    """Prune a full-vocabulary DSpark plan to the draft vocabulary of ``--vocab-mapping`` (unchanged without
    it; docs/adding_a_converter.md).

    Raises:
        InvalidInputError: invalid mapping (see ``_vocab.resolve_vocab``), or no LM head
            (neither in the source nor in the verifier).
    """
    if opts.vocab_mapping is None:
        return plan
    from specconv.format import Finding

    from ._vocab import read_mapping_file, resolve_vocab

    layer_config = plan.config.transformer_layer_config
    V = layer_config.vocab_size
    flag = read_mapping_file(opts.vocab_mapping)
    Vd = int(flag["d2t"].shape[0]) if "d2t" in flag else int(flag["t2d"].astype(bool).sum())
    vocab = resolve_vocab(src, opts, vocab_size=V, draft_vocab_size=Vd, side_files=False)
    plan.notes.extend(vocab.notes)
    plan.findings.extend(vocab.findings)
    plan.dropped.extend(vocab.dropped)
    if vocab.kind != "pruned":
        return plan
    plan.tensors = _pruned_tensors(plan, src, verifier, vocab, Vd)
    plan.config = plan.config.model_copy(update={"draft_vocab_size": Vd})
    plan.findings.append(Finding(
        "warning", "dspark-vocab-pruned",
        f"{conv.title} was trained with the full vocabulary ({V}); --vocab-mapping restricts its proposals to "
        f"{Vd} tokens (markov_w2 and lm_head rows sliced by t2d)", "draft_vocab_size",
    ))
    return plan


def _pruned_tensors(plan: ConversionPlan, src: SourceInfo, verifier: VerifierView | None, vocab: Any, Vd: int) -> list:
    """``markov_w2`` and ``lm_head`` (else the verifier's) rows of the draft tokens, plus the ``d2t``/``t2d`` plans."""
    from ._vocab import slice_rows_plan

    tensors = []
    have_lm_head = False
    for t in plan.tensors:
        if t.out == "markov_head.markov_w2.weight":
            t = slice_rows_plan(src.store, t.source_name, t.out, vocab, dtype=t.dtype,
                                note=f"rows of the {Vd} draft tokens (t2d order) of the full-vocab Markov projection")
        elif t.out == "lm_head.weight":
            have_lm_head = True
            t = slice_rows_plan(src.store, t.source_name, t.out, vocab, dtype=t.dtype,
                                note=f"rows of the {Vd} draft tokens (t2d order) of the source's "
                                     "verifier-equal LM head")
        tensors.append(t)
    if not have_lm_head:
        tensors.append(_verifier_lm_head_rows(verifier, vocab, plan.config.dtype))
    return [t for t in tensors if t.out not in ("d2t", "t2d")] + list(vocab.tensors)


def _verifier_lm_head_rows(verifier: VerifierView | None, vocab: Any, dtype_name: str | None) -> Any:
    """``lm_head.weight [Vd, H]`` = the verifier's LM head rows selected by ``t2d``."""
    from ._common import DTYPE_FLAG, FLOAT_DTYPES
    from ._vocab import slice_rows_plan

    if verifier is None:
        raise InvalidInputError("a pruned DSpark output needs the verifier's LM head (no --verifier given)")
    name = verifier.find_tensor("lm_head")
    if name is None:
        raise InvalidInputError(f"verifier {verifier.spec} has no LM head (or tied embedding) tensor",
                                code="verifier_tensor_missing")
    store = verifier.tensor_store(name)
    info = store.info(name)
    out_dtype = DTYPE_FLAG.get(dtype_name or "", info.dtype) if info.dtype in FLOAT_DTYPES else info.dtype
    t = slice_rows_plan(store, name, "lm_head.weight", vocab, dtype=out_dtype,
                        note="the verifier's LM head rows of the draft tokens (t2d order)")
    t.origin = "verifier"
    return t
