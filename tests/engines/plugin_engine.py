"""A plug-in engine defined only under ``tests/`` (issue 26): registered through the entry-point
group ``specconv.engines`` by a ``*.dist-info`` the test writes, never by a product edit.

Its export writes ``dummy/layout.txt`` (the greeting and the drafter's algorithm) through the
generic export lifecycle (:func:`specconv.engines.exportdir.export`), checks it, and lets push
publish it once that check recorded these very bytes; ``release --export-dummy`` runs it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specconv.engines.base import Engine, Exporter, OptionSpec, PushVerdict, Surface
from specconv.outdir import OutputKind, files_listed
from specconv.results import StageResult

META = "dummy_meta.json"


class DummyResult(StageResult):
    """``specconv export dummy``'s result."""

    def human(self) -> str:
        return f"dummy export: {self.extra('output')} ({self.extra('algorithm')})"


class DummyExporter(Exporter):
    kind = "dummy"
    dir_name = "dummy"
    record_key = "dummy"
    release_key = "dummy"
    result_type = DummyResult
    surface = Surface(
        command=("export", "dummy"),
        options=(OptionSpec(("--greeting",), "greeting", "What layout.txt starts with.", default="hello"),),
        flag=OptionSpec(("--export-dummy",), "export_dummy", "After validate, write dummy/.", kind="flag",
                        default=False),
        help="Write the dummy engine's layout of the drafter in DIR.")

    def write(self, job: Any, tmp: Path) -> dict[str, Any]:
        algorithm = json.loads((job.drafter_dir / "config.json").read_text())["speculators_model_type"]
        (tmp / "layout.txt").write_text(f"{job.options.get('greeting', 'hello')} {algorithm}\n")
        return {"algorithm": algorithm}

    def check(self, job: Any, tmp: Path, meta: dict[str, Any]) -> dict[str, Any]:
        return {"check": {"passed": (tmp / "layout.txt").read_text().endswith(f"{meta['algorithm']}\n")}}

    def result(self, job: Any, meta: dict[str, Any]) -> dict[str, Any]:
        return {"output": str(job.out_dir), "algorithm": meta["algorithm"], "files": meta["files"],
                "check": meta["check"]}

    def push_verdict(self, d: Path, rec: Any, rel: str) -> PushVerdict:
        from specconv.engines.exportdir import read_meta
        from specconv.tensors import sha256_file

        meta = read_meta(d, self) or {}
        passed = ((rec.export.model_extra or {}).get("dummy") or {}).get("check", {}).get("passed") \
            if rec.export is not None else False
        name = rel[len("dummy/"):]
        same = name == META or (meta.get("files") or {}).get(name) == sha256_file(d / rel)
        return PushVerdict(covered=bool(passed) and same)

    def card_rows(self, files: Any) -> list[tuple[str, str]]:
        return [(p, "Dummy layout") for p in files if p.startswith("dummy/") and p.endswith(".txt")]

    def release_step(self, drafter: Path, work: Path, options: Mapping[str, Any], value: Any) -> dict[str, Any]:
        r = self.run(drafter, None, verifier=options.get("verifier"), overwrite=True)
        return {"algorithm": r.extra("algorithm"), "check": r.extra("check")}


ENGINE = Engine(key="dummy", display="Dummy", order=90,
                output_kinds={"dummy": OutputKind("dummy export", META, "specconv-dummy-layout", files_listed)},
                export=DummyExporter())
