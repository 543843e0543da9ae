"""The four validation gates as steps, in order (checks and tolerances: ``docs/validate.md``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engines.counts import near_tie
from ..format.algorithms import PARITY_TOLERANCES as _PARITY_TABLE
from .metrics import kl_rows

if TYPE_CHECKING:
    from ..verifier import Verifier
    from .verifier_runner import VerifierRunner

log = logging.getLogger("specconv.validate")

GATE_ORDER = ("structure", "parity", "acceptance", "lossless")


@dataclass
class GateResult:
    """Outcome of one gate (``name`` in :data:`GATE_ORDER`; ``passed`` None when skipped)."""

    name: str
    passed: bool | None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    details: dict = field(default_factory=dict)
    skipped_reason: str | None = None

    def to_dict(self) -> dict:
        status = "skipped" if self.passed is None else ("passed" if self.passed else "failed")
        return {"name": self.name, "passed": self.passed, "status": status, "errors": self.errors,
                "warnings": self.warnings, "details": self.details, "skipped_reason": self.skipped_reason}


def skipped(name: str, reason: str) -> GateResult:
    """A gate that did not run."""
    return GateResult(name=name, passed=None, skipped_reason=reason)


def _verifier_tensor(verifier: Verifier, role: str):
    """Read the verifier's ``embed`` / ``lm_head`` tensor (None when absent)."""
    from ..tensors import TensorStore

    name = verifier.find_tensor(role)
    if name is None:
        return None, None
    info = verifier.tensor_info(name)
    return name, TensorStore.open(info.file).read_tensor(name)


def _lm_head_frozen(drafter_dir: Path) -> bool:
    """Whether the conversion record has a ``lm-head-frozen`` finding (``specconv/converters/_peagle.py``)."""
    from ..errors import SpecconvError
    from ..record import read_record

    try:
        conversion = read_record(drafter_dir, missing_ok=True).conversion
    except SpecconvError:
        return False
    findings = conversion.findings if conversion is not None else []
    return any(isinstance(f, dict) and f.get("code") == "lm-head-frozen" for f in findings)


def gate_structure(drafter_dir: str | Path, verifier: Verifier, *, config=None, source_config=None) -> GateResult:
    """G1: lint (``details["findings"]``), tensor accounting, verifier-supplied tensors, vocab map, aux ids.

    ``config``: the typed config if already parsed; ``source_config``: the source converted afresh,
    whose aux ids must equal the directory's.
    """
    from ..errors import SpecconvError
    from ..format import lint_dir, load_config
    from ..tensors import TensorStore

    d = Path(drafter_dir)
    res = GateResult(name="structure", passed=True)
    try:
        findings = lint_dir(d, verifier.facts(), config=config)
        cfg = config if config is not None else load_config(d)
        store = TensorStore.open(d)
    except SpecconvError as e:
        res.passed = False
        res.errors.append(f"cannot read {d}: {e.message}")
        return res
    _lint_step(res, findings)
    names = _accounting_step(res, cfg, store)
    t2d = store.read_tensor("t2d").bool() if "t2d" in names else None
    _verifier_tensors_step(res, store, names, verifier, t2d, d)
    _vocab_map_step(res, store, names, t2d, int(verifier.vocab_size))
    if source_config is not None:
        src_ids = list(source_config.aux_layer_ids or [])
        res.details["source_aux_layer_ids"] = src_ids
        if src_ids != res.details["aux_layer_ids"]:
            res.errors.append(f"aux layer ids {res.details['aux_layer_ids']} differ from the source's "
                              f"(converted afresh) {src_ids}")
    res.passed = not res.errors
    return res


def _lint_step(res: GateResult, findings) -> None:
    """The Speculators lint: errors fail G1, warnings are carried."""
    res.details["findings"] = [f.to_dict() for f in findings]
    for f in findings:
        if f.level == "error":
            res.errors.append(f"lint [{f.code}] {f.message}")
        elif f.level == "warning":
            res.warnings.append(f"lint [{f.code}] {f.message}")


