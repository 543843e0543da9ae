"""DSpark-family conversion: what every DSpark source format the converter registry lists
(built by ``tests/fixtures_dspark.BUILDERS``, converted once per session by conftest's
``dspark_converted``) must give. A format's own mapping (aux ids, layout, head renames, ...)
is tested in tests/converters/test_<format>.py on the same conversion.
"""

from __future__ import annotations

import pytest
from _dspark_helpers import detected, out_tensors, record

from fixtures_dflash import read
from fixtures_dspark import FORMATS, MASK


@pytest.fixture(params=FORMATS)
def fmt(request) -> str:
    return request.param


def test_detected(fmt, dspark_converted):
    assert detected(dspark_converted(fmt).src) == fmt


def test_convert_end_to_end(fmt, dspark_converted):
    """The report and config.json keys every DSpark conversion writes (the fixtures' heads:
    Markov rank 8 vanilla, confidence head with Markov input), and every source tensor in the
    output unchanged under the name the record gives its source."""
    src, out, rep = dspark_converted(fmt)
    cfg = read(out)
    assert rep["format"] == fmt and rep["algorithm"] == "dspark"
    assert cfg["speculators_model_type"] == "dspark" and "model_type" not in cfg
    assert (cfg["markov_rank"], cfg["markov_head_type"]) == (8, "vanilla")
    assert cfg["enable_confidence_head"] is True and cfg["confidence_head_with_markov"] is True
    assert cfg["mask_token_id"] == MASK and cfg["draft_vocab_size"] == 256
    assert cfg["transformer_layer_config"]["model_type"] == "qwen3"
    # anchor-first drafts every slot of a block, 1+N all but the anchor
    k = cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    assert k == cfg["block_size"] - (0 if cfg["sample_from_anchor"] else 1)
    s, d, fates = out_tensors(src), out_tensors(out), record(out)["tensors"]
    assert sorted(fates[n]["source"] for n in d) == sorted(s)
    for n, t in d.items():
        v = s[fates[n]["source"]]
        assert t.dtype == v.dtype and bool((t == v).all()), n


@pytest.mark.peer
def test_loads_in_speculators_and_forward_runs(fmt, dspark_converted, tiny_verifier_dir):
    from interop import load_with_speculators, run_speculators_forward

    out = dspark_converted(fmt).out
    model = load_with_speculators(out, tiny_verifier_dir)
    assert model.markov_head is not None and model.confidence_head is not None
    assert model.config.sample_from_anchor is read(out)["sample_from_anchor"]
    assert run_speculators_forward(model).shape[-1] == 256
