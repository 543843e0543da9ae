"""One rule for layer-architecture keys no Speculators drafter has (issue 14 item 8).

``specconv.format.facts.UNSUPPORTED_LAYER_KEYS`` (gated attention: ``attn_output_gate`` and
its spellings), set at the top level, in ``dflash_config``, ``dspark_config`` or
``transformer_layer_config`` of the source config, refuses the conversion (exit 3) in every
converter, before the converter can drop, hoist or copy the key; validate's reference
drafter refuses the same set (``specconv/drafters/layers.py``). Sources: a SpecForge DSpark
export and a z-lab DFlash export (spec-built, tests/fixtures_dspark.py / fixtures_dflash.py),
a SpecForge P-EAGLE export and a speculators-trainer P-EAGLE (built by speculators 0.9.0,
tests/fixtures_peagle.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import fixtures_peagle as fp
from fixtures_dflash import api_convert, cli_convert, make_source
from fixtures_dspark import make_specforge_dspark
from specconv.errors import UnsupportedFormatError
from specconv.format.facts import LAYER_KEY_SCOPES, UNSUPPORTED_LAYER_KEYS

CASES = [(k, s) for k in UNSUPPORTED_LAYER_KEYS for s in LAYER_KEY_SCOPES]
IDS = [f"{s or 'top'}.{k}" for k, s in CASES]


def _nest(cfg: dict, scope: str, key: str, value) -> dict:
    """``cfg`` with ``key: value`` at the top level (``scope == ""``) or inside ``cfg[scope]``."""
    cfg = json.loads(json.dumps(cfg))
    (cfg.setdefault(scope, {}) if scope else cfg)[key] = value
    return cfg


def _with_key(src: Path, dst: Path, scope: str, key: str, value=True) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(_nest(cfg, scope, key, value), indent=2))
    return dst


def _refused(e: pytest.ExceptionInfo, src: Path, scope: str, key: str, format_id: str) -> None:
    msg = e.value.message
    assert e.value.exit_code == 3 and e.value.code == "unsupported_layer_key" and e.value.format_id == format_id
    assert f"{scope + '.' if scope else ''}{key}=True" in msg and f"{src}/config.json" in msg, msg


@pytest.fixture(scope="module")
def specforge_dspark(tiny_verifier_dir, tmp_path_factory) -> Path:
    return make_specforge_dspark(tmp_path_factory.mktemp("sfd") / "src", tiny_verifier_dir)


@pytest.fixture(scope="module")
def zlab_dflash(tmp_path_factory) -> Path:
    return make_source(tmp_path_factory.mktemp("zl"), "zlab_dflash")


@pytest.mark.parametrize("key,scope", CASES, ids=IDS)
def test_specforge_dspark_refuses_each_key_at_each_nesting(specforge_dspark, tiny_verifier_dir, tmp_path, key, scope):
    src = _with_key(specforge_dspark, tmp_path / "s", scope, key)
    with pytest.raises(UnsupportedFormatError) as e:
        api_convert(src, tiny_verifier_dir, dry_run=True)
    _refused(e, src, scope, key, "specforge_dspark")


@pytest.mark.parametrize("key,scope", CASES, ids=IDS)
def test_zlab_dflash_refuses_each_key_at_each_nesting(zlab_dflash, tiny_verifier_dir, tmp_path, key, scope):
    src = _with_key(zlab_dflash, tmp_path / "s", scope, key)
    with pytest.raises(UnsupportedFormatError) as e:
        api_convert(src, tiny_verifier_dir, dry_run=True)
    _refused(e, src, scope, key, "zlab_dflash")


@pytest.mark.parametrize("scope", LAYER_KEY_SCOPES, ids=[s or "top" for s in LAYER_KEY_SCOPES])
def test_refusal_is_exit_3_and_writes_nothing(specforge_dspark, tiny_verifier_dir, tmp_path, scope):
    src = _with_key(specforge_dspark, tmp_path / "s", scope, "attn_output_gate")
    code, obj, _ = cli_convert(src, tiny_verifier_dir, tmp_path / "out")
    assert code == 3 and obj["error"] == "unsupported_layer_key", obj
    assert not (tmp_path / "out").exists()


def test_false_values_convert(specforge_dspark, zlab_dflash, tiny_verifier_dir, tmp_path):
    """The controls: the same sources with every key present but false convert."""
    for name, base in (("dspark", specforge_dspark), ("dflash", zlab_dflash)):
        src = tmp_path / name
        shutil.copytree(base, src)
        cfg = json.loads((src / "config.json").read_text())
        for key, scope in CASES:
            cfg = _nest(cfg, scope, key, False)
        (src / "config.json").write_text(json.dumps(cfg))
        code, _, err = cli_convert(src, tiny_verifier_dir, tmp_path / f"{name}-out")
        assert code == 0, err


# ------------------------------------------------------------------- P-EAGLE sources
@pytest.fixture(scope="module")
def speculators_peagle(tiny_llama_verifier_dir, tmp_path_factory) -> Path:
    pytest.importorskip("speculators")
    pytest.importorskip("loguru")
    return fp.build_speculators_peagle(tiny_llama_verifier_dir, tmp_path_factory.mktemp("pe") / "pe", seed=2)


@pytest.fixture(scope="module")
def specforge_peagle(speculators_peagle, tmp_path_factory) -> Path:
    return fp.to_specforge(speculators_peagle, tmp_path_factory.mktemp("sfp") / "sf")


PEAGLE_FLAGS = dict(mask_token_id=fp.MASK, aux_layer_ids=fp.AUX, speculative_tokens=4)


@pytest.mark.peer
@pytest.mark.parametrize("key,scope", CASES, ids=IDS)
def test_specforge_peagle_refuses_each_key_at_each_nesting(specforge_peagle, tiny_llama_verifier_dir, tmp_path,
                                                           key, scope):
    src = _with_key(specforge_peagle, tmp_path / "s", scope, key)
    with pytest.raises(UnsupportedFormatError) as e:
        api_convert(src, tiny_llama_verifier_dir, dry_run=True, **PEAGLE_FLAGS)
    _refused(e, src, scope, key, "specforge_peagle")


@pytest.mark.peer
@pytest.mark.parametrize("key", UNSUPPORTED_LAYER_KEYS)
def test_speculators_peagle_refuses_each_key_in_its_layer_config(speculators_peagle, tiny_llama_verifier_dir,
                                                                  tmp_path, key):
    src = _with_key(speculators_peagle, tmp_path / "s", "transformer_layer_config", key)
    with pytest.raises(UnsupportedFormatError) as e:
        api_convert(src, tiny_llama_verifier_dir, dry_run=True)
    _refused(e, src, "transformer_layer_config", key, "speculators_peagle")


@pytest.mark.peer
def test_peagle_controls_convert(specforge_peagle, speculators_peagle, tiny_llama_verifier_dir):
    api_convert(specforge_peagle, tiny_llama_verifier_dir, dry_run=True, **PEAGLE_FLAGS)
    api_convert(speculators_peagle, tiny_llama_verifier_dir, dry_run=True)


# ------------------------------------------------------------------- one key set
def test_every_converter_applies_the_rule():
    from specconv.converters import REGISTRY

    supported = [c for c in REGISTRY.values() if c.supported]
    assert len(supported) >= 15
    assert all(getattr(c.plan, "checks_layer_keys", False) for c in supported), [
        c.format_id for c in supported if not getattr(c.plan, "checks_layer_keys", False)]


@pytest.mark.parametrize("key", UNSUPPORTED_LAYER_KEYS)
def test_validate_drafter_refuses_the_same_set(key):
    pytest.importorskip("torch")
    from specconv.drafters.layers import check_layers
    from specconv.format.schema import TransformerLayerConfig

    lcfg = {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
            "rms_norm_eps": 1e-6, "rope_theta": 1e6}
    check_layers(TransformerLayerConfig.model_validate(lcfg), "tlc")
    with pytest.raises(UnsupportedFormatError, match=f"gated attention \\({key}=True\\)"):
        check_layers(TransformerLayerConfig.model_validate({**lcfg, key: True}), "tlc")


def test_specforge_training_names_its_draft_config(tiny_verifier_dir, tmp_path):
    """A training dir's config is ``--draft-config``: that file is named, and nothing is unpickled."""
    from fixtures_dspark import make_specforge_training

    ckpt, draft_cfg = make_specforge_training(tmp_path / "run", tiny_verifier_dir,
                                              extra_dflash={"attn_output_gate": True})
    (ckpt / "training_state.pt").write_bytes(b"not a pickle: the refusal comes first\n")
    with pytest.raises(UnsupportedFormatError) as e:
        api_convert(ckpt, tiny_verifier_dir, dry_run=True, allow_unpickle=True, draft_config=draft_cfg)
    assert e.value.code == "unsupported_layer_key" and e.value.format_id == "specforge_training"
    assert str(draft_cfg) in e.value.message and "dflash_config.attn_output_gate=True" in e.value.message