def _accounting_step(res: GateResult, cfg, store) -> set[str]:
    """Every tensor in the directory is one the format defines for this config."""
    from ..format import expected_tensors

    algo = cfg.speculators_model_type
    res.details["algorithm"] = algo
    res.details["aux_layer_ids"] = list(cfg.aux_layer_ids or [])
    names = set(store.names())
    unaccounted = sorted(names - (set(expected_tensors(cfg)) | {"d2t", "t2d"}))
    res.details["num_tensors"] = len(names)
    res.details["unaccounted_tensors"] = unaccounted
    if unaccounted:
        res.errors.append(
            f"{len(unaccounted)} tensor(s) are not part of the {algo} format for this config "
            f"(would be ignored or rejected by loaders): {unaccounted[:8]}"
        )
    return names


def _verifier_tensors_step(res: GateResult, store, names: set[str], verifier: Verifier, t2d, drafter_dir: Path) -> None:
    """The tensors the format takes from the verifier (embedding, LM head or its ``t2d`` rows) equal its."""
    from ..format.algorithms import algorithm

    alg = algorithm(res.details["algorithm"])
    roles = [("lm_head.weight", "lm_head")]
    if not alg.trains_embedding:  # else the drafter trains its own embedding
        roles.insert(0, ("embed_tokens.weight", "embed"))
    checks: dict[str, Any] = {}
    # a head that may be trained (P-EAGLE, EAGLE-3 lineage) must equal the verifier's only
    # where the conversion record says the source format freezes it
    frozen = not alg.lm_head_may_train or _lm_head_frozen(drafter_dir)
    for tname, role in roles:
        if tname in names:
            _compare_to_verifier(res, store, tname, role, verifier, t2d, checks, frozen)
    res.details["verifier_tensors"] = checks


def _compare_to_verifier(res: GateResult, store, tname: str, role: str, verifier: Verifier, t2d, checks: dict,
                         frozen: bool) -> None:
    import torch

    from ..errors import SpecconvError

    try:
        vname, ref = _verifier_tensor(verifier, role)
    except SpecconvError as e:
        res.warnings.append(f"cannot read the verifier's {role} to compare {tname}: {e.message}")
        return
    if ref is None:
        res.warnings.append(f"verifier has no {role} tensor to compare {tname} with")
        return
    rows = int(store.info(tname).shape[0])
    if rows == ref.shape[0]:
        expect = ref
    elif t2d is not None and rows == int(t2d.sum()) and t2d.shape[0] == ref.shape[0]:
        expect = ref[t2d]
    else:
        checks[tname] = {"compared": False, "reason": f"{rows} rows vs verifier {ref.shape[0]}"}
        res.warnings.append(f"{tname} has {rows} rows; verifier {vname} has {ref.shape[0]}: not compared")
        return
    got = store.read_tensor(tname)
    expect = expect.to(got.dtype)
    same = tuple(got.shape) == tuple(expect.shape) and torch.equal(got, expect)
    diff = None
    if not same and tuple(got.shape) == tuple(expect.shape):
        diff = float((got.float() - expect.float()).abs().max())
    checks[tname] = {"compared": True, "verifier_tensor": vname, "equal": same, "max_abs_diff": diff}
    if not same and not frozen:
        res.warnings.append(
            f"{tname} differs from the verifier's {vname} (max |Δ| = {diff}); the source format is not known to "
            "freeze it (specconv.json has no lm-head-frozen finding): vLLM uses this file's head, speculators "
            "may reload the verifier's"
        )
    elif not same:
        res.errors.append(
            f"{tname} differs from the verifier's {vname} (max |Δ| = {diff}); the format "
            "requires the verifier's tensor here (random or stale weights?)"
        )


