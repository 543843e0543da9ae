"""Lint rules on the tensors of a draft (names, shapes, dtypes) against its config.

vLLM 0.33's draft models (``vllm/model_executor/models/``) return nothing from ``load_weights``, so
a missing tensor loads silently: the lint is what catches it.
"""

from __future__ import annotations

import re

from ..facts import CONFIG_DTYPE_TO_ST, FLOAT_DTYPES
from ..findings import Level
from ..tensors import TensorSpec
from .registry import Hit, LintContext, Needs, rule

_T: tuple[Needs, ...] = ("tensors",)
_LAYER_RE = re.compile(r"^layers\.(\d+)\.")


def _fused(name: str) -> bool:
    return ".qkv_proj." in name or ".gate_up_proj." in name


@rule("verifier-tensor", "error", needs=_T)
def _verifier_tensor(ctx: LintContext) -> Hit | None:
    vt = sorted(n for n in ctx.names if n.startswith("verifier_"))
    if vt:
        return f"training-only tensors {vt} must not be shipped (speculators excludes them on save)", vt[0]
    return None


@rule("mask-hidden-present", "error", needs=_T)
def _mask_hidden_present(ctx: LintContext) -> Hit | None:
    if not ctx.alg.mask_hidden and "mask_hidden" in ctx.names:
        return f"{ctx.algo} must not contain mask_hidden: vLLM asserts it is absent", "mask_hidden"
    return None


@rule("fused-tensor", "error", needs=_T)
def _fused_tensor(ctx: LintContext) -> Hit | None:
    fused = sorted(n for n in ctx.names if _fused(n))
    if fused:
        return (f"fused tensors {fused[:4]}: speculators stores q/k/v and gate/up separately (vLLM "
                "fuses at load)", fused[0])
    return None


@rule("prefixed-tensor-names", "error", needs=_T)
def _prefixed(ctx: LintContext) -> Hit | None:
    prefixed = sorted(n for n in ctx.names if n.startswith("model."))
    if prefixed:
        return (f"tensor names carry a 'model.' prefix ({prefixed[:3]}...): speculators names have none",
                prefixed[0])
    return None


@rule("layer-count", "error", needs=_T)
def _layer_count(ctx: LintContext) -> Hit | None:
    idx = {int(m.group(1)) for n in ctx.names if (m := _LAYER_RE.match(n))}
    L = ctx.cfg.num_layers
    if idx and idx != set(range(L)):
        return (f"the checkpoint has layers {sorted(idx)} but transformer_layer_config."
                f"num_hidden_layers={L}", "transformer_layer_config.num_hidden_layers")
    return None


@rule("draft-vocab-padded", "warning", needs=_T)
def _vocab_padded(ctx: LintContext) -> Hit | None:
    Vt, Vd = ctx.cfg.vocab_size, ctx.cfg.draft_vocab_size
    if Vd > Vt and "embed_tokens.weight" not in ctx.names:
        return (f"draft_vocab_size={Vd} > vocab_size={Vt} (padded vocab) without embed_tokens: vLLM "
                "needs embed_tokens when the draft input vocab exceeds the target's", "draft_vocab_size")
    return None


@rule("draft-vocab-larger", "info", needs=_T)
def _vocab_larger(ctx: LintContext) -> Hit | None:
    Vt, Vd = ctx.cfg.vocab_size, ctx.cfg.draft_vocab_size
    if Vd > Vt and "embed_tokens.weight" in ctx.names:
        return f"draft_vocab_size={Vd} > vocab_size={Vt}: treated as a padded identity vocab", "draft_vocab_size"
    return None


@rule("vocab-map-unneeded", "warning", needs=_T)
def _vocab_map_unneeded(ctx: LintContext) -> Hit | None:
    if ctx.cfg.draft_vocab_size == ctx.cfg.vocab_size and ({"d2t", "t2d"} & ctx.names):
        return ("d2t/t2d present although draft_vocab_size == vocab_size (speculators writes them only "
                "for pruned vocabularies)", "d2t" if "d2t" in ctx.names else "t2d")
    return None


