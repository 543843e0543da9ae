#!/usr/bin/env python
"""Example weights kept in git compressed (xz), unpacked beside themselves at run time.

A tracked file stays under 20 MB: the DFlash2 example's ``model.safetensors`` (23.2 MB, bf16) is committed
as ``model.safetensors.xz`` (16.4 MB) and its SHA-256 is recorded in ``examples/packed.json``. ``unpack()``
writes the plain file (git-ignored) once, atomically, and checks it against the record; a stale or damaged
plain file is rewritten. ``make examples`` runs it for your own commands; the tests (``trained2`` in
``tests/structure/test_examples.py``) and ``benchmarks/validate_tau.py`` call it themselves;
``examples/train_dflash2.py save`` calls ``pack()``.
Standard library only.

    python examples/packed.py            # unpack every recorded file
    python examples/packed.py --pack examples/smollm2-dflash2-b8/model.safetensors
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import shutil
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECORD = HERE / "packed.json"


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with p.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _record() -> dict[str, dict[str, int | str]]:
    return json.loads(RECORD.read_text()) if RECORD.exists() else {}


def unpack(name: str | None = None) -> list[Path]:
    """Write each recorded file (or only ``name``, relative to ``examples/``) from its ``.xz`` beside it.

    Returns the plain files' paths. A plain file whose SHA-256 matches the record is left as it is.
    Raises ``FileNotFoundError`` for an unrecorded name or a missing ``.xz``, ``ValueError`` when the
    decompressed bytes do not match the record (nothing is written then).
    """
    record = _record()
    names = [name] if name is not None else sorted(record)
    out = []
    for n in names:
        if n not in record:
            raise FileNotFoundError(f"{n} is not in {RECORD}")
        dst, want = HERE / n, str(record[n]["sha256"])
        if not (dst.exists() and _sha256(dst) == want):
            _decompress(dst.with_name(dst.name + ".xz"), dst, want)
        out.append(dst)
    return out


def _decompress(src: Path, dst: Path, want: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", dir=dst.parent)
    try:
        with os.fdopen(fd, "wb") as f, lzma.open(src) as z:
            shutil.copyfileobj(z, f, 1 << 20)
        if _sha256(Path(tmp)) != want:
            raise ValueError(f"{src} does not decompress to the recorded {dst.name} (sha256 {want})")
        os.chmod(tmp, 0o644)
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def pack(path: Path) -> Path:
    """Compress ``path`` (under ``examples/``) to ``path.xz`` (xz preset 9) and record its size and SHA-256."""
    path = Path(path).resolve()
    rel = path.relative_to(HERE).as_posix()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "wb") as f, lzma.open(f, "wb", preset=9) as z, path.open("rb") as src:
        shutil.copyfileobj(src, z, 1 << 20)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path.with_name(path.name + ".xz"))
    record = _record()
    record[rel] = {"sha256": _sha256(path), "bytes": path.stat().st_size}
    RECORD.write_text(json.dumps(dict(sorted(record.items())), indent=2) + "\n")
    return path.with_name(path.name + ".xz")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pack", type=Path, help="compress this file and record it (after training)")
    args = ap.parse_args(argv)
    if args.pack:
        print(pack(args.pack))
    else:
        for p in unpack():
            print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