def _vocab_map_step(res: GateResult, store, names: set[str], t2d, vocab: int) -> None:
    """``d2t`` offsets map draft ids onto the ids ``t2d`` selects; ``t2d`` covers the vocab."""
    import torch

    if "d2t" in names and t2d is not None:
        d2t = store.read_tensor("d2t").long()
        sel = torch.nonzero(t2d).flatten()
        ok = d2t.shape[0] == sel.shape[0] and torch.equal(torch.arange(d2t.shape[0]) + d2t, sel)
        res.details["vocab_map_consistent"] = bool(ok)
        if not ok:
            res.errors.append("d2t offsets do not map draft ids onto the ids selected by t2d (sorted ascending)")
    if t2d is not None and t2d.shape[0] != vocab:
        res.errors.append(f"t2d has {t2d.shape[0]} entries, verifier vocab is {vocab}")


#: G2 tolerances per dtype as the report records them (:data:`specconv.format.algorithms.PARITY_TOLERANCES`).
PARITY_TOLERANCES: dict[str, dict[str, float | None]] = {k: v.as_dict() for k, v in _PARITY_TABLE.items()}


def compare_logits(ref, test, *, margin: float) -> dict:
    """Per-row comparison of two logit matrices ``[S, V]`` (float32, ``-inf`` allowed).

    ``top1_agree`` counts rows whose reference top-1/top-2 margin > ``margin``; ``support_mismatch``
    rows whose finite entries differ (a vocab-map bug); ``per_slot`` holds the per-row numbers.
    """
    import torch

    ref = ref.float()
    test = test.float()
    fin_r, fin_t = torch.isfinite(ref), torch.isfinite(test)
    support_mismatch = int((fin_r != fin_t).any(-1).sum())
    both = fin_r & fin_t
    r0 = torch.where(both, ref, torch.zeros_like(ref))
    t0 = torch.where(both, test, torch.zeros_like(test))
    absd = (r0 - t0).abs()
    max_abs_row = absd.max(-1).values
    cos = _cosine_rows(r0, t0)
    kl = kl_rows(ref, test)
    eq, marg, overlap = _top_k_agreement(ref, test)
    clear = marg > margin
    n_clear = int(clear.sum())
    max_ref = float(r0.abs().max()) if r0.numel() else 0.0
    return {
        "rows": int(ref.shape[0]),
        "max_abs": float(max_abs_row.max()) if ref.shape[0] else 0.0,
        "mean_abs": float(absd.sum() / both.sum().clamp_min(1)),
        "rel_max": float(max_abs_row.max() / max_ref) if ref.shape[0] and max_ref > 0 else 0.0,
        "cosine_min": float(cos.min()) if ref.shape[0] else 1.0,
        "top1_agree": float(eq[clear].float().mean()) if n_clear else 1.0,
        "top1_rows": n_clear,
        "top1_agree_all": float(eq.float().mean()) if ref.shape[0] else 1.0,
        "top5_overlap": sum(overlap) / len(overlap) if overlap else 1.0,
        "kl_mean": float(kl.mean()) if ref.shape[0] else 0.0,
        "kl_max": float(kl.max()) if ref.shape[0] else 0.0,
        "support_mismatch": support_mismatch,
        "per_slot": [
            {"max_abs": float(m), "cosine": float(c), "kl": float(k_), "top1_equal": bool(e), "margin": float(g)}
            for m, c, k_, e, g in zip(max_abs_row, cos, kl, eq, marg, strict=True)
        ],
    }


