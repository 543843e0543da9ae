"""A plug-in engine defined only under ``tests/`` (issue 26): registered through the entry-point
group ``specconv.engines`` by a ``*.dist-info`` the test writes, never by a product edit.

Its export writes ``dummy/layout.txt`` (the greeting and the drafter's algorithm) through the
generic export lifecycle (:func:`specconv.engines.exportdir.export`), checks it, and lets push
publish it once that check recorded these very bytes; ``release --export-dummy`` runs it. Its load
check (``validate --dummy-load-check``) runs a standard-library script in ``--dummy-loader-python``
(default: this interpreter) that reads the drafter's ``config.json`` as an engine's loader would.
Its serve capability (``validate --backend dummy``) is a loopback stub server: ``/v1/completions``
answers the prompt's last tokens and counts 2 accepted of 4 drafted tokens per request on
``/metrics`` (spec-decode counters, read through ``specconv.engines.served``); its plain answer is
G4's reference.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from specconv.engines.base import Engine, Exporter, LoadCheck, OptionSpec, PushVerdict, Serve, Surface
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


#: the "engine's loader": loads DIR/config.json and accepts the DFlash / DSpark drafters it knows
LOADER = """import json, sys
cfg = json.load(open(sys.argv[1] + '/config.json'))
kind = cfg.get('speculators_model_type')
print(json.dumps({'ok': kind in ('dflash', 'dspark'), 'model_type': kind,
                  'errors': [] if kind in ('dflash', 'dspark') else [f'unknown drafter {kind!r}']}))
"""


def load(drafter_dir: Path, verifier: str, *, python: str | None = None) -> dict[str, Any]:
    """Run :data:`LOADER` in ``python`` (default: this interpreter); its JSON line is the payload."""
    out = subprocess.run([python or sys.executable, "-c", LOADER, str(drafter_dir)], capture_output=True, text=True,
                         check=True)
    return {**json.loads(out.stdout), "verifier": verifier}


def refuse(drafter_dir: Path, verifier: str, python: str | None) -> None:
    from specconv.errors import InvalidInputError

    if python is not None and not Path(python).is_file():
        raise InvalidInputError(f"dummy loader interpreter {python} does not exist", code="dummy_python_missing")


def answer(ids: list[int], n: int) -> list[int]:
    """The stub's greedy output for prompt ``ids``: its last tokens, ``n`` of them."""
    return [ids[-1 - i % len(ids)] for i in range(n)]


class _Stub(BaseHTTPRequestHandler):
    counts = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "pos": [0, 0, 0, 0]}

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ids, c = list(body["prompt"]), self.counts
        c["num_drafts"] += 1
        c["num_draft_tokens"] += 4
        c["num_accepted_tokens"] += 2
        c["pos"][0] += 1
        c["pos"][1] += 1
        self._send({"choices": [{"token_ids": answer(ids, body["max_tokens"])}], "prompt_token_ids": ids})

    def do_GET(self) -> None:
        c = self.counts
        lines = [f"dummy:spec_decode_{k}_total {c[k]}"
                 for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")]
        lines += [f'dummy:spec_decode_accepted_per_pos_total{{position="{i}"}} {v}' for i, v in enumerate(c["pos"])]
        self._send("\n".join(lines) + "\n", "text/plain")

    def _send(self, obj: Any, kind: str = "application/json") -> None:
        data = (obj if isinstance(obj, str) else json.dumps(obj)).encode()
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


class DummyServe(Serve):
    backend = "dummy"
    help = "the dummy engine's loopback stub server"
    report_key = "dummy_serve"
    server_name = "the dummy server"

    def measure(self, drafter_dir: Path, verifier: Any, rendered: list[tuple[str, list[int]]], options: Any,
                found: Any, torch_report: dict[str, Any]) -> dict[str, Any]:
        from specconv.engines.local_server import LOOPBACK, http_get, post_json
        from specconv.engines.served import CounterNames, counter_metrics, diff_counters, measure, parse_counters

        server = ThreadingHTTPServer((LOOPBACK, 0), _Stub)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://{LOOPBACK}:{server.server_address[1]}"
        names = CounterNames({f"dummy:spec_decode_{k}": k for k in ("num_drafts", "num_draft_tokens",
                                                                   "num_accepted_tokens")},
                             "dummy:spec_decode_accepted_per_pos")

        def send() -> list[dict[str, Any]]:
            out = []
            for pid, ids in rendered:
                r = post_json(url + "/v1/completions", {"prompt": ids, "max_tokens": options.max_new_tokens},
                              timeout=10)
                out.append({"prompt_id": pid, "prompt_token_ids": r["prompt_token_ids"],
                            "output_ids": r["choices"][0]["token_ids"]})
            return out

        try:
            requests, before, after = measure(lambda: parse_counters(http_get(url + "/metrics")[1], names), send)
        finally:
            server.shutdown()
        return {**counter_metrics(diff_counters(before, after)), "requests": requests,
                "serving": {"runner": None, "mode": "local"}, "server": {"url": "<loopback>"}}

    def summary(self, measured: dict[str, Any]) -> dict[str, Any]:
        return {"tau": measured["acceptance_length"], "server": measured.pop("server", {})}

    def reference(self, drafter_dir: Path, verifier: Any, rendered: list[tuple[str, list[int]]],
                  options: Any) -> tuple[list[list[int]], str] | None:
        return [answer(ids, options.max_new_tokens) for _, ids in rendered], "dummy_plain"


ENGINE = Engine(key="dummy", display="Dummy", order=90,
                output_kinds={"dummy": OutputKind("dummy export", META, "specconv-dummy-layout", files_listed)},
                export=DummyExporter(), serve=DummyServe(),
                load_check=LoadCheck(
                    flag=OptionSpec(("--dummy-load-check",), "dummy_load_check", "Load DIR with the dummy loader.",
                                    kind="flag", default=False),
                    python=OptionSpec(("--dummy-loader-python",), "dummy_loader_python", "Its interpreter.",
                                      metavar="PATH"),
                    report_key="dummy_load", runner="plugin_engine:load", preflight="plugin_engine:refuse"))
