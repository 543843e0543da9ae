"""Golden cases, group ``convert``: one conversion per supported source format (the
fixtures of ``tests/fixtures_dflash.py``, ``fixtures_dspark.py`` and ``fixtures_peagle.py``,
built as the converter tests build them), a few option variants, and the bundled example.

Each case records ``inspect SRC``, ``inspect SRC --verifier V`` (the plan), ``convert``,
``inspect OUT`` (lint of the output) and every output file (JSON / Markdown content,
tensor files by sha256).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from golden.workspace import HUB, REPO, SMOLLM2_HUB_ID, Workspace, contents, run_cli

Build = Callable[[Workspace, Path], tuple[Path, tuple]]
EXAMPLE = REPO / "examples" / "smollm2-dflash-b8"


@dataclass(frozen=True)
class Conversion:
    """A source builder (``(ws, dir) → (SRC, extra flags)``), the verifier kind and flags."""

    build: Build
    verifier: str = "qwen3"  # qwen3 | llama (tiny, conftest) | smollm2 (the real one)
    flags: tuple = ()
    name: str = HUB


def verifier_of(ws: Workspace, kind: str) -> Path:
    return ws.smollm2 if kind == "smollm2" else ws.verifier(kind)


def run_conversion(ws: Workspace, d: Path, c: Conversion) -> dict[str, Any]:
    """inspect → inspect --verifier → convert → inspect OUT, plus the output files."""
    src, extra = c.build(ws, d / "src")
    base = ["--verifier", verifier_of(ws, c.verifier), "--verifier-name", c.name]
    out = d / "out"
    rec = {
        "inspect_source": run_cli(ws, ["inspect", src], watch=d),
        "inspect_plan": run_cli(ws, ["inspect", src, *base], watch=d),
        "convert": run_cli(ws, ["convert", src, *base, "-o", out, *c.flags, *extra], watch=d),
        "outputs": contents(out, ws.norm),
    }
    if out.is_dir():
        rec["inspect_output"] = run_cli(ws, ["inspect", out], watch=d)
    return rec


# ------------------------------------------------------------------------ DFlash family
def dflash_family(fmt: str, **kw) -> Build:
    """``fixtures_dflash.make_source`` for layout ``fmt`` (DeepSpec copies the verifier's embeddings)."""
    def build(ws: Workspace, d: Path) -> tuple[Path, tuple]:
        from fixtures_dflash import make_source

        vd = ws.verifier("qwen3") if fmt == "deepspec_dflash" else None
        return make_source(d, fmt, verifier_dir=vd, **kw), ()
    return build


# ------------------------------------------------------------------------------ DSpark
def dspark(maker: str, **kw) -> Build:
    """A ``fixtures_dspark.make_<maker>`` export against the tiny Qwen3 verifier."""
    def build(ws: Workspace, d: Path) -> tuple[Path, tuple]:
        import fixtures_dspark

        return getattr(fixtures_dspark, f"make_{maker}")(d, ws.verifier("qwen3"), **kw), ()
    return build


def specforge_training(strategy: str, **kw) -> Build:
    """A SpecForge training checkpoint (a real pickle) converted with both opt-ins."""
    def build(ws: Workspace, d: Path) -> tuple[Path, tuple]:
        from fixtures_dspark import make_specforge_training

        ckpt, cfg = make_specforge_training(d, ws.verifier("qwen3"), strategy=strategy, **kw)
        return ckpt, ("--allow-unpickle", "--draft-config", cfg)
    return build


# ----------------------------------------------------------------------------- P-EAGLE
def at_root(ws: Workspace, build: Callable[..., Path], kind: str, *args, **kw) -> Path:
    """Run a speculators builder (``build(verifier, *args, **kw)``) from the root with the
    verifier as a root-relative path: speculators writes ``verifier_name_or_path`` into the
    ``config.json`` it saves, and an absolute scratch path would change the source bytes
    (and their recorded sha256) on every run."""
    import pytest

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ws.root)
        return build(ws.verifier(kind).relative_to(ws.root), *args, **kw)


def peagle_ref(ws: Workspace, name: str, **kw) -> Path:
    """A P-EAGLE drafter built by speculators 0.9.0 on the tiny Llama verifier (shared)."""
    import fixtures_peagle as fp

    return ws.shared(f"peagle-{name}", lambda d: at_root(ws, fp.build_speculators_peagle, "llama", d / "peagle", **kw))


def block_ref(ws: Workspace, name: str, algorithm: str, **kw) -> Path:
    """A DFlash / DSpark drafter built by speculators 0.9.0 on the tiny Qwen3 verifier (shared)."""
    import fixtures_peagle as fp

    return ws.shared(f"{algorithm}-{name}",
                     lambda d: at_root(ws, fp.build_speculators_block, "qwen3", d / algorithm, algorithm, **kw))


def aws(ws: Workspace, d: Path) -> tuple[Path, tuple]:
    import fixtures_peagle as fp

    return fp.to_aws(peagle_ref(ws, "vd64", vd=64), d), ("--speculative-tokens", "4")


def specforge_peagle(ws: Workspace, d: Path) -> tuple[Path, tuple]:
    import fixtures_peagle as fp

    src = fp.to_specforge(peagle_ref(ws, "full", layers=2, seed=2), d)
    return src, ("--mask-token-id", fp.MASK, "--aux-layer-ids", ",".join(map(str, fp.AUX)), "--speculative-tokens", "4")