def _cosine_rows(a, b, chunk: int = 64):
    """Row cosines of ``[S, V]`` pairs as float64 ``[S]``, ``chunk`` rows at a time (a float32 cosine
    of a 49,152-wide row with itself rounds to 0.9999989, under G2's float32 bound 0.999999)."""
    import torch

    parts = [torch.nn.functional.cosine_similarity(x.double(), y.double(), dim=-1)
             for x, y in zip(a.split(chunk), b.split(chunk), strict=True)]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def _top_k_agreement(ref, test):
    """Per row: top-1 equal, the reference's top-1 − top-2 margin, top-5 overlap fraction."""
    import torch

    top_r = torch.topk(ref, min(5, ref.shape[-1]), -1)
    top_t = torch.topk(test, min(5, test.shape[-1]), -1)
    eq = top_r.indices[:, 0] == top_t.indices[:, 0]
    if ref.shape[-1] > 1:
        marg = top_r.values[:, 0] - top_r.values[:, 1]
    else:
        marg = torch.full((ref.shape[0],), float("inf"))
    overlap = [
        len(set(a.tolist()) & set(b.tolist())) / top_r.indices.shape[-1]
        for a, b in zip(top_r.indices, top_t.indices, strict=True)
    ]
    return eq, marg, overlap


def _aux_union(ids_a: Sequence[int], ids_b: Sequence[int]) -> list[int]:
    return list(dict.fromkeys([*ids_a, *ids_b]))


def _select_aux(feats, union: Sequence[int], ids: Sequence[int], hidden: int):
    import torch

    cols = [feats[..., union.index(i) * hidden : (union.index(i) + 1) * hidden] for i in ids]
    return torch.cat(cols, dim=-1)


def parity_anchors(seq_len: int, prompt_len: int, per_sequence: int) -> list[int]:
    """Anchors evenly spaced over the generated part, plus 1 (anchor ``a``: tokens ``0…a``, features
    ``0…a−1``)."""
    lo = max(1, prompt_len)
    hi = seq_len - 1
    out = {1} if seq_len > 1 else set()
    if hi >= lo and per_sequence > 0:
        if per_sequence == 1:
            out.add(hi)
        else:
            for i in range(per_sequence):
                out.add(lo + round(i * (hi - lo) / (per_sequence - 1)))
    return sorted(out)


@dataclass
class _Proposals:
    """The reference's and the converted drafter's proposals on the same anchors."""

    ref_rows: list = field(default_factory=list)  # per proposal: logits [k, V] float32 cpu
    test_rows: list = field(default_factory=list)
    conf_ref: list = field(default_factory=list)  # DSpark confidences [k]
    conf_test: list = field(default_factory=list)
    tokens_equal: int = 0


def gate_parity(
    reference,
    test,
    verifier: VerifierRunner,
    sequences: Sequence[tuple[Sequence[int], int]],
    *,
    dtype: str = "float32",
    anchors_per_sequence: int = 4,
    reference_kind: str = "",
    tolerance: dict[str, float | None] | None = None,
) -> GateResult:
    """G2: compare the reference and converted drafters (DrafterBackends) on real verifier features.

    Each side's features are captured by its own ``aux_layer_ids``, so an aux-id off-by-one shows
    here. ``sequences``: ``[(token ids, prompt length)]``; ``tolerance``: the algorithm's row (None:
    the table's for ``dtype``).
    """
    import torch

    tol = tolerance or PARITY_TOLERANCES.get(dtype, PARITY_TOLERANCES["float32"])
    res = GateResult(name="parity", passed=True)
    res.details["reference"] = reference_kind
    res.details["tolerances"] = tol
    props = _collect_proposals(reference, test, verifier, sequences, anchors_per_sequence)
    if not props.ref_rows:
        return skipped("parity", "no sequence long enough to draft from")
    R, T = torch.cat(props.ref_rows), torch.cat(props.test_rows)
    if R.shape[-1] != T.shape[-1]:
        res.passed = False
        res.errors.append(f"reference logits have {R.shape[-1]} columns, converted {T.shape[-1]}")
        return res
    margin = tol["margin"]
    assert margin is not None, "a parity tolerance row always has a margin (only max_abs may be None)"
    cmp = compare_logits(R, T, margin=float(margin))
    cmp.pop("per_slot")
    res.details.update(cmp)
    _parity_details(res, props, float(margin), reference, test)
    _parity_verdict(res, cmp, tol, dtype)
    res.passed = not res.errors
    return res


