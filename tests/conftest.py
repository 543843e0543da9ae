"""Shared fixtures: the real SmolLM2 verifier, tiny random verifiers, the bundled drafter and
the DSpark fixture sources converted once per session, repo paths, torch on one thread. The
CLI runners are ``tests/cli_runner.py`` (``from cli_runner import invoke``) and the harness
drafter doubles ``tests/validate/drafter_doubles.py``. The engine tiers (markers ``server``,
``engine_venv``, ``llamacpp`` applied by fixture and implication, and the guard that fails an
unmarked test starting an engine process) are ``tests/tiers.py``, hooked in here.

Owned by the lead; add fixtures here only through the lead.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # `import examples.zlab_dflash`
#: tests/<room>/ mirrors specconv/; a room's test module that builds inputs other rooms reuse
#: (tests/drafters/test_drafters.make_dflash, tests/hub/test_hub_paths.FakeHub, ...) is importable by
#: its name from any room, whichever file pytest collects first (the names are unique).
for _room in sorted(p for p in Path(__file__).resolve().parent.iterdir()
                    if p.is_dir() and p.name not in ("golden", "__pycache__")):
    if str(_room) not in sys.path:
        sys.path.append(str(_room))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    import tiers

    for item in items:  # the engine tiers (tests/tiers.py): fixture-keyed and implied markers
        for name in sorted(tiers.implied_marks({m.name for m in item.iter_markers()}, item.fixturenames)):
            item.add_marker(name)
    tiers.servers_first(items)
    if not any("gpu" in i.keywords for i in items):
        return
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


_GUARD = None


def pytest_configure(config):
    """Install the engine-tier guard (tests/tiers.py): a test that starts an engine process
    without its marker fails."""
    global _GUARD
    import tiers

    _GUARD = tiers.Guard()
    _GUARD.install()


def pytest_unconfigure(config):
    if _GUARD is not None:
        _GUARD.uninstall()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _GUARD is not None:
        _GUARD.item = item
    try:
        yield
    finally:
        if _GUARD is not None:
            _GUARD.item = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    msg = _GUARD.refused.get(item.nodeid) if _GUARD is not None else None
    if msg and rep.passed and call.when == "call":  # the refusal was swallowed: fail anyway
        rep.outcome, rep.longrepr = "failed", msg


@pytest.fixture(scope="session")
def llamacpp_build() -> dict[str, Path]:
    """This machine's llama.cpp build (``make llama-cpp``) as
    ``specconv.engines.llamacpp.build.paths``: ``server``, ``converter``, ``gguf_py``, ``site``;
    skips where it is absent. A test using it is marked ``llamacpp`` (tests/tiers.py)."""
    from specconv.engines.llamacpp import build

    d = build.build_dir()
    if d is None:
        pytest.skip("no `make llama-cpp` build for this machine")
    return build.paths(d)


@contextlib.contextmanager
def _torch_threads(n: int):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def one_thread():
    """torch on one OpenMP thread for the test: on a shared 2-core box two threads thrash
    (a decode runs ~10x slower)."""
    with _torch_threads(1):
        yield


@pytest.fixture(scope="module")
def one_thread_module():
    """:func:`one_thread` for a whole module (``pytestmark = pytest.mark.usefixtures(...)``),
    module-scoped fixtures included."""
    with _torch_threads(1):
        yield


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The real verifier (SmolLM2-135M-Instruct) as a cached HF dir."""
    from specconv.offline import smollm2_verifier_dir

    return smollm2_verifier_dir()


SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
#: The bundled trained drafter (z-lab DFlash for SmolLM2-135M-Instruct, block 8).
BUNDLED_DRAFTER = REPO / "examples" / "smollm2-dflash-b8"


def _tree_digest(d: Path) -> dict[str, str]:
    import hashlib

    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="session")
