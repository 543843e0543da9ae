#!/usr/bin/env python
"""Benchmark (issue 11 item 3): bytes a conversion reads from a local sharded verifier.

For each verifier size (``tiny``: hidden 64, vocab 256; ``moderate``: hidden 512, vocab
32,768; both 6 layers, saved by transformers, re-saved as 3 shards + index the way
``tests/hub/test_hub_paths.py::_shard`` does) this converts, in-process with
:func:`specconv.convert.convert`:

* ``dflash``: a z-lab DFlash export (full vocabulary: nothing is taken from the verifier);
* ``dspark_full``: a SpecForge DSpark export without ``--vocab-mapping`` (same);
* ``dspark_pruned``: the same with a ``--vocab-mapping`` d2t of ``vocab/8`` scattered
  tokens: the output's ``lm_head`` is the verifier's LM head rows of those tokens;
* ``peagle``: a speculators-built P-EAGLE re-laid-out as AWS P-EAGLE without its
  embedding: the output's ``embed_tokens`` is the verifier's (skipped when speculators
  is not installed).

and prints one JSON object: per case ``verifier_bytes_read`` (``Verifier.bytes_read``:
tensor-data bytes read from the verifier's files, headers not counted),
``verifier_bytes_needed`` (bytes of verifier tensors the output holds) and their ratio,
with the goal (ratio <= 1.1; zero bytes read where none are needed) and pass/fail.
Sources are generated with the test fixtures (``tests/fixtures_*.py``).

Usage::

    python benchmarks/verifier_bytes.py [--workdir DIR] [--sizes tiny,moderate]

Exit status: 0 when every goal is met, 1 when one is missed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

RATIO_GOAL = 1.1
SIZES = {"tiny": {"hidden_size": 64, "vocab_size": 256}, "moderate": {"hidden_size": 512, "vocab_size": 32768}}


def _verifier(work: Path, size: str, model_type: str) -> Path:
    from test_hub_paths import _shard

    from conftest import make_tiny_verifier

    plain = make_tiny_verifier(work / f"{size}-{model_type}", model_type=model_type, **SIZES[size])
    return _shard(plain, work / f"{size}-{model_type}-sharded")


def _convert(src: Path, verifier: Path, out: Path, **opts) -> dict:
    from specconv.convert import convert
    from specconv.converters import ConvertOptions

    rep = convert(str(src), verifier=str(verifier), output=out, options=ConvertOptions(**opts),
                  verifier_name="org/synthetic", overwrite=True)
    return {"read": rep["verifier_bytes_read"], "needed": rep["verifier_bytes_needed"]}


def _d2t(path: Path, vocab: int) -> Path:
    vd = vocab // 8
    tgt = np.sort(np.random.default_rng(0).choice(np.arange(vocab), vd, replace=False))
    np.save(path, (tgt - np.arange(vd)).astype(np.int64))
    return path


def _peagle(work: Path, size: str) -> dict | None:
    try:
        import loguru  # noqa: F401
        import speculators  # noqa: F401
    except ImportError:
        return None
    import fixtures_peagle as fp
    from conftest import make_tiny_verifier

    plain = make_tiny_verifier(work / f"{size}-llama", model_type="llama", **SIZES[size])
    ref = fp.build_speculators_peagle(plain, work / f"{size}-peagle-ref", layers=1, aux=[2, 5], nbr=False, seed=1)
    src = fp.to_aws(ref, work / f"{size}-peagle-aws", keep_embed=False)
    return _convert(src, _verifier(work, size, "llama"), work / f"{size}-peagle-out", speculative_tokens=2)


def run_size(work: Path, size: str) -> dict[str, dict]:
    """Convert the four cases against the ``size`` verifier; ``{case: {read, needed}}``."""
    from conftest import make_tiny_verifier
    from fixtures_dspark import make_specforge_dspark, make_zlab_dflash

    plain = make_tiny_verifier(work / f"{size}-qwen3", model_type="qwen3", **SIZES[size])
    ver = _verifier(work, size, "qwen3")
    zlab = make_zlab_dflash(work / f"{size}-zlab", plain)
    sf = make_specforge_dspark(work / f"{size}-sf-dspark", plain)
    d2t = _d2t(work / f"{size}-d2t.npy", SIZES[size]["vocab_size"])
    cases = {
        "dflash": _convert(zlab, ver, work / f"{size}-dflash-out"),
        "dspark_full": _convert(sf, ver, work / f"{size}-dspark-full-out"),
        "dspark_pruned": _convert(sf, ver, work / f"{size}-dspark-pruned-out", vocab_mapping=str(d2t)),
    }
    pe = _peagle(work, size)
    if pe is not None:
        cases["peagle"] = pe
    return cases


def _judge(c: dict) -> dict:
    ratio = c["read"] / c["needed"] if c["needed"] else None
    ok = c["read"] == 0 if not c["needed"] else ratio <= RATIO_GOAL
    return {**c, "ratio": None if ratio is None else round(ratio, 4), "ok": ok}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--workdir", type=Path, default=None, help="where inputs and outputs go (default: a temp dir)")
    ap.add_argument("--sizes", default="tiny,moderate", help="comma-separated: " + ", ".join(SIZES))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="specconv-vbytes-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        res = {size: {k: _judge(c) for k, c in run_size(work, size).items()} for size in args.sizes.split(",")}
    ok = all(c["ok"] for cases in res.values() for c in cases.values())
    print(json.dumps({"goal": f"read <= {RATIO_GOAL} x needed; read == 0 when nothing is needed",
                      "results": res, "ok": ok}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