def _collect_proposals(reference, test, verifier: VerifierRunner, sequences, anchors_per_sequence: int) -> _Proposals:
    """Both drafters propose from the same anchors on one capture per sequence (union of aux ids)."""
    import torch

    ids_r, ids_t = list(reference.aux_layer_ids), list(test.aux_layer_ids)
    union = _aux_union(ids_t, ids_r)
    saved = list(verifier.aux_layer_ids)
    H = verifier.hidden_size
    out = _Proposals()
    try:
        verifier.set_aux_layer_ids(union)
        for seq, plen in sequences:
            seq = list(seq)
            if len(seq) < 2:
                continue
            feats = verifier.forward(seq, None).aux  # [L, U*H]
            assert feats is not None, "a drafter captures at least one aux layer"
            for a in parity_anchors(len(seq), plen, anchors_per_sequence):
                ctx = torch.tensor([seq[: a + 1]])
                pr = reference.propose(ctx, _select_aux(feats[:a], union, ids_r, H)[None], temperature=0.0)
                pt = test.propose(ctx, _select_aux(feats[:a], union, ids_t, H)[None], temperature=0.0)
                k = min(pr.logits.shape[0], pt.logits.shape[0])
                out.ref_rows.append(pr.logits[:k].float().cpu())
                out.test_rows.append(pt.logits[:k].float().cpu())
                out.tokens_equal += int(torch.equal(pr.tokens[:k].cpu(), pt.tokens[:k].cpu()))
                conf_r, conf_t = getattr(pr, "confidence", None), getattr(pt, "confidence", None)
                if conf_r is not None and conf_t is not None:
                    out.conf_ref.append(conf_r[:k].float().cpu())
                    out.conf_test.append(conf_t[:k].float().cpu())
    finally:
        verifier.set_aux_layer_ids(saved)
    return out


def _parity_details(res: GateResult, props: _Proposals, margin: float, reference, test) -> None:
    """Per-slot numbers, proposal counts, the aux ids used and the confidence-head delta."""
    import torch

    res.details["per_slot"] = _per_slot(props, margin)
    n = len(props.ref_rows)
    res.details["num_proposals"] = n
    res.details["proposals_token_equal"] = props.tokens_equal / n
    res.details["aux_layer_ids"] = {"reference": list(reference.aux_layer_ids), "converted": list(test.aux_layer_ids)}
    if props.conf_ref:
        cr, ct = torch.cat(props.conf_ref), torch.cat(props.conf_test)
        res.details["confidence_max_abs"] = float((cr - ct).abs().max())


def _per_slot(props: _Proposals, margin: float) -> list[dict]:
    """:func:`compare_logits` per block slot (slot = draft index within a proposal)."""
    import torch

    slots = []
    for s in range(props.ref_rows[0].shape[0]):
        rs = torch.stack([r[s] for r in props.ref_rows if r.shape[0] > s])
        ts = torch.stack([t[s] for t in props.test_rows if t.shape[0] > s])
        c = compare_logits(rs, ts, margin=margin)
        c.pop("per_slot")
        slots.append({"slot": s, **c})
    return slots


