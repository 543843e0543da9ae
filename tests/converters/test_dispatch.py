"""Detection by discriminator (``converters/dispatch.py``): a source is tried only against
the short candidate list its ``speculators_model_type`` / ``projector_type`` /
``architectures[0]`` / markers select, and every format is reachable by some route.

Inputs: the refusal triggers of ``tests/fixtures_dspark.REFUSAL_CASES`` and tiny sources of
the supported DFlash/DSpark layouts (``tests/fixtures_dspark``), built per module.
"""

from __future__ import annotations

import json

import pytest

from fixtures_dspark import REFUSAL_CASES, make_deepspec_dspark, make_refusal, make_specforge_dspark, make_zlab_dflash
from specconv.converters import REGISTRY, SourceInfo, detect
from specconv.converters.dispatch import ROUTES, all_ids, candidates, discriminators


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, tiny_verifier_dir):
    b = tmp_path_factory.mktemp("dispatch")
    out = {kind: make_refusal(kind, b / kind.replace(":", "_"), tiny_verifier_dir) for kind, _ in REFUSAL_CASES}
    out["zlab_dflash"] = make_zlab_dflash(b / "zl", tiny_verifier_dir)
    out["deepspec_dspark"] = make_deepspec_dspark(b / "ds", tiny_verifier_dir)
    out["specforge_dspark"] = make_specforge_dspark(b / "sf", tiny_verifier_dir)
    return out


def test_candidate_lists_are_short_and_hold_the_match(dirs):
    for kind, d in dirs.items():
        src = SourceInfo.open(d)
        cands = candidates(src)
        assert len(cands) <= 16 < len(REGISTRY), (kind, cands)  # never the whole registry
        hit = detect(src)
        assert hit is not None and hit.format_id in cands, kind


def test_speculators_model_type_route_is_exclusive(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"speculators_model_type": "dflash",
                                                      "architectures": ["DFlashDraftModel"]}))
    src = SourceInfo.open(tmp_path)
    assert discriminators(src) == [("speculators_model_type", "dflash")]
    assert candidates(src) == ["quantized_drafter", "speculators_dflash"]
    (tmp_path / "config.json").write_text(json.dumps({"speculators_model_type": "mtp"}))
    assert candidates(SourceInfo.open(tmp_path)) == ["quantized_drafter", "speculators_other"]


def test_projector_type_precedes_architecture(dirs, tiny_verifier_dir, tmp_path):
    from fixtures_dspark import make_modelopt_dspark

    src = SourceInfo.open(dirs["specforge_dspark"])
    assert discriminators(src) == [("projector_type", "dspark"), ("architectures[0]", "DSparkDraftModel"),
                                   ("marker", "dflash_config")]
    assert detect(src).format_id == "specforge_dspark"
    # a ModelOpt DSpark says DFlashDraftModel: its projector_type, not the class name, picks DSpark
    mo = SourceInfo.open(make_modelopt_dspark(tmp_path / "mo", tiny_verifier_dir, markov_head_type="gated"))
    assert discriminators(mo)[:2] == [("projector_type", "dspark"), ("architectures[0]", "DFlashDraftModel")]
    cands = candidates(mo)
    assert cands.index("modelopt_dspark") < cands.index("zlab_dflash")
    assert detect(mo).format_id == "modelopt_dspark"


def test_a_dflash_source_is_never_tried_as_peagle(dirs):
    cands = candidates(SourceInfo.open(dirs["zlab_dflash"]))
    assert not {"specforge_peagle", "nemo_peagle", "speculators_peagle"} & set(cands)
    assert cands.index("dflash2_variant") < cands.index("zlab_dflash")  # refusals before the generic layout


def test_routes_name_only_registered_formats_and_reach_all():
    routed = {i for kind in ROUTES.values() for ids in kind.values() for i in ids}
    assert routed <= set(REGISTRY)
    assert set(all_ids()) == set(REGISTRY)
