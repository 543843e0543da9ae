"""``llama-server`` on 127.0.0.1: the argv, the process, ``/completion`` and the ``/metrics`` counters
(docs/llamacpp.md, "The check")."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import InvalidInputError
from ..local_server import LocalServer, post_json
from ..served import CounterNames
from ..served import parse_counters as parse_counters_of
from . import LLAMA_SERVER_ENV

if TYPE_CHECKING:
    from ...results import GgufExport

log = logging.getLogger("specconv.engines.llamacpp")

__all__ = ["COUNTERS", "LLAMA_SERVER_ENV", "LlamaServer", "PER_POSITION", "PORTABLE_ARGS", "completion", "launch_argv",
           "parse_counters", "resolve_server", "server_argv", "server_version"]

#: ``/metrics`` series (``_total`` optional) → counter (``llamacpp:spec_decode_*``; ``--metrics``).
COUNTERS = {f"llamacpp:spec_decode_{k}": k for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}
#: labelled ``{position="i"}``: accepted drafts per draft position
PER_POSITION = "llamacpp:spec_decode_num_accepted_tokens_per_pos"
#: llama-server's series, for the generic parser (:func:`specconv.engines.served.parse_counters`).
NAMES = CounterNames(COUNTERS, PER_POSITION)
#: Bounded waits (seconds): start-up, one request, the shutdown before SIGKILL.
STARTUP_TIMEOUT_S, REQUEST_TIMEOUT_S, STOP_TIMEOUT_S = 300.0, 900.0, 20.0


def resolve_server(explicit: str | os.PathLike | None = None) -> Path | None:
    """``explicit`` (``--llama-server``), ``$SPECCONV_LLAMA_SERVER``, else the ``make llama-cpp``
    build for this machine; None when there is none.

    Raises:
        InvalidInputError: a named binary does not exist.
    """
    from . import build as llamacpp_build
    from .target import named_file

    p = named_file(explicit, LLAMA_SERVER_ENV, "llama-server", "llama_server_missing")
    if p is not None:
        return p.absolute()
    d = llamacpp_build.build_dir()
    return llamacpp_build.paths(d)["server"] if d is not None else None


def server_version(server: Path) -> dict[str, Any]:
    """``{version, commit}`` from ``llama-server --version`` (``version: 0.5.0-dev (build 1, commit 0c1e570)``)."""
    try:
        res = subprocess.run([str(server), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise InvalidInputError(f"{server} --version failed: {e}", code="llama_server_missing") from e
    line = next((ln.strip() for ln in (res.stdout + res.stderr).splitlines() if ln.startswith("version:")), "")
    m = re.search(r"commit ([0-9a-f]+)", line)
    return {"version": line or None, "commit": m.group(1) if m else None}


#: Flags every llama-server line specconv runs or prints carries (``--no-repack``: the AMX segfault,
#: ggml-org/llama.cpp#20824, docs/llamacpp.md; one kernel path keeps AMD and Intel runs alike).
PORTABLE_ARGS = ("--no-repack",)


def server_argv(server: Path, target: Path, port: int, *, draft: Path | None = None, spec_type: str | None = None,
                n_max: int | None = None, threads: int = 1, ctx: int = 4096) -> list[str]:
    """The ``llama-server`` argv: the target, loopback, ``--metrics``, one slot; with ``draft`` also
    ``-md``, ``--spec-type`` and ``--spec-draft-n-max`` (always explicit)."""
    argv = [str(server), "-m", str(target), "--host", "127.0.0.1", "--port", str(port), "--metrics",
            "-np", "1", "-c", str(ctx), "-t", str(threads), "--no-webui", *PORTABLE_ARGS]
    if draft is not None:
        argv += ["-md", str(draft), "--spec-type", str(spec_type), "--spec-draft-n-max", str(n_max),
                 "-td", str(threads)]
    return argv


def launch_argv(export: GgufExport, draft_repo: str | None) -> list[str]:
    """The ``llama-server`` argv a card prints for the record's ``export.gguf`` (docs/llamacpp.md,
    "Publishing"; ``draft_repo`` None: the drafter dir's own card)."""
    vg = export.verifier_gguf or {}
    target = ["-hf", str(vg["repo"]), "-hff", str(vg["name"])] if vg.get("repo") else ["-m", str(vg.get("name"))]
    draft = ["-hfd", draft_repo, "-md", f"gguf/{export.file}"] if draft_repo else ["-md", f"./gguf/{export.file}"]
    return ["llama-server", *target, *draft, "--spec-type", str(export.spec_type),
            "--spec-draft-n-max", str(export.spec_draft_n_max), *PORTABLE_ARGS]