def bundled_drafter(tmp_path_factory, smollm2_dir) -> Path:
    """:data:`BUNDLED_DRAFTER` converted against the real SmolLM2 verifier (recorded as
    :data:`SMOLLM2_HUB_ID`) once per session: the files ``specconv convert`` writes, model card
    included, in ``.../drafter``. Read-only, checked at the end of the session: a test that
    writes into it takes :func:`bundled_drafter_copy` (or copies it for a wider scope)."""
    from specconv.convert import convert

    out = tmp_path_factory.mktemp("bundled_drafter") / "drafter"
    convert(str(BUNDLED_DRAFTER), verifier=str(smollm2_dir), output=out, verifier_name=SMOLLM2_HUB_ID)
    before = _tree_digest(out)
    yield out
    assert _tree_digest(out) == before, "a test wrote into the shared bundled_drafter dir: use bundled_drafter_copy"


@pytest.fixture
def bundled_drafter_copy(bundled_drafter, tmp_path) -> Path:
    """A private copy of :func:`bundled_drafter` (``tmp_path/drafter``) to write into."""
    import shutil

    return Path(shutil.copytree(bundled_drafter, tmp_path / "drafter"))


def make_tiny_verifier(
    out: Path,
    *,
    model_type: str = "qwen3",
    hidden_size: int = 64,
    num_layers: int = 6,
    vocab_size: int = 256,
    heads: int = 4,
    kv_heads: int = 2,
    tie: bool = False,
    seed: int = 0,
) -> Path:
    """Save a tiny random Llama/Qwen3 causal LM with transformers (for unit tests)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if (out / "config.json").exists():
        return out
    cfg = AutoConfig.for_model(
        model_type,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden_size // heads,
        vocab_size=vocab_size,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tie,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_verifier_dir(tmp_path_factory) -> Path:
    """Tiny random Qwen3 verifier: H=64, 6 layers, vocab 256, untied."""
    return make_tiny_verifier(tmp_path_factory.mktemp("tiny_verifier") / "qwen3")


@pytest.fixture(scope="session")
def tiny_llama_verifier_dir(tmp_path_factory) -> Path:
    """Tiny random Llama verifier: H=64, 6 layers, vocab 256, untied."""
    return make_tiny_verifier(tmp_path_factory.mktemp("tiny_llama") / "llama", model_type="llama")


@pytest.fixture(scope="module")
def verifier_dir(tmp_path_factory) -> Path:
    """Tied-embedding verifier (like SmolLM2): only model.embed_tokens.weight, in the sizes of
    ``tests/drafters/test_drafters.py`` (whose drafters the drafter and export rooms build on it)."""
    import torch
    from safetensors.torch import save_file
    from test_drafters import VT, H

    d = tmp_path_factory.mktemp("verifier")
    g = torch.Generator().manual_seed(42)
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                               "hidden_size": H, "num_hidden_layers": 6,
                                               "vocab_size": VT, "tie_word_embeddings": True}))
    save_file({"model.embed_tokens.weight": torch.randn(VT, H, generator=g),
               "model.norm.weight": torch.ones(H)}, str(d / "model.safetensors"))
    return d


@pytest.fixture(scope="module")
def sharded_qwen3(tiny_verifier_dir, tmp_path_factory) -> Path:
    """``tiny_verifier_dir`` re-saved as 3 shards + index (``tests/hub/test_hub_paths.py::_shard``)."""
    from test_hub_paths import _shard

    return _shard(tiny_verifier_dir, tmp_path_factory.mktemp("sharded") / "qwen3")


class Converted(NamedTuple):
    """One shared conversion: the source dir, the output dir and ``convert``'s JSON report."""

    src: Path
    out: Path
    rep: dict[str, Any]


@pytest.fixture(scope="session")
def dspark_converted(tmp_path_factory, tiny_verifier_dir):
    """``fmt -> Converted``: each DSpark fixture source (``tests/fixtures_dspark.BUILDERS``) built
    and converted with ``specconv convert`` against ``tiny_verifier_dir`` once per session.
    Read-only: a test that writes into the source or the output copies it first."""
    import fixtures_dspark as fs
    from fixtures_dflash import cli_convert

    done: dict[str, Converted] = {}

    def get(fmt: str) -> Converted:
        if fmt not in done:
            root = tmp_path_factory.mktemp(fmt)
            src = fs.make_source(root / fmt, fmt, tiny_verifier_dir)
            code, rep, err = cli_convert(src, tiny_verifier_dir, root / "out")
            assert code == 0, err
            done[fmt] = Converted(src, root / "out", rep)
        return done[fmt]

    return get


