"""Draft-vocabulary mapping (``d2t`` / ``t2d``): read, check, normalise, plan (docs/adding_a_converter.md)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from specconv.errors import InvalidInputError
from specconv.format.names import VOCAB_MAP_PATTERNS
from specconv.plan import DroppedTensor, Fate, Origin, TensorPlan

from ._vocab_io import D2T_KEYS, SIDE_FILES, T2D_KEYS, as_array, find_side_files, read_mapping_file

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from .base import ConvertOptions, SourceInfo

#: accept-patterns for the mapping tensors; :func:`merge_vocab` replaces their plans.
VOCAB_PATTERNS = VOCAB_MAP_PATTERNS

EAGLE_222 = "SafeAILab/EAGLE #222"


__all__ = [
    "D2T_KEYS", "SIDE_FILES", "T2D_KEYS", "VOCAB_PATTERNS", "D2TReading", "VocabResult", "as_array", "check_mapping",
    "find_side_files", "merge_vocab", "normalise_d2t", "read_mapping_file", "resolve_vocab", "slice_rows_plan",
    "t2d_from_d2t",
]


def _as_bool(t2d: np.ndarray, what: str) -> np.ndarray:
    import numpy as np

    if t2d.dtype == np.bool_:
        return t2d
    vals = np.unique(t2d)
    if not set(vals.tolist()) <= {0, 1}:
        raise InvalidInputError(f"{what} must hold only 0/1 (bool), found values {vals[:8].tolist()}",
                                code="vocab_map_invalid")
    return t2d.astype(np.bool_)


def t2d_from_d2t(d2t: Any, vocab_size: int) -> np.ndarray:
    """Rebuild ``t2d`` (bool ``[V]``) from offset-form ``d2t`` (``t2d[i + d2t[i]] = True``).

    Raises:
        InvalidInputError: a target id falls outside ``[0, V)``.
    """
    import numpy as np

    d = as_array(d2t, what="d2t").astype(np.int64)
    tgt = np.arange(d.shape[0], dtype=np.int64) + d
    if tgt.size and (tgt.min() < 0 or tgt.max() >= vocab_size):
        raise InvalidInputError(f"d2t maps draft ids outside the target vocabulary [0, {vocab_size})",
                                code="vocab_map_invalid")
    out = np.zeros(vocab_size, dtype=np.bool_)
    out[tgt] = True
    return out


def _offset_problems(d2t: np.ndarray, vocab_size: int, t2d: np.ndarray | None) -> list[str]:
    """Why ``d2t`` (read as offsets) is not a valid mapping; ``[]`` when it is."""
    import numpy as np

    vd = d2t.shape[0]
    tgt = np.arange(vd, dtype=np.int64) + d2t.astype(np.int64)
    return _target_problems(tgt, vocab_size, t2d, "i + d2t[i]")


def _target_problems(tgt: np.ndarray, vocab_size: int, t2d: np.ndarray | None, label: str) -> list[str]:
    import numpy as np

    probs = []
    bad = np.nonzero((tgt < 0) | (tgt >= vocab_size))[0]
    if bad.size:
        i = int(bad[0])
        probs.append(f"{label} is outside [0, {vocab_size}) for {bad.size} draft id(s), e.g. draft {i} → {int(tgt[i])}")
        return probs
    if np.unique(tgt).size != tgt.size:
        probs.append(f"{label} maps {tgt.size - np.unique(tgt).size} draft id(s) onto an already used target id")
    if t2d is not None:
        miss = np.nonzero(~t2d[tgt])[0]
        if miss.size:
            i = int(miss[0])
            probs.append(f"t2d is false at {label} for {miss.size} draft id(s), e.g. draft {i} → target {int(tgt[i])}")
    return probs


def check_mapping(d2t: Any, t2d: Any | None, vocab_size: int, draft_vocab_size: int, *, where: str = "") -> None:
    """Validate offset-form int ``d2t [Vd]`` (array, tensor or ``(store, name)``) and bool ``t2d [V]`` (or
    ``None``): lengths, ``0 ≤ i + d2t[i] < V``, distinct targets, ``t2d.sum() == Vd``, ``t2d[i + d2t[i]]``.

    Raises:
        InvalidInputError: the first failed check, naming it (``where`` prefixes messages).
    """
    d = as_array(d2t, what="d2t")
    t = None if t2d is None else _as_bool(as_array(t2d, what="t2d"), "t2d")
    pre = f"{where}: " if where else ""
    _check_lengths(d, t, vocab_size, draft_vocab_size, pre)
    probs = _offset_problems(d, vocab_size, t)
    if probs:
        raise InvalidInputError(f"{pre}invalid d2t/t2d mapping: " + "; ".join(probs), code="vocab_map_invalid")


@dataclass
class D2TReading:
    """Result of :func:`normalise_d2t`: int64 ``offsets [Vd]``, the ``form`` read, a finding ``message``
    (``""`` when unremarkable), ``ambiguous_but_offsets`` (both readings valid, offsets kept)."""

    offsets: np.ndarray
    form: Literal["offsets", "absolute"]
    message: str = ""
    ambiguous_but_offsets: bool = False


def normalise_d2t(d2t: Any, t2d: Any | None, vocab_size: int, draft_vocab_size: int, *, where: str = "") -> D2TReading:
    """Interpret ``d2t`` as offsets or, failing that, absolute target ids (rules: docs/adding_a_converter.md).

    Raises:
        InvalidInputError: codes ``vocab_map_all_zero``, ``vocab_map_ambiguous``,
            ``vocab_map_invalid``.
    """
    import numpy as np

    d = as_array(d2t, what="d2t").astype(np.int64)
    t = None if t2d is None else _as_bool(as_array(t2d, what="t2d"), "t2d")
    pre = f"{where}: " if where else ""
    vd = d.shape[0]
    _check_lengths(d, t, vocab_size, draft_vocab_size, pre)
    off_probs = _offset_problems(d, vocab_size, t)
    if vd and not d.any() and vd < vocab_size and (t is None or off_probs):
        why = "no t2d confirms it" if t is None else "; ".join(off_probs)
        raise InvalidInputError(
            f"{pre}d2t is all zeros with draft_vocab_size {vd} < vocab_size {vocab_size}: every draft id would map "
            f"to the same target id (identity) although the vocabulary is pruned ({why}). This is the known defect of "
            f"some EAGLE-3 exports ({EAGLE_222}); the real mapping is lost",
            code="vocab_map_all_zero",
            hint="pass the mapping the drafter was trained with: --vocab-mapping FILE "
                 "(.pt/.npy/.safetensors with d2t/t2d)",
        )
    abs_probs = _target_problems(d, vocab_size, t, "d2t[i]")
    if not off_probs:
        return _offsets_reading(d, t, abs_probs, pre)
    if not abs_probs:
        return D2TReading(
            d - np.arange(vd, dtype=np.int64), "absolute",
            f"d2t holds absolute target ids, not offsets ({off_probs[0]}); converted to offsets "
            "(target = draft + d2t[draft])",
        )
    raise InvalidInputError(
        f"{pre}invalid d2t: as offsets {'; '.join(off_probs)}; as absolute ids {'; '.join(abs_probs)}",
        code="vocab_map_invalid",
    )


def _check_lengths(d: np.ndarray, t: np.ndarray | None, vocab_size: int, draft_vocab_size: int, pre: str) -> None:
    vd = d.shape[0]
    if vd != draft_vocab_size:
        raise InvalidInputError(f"{pre}d2t has {vd} entries but draft_vocab_size is {draft_vocab_size}",
                                code="vocab_map_invalid")
    if t is not None:
        if t.shape[0] != vocab_size:
            raise InvalidInputError(f"{pre}t2d has {t.shape[0]} entries but the target vocab_size is {vocab_size}",
                                    code="vocab_map_invalid")
        if int(t.sum()) != vd:
            raise InvalidInputError(
                f"{pre}t2d marks {int(t.sum())} target ids but draft_vocab_size is {vd}", code="vocab_map_invalid"
            )


def _offsets_reading(d: np.ndarray, t: np.ndarray | None, abs_probs: list[str], pre: str) -> D2TReading:
    import numpy as np

    if t is not None or abs_probs:
        return D2TReading(d, "offsets")
    if d.shape[0] >= 2 and bool(np.all(np.diff(d) > 0)):
        raise InvalidInputError(
            f"{pre}d2t is strictly increasing and valid both as offsets and as absolute target ids; "
            "producers sort the draft vocabulary, so offsets normally repeat while absolute ids always "
            "increase — without t2d the two readings cannot be told apart",
            code="vocab_map_ambiguous",
            hint="provide t2d (beside the checkpoint, or both tensors via --vocab-mapping FILE)",
        )
    return D2TReading(
        d, "offsets",
        "d2t is also valid read as absolute target ids; kept as offsets (the convention of speculators, "
        "SpecForge, EAGLE and vLLM) — no t2d to confirm",
        ambiguous_but_offsets=True,
    )


# ------------------------------------------------------------------------------ plan
@dataclass
class VocabResult:
    """The vocabulary decision for one conversion: ``kind`` ``pruned`` (``Vd < V``), ``full`` or ``padded``
    (``Vd > V``); int64 ``d2t [Vd]`` and bool ``t2d [V]`` and their output ``tensors`` (pruned only);
    ``consumed``: source tensor names handled here (see :func:`merge_vocab`)."""

    kind: Literal["pruned", "full", "padded"]
    vocab_size: int
    draft_vocab_size: int
    d2t: np.ndarray | None = None
    t2d: np.ndarray | None = None
    tensors: list[TensorPlan] = field(default_factory=list)
    dropped: list[DroppedTensor] = field(default_factory=list)
    findings: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    consumed: set[str] = field(default_factory=set)

    def target_ids(self) -> np.ndarray:
        """int64 ``[Vd]``: target id of each draft row (``arange(Vd) + d2t``; identity unless pruned)."""
        import numpy as np

        n = min(self.draft_vocab_size, self.vocab_size)
        if self.d2t is None:
            return np.arange(n, dtype=np.int64)
        return np.arange(self.d2t.shape[0], dtype=np.int64) + self.d2t


@dataclass
class _Found:
    value: np.ndarray
    where: str  # human label
    source_name: str | None = None  # tensor name in the source store
    src_dtype: str | None = None
    file: str = ""  # the file (or dir) holding it: named by errors about this mapping
    generated: bool = False  # built by a documented rule, not read


def _bytes_plan(out: str, arr: np.ndarray, dtype: str, fate: Fate, origin: Origin, source: str | None, src_dtype: str,
                note: str) -> TensorPlan:
    import numpy as np

    np_dtype = {"I64": np.dtype("<i8"), "BOOL": np.dtype(np.bool_)}[dtype]
    data = np.ascontiguousarray(arr.astype(np_dtype)).tobytes()
    return TensorPlan(
        out=out, fate=fate, origin=origin, source=source, shape=tuple(int(s) for s in arr.shape),
        dtype=dtype, src_dtype=src_dtype, produce=lambda: data, note=note,
    )


def _find_mappings(src: SourceInfo, opts: ConvertOptions, res: VocabResult, d2t_names: Iterable[str],
                   t2d_names: Iterable[str], extra: Mapping[str, Any] | None, extra_label: str,
                   side_files: bool) -> dict[str, _Found]:
    """d2t/t2d from the weights, ``extra``, side files, then ``--vocab-mapping`` (must agree)."""
    import numpy as np

    Vd = res.draft_vocab_size
    names = set(src.tensor_names())
    found: dict[str, _Found] = {}
    for role, cands in (("d2t", tuple(d2t_names)), ("t2d", tuple(t2d_names))):
        n = next((n for n in cands if n in names), None)
        if n is not None:
            found[role] = _Found(as_array((src.store, n), what=f"{src.path}:{n}"), f"tensor {n}", n,
                                 src.store.info(n).dtype, str(src.path))
            res.consumed.add(n)
    for role in ("d2t", "t2d"):
        if role not in found and extra and extra.get(role) is not None:
            found[role] = _Found(as_array(extra[role], what=f"{extra_label}:{role}"), f"{extra_label} ({role})",
                                 file=extra_label or str(src.path))
    if side_files:
        for role, p in find_side_files(src.path, Vd).items():
            if role not in found:
                found[role] = _Found(read_mapping_file(p, role=role)[role], f"side file {p.name}", file=str(p))
    if opts.vocab_mapping is None:
        return found
    flag = read_mapping_file(opts.vocab_mapping, draft_vocab_size=Vd)
    for role, arr in flag.items():
        if role not in found:
            found[role] = _Found(arr, f"--vocab-mapping {Path(opts.vocab_mapping).name}", file=str(opts.vocab_mapping))
            continue
        have = found[role].value
        if have.shape != arr.shape or not np.array_equal(have.astype(np.int64), arr.astype(np.int64)):
            raise InvalidInputError(
                f"--vocab-mapping {opts.vocab_mapping}: its {role} differs from the checkpoint's {found[role].where}",
                code="conflicting_vocab_mapping",
            )
        res.notes.append(f"--vocab-mapping {role} agrees with the checkpoint's {found[role].where}")
    return found


def _identity(src: SourceInfo, res: VocabResult, found: dict[str, _Found]) -> VocabResult:
    import numpy as np

    from specconv.format import Finding

    V, Vd = res.vocab_size, res.draft_vocab_size
    label = ("full vocabulary (draft_vocab_size == vocab_size)" if Vd == V
             else f"padded vocabulary (draft_vocab_size {Vd} > vocab_size {V})")
    for role, f in found.items():
        v = f.value
        if role == "d2t":
            identity = v.shape[0] == Vd and not v.astype(np.int64).any()
            what = "all-zero d2t (identity offsets)"
        else:
            identity = v.shape[0] == V and bool(_as_bool(v, "t2d").all())
            what = "all-true t2d"
        if not identity:
            raise InvalidInputError(
                f"{f.file}: {label} but {f.where} is not the identity mapping; Speculators has no way to store a "
                "permuted/partial full vocabulary",
                code="vocab_map_invalid",
            )
        reason = f"{what} with a {label}: no mapping needed (speculators writes d2t/t2d only when Vd < V)"
        if f.source_name:
            res.dropped.append(DroppedTensor(f.source_name, reason))
        else:
            res.notes.append(f"{f.where} ignored: {reason}")
    if Vd > V:
        res.findings.append(Finding("info", "vocab-padded",
                                    f"draft_vocab_size {Vd} > vocab_size {V}: padded vocabulary, identity mapping",
                                    "draft_vocab_size"))
    return res


def _logical_identity(res: VocabResult, logical: int) -> dict[str, _Found]:
    import numpy as np

    from specconv.format import Finding

    V, Vd = res.vocab_size, res.draft_vocab_size
    t2d = np.zeros(V, dtype=np.bool_)
    t2d[:Vd] = True
    res.findings.append(Finding(
        "info", "vocab-logical-identity",
        f"draft_vocab_size {Vd} ≥ the verifier's logical vocab_size {logical} (its {V} embedding rows are padded): "
        f"identity mapping written (d2t zeros, t2d true for ids < {Vd})", "draft_vocab_size",
    ))
    label = f"identity over the logical vocabulary ({logical})"
    return {"d2t": _Found(np.zeros(Vd, dtype=np.int64), label, generated=True),
            "t2d": _Found(t2d, label, generated=True)}


def _drop_default_t2d(res: VocabResult, t2d_f: _Found | None) -> tuple[_Found | None, np.ndarray | None]:
    from specconv.format import Finding

    if t2d_f is None:
        return None, None
    t2d_arr = _as_bool(t2d_f.value, f"t2d ({t2d_f.where})")
    V, Vd = res.vocab_size, res.draft_vocab_size
    if not (t2d_arr.shape[0] == V and bool(t2d_arr.all())):
        return t2d_f, t2d_arr
    msg = (f"{t2d_f.where} is all-true (an untouched default) although the vocabulary is pruned "
           f"({Vd} < {V}); it is ignored and t2d is rebuilt from d2t")
    res.findings.append(Finding("warning", "t2d-default-all-true", msg, "t2d"))
    if t2d_f.source_name:
        res.dropped.append(DroppedTensor(t2d_f.source_name,
                                         "all-true default t2d with a pruned vocabulary; rebuilt from d2t"))
    return None, None


def _read_plan(role: str, dtype: str, f: _Found, arr: np.ndarray) -> TensorPlan:
    if f.source_name and f.src_dtype == dtype:
        return TensorPlan(out=role, fate="copied", origin="source", source=f.source_name, shape=tuple(arr.shape),
                          dtype=dtype, src_dtype=dtype)
    converted = f.src_dtype and f.src_dtype != dtype
    note = f"from {f.where}" + (f", converted {f.src_dtype} → {dtype}" if converted else "")
    return _bytes_plan(role, arr, dtype, "copied", "source", f.source_name or f.where, f.src_dtype or dtype, note)


def _t2d_plan(res: VocabResult, t2d_f: _Found | None, t2d_arr: np.ndarray) -> TensorPlan:
    if t2d_f is not None and t2d_f.generated:
        return _bytes_plan("t2d", t2d_arr, "BOOL", "generated", "generated", None, "BOOL", t2d_f.where)
    if t2d_f is None:
        res.notes.append("t2d rebuilt from d2t")
        return _bytes_plan("t2d", t2d_arr, "BOOL", "generated", "generated", None, "BOOL",
                           "rebuilt from d2t (t2d[i + d2t[i]] = True); source had no t2d")
    return _read_plan("t2d", "BOOL", t2d_f, t2d_arr)


def _d2t_plan(d2t_f: _Found, reading: D2TReading) -> TensorPlan:
    d2t = reading.offsets
    if d2t_f.generated:
        return _bytes_plan("d2t", d2t, "I64", "generated", "generated", None, "I64", d2t_f.where)
    if reading.form == "absolute":
        return _bytes_plan("d2t", d2t, "I64", "generated", "generated", d2t_f.source_name, d2t_f.src_dtype or "I64",
                           f"converted from absolute target ids ({d2t_f.where}) to offsets")
    return _read_plan("d2t", "I64", d2t_f, d2t)


def _pruned(src: SourceInfo, res: VocabResult, found: dict[str, _Found], extra_label: str) -> VocabResult:
    from specconv.format import Finding

    V, Vd = res.vocab_size, res.draft_vocab_size
    d2t_f = found.get("d2t")
    if d2t_f is None:
        raise InvalidInputError(
            f"{src.path}: pruned draft vocabulary (draft_vocab_size {Vd} < vocab_size {V}) but no "
            "d2t mapping was found "
            "(looked at the weights" + (f", {extra_label}" if extra_label else "")
            + ", d2t.npy beside the checkpoint and --vocab-mapping)",
            code="vocab_map_missing",
            hint="pass the mapping the drafter was trained with: --vocab-mapping FILE "
                 "(.pt/.npy/.safetensors with d2t[/t2d])",
        )
    t2d_f, t2d_arr = _drop_default_t2d(res, found.get("t2d"))
    files = [f.file for f in (d2t_f, t2d_f) if f is not None and f.file]
    where = " and ".join(dict.fromkeys(files)) or str(src.path)
    reading = normalise_d2t(d2t_f.value, t2d_arr, V, Vd, where=where)
    if reading.form == "absolute":
        res.findings.append(Finding("warning", "d2t-absolute-ids", f"{d2t_f.where}: {reading.message}", "d2t"))
    elif reading.ambiguous_but_offsets:
        res.findings.append(Finding("info", "d2t-form-unconfirmed", f"{d2t_f.where}: {reading.message}", "d2t"))
    if t2d_arr is None:
        t2d_arr = t2d_from_d2t(reading.offsets, V)
    check_mapping(reading.offsets, t2d_arr, V, Vd, where=where)
    res.tensors = [_d2t_plan(d2t_f, reading), _t2d_plan(res, t2d_f, t2d_arr)]
    res.d2t, res.t2d = reading.offsets, t2d_arr
    res.notes.insert(0, f"vocab mapping: d2t from {d2t_f.where}" + (f", t2d from {t2d_f.where}" if t2d_f else ""))
    return res


def resolve_vocab(
    src: SourceInfo, opts: ConvertOptions, *, vocab_size: int, draft_vocab_size: int,
    d2t_names: Iterable[str] = ("d2t",), t2d_names: Iterable[str] = ("t2d",), extra: Mapping[str, Any] | None = None,
    extra_label: str = "", side_files: bool = True, logical_vocab_size: int | None = None,
) -> VocabResult:
    """Decide the vocabulary mapping of a conversion and plan the ``d2t``/``t2d`` outputs (lookup order
    and outcomes: docs/adding_a_converter.md).

    Raises:
        InvalidInputError: missing mapping for a pruned draft (``vocab_map_missing``), a
            contradiction between locations, or an invalid/ambiguous mapping (naming the
            file it came from).
    """
    V, Vd = int(vocab_size), int(draft_vocab_size)
    res = VocabResult(kind="pruned" if Vd < V else ("full" if Vd == V else "padded"), vocab_size=V, draft_vocab_size=Vd)
    found = _find_mappings(src, opts, res, d2t_names, t2d_names, extra, extra_label, side_files)
    if Vd >= V:
        return _identity(src, res, found)
    if not found and logical_vocab_size is not None and logical_vocab_size <= Vd:
        found = _logical_identity(res, logical_vocab_size)
    return _pruned(src, res, found, extra_label)


def merge_vocab(plans: list[TensorPlan], dropped: list[DroppedTensor],
                vocab: VocabResult) -> tuple[list[TensorPlan], list[DroppedTensor]]:
    """Replace the plans of the source mapping tensors (``vocab.consumed``, accepted through
    :data:`VOCAB_PATTERNS`) by ``vocab.tensors`` / ``vocab.dropped``."""
    kept = [p for p in plans if p.source not in vocab.consumed and p.out not in ("d2t", "t2d")]
    return kept + list(vocab.tensors), list(dropped) + list(vocab.dropped)


def _sliced_bytes(store: Any, source: str, rows: np.ndarray, out_dtype: str) -> bytes:
    """Rows ``rows`` of ``source`` as ``out_dtype`` safetensors bytes (run at write time; only those rows read)."""
    from specconv.tensors import cast_tensor, tensor_to_bytes

    sl = cast_tensor(store.read_rows(source, rows), out_dtype,
                     name=f"rows of {source!r} in {Path(store.info(source).file).name}")
    return tensor_to_bytes(sl)[2]


def slice_rows_plan(
    store: Any, source: str, out: str, vocab: VocabResult, *, dtype: str | None = None, note: str = "",
) -> TensorPlan:
    """A ``produce`` plan keeping the rows of ``source [V, ...]`` that belong to the pruned draft vocab:
    output row ``j`` is source row ``j + d2t[j]`` (``dtype`` defaults to the source's). Never ``markov_w1``.

    Raises:
        InvalidInputError: vocab not pruned, or the source's first dim is not ``V``.
    """
    if vocab.kind != "pruned" or vocab.d2t is None:
        raise InvalidInputError(f"cannot slice {source}: the draft vocabulary is not pruned")
    if "markov_w1" in source or "markov_w1" in out:
        raise InvalidInputError(f"{source}: markov_w1 is indexed by target ids and is never sliced")
    info = store.info(source)
    shape = tuple(info.shape)
    if not shape or shape[0] != vocab.vocab_size:
        raise InvalidInputError(
            f"{source} has shape {list(shape)}; slicing by t2d needs first dim = vocab_size {vocab.vocab_size}",
            code="vocab_map_invalid",
        )
    rows = vocab.target_ids().copy()
    out_dtype = dtype or info.dtype
    return TensorPlan(
        out=out, fate="sliced", origin="source", source=source, shape=(int(rows.shape[0]), *shape[1:]),
        dtype=out_dtype, src_dtype=info.dtype, produce=functools.partial(_sliced_bytes, store, source, rows, out_dtype),
        note=note or f"rows of the {len(rows)} draft-vocab tokens (row j = source row j + d2t[j]) of {list(shape)}",
    )
