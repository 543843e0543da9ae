"""What ``push`` may publish of ``trt/`` (:meth:`specconv.engines.base.Exporter.push_verdict`): a
variant with its ``build.json``; the manifest when every variant it lists has one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..base import PushVerdict
from . import BUILD_NAME


def _build(v: Path) -> dict:
    """The JSON object of ``v/build.json``; ``{}`` when missing or unreadable."""
    from ...errors import InvalidInputError
    from ...fileio import read_json_object

    try:
        return read_json_object(v / BUILD_NAME) if (v / BUILD_NAME).is_file() else {}
    except InvalidInputError:
        return {}


def variant_verifier_weights(v: Path) -> tuple[bool, str]:
    """Whether variant dir ``trt/<key>/`` embeds verifier tensors (its ``build.json`` says; one that does
    not record it counts as containing them), and the note when assumed."""
    build = _build(v)
    if "contains_verifier_weights" in build:
        return bool(build["contains_verifier_weights"]), ""
    return True, ("; its build.json does not record it (an engine built by an older specconv), so it "
                  "is treated as containing them: rebuild it with `specconv build-engine`")


def verdict(d: Path, rec: Any, rel: str) -> PushVerdict:
    """``trt/<key>/*`` needs its variant's ``build.json``; ``trt/manifest.json`` needs the
    ``build.json`` of every variant it lists."""
    parts = Path(rel).parts
    if len(parts) >= 3:
        v = d / parts[0] / parts[1]
        if not (v / BUILD_NAME).is_file():
            return PushVerdict(covered=False)
        contains, note = variant_verifier_weights(v)
        return PushVerdict(covered=True, verifier_weights=contains, note=note, label=f"trt/{v.name}/")
    if rel != "trt/manifest.json":
        return PushVerdict(covered=False)
    try:
        variants = json.loads((d / rel).read_text(encoding="utf-8")).get("variants") or []
        keys = [v["key"] for v in variants]
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return PushVerdict(covered=False)
    return PushVerdict(covered=bool(keys) and all((d / "trt" / k / BUILD_NAME).is_file() for k in keys))


def holds_verifier_weights(d: Path, rec: Any, rels: list[str]) -> bool:
    """Whether any variant among ``rels`` embeds verifier tensors (the card says so)."""
    keys = {Path(r).parts[1] for r in rels if len(Path(r).parts) >= 3 and Path(r).parts[0] == "trt"}
    return any(variant_verifier_weights(d / "trt" / k)[0] for k in sorted(keys))