def _missing(ctx: LintContext, code: str, need: str) -> list[Hit]:
    out: list[Hit] = []
    for spec in ctx.expected.values():
        if spec.missing_code == code and spec.need == need and spec.name not in ctx.names:
            why = f" ({spec.why})" if spec.why else ""
            out.append((f"tensor {spec.name} {list(spec.shape)} is missing{why}", spec.name))
    return out


def _register_missing(code: str, level: Level, need: str) -> None:
    rule(code, level, needs=_T)(lambda ctx: _missing(ctx, code, need))


for _code in ("tensor-missing", "lm-head-missing", "d2t-missing", "t2d-missing", "mask-hidden-missing",
              "embed-tokens-missing", "markov-head-missing"):
    _register_missing(_code, "error", "required")
_register_missing("tensor-recommended-missing", "warning", "recommended")


def _present(ctx: LintContext) -> list[tuple[TensorSpec, tuple[int, ...], str]]:
    assert ctx.tensors is not None
    return [(s, tuple(int(x) for x in ctx.tensors[s.name][0]), ctx.tensors[s.name][1])
            for s in ctx.expected.values() if s.name in ctx.names]


@rule("fc-shape", "error", needs=_T)
def _fc_shape(ctx: LintContext) -> Hit | None:
    H, A = ctx.cfg.hidden_size, ctx.cfg.num_aux
    if not A:  # no aux ids: fc.weight is not expected (format.expected_tensors)
        return None
    for spec, shape, _ in _present(ctx):
        if spec.name == "fc.weight" and shape != spec.shape:
            return (f"fc.weight has shape {list(shape)} but must be [H, A·H] = [{H}, {A}·{H}] = "
                    f"[{H}, {A * H}] for {A} aux layers", spec.name)
    return None


@rule("tensor-shape", "error", needs=_T)
def _tensor_shape(ctx: LintContext) -> list[Hit]:
    return [(f"tensor {spec.name} has shape {list(shape)}, expected {list(spec.shape)}", spec.name)
            for spec, shape, _ in _present(ctx) if spec.name != "fc.weight" and shape != spec.shape]


@rule("tensor-dtype", "error", needs=_T)
def _tensor_dtype(ctx: LintContext) -> list[Hit]:
    out: list[Hit] = []
    for spec, _, dtype in _present(ctx):
        if spec.kind == "float" and dtype not in FLOAT_DTYPES:
            out.append((f"tensor {spec.name} has dtype {dtype}, expected a float", spec.name))
        elif spec.kind != "float" and dtype != spec.kind:
            out.append((f"tensor {spec.name} has dtype {dtype}, expected {spec.kind}", spec.name))
    return out


def _reported_elsewhere(name: str, L: int) -> bool:
    m = _LAYER_RE.match(name)
    return (name.startswith(("verifier_", "model.")) or name == "mask_hidden" or _fused(name)
            or bool(m and int(m.group(1)) >= L))


@rule("unexpected-tensor", "warning", needs=_T)
def _unexpected(ctx: LintContext) -> Hit | None:
    L = ctx.cfg.num_layers
    unexpected = sorted(n for n in ctx.names if n not in ctx.expected and not _reported_elsewhere(n, L))
    if unexpected:
        more = " ..." if len(unexpected) > 8 else ""
        return (f"{len(unexpected)} tensor(s) the {ctx.algo} format does not define for this config: "
                f"{unexpected[:8]}{more}", unexpected[0])
    return None


def _float_dtypes(ctx: LintContext) -> list[str]:
    assert ctx.tensors is not None
    return sorted({d for _, d in ctx.tensors.values() if d in FLOAT_DTYPES})


@rule("mixed-float-dtypes", "warning", needs=_T)
def _mixed_dtypes(ctx: LintContext) -> Hit | None:
    floats = _float_dtypes(ctx)
    if len(floats) > 1:
        return f"float tensors use several dtypes {floats}; speculators saves one training dtype", None
    return None


@rule("dtype-mismatch", "warning", needs=_T)
def _dtype_mismatch(ctx: LintContext) -> Hit | None:
    floats = _float_dtypes(ctx)
    want = CONFIG_DTYPE_TO_ST.get(str(ctx.cfg.dtype or "").lower())
    if want and len(floats) == 1 and floats[0] != want:
        return f"config dtype is {ctx.cfg.dtype!r} but the float tensors are {floats[0]}", "dtype"
    return None