def _parity_verdict(res: GateResult, cmp: dict, tol: dict, dtype: str) -> None:
    """G2's decision from the comparison and the dtype's tolerance row."""
    if cmp["support_mismatch"]:
        res.errors.append(
            f"{cmp['support_mismatch']} slot(s) have different finite-logit supports: the draft "
            "vocabulary mapping (d2t/t2d) differs"
        )
    if tol["max_abs"] is not None and cmp["max_abs"] > tol["max_abs"]:
        res.errors.append(f"max |Δlogit| {cmp['max_abs']:.3g} > {tol['max_abs']:g} ({dtype})")
    if cmp["cosine_min"] < tol["cosine_min"]:
        res.errors.append(f"min cosine {cmp['cosine_min']:.7f} < {tol['cosine_min']} ({dtype})")
    if cmp["top1_agree"] < tol["top1_min"]:
        res.errors.append(
            f"top-1 agreement {cmp['top1_agree']:.4f} on {cmp['top1_rows']} clear-margin slots "
            f"< {tol['top1_min']} ({dtype})"
        )
    if cmp["kl_mean"] > tol["mean_kl_max"]:
        res.errors.append(f"mean KL {cmp['kl_mean']:.3g} > {tol['mean_kl_max']:g} ({dtype})")
    conf = res.details.get("confidence_max_abs")
    if conf is not None and dtype == "float32" and conf > 1e-4:
        res.errors.append(f"confidence head max |Δ| {conf:.3g} > 1e-4")
    if tol["max_abs"] is None:
        res.warnings.append(f"max |Δlogit| {cmp['max_abs']:.3g} reported only ({dtype}: gated on cosine/top-1/KL)")


def gate_acceptance(metrics: dict, *, source_metrics: dict | None = None, min_tau: float | None = None) -> GateResult:
    """G3 on pooled τ (:func:`~.metrics.compute_metrics` of converted and source drafters; ``docs/validate.md``)."""
    res = GateResult(name="acceptance", passed=True)
    tau = float(metrics["acceptance_length"])
    res.details.update({"tau": tau, **{k: metrics.get(k) for k in ("tau_ci95", "acceptance_at_pos", "num_drafts")}})
    if source_metrics is not None:
        ts = float(source_metrics["acceptance_length"])
        hw = max(metrics.get("tau_ci95_half_width") or 0.0, source_metrics.get("tau_ci95_half_width") or 0.0)
        band = max(0.02 * ts, hw)
        res.details.update({"tau_source": ts, "band": band, "delta": tau - ts})
        if abs(tau - ts) > band:
            res.errors.append(f"τ {tau:.4f} differs from the source's {ts:.4f} by more than {band:.4f}")
    if min_tau is not None:
        res.details["min_tau"] = min_tau
        if tau < min_tau:
            res.errors.append(f"τ {tau:.4f} is below --min-tau {min_tau}")
    if source_metrics is None and min_tau is None:
        res.warnings.append("no --source and no --min-tau: acceptance is reported, not gated")
    p = metrics.get("acceptance_at_pos") or []
    if p and p[0] < 0.01 and (metrics.get("num_drafts") or 0) >= 20:
        res.warnings.append(
            f"first-position acceptance is {p[0]:.3f}: the drafter looks broken (aux-layer "
            "off-by-one, wrong mask token, random weights?)"
        )
    res.passed = not res.errors
    return res


#: Model runners a serving engine may report (``unknown``: it did not say).
KNOWN_RUNNERS = ("v1", "v2")


def served_engine_checks(run: Any, g3: GateResult, engine: str, seen: Sequence[Any], runner: str | None,
                         runners: Sequence[str] = ()) -> dict[str, Any]:
    """What G3 (``g3``, mutated) adds for a serving engine, one rule for every engine.

    The prompt ids the engine saw (``seen``: per request ids, a count or None) must equal the
    rendered ones (each difference a G3 error); a parallel-drafting drafter under a reported
    ``runner`` not among ``runners`` gives the finding ``sequential-drafting-runner``.
    Returns ``{"prompt_tokens": "ids" | "count" | None}``.
    """
    from ..format.algorithms import find_algorithm
    from ..format.findings import finding
    from ..prompts import compare_prompt_ids

    checked, diffs = compare_prompt_ids(run.rendered, seen)
    g3.errors += [f"{engine} did not see specconv's prompt tokens: {d}" for d in diffs]
    alg = find_algorithm(run.report.get("algorithm"))
    if alg is not None and alg.parallel_drafting and runner in KNOWN_RUNNERS and runner not in runners:
        f = finding("sequential-drafting-runner", f"{engine} ran the {alg.display_name} drafter on model runner "
                    f"{runner}, which does not draft it in one pass (runners that do: {', '.join(runners) or 'none'}); "
                    "τ measures sequential drafting, not the drafter as trained")
        g3.warnings.append(f.message)
        run.report.setdefault("findings", []).append(f.to_dict())
    if g3.passed is not None and g3.errors:
        g3.passed = False
    return {"prompt_tokens": checked}