def nemo_peagle(ws: Workspace, d: Path) -> tuple[Path, tuple]:
    import fixtures_peagle as fp

    return fp.to_nemo(peagle_ref(ws, "vd80", vd=80, num_depths=5, seed=5), d, shards=2, consolidated=True), ()


def peagle_epochs(ws: Workspace) -> dict[int, Path]:
    return {e: peagle_ref(ws, f"epoch{e}", vd=64, dtype="bfloat16", seed=10 + e) for e in (0, 1)}


def speculators_peagle(ws: Workspace, d: Path) -> tuple[Path, tuple]:
    import fixtures_peagle as fp

    return fp.trainer_save_dir(d, peagle_epochs(ws), best=1), ()


def speculators_peagle_early(ws: Workspace, d: Path) -> tuple[Path, tuple]:
    import fixtures_peagle as fp

    return fp.to_early_speculators(peagle_epochs(ws)[1], d, para_num=6), ()


def speculators_block(algorithm: str, legacy: bool = False) -> Build:
    """A speculators trainer save dir of a DFlash / DSpark drafter (``legacy``: no
    ``sample_from_anchor``, an old ``speculators_version`` and ``max_anchors``)."""
    def build(ws: Workspace, d: Path) -> tuple[Path, tuple]:
        import fixtures_peagle as fp

        ref = (block_ref(ws, "default", "dflash") if algorithm == "dflash"
               else block_ref(ws, "sfa", "dspark", vd=64, sample_from_anchor=True))
        patch = {"max_anchors": 1024, "speculators_version": "0.6.1.dev60"} if legacy else None
        drop = ("sample_from_anchor",) if legacy else ()
        return fp.trainer_save_dir(d, {0: ref}, best=0, config_patch=patch, config_drop=drop), ()
    return build


def dflash2(producer: str, **kw) -> Build:
    """A DFlash2 dir written by z-lab's ``dflash`` (``zlab``) or speculators 0.9.0 (``speculators``)."""
    def build(ws: Workspace, d: Path) -> tuple[Path, tuple]:
        import fixtures_dflash2 as f2

        make = f2.zlab_dflash2 if producer == "zlab" else f2.speculators_dflash2
        return make(d / producer, ws.verifier("qwen3"), **kw), ()
    return build


def example(ws: Workspace, d: Path) -> tuple[Path, tuple]:
    """The bundled trained drafter (examples/smollm2-dflash-b8), copied into the case dir."""
    import shutil

    return Path(shutil.copytree(EXAMPLE, d / EXAMPLE.name)), ()


CASES: dict[str, Conversion] = {
    **{fmt: Conversion(dflash_family(fmt)) for fmt in (
        "zlab_dflash", "specforge_dflash", "modelopt_dflash", "nemo_dflash", "muse_glimmer_dflash", "deepspec_dflash")},
    "zlab_dflash-float16": Conversion(dflash_family("zlab_dflash"), flags=("--dtype", "float16")),
    "zlab_dflash-float32-sharded": Conversion(dflash_family("zlab_dflash"),
                                              flags=("--dtype", "float32", "--max-shard-size", "100KB")),
    "zlab_dflash-dry_run": Conversion(dflash_family("zlab_dflash"), flags=("--dry-run",)),
    "zlab_dflash-block_both_mask_both": Conversion(dflash_family("zlab_dflash", block_size=8, block_at="both",
                                                                 mask_at="both")),
    "deepspec_dspark": Conversion(dspark("deepspec_dspark")),
    "deepspec_dspark-no_heads": Conversion(dspark("deepspec_dspark", markov_rank=0, enable_confidence_head=False)),
    "specforge_dspark": Conversion(dspark("specforge_dspark")),
    "specforge_dspark-gated_top": Conversion(dspark("specforge_dspark", head_location="top",
                                                    markov_head_type="gated")),
    "modelopt_dspark": Conversion(dspark("modelopt_dspark")),
    "specforge_training-dspark": Conversion(specforge_training("dspark")),
    "specforge_training-dflash": Conversion(specforge_training("dflash", prefix="_orig_mod.")),
    "aws_peagle": Conversion(aws, verifier="llama"),
    "specforge_peagle": Conversion(specforge_peagle, verifier="llama"),
    "nemo_peagle": Conversion(nemo_peagle, verifier="llama"),
    "speculators_peagle": Conversion(speculators_peagle, verifier="llama"),
    "speculators_peagle_early": Conversion(speculators_peagle_early, verifier="llama"),
    "speculators_dflash": Conversion(speculators_block("dflash")),
    "speculators_dflash-legacy": Conversion(speculators_block("dflash", legacy=True)),
    "speculators_dspark": Conversion(speculators_block("dspark")),
    "speculators_dspark-legacy": Conversion(speculators_block("dspark", legacy=True)),
    "zlab_dflash2": Conversion(dflash2("zlab")),
    "zlab_dflash2-bare_top_level": Conversion(dflash2("zlab", bare=True, top_level=True)),
    "speculators_dflash2": Conversion(dflash2("speculators")),
    "example-smollm2-dflash-b8": Conversion(example, verifier="smollm2", name=SMOLLM2_HUB_ID),
}


def case(name: str) -> Callable[[Workspace, Path], dict[str, Any]]:
    """The runner of one convert case."""
    return lambda ws, d: run_conversion(ws, d, CASES[name])