def parse_counters(text: str) -> dict[str, Any]:
    """The speculative counters of a ``/metrics`` page (:func:`specconv.engines.served.parse_counters`)."""
    return parse_counters_of(text, NAMES)


class LlamaServer(LocalServer):
    """One ``llama-server`` process (a :class:`specconv.engines.local_server.LocalServer`).

    Raises (on enter):
        InvalidInputError: ``llama_server_failed`` with the log tail (exited or never healthy).
    """

    name = "llama-server"
    poll_s = 0.5
    tail_chars = 3000
    logger = log

    def __init__(self, argv: Sequence[str], log_path: Path):
        super().__init__(argv, Path(log_path), env={**os.environ, "LLAMA_ARG_HOST": "127.0.0.1"},
                         startup_timeout=STARTUP_TIMEOUT_S, stop_timeout=STOP_TIMEOUT_S)

    def healthy(self, status: int, body: str) -> bool:
        """``/health`` answered 200 with ``"ok"``."""
        return status == 200 and '"ok"' in body

    def failed(self, message: str) -> InvalidInputError:
        """``llama_server_failed``: ``llama-server <message> (log PATH):`` and the log tail."""
        return InvalidInputError(f"llama-server {message} (log {self.log_path}):\n{self.log_tail()}",
                                 code="llama_server_failed")

    def counters(self) -> dict[str, Any]:
        """The speculative counters now (:func:`parse_counters`)."""
        status, text = self.get("/metrics", 30)
        if status != 200:
            raise self.failed("answered no /metrics")
        return parse_counters(text)


def completion(server: LlamaServer, prompt_ids: Sequence[int], n_predict: int, *, n_probs: int = 0) -> dict[str, Any]:
    """One greedy ``POST /completion`` with prompt token ids.

    Returns:
        ``{tokens: [ids], margins: [top-1 − top-2 logprob per token] (n_probs ≥ 2), top1: [logprob],
        draft_n, draft_n_accepted, stop_type, prompt_n}``; ``prompt_n``: ``tokens_evaluated`` or None.

    Raises:
        InvalidInputError: ``llama_server_failed``: no answer, an HTTP error or no ``tokens``.
    """
    body = {"prompt": [int(i) for i in prompt_ids], "n_predict": int(n_predict), "temperature": 0.0, "top_k": 1,
            "cache_prompt": False, "return_tokens": True, "n_probs": int(n_probs), "seed": 0}
    try:
        r = post_json(server.base + "/completion", body, timeout=REQUEST_TIMEOUT_S)
    except (OSError, RuntimeError, ValueError) as e:
        raise server.failed(f"failed a /completion request: {e}") from e
    if not isinstance(r.get("tokens"), list):
        raise server.failed(f"answered /completion without tokens: {json.dumps(r)[:300]}")
    probs = r.get("completion_probabilities") or []
    margins, top1 = [], []
    for p in probs:
        lps = [x.get("logprob") for x in p.get("top_logprobs") or []]
        top1.append(lps[0] if lps else None)
        margins.append(lps[0] - lps[1] if len(lps) > 1 else None)
    t = r.get("timings") or {}
    n = r.get("tokens_evaluated")
    return {"tokens": [int(x) for x in r["tokens"]], "margins": margins, "top1": top1,
            "draft_n": t.get("draft_n"), "draft_n_accepted": t.get("draft_n_accepted"), "stop_type": r.get("stop_type"),
            "prompt_n": n if isinstance(n, int) else None}
