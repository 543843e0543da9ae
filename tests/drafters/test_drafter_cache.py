"""The drafter context cache (``specconv.drafters.cache``) against the stateless path.

Both paths must give the same tokens, τ and per-position acceptance (fp32, greedy) in the
validation loop — on the bundled trained drafter against the real SmolLM2 verifier and on
tiny drafters of all three algorithms (written by the fixture producers and converted, or
built by speculators 0.9.0) — and the cache must hold exactly the accepted context.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specconv.drafters import load_drafter  # noqa: E402
from specconv.validate.loop import run_requests  # noqa: E402
from specconv.validate.metrics import compute_metrics  # noqa: E402
from specconv.validate.verifier_runner import VerifierRunner  # noqa: E402
from tests import fixtures_dflash as fd  # noqa: E402
from tests import fixtures_dspark as fs  # noqa: E402
from tests import fixtures_peagle as fp  # noqa: E402
from tests.tolerances import assert_close, assert_logits_match  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread_module")  # conftest: torch on one thread


class Recorder:
    """Wraps a drafter backend; records each proposal's tokens and the cache length."""

    def __init__(self, inner):
        self.inner = inner
        self.algorithm = inner.algorithm
        self.num_draft_tokens = inner.num_draft_tokens
        self.aux_layer_ids = inner.aux_layer_ids
        self.calls: list[tuple[int, list[int], torch.Tensor]] = []  # (T, tokens, logits)
        self.lengths: list[int] = []

    def propose(self, context_tokens, aux_hidden, **kw):
        p = self.inner.propose(context_tokens, aux_hidden, **kw)
        self.calls.append((aux_hidden.shape[1], p.tokens.tolist(), p.logits.clone()))
        self.lengths.append(getattr(self.inner, "length", -1))
        return p


class SessionFactory:
    """A drafter whose ``new_session`` hands out recorded sessions (one per request)."""

    def __init__(self, drafter):
        self.drafter = drafter
        self.algorithm = drafter.algorithm
        self.num_draft_tokens = drafter.num_draft_tokens
        self.aux_layer_ids = drafter.aux_layer_ids
        self.sessions: list[Recorder] = []

    def propose(self, *a, **kw):  # the stateless path
        return self.drafter.propose(*a, **kw)

    def new_session(self):
        self.sessions.append(Recorder(self.drafter.new_session()))
        return self.sessions[-1]


def _both(runner, drafter, prompts, n, **kw):
    """Decode ``prompts`` statelessly and through the cache; return results + recordings."""
    stateless = Recorder(drafter)
    r0 = run_requests(runner, stateless, prompts, max_new_tokens=n, drafter_cache=False, **kw)
    cached = SessionFactory(drafter)
    r1 = run_requests(runner, cached, prompts, max_new_tokens=n, **kw)
    return r0, r1, stateless, cached


def _assert_same(r0, r1, stateless, cached, k, *, greedy=True):
    """The cached path proposes what the stateless one does (logits within the fp32
    tolerance, ids equal outside near-ties, ``tests/tolerances.py``); then the two loops
    are the same loop: same outputs, acceptance and τ. A greedy near-tie difference
    legitimately forks the trajectories: it is reported and the rest is not compared.
    Sampled draws (T > 0) use the same seeded generator on logits within tolerance: a
    draw flips only when its uniform lands within ~1e-6 of a CDF boundary, so they stay exact."""
    for s in cached.sessions:  # after every step the cache holds exactly the accepted context
        assert s.lengths == [t for t, _, _ in s.calls]
    calls1 = [c for s in cached.sessions for c in s.calls]
    assert stateless.calls and calls1
    for i, ((t0, tok0, lg0), (t1, tok1, lg1)) in enumerate(zip(stateless.calls, calls1, strict=True)):
        assert t0 == t1
        if not greedy:
            assert_close(lg1, lg0, what=f"proposal {i} logits")
            assert tok0 == tok1, f"proposal {i}: sampled drafts differ"
        elif assert_logits_match(lg1, lg0, actual_ids=tok1, expected_ids=tok0, what=f"proposal {i}"):
            return  # the loops fork at a near-tie (reported)
    assert len(calls1) == len(stateless.calls)
    assert [r.output_ids for r in r0] == [r.output_ids for r in r1]
    assert [[s.accepted for s in r.steps] for r in r0] == [[s.accepted for s in r.steps] for r in r1]
    m0, m1 = compute_metrics(r0, k), compute_metrics(r1, k)
    assert m0["acceptance_length"] == m1["acceptance_length"]
    assert m0["acceptance_at_pos"] == m1["acceptance_at_pos"]


