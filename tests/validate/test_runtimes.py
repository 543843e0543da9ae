"""The runtimes (``specconv/validate/runtimes.py``, each an engine's ``runtime`` capability): adding
one is one loader plus one ``Runtime`` on its engine. A runtime defined here (the torch reference behind another name,
and one that perturbs a draft) runs the compare gate through ``validate_drafter`` end to
end on a tiny z-lab DFlash conversion: identical drafts pass, a perturbed draft fails
(exit-4 material: ``passed`` false) while speculative decoding stays lossless. Also: the
registry's dotted paths resolve and the refusals before any model (that ``engines/`` imports
nothing from ``validate/`` is tests/structure/test_architecture.py's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specconv.validate import runtimes
from specconv.validate.runtimes import CompareRule, Runtime, check_runtime, judge
from specconv.validate.runtimes import runtimes as all_runtimes

REPO = Path(__file__).resolve().parents[2]


class PerturbedDrafter:
    """The torch reference drafter, with draft 0 of every step replaced by the next token id
    (a draft that differs from the reference outside any near tie)."""

    def __init__(self, inner):
        self.inner = inner
        for a in ("algorithm", "block_size", "num_draft_tokens", "aux_layer_ids", "device", "dtype"):
            setattr(self, a, getattr(inner, a))

    def propose(self, context_tokens, aux_hidden, *, temperature=0.0, generator=None):
        prop = self.inner.propose(context_tokens, aux_hidden, temperature=temperature, generator=generator)
        prop.tokens = prop.tokens.clone()
        prop.tokens[0] = (prop.tokens[0] + 1) % prop.logits.shape[-1]
        return prop

    def describe(self) -> dict:
        return {"perturbed": "draft 0"}


def load_same(drafter_dir, verifier, *, path, dtype, device, config=None):
    return runtimes.load_torch(drafter_dir, verifier, path=path, dtype=dtype, device=device, config=config)


def load_perturbed(drafter_dir, verifier, *, path, dtype, device, config=None):
    return PerturbedDrafter(load_same(drafter_dir, verifier, path=path, dtype=dtype, device=device, config=config))


@pytest.fixture
def registered(monkeypatch):
    """Two runtimes from this file in the registry, with the ONNX Runtime rule (+ KL)."""
    extra = {"same": Runtime("same", f"{__name__}:load_same", key="same", side="same_run",
                             rule=CompareRule(identical_tokens=True)),
             "perturbed": Runtime("perturbed", f"{__name__}:load_perturbed", key="perturbed", side="perturbed_run",
                                  rule=CompareRule(identical_tokens=True, kl=True))}
    monkeypatch.setattr(runtimes, "runtimes", lambda: {**all_runtimes(), **extra})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, validate_set):
    """A module copy of conftest's ``validate_set`` (``validate_drafter`` records into ``spec``)."""
    from conftest import copy_validate_set

    return copy_validate_set(validate_set, tmp_path_factory.mktemp("runtimes_tiny"))


def _validate(tiny, runtime):
    import torch

    from specconv.validate.run import ValidateOptions, validate_drafter

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        opts = ValidateOptions(prompts=str(tiny["prompts"]), num_prompts=2, max_new_tokens=8, device="cpu",
                               runtime=runtime)
        return validate_drafter(tiny["spec"], str(tiny["verifier"]), opts).to_dict()
    finally:
        torch.set_num_threads(n)


@pytest.mark.slow
def test_a_registered_runtime_identical_to_torch_passes_the_compare_gate(tiny, registered):
    rep = _validate(tiny, "same")
    res = rep["same"]
    assert res["tokens_identical"] is True and res["tau_equal"] is True and res["passed"] is True
    assert res["same_run"]["acceptance_length"] == res["torch"]["acceptance_length"] == rep["acceptance_length"]
    assert res["drafts"]["drafts"] > 0 and res["drafts"]["mismatches"] == 0
    assert rep["gates"] == {"structure": True, "acceptance": True, "lossless": True, "same": True}
    assert [g["name"] for g in rep["gate_results"]] == ["structure", "parity", "acceptance", "lossless", "same"]
    assert rep["passed"] is True
    assert "same" in rep["options"] and "runtime" not in rep["options"]  # options as the CLI flags


