"""A server process specconv starts on 127.0.0.1 (vLLM's, ``llama-server``) and the standard-library
HTTP calls made to it and to ``--server-url``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from .vllm.server import LOOPBACK, redact_argv

log = logging.getLogger("specconv.validate")

#: Seconds a health request may take; seconds to SIGKILL's end and to the group's end after it.
HEALTH_TIMEOUT_S, KILL_TIMEOUT_S, GROUP_EXIT_S = 5.0, 10.0, 5.0

_Server = TypeVar("_Server", bound="LocalServer")


def free_port(preferred: int | None = None, host: str = LOOPBACK) -> int:
    """``preferred`` when it can be bound on ``host`` now, else a port the OS picks."""
    import socket

    for port in ([int(preferred)] if preferred else []) + [0]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                log.info("port %d on %s is busy; using a free one", port, host)
                continue
            return int(s.getsockname()[1])
    raise OSError(f"no free port on {host}")  # pragma: no cover - bind(0) does not fail


def http_get(url: str, timeout: float = 10.0, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """``GET url`` → ``(status, body)``; ``(status, "")`` for an HTTP error, ``(0, "")`` when
    there is no answer at all (``timeout`` in seconds)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as r:  # noqa: S310
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except (urllib.error.URLError, OSError, ValueError):
        return 0, ""


def post_json(url: str, body: dict, *, timeout: float, headers: dict[str, str] | None = None) -> dict:
    """``POST`` ``body`` as JSON to ``url`` and return the JSON object answered (``timeout`` in
    seconds).

    Raises:
        RuntimeError: a non-2xx answer (``HTTP <status>: <the server's error message>``).
        OSError: no connection, timeout (``urllib.error.URLError`` is one).
        ValueError: the answer is not a JSON object.
    """
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode("utf-8"), method="POST",
                                 headers={"Content-Type": "application/json", "Accept": "application/json",
                                          **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 (127.0.0.1 only)
            out = json.loads(r.read().decode("utf-8"))
    except urllib.error.HTTPError as e:
        text = e.read().decode("utf-8", "replace")
        try:
            err = json.loads(text)
            err = err.get("error", err) if isinstance(err, dict) else err
            text = err.get("message", text) if isinstance(err, dict) else text
        except ValueError:
            pass
        raise RuntimeError(f"HTTP {e.code}: {str(text).strip()[:2000]}") from None
    if not isinstance(out, dict):
        raise ValueError(f"{url} answered {type(out).__name__}, not a JSON object")
    return out


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a member (one this user may signal)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class LocalServer:
    """One server subprocess on 127.0.0.1 (``argv`` with ``--port``), a context manager: ``__enter__``
    starts it (own process group, output appended to ``log_path``) and polls ``health_path`` every
    ``poll_s`` s for at most ``startup_timeout`` s; ``__exit__`` calls :meth:`stop` (SIGKILL after
    ``stop_timeout`` s). A subclass names the server and builds its errors (:meth:`failed`).

    Raises (on enter):
        what :meth:`failed` returns: the server exited, or was not healthy in time.
    """

    name = "server"
    exited = "exited with {rc} before it was healthy"
    unhealthy = "not healthy after {timeout:.0f} s"
    health_path = "/health"
    poll_s = 2.0
    tail_chars = 4000
    logger = log

    def __init__(self, argv: Sequence[str], log_path: str | Path, *, env: dict[str, str] | None = None,
                 startup_timeout: float, stop_timeout: float):
        self.argv = list(argv)
        self.port = int(self.argv[self.argv.index("--port") + 1])
        self.base = f"http://{LOOPBACK}:{self.port}"
        self.log_path, self.env = log_path, env
        self.startup_timeout, self.stop_timeout = float(startup_timeout), float(stop_timeout)
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    def log_tail(self) -> str:
        """The last ``tail_chars`` characters of the log ("" when unreadable)."""
        try:
            return Path(self.log_path).read_text(errors="replace")[-self.tail_chars:]
        except OSError:
            return ""

    def failed(self, message: str) -> Exception:
        """The error to raise for ``message`` (the subclass's, carrying the log)."""
        raise NotImplementedError

    def healthy(self, status: int, body: str) -> bool:
        """Whether ``GET health_path`` answered healthy (default: HTTP 200)."""
        return status == 200

    def get(self, path: str, timeout: float) -> tuple[int, str]:
        """``GET path`` on the server: :func:`http_get`."""
        return http_get(self.base + path, timeout)

    def __enter__(self: _Server) -> _Server:
        self.logger.info("starting %s: %s (log %s)", self.name, " ".join(redact_argv(self.argv)), self.log_path)
        with open(self.log_path, "ab") as logf:
            proc = self.proc = subprocess.Popen(self.argv, stdout=logf, stderr=subprocess.STDOUT, env=self.env,
                                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_healthy(proc)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _wait_healthy(self, proc: subprocess.Popen) -> None:
        t0 = time.monotonic()
        while True:
            rc = proc.poll()
            if rc is not None:
                raise self.failed(self.exited.format(rc=rc))
            if self.healthy(*self.get(self.health_path, HEALTH_TIMEOUT_S)):
                self.startup_s = time.monotonic() - t0
                self.logger.info("%s healthy after %.0f s", self.name, self.startup_s)
                return
            if time.monotonic() - t0 > self.startup_timeout:
                raise self.failed(self.unhealthy.format(timeout=self.startup_timeout))
            time.sleep(self.poll_s)

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it after ``stop_timeout`` s; once the leader is
        gone its children get :data:`GROUP_EXIT_S` s to follow."""
        import signal

        p = self.proc
        if p is None or p.returncode is not None and not group_alive(p.pid):
            return
        for sig, wait in ((signal.SIGTERM, self.stop_timeout), (signal.SIGKILL, KILL_TIMEOUT_S)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                p.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            t0 = time.monotonic()
            while group_alive(p.pid) and time.monotonic() - t0 < GROUP_EXIT_S:
                time.sleep(0.2)
            if not group_alive(p.pid):
                break