@pytest.fixture
def converted(request, dspark_converted):
    """The shared DSpark conversion of the requesting module's ``FMT`` (``dspark_converted``;
    read-only): src, out, rep. Detection, the DSpark keys, tensor bytes and the speculators load
    are tested once for every format in tests/converters/test_convert_dspark.py. A module with
    its own ``converted`` fixture overrides this one."""
    return dspark_converted(request.module.FMT)


def make_validate_set(root: Path, smollm2: Path) -> dict[str, Path]:
    """The validate rooms' tiny set under ``root``: a tiny Llama verifier (vocab 49,152 so
    SmolLM2's tokenizer/chat template apply), a random z-lab DFlash drafter for it written by
    z-lab's ``dflash`` package, its Speculators conversion and a 2-prompt file.

    Returns:
        ``{"verifier", "zlab", "spec", "prompts"}`` → paths under ``root`` (needs torch,
        transformers and dflash).
    """
    import shutil

    import torch
    from dflash.model import DFlashDraftModel
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config

    from specconv.convert import convert

    vdir, zdir, sdir = root / "verifier", root / "zlab", root / "spec"
    cfg = LlamaConfig(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
        bos_token_id=1, eos_token_id=2, pad_token_id=2, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(vdir)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (smollm2 / f).exists():
            shutil.copy(smollm2 / f, vdir / f)
    zc = Qwen3Config(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
        rms_norm_eps=1e-6, rope_theta=10000.0, num_target_layers=4, block_size=4,
        dflash_config={"target_layer_ids": [0, 2], "mask_token_id": 16},
        architectures=["DFlashDraftModel"], tie_word_embeddings=False, dtype="float32",
    )
    torch.manual_seed(1)
    DFlashDraftModel(zc).float().eval().save_pretrained(zdir, safe_serialization=True)
    convert(str(zdir), verifier=str(vdir), output=sdir, overwrite=True)
    prompts = root / "prompts.jsonl"
    prompts.write_text('{"prompt": "Say hi."}\n{"prompt": "Count to three."}\n')
    return {"verifier": vdir, "zlab": zdir, "spec": sdir, "prompts": prompts}


def copy_validate_set(vset: dict[str, Path], root: Path) -> dict[str, Path]:
    """Copy a :func:`make_validate_set` set into ``root`` (same keys, paths under ``root``)."""
    import shutil

    root.mkdir(parents=True, exist_ok=True)
    return {k: Path(shutil.copytree(p, root / p.name) if p.is_dir() else shutil.copy2(p, root / p.name))
            for k, p in vset.items()}


@pytest.fixture(scope="session")
def validate_set(tmp_path_factory, smollm2_dir) -> dict[str, Path]:
    """:func:`make_validate_set` once per session. Read-only, checked at the end of the session:
    a test that writes into it (a ``specconv validate`` run records into ``spec``) takes
    :func:`validate_set_copy` or :func:`copy_validate_set` for a wider scope."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("dflash")
    root = tmp_path_factory.mktemp("validate_set")
    vset = make_validate_set(root, smollm2_dir)
    before = _tree_digest(root)
    yield vset
    assert _tree_digest(root) == before, "a test wrote into the shared validate_set: use validate_set_copy"


@pytest.fixture
def validate_set_copy(validate_set, tmp_path) -> dict[str, Path]:
    """A private copy of :func:`validate_set` under ``tmp_path/set`` to write into."""
    return copy_validate_set(validate_set, tmp_path / "set")


def read_json(p: Path) -> dict:
    return json.loads(Path(p).read_text())
