"""Run several ``specconv`` command lines in ONE process with huggingface_hub online (it
reads ``HF_HUB_OFFLINE`` / ``HF_ENDPOINT`` at import, so the parent's offline process
cannot): ``python tests/golden/online.py CALLS.json RESULTS.json``.

``CALLS.json``: ``[{"argv": [...], "cwd": DIR, "watch": DIR | null}]``; ``RESULTS.json``:
one ``{"exit_code", "stdout", "exception", "traceback_on_stderr", "written"}`` per call
(raw, the parent normalises). Started by :func:`golden.cases_commands.online`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(calls_file: str, results_file: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from click.testing import CliRunner

    from golden.workspace import snapshot, written
    from specconv.cli.main import cli

    results = []
    for call in json.loads(Path(calls_file).read_text()):
        os.chdir(call["cwd"])
        watch = call.get("watch")
        before = snapshot(watch)
        r = CliRunner().invoke(cli, call["argv"], catch_exceptions=True)
        exc = r.exception if r.exception is not None and not isinstance(r.exception, SystemExit) else None
        results.append({"exit_code": r.exit_code, "stdout": r.stdout,
                        "exception": type(exc).__name__ if exc else None,
                        "traceback_on_stderr": "Traceback (most recent call last)" in r.stderr,
                        "written": written(before, snapshot(watch)) if watch else None})
    Path(results_file).write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