@pytest.mark.slow
def test_a_runtime_with_a_perturbed_draft_fails_the_gate(tiny, registered):
    rep = _validate(tiny, "perturbed")
    res = rep["perturbed"]
    d = res["drafts"]
    assert d["steps"] > 0 and d["mismatches"] == d["steps"] and d["near_tie_mismatches"] == 0
    assert res["tokens_identical"] is True  # speculative decoding stays lossless
    assert res["perturbed_run"]["acceptance_length"] <= res["torch"]["acceptance_length"]
    assert res["passed"] is False and rep["gates"]["perturbed"] is False and rep["passed"] is False
    assert d["top1_agreement"] == pytest.approx(1 - 1 / rep["k"])  # one of k drafts per step changed
    assert d["kl_max"] == pytest.approx(0.0, abs=1e-9)  # the rule asked for KL; the logits are torch's
    gate = next(g for g in rep["gate_results"] if g["name"] == "perturbed")
    assert gate["status"] == "failed" and any("outside near-ties" in e for e in gate["errors"])
    assert res["perturbed"] == "draft 0"  # the runtime's describe()
    assert rep["gates"]["lossless"] is True


def test_the_greedy_rule_is_not_gated_at_temperature():
    verdict, passed, errors = judge(CompareRule(identical_tokens=True), 2.0, 1.5,
                                    {"mismatches": 4, "near_tie_mismatches": 0}, False, 0.7)
    assert passed is None and errors == [] and verdict == {"tokens_identical": False, "tau_equal": False}
    _, passed, errors = judge(CompareRule(identical_tokens=True), 2.0, 2.0,
                              {"mismatches": 2, "near_tie_mismatches": 2}, True, 0.0)
    assert passed is True and errors == []  # differences at near ties only


def test_every_registered_dotted_path_resolves():
    pytest.importorskip("torch")
    from specconv.format.algorithms import import_object

    for name, rt in all_runtimes().items():
        assert callable(import_object(rt.loader)), name
        assert rt.preflight is None or callable(import_object(rt.preflight)), name
        assert (rt.rule is None) == (rt.key is None) == (rt.side is None), name
    assert all_runtimes()["torch"].rule is None  # the reference


def test_refusals_before_any_model(tmp_path):
    from specconv.errors import InvalidInputError, UsageError

    with pytest.raises(UsageError, match="unknown runtime 'nope'"):
        check_runtime("nope", "x", tmp_path, "float32")
    with pytest.raises(UsageError, match="is the reference"):
        check_runtime("torch", None, tmp_path, "float32")
    with pytest.raises(UsageError, match="--engine needs a PATH"):
        check_runtime("tensorrt", None, tmp_path, "float32")
    with pytest.raises(InvalidInputError) as e:
        check_runtime("tensorrt", str(tmp_path / "none"), tmp_path, "float32")
    assert e.value.code == "engine_not_found"
    check_runtime(None, None, tmp_path, "float32")  # nothing to compare: nothing refused


def test_flags_map_to_one_runtime():
    assert runtimes.runtime_from_flags({"onnx": None, "engine": Path("/e")}) == ("tensorrt", "/e")
    assert runtimes.runtime_from_flags({"onnx": Path("/g"), "engine": None}) == ("onnx", "/g")
    assert runtimes.runtime_from_flags({"onnx": None, "engine": None}) == (None, None)
    assert runtimes.runtime_flags("onnx", "/g") == {"onnx": "/g", "engine": None}


def test_one_runtime_at_a_time_is_the_librarys_rule(tmp_path):
    """--backend vllm|llamacpp, --onnx, --engine: at most one, refused as the CLI flags (exit 2),
    by the CLI's flag parser and by validate_drafter's own option check."""
    from specconv.errors import UsageError
    from specconv.validate.run import ValidateOptions, _check_inputs

    with pytest.raises(UsageError,
                       match="^--onnx and --engine are mutually exclusive: validate one runtime at a time$"):
        runtimes.runtime_from_flags({"onnx": Path("/g"), "engine": Path("/e")})
    with pytest.raises(UsageError, match="^--backend llamacpp and --engine are mutually exclusive"):
        runtimes.runtime_from_flags({"onnx": None, "engine": Path("/e")}, "llamacpp")
    assert runtimes.runtime_from_flags({"onnx": Path("/g")}, "torch") == ("onnx", "/g")
    with pytest.raises(UsageError, match="^--backend vllm and --onnx are mutually exclusive"):
        _check_inputs(tmp_path, ValidateOptions(backend="vllm", runtime="onnx", runtime_path="/g"))