# ------------------------------------------------------------------- tiny drafters
@pytest.fixture(scope="module")
def tiny_runner(tiny_verifier_dir):
    return VerifierRunner.load(tiny_verifier_dir, dtype="float32")


def _tiny_drafter(kind: str, root: Path, verifier: Path):
    if kind == "dflash-zlab":
        src = fd.make_source(root / "src", "zlab_dflash", verifier_dir=verifier)
        fd.api_convert(src, verifier, root / "out")
        return load_drafter(root / "out", verifier, dtype=torch.float32)
    if kind == "dspark-deepspec":
        src = fs.make_deepspec_dspark(root / "src", verifier)
        fd.api_convert(src, verifier, root / "out")
        return load_drafter(root / "out", verifier, dtype=torch.float32)
    if kind == "dflash-swa":  # speculators-built, sliding window 32 < the context reached
        d = fp.build_speculators_block(verifier, root / "spec", "dflash", layers=2)
        return load_drafter(d, verifier, dtype=torch.float32)
    d = fp.build_speculators_peagle(verifier, root / "spec", layers=2)
    drafter = load_drafter(d, verifier, dtype=torch.float32)
    if kind == "peagle-swa":  # sliding window 8 on layer 1: context keys in (q_pos - 8, q_pos]
        drafter.windows = [None, 8]
    return drafter


@pytest.fixture(scope="module")
def tiny(tiny_verifier_dir, tmp_path_factory):
    """``tiny(kind)``: the tiny drafter of ``kind``, built once per module."""
    built: dict = {}

    def get(kind: str):
        if kind not in built:
            built[kind] = _tiny_drafter(kind, tmp_path_factory.mktemp(kind), tiny_verifier_dir)
        return built[kind]

    return get


TINY_PROMPTS = [("a", [5, 17, 3, 42, 8, 11, 60, 9] * 4), ("b", [7, 7, 1, 30, 99])]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dflash-zlab", "dflash-swa", "dspark-deepspec", "peagle"])
def test_cached_equals_stateless_tiny(kind, tiny, tiny_runner):
    drafter = tiny(kind)
    tiny_runner.set_aux_layer_ids(drafter.aux_layer_ids)
    r0, r1, st, ca = _both(tiny_runner, drafter, TINY_PROMPTS, 24)
    _assert_same(r0, r1, st, ca, drafter.num_draft_tokens)


@pytest.mark.parametrize("kind", ["dflash-swa", "dspark-deepspec", "peagle"])
def test_cached_equals_stateless_sampled(kind, tiny, tiny_runner):
    """T > 0 (seeded rejection sampling): random drafters get drafts accepted here, so the
    per-position acceptance compared is not all zeros."""
    drafter = tiny(kind)
    tiny_runner.set_aux_layer_ids(drafter.aux_layer_ids)
    r0, r1, st, ca = _both(tiny_runner, drafter, TINY_PROMPTS, 24, temperature=0.8, seed=3)
    _assert_same(r0, r1, st, ca, drafter.num_draft_tokens, greedy=False)
    assert compute_metrics(r1, drafter.num_draft_tokens)["acceptance_at_pos"][0] > 0