def gate_lossless(spec: Sequence[Any], plain: Sequence[Any], *, dtype: str = "float32") -> GateResult:
    """G4 (greedy): speculative == plain greedy output per request (RequestResult lists, same order);
    clear-margin divergences fail in float32, else warn."""
    res = GateResult(name="lossless", passed=True)
    n = len(spec)
    exact = 0
    divs = []
    strict = dtype in ("float32", "float64")
    for s, p in zip(spec, plain, strict=True):
        if list(s.output_ids) == list(p.output_ids):
            exact += 1
        else:
            divs.append(_divergence(s, p, dtype))
    rate = exact / n if n else 1.0
    res.details.update({"exact_match": rate, "n": n, "n_exact": exact, "divergences": divs, "mode": "greedy"})
    for d in divs:
        msg = (
            f"{d['prompt_id']}: speculative output diverges from plain greedy at token "
            f"{d['first_divergence']} (verifier top-1/top-2 gap {d['logit_gap']})"
        )
        if d["near_tie"]:
            res.warnings.append(msg + " — near-tie, numerically legitimate")
        elif strict:
            res.errors.append(msg + " — clear margin: the loop is not lossless")
        else:
            res.warnings.append(msg + f" — {dtype}: verify/decode kernels may flip an argmax")
    if strict and n and rate < 0.95 and not res.errors:
        res.warnings.append(f"exact match {rate:.2%} < 95% (all divergences at near-ties)")
    res.passed = not res.errors
    return res


def _divergence(s, p, dtype: str) -> dict:
    """Where ``s`` first differs from ``p``, with the smaller top-1 − top-2 logit gap of the two there."""
    a, b = list(s.output_ids), list(p.output_ids)
    j = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    gap_p = p.gaps[j] if j < len(p.gaps) else None
    gap_s = s.gaps[j] if j < len(s.gaps) else None
    gaps = [g for g in (gap_p, gap_s) if g is not None]
    gap = min(gaps) if gaps else None
    top1 = p.top1[j] if j < len(p.top1) else (s.top1[j] if j < len(s.top1) else 0.0)
    return {
        "prompt_id": s.prompt_id,
        "first_divergence": j,
        "spec_token": a[j] if j < len(a) else None,
        "plain_token": b[j] if j < len(b) else None,
        "logit_gap": gap,
        "top1_logit": top1,
        "near_tie": gap is not None and near_tie(gap, top1, dtype),
    }


def sampler_check(*, vocab: int = 50, k: int = 3, draws: int = 100_000, seed: int = 0) -> GateResult:
    """G4 for T > 0: the first emitted token's empirical law is within TV 0.01 of ``p_0`` (synthetic p, q)."""
    import torch

    from .sampling import speculative_sample

    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(k + 1, vocab, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(k, vocab, generator=g) * 1.5, -1)
    x = torch.multinomial(q.repeat(draws, 1), 1, generator=g).view(draws, k)
    acc, nxt = speculative_sample(x, q.expand(draws, k, vocab), p.expand(draws, k + 1, vocab), generator=g)
    first = torch.where(acc > 0, x[:, 0], nxt)
    emp = torch.bincount(first, minlength=vocab).double() / draws
    tv = 0.5 * float((emp - p[0].double()).abs().sum())
    res = GateResult(name="lossless", passed=tv < 0.01)
    res.details.update({"mode": "sampler", "tv": tv, "vocab": vocab, "draws": draws})
    if not res.passed:
        res.errors.append(f"rejection sampler output law differs from p (TV {tv:.4f} ≥ 0.01)")
    return res