# ------------------------------------------------------------- direct cache units
def _inputs(drafter, T, seed=1):
    g = torch.Generator().manual_seed(seed)
    width = len(drafter.aux_layer_ids) * drafter.aux_hidden_size
    return (torch.randint(3, 200, (1, T + 1), generator=g), torch.randn(1, T, width, generator=g))


def _same_block(drafter, session, ctx, aux):
    a = drafter.forward_block(ctx, aux)
    b = session.forward_block(ctx, aux)
    assert_logits_match(b.target_logits, a.target_logits, actual_ids=b.tokens, expected_ids=a.tokens,
                        what=f"cached block at T={aux.shape[1]}")
    if a.confidence is not None:
        assert_close(b.confidence, a.confidence, what=f"cached confidence at T={aux.shape[1]}")
    assert session.length == aux.shape[1]


@pytest.mark.parametrize("kind", ["dflash-swa", "dspark-deepspec", "peagle", "peagle-swa"])
def test_cache_crops_to_the_accepted_context(kind, tiny):
    """Growing context, a repeated call, a rewind after rejected drafts (shorter context),
    and — P-EAGLE, whose entries depend on tokens — a changed token inside the prefix."""
    drafter = tiny(kind)
    ctx, aux = _inputs(drafter, 48)
    s = drafter.new_session()
    for T in (5, 9, 40, 40, 44):
        _same_block(drafter, s, ctx[:, : T + 1], aux[:, :T])
    s.crop(30)  # three drafts rejected: the caller rewinds to the accepted context
    assert s.length == 30
    _same_block(drafter, s, ctx[:, :34], aux[:, :33])
    _same_block(drafter, s, ctx[:, :21], aux[:, :20])  # a shorter context crops by itself
    assert s.cache.layers[-1].length == 20
    if kind.startswith("peagle"):
        ctx2 = ctx.clone()
        ctx2[0, 11] = (ctx2[0, 11] + 1) % 200  # entry 10 uses t_11
        s.forward_block(ctx2[:, :31], aux[:, :30])
        assert s.cache.tokens is not None and int(s.cache.tokens[10]) == int(ctx2[0, 11])
        _same_block(drafter, s, ctx2[:, :31], aux[:, :30])


def test_stateless_switch_on_real_drafters(tiny, tiny_runner):
    """``drafter_cache=False`` never opens a session; the default opens one per request."""
    drafter = tiny("peagle")
    tiny_runner.set_aux_layer_ids(drafter.aux_layer_ids)
    f = SessionFactory(drafter)
    run_requests(tiny_runner, f, TINY_PROMPTS, max_new_tokens=6, drafter_cache=False)
    assert f.sessions == []
    run_requests(tiny_runner, f, TINY_PROMPTS, max_new_tokens=6)
    assert len(f.sessions) == len(TINY_PROMPTS) and all(s.calls for s in f.sessions)


# -------------------------------------------------- bundled drafter, real verifier
@pytest.fixture(scope="module")
def bundled(bundled_drafter, smollm2_dir):
    drafter = load_drafter(bundled_drafter, smollm2_dir, dtype=torch.float32)
    runner = VerifierRunner.load(smollm2_dir, dtype="float32", aux_layer_ids=drafter.aux_layer_ids)
    return drafter, runner


@pytest.mark.slow
def test_cached_equals_stateless_bundled(bundled):
    from specconv.prompts import load_prompts, render

    drafter, runner = bundled
    prompts = [(p.id, render(p, runner.tokenizer)) for p in load_prompts("humaneval", 2)]
    r0, r1, st, ca = _both(runner, drafter, prompts, 24)
    _assert_same(r0, r1, st, ca, drafter.num_draft_tokens)
    assert compute_metrics(r1, drafter.num_draft_tokens)["acceptance_length"] > 1.5  # it drafts well
    assert any(s.accepted < drafter.num_draft_tokens for r in r1 for s in r.steps[:-1])  # rejections happened
