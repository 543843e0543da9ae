"""Units of ``--backend vllm`` that need no vLLM: argv, interpreter choice, token agreement,
the server lifecycle (health wait, log tail, process-group cleanup) and the CLI's runtime
exclusivity. Real serving is in tests/validate/test_vllm_serve.py."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from cli_runner import invoke
from specconv.engines.local_server import free_port, group_alive
from specconv.engines.served import token_agreement
from specconv.engines.vllm import serve as vb
from specconv.errors import InvalidInputError


def test_server_argv_uses_the_module_entry_point():
    serve = ["vllm", "serve", "/v", "--speculative-config", '{"model": "/d"}', "--port", "9000"]
    argv = vb.server_argv(serve, "/venv/bin/python")
    assert argv[:5] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/v"]
    assert argv[5:9] == serve[3:] and argv[-2:] == ["--host", "127.0.0.1"]
    with pytest.raises(InvalidInputError):
        vb.server_argv(["python", "x.py"], "/venv/bin/python")


def test_resolve_vllm_python_order(tmp_path, monkeypatch):
    py = tmp_path / "python"
    py.write_text("")
    monkeypatch.setenv(vb.PYTHON_ENV, str(py))
    assert vb.resolve_vllm_python() == str(py)
    assert vb.resolve_vllm_python(sys.executable) == sys.executable  # explicit wins over the env
    monkeypatch.setenv(vb.PYTHON_ENV, str(tmp_path / "missing"))
    with pytest.raises(InvalidInputError, match="does not exist"):
        vb.resolve_vllm_python()


def test_token_agreement_counts_common_prefixes():
    r = token_agreement([[1, 2, 3, 4], [5, 6], [7]], [[1, 2, 9, 4], [5, 6], [7, 8]])
    assert r["agreement"] == pytest.approx((2 + 2 + 1) / (4 + 2 + 2))
    assert r["exact_match"] == pytest.approx(1 / 3)
    assert r["first_divergence"] == [2, None, 1]
    with pytest.raises(InvalidInputError):
        token_agreement([[1]], [])


def test_free_port_is_bindable():
    import socket

    p = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", p))


FAKE_SERVER = textwrap.dedent(
    """
    import http.server, subprocess, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("child", child.pid, flush=True)
    if "--refuse" in sys.argv:
        print("ValueError: Model Runner V1 does not support: test", flush=True)
        sys.exit(1)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


def _fake(tmp_path: Path, *extra: str) -> vb.VllmServer:
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    argv = [sys.executable, str(script), "--port", str(free_port()), *extra]
    return vb.VllmServer(argv, env=dict(os.environ), startup_timeout=60, log_path=tmp_path / "server.log")


def _child_pid(log: Path) -> int:
    return int(next(line.split()[1] for line in log.read_text().splitlines() if line.startswith("child")))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z" if Path(f"/proc/{pid}").exists() else True


@pytest.mark.slow
def test_server_healthy_then_whole_group_stopped(tmp_path):
    srv = _fake(tmp_path)
    with srv:
        assert srv.startup_s is not None
        child = _child_pid(tmp_path / "server.log")
        assert _alive(child)
    assert srv.proc.returncode is not None
    assert not group_alive(srv.proc.pid) and not _alive(child)


@pytest.mark.slow
def test_server_that_exits_is_reported_with_its_log_and_cleaned_up(tmp_path):
    srv = _fake(tmp_path, "--refuse")
    with pytest.raises(vb.ServerFailed) as ei:
        with srv:
            pass
    assert "Model Runner V1 does not support: test" in ei.value.log_tail
    assert ei.value.pid == srv.proc.pid and ei.value.log_path == str(tmp_path / "server.log")
    assert not group_alive(srv.proc.pid) and not _alive(_child_pid(tmp_path / "server.log"))


def test_server_env_defaults_keep_what_is_set():
    env = vb.server_env({"VLLM_CPU_KVCACHE_SPACE": "4", "PYTHONPATH": "/x"})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4" and env["HF_HUB_OFFLINE"] == "1" and "PYTHONPATH" not in env
    assert vb.server_env({})["VLLM_CPU_KVCACHE_SPACE"] == vb.DEFAULT_CPU_KVCACHE_GIB


@pytest.mark.parametrize("args",
                         [["--backend", "vllm", "--onnx", "a.onnx"], ["--backend", "vllm", "--engine", "e.plan"],
                                  ["--onnx", "a.onnx", "--engine", "e.plan"]])
def test_runtimes_are_mutually_exclusive(tmp_path, args):

    r = invoke("validate", tmp_path, "--verifier", "v", *args, catch=True)
    assert r.code == 2
    assert "mutually exclusive" in json.loads(r.stdout)["message"]


# ------------------------------------------------------------ the completions client (stdlib)
@pytest.fixture
def chat_server():
    """An in-process stand-in for vLLM's ``/v1/completions``: records each request and
    answers ``reply(body) -> (status, json)``."""
    import http.server
    import threading

    seen: list = []
    state = {"reply": lambda body: (200, {})}

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
            status, answer = state["reply"](body)
            data = answer.encode() if isinstance(answer, str) else json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", seen, state
    srv.shutdown()
    srv.server_close()


def _prompt_opts(temperature=0.0):
    from types import SimpleNamespace

    return (("p/1", [1, 7, 8]), SimpleNamespace(max_new_tokens=12, temperature=temperature, seed=5))


def test_completion_request_sends_the_rendered_ids_and_reads_vllm_token_ids(chat_server):
    """The server gets specconv's rendered token ids as the ``prompt`` (never messages for it
    to render), and the ids it says it saw are read from the choice."""
    base, seen, state = chat_server
    state["reply"] = lambda body: (200, {
        "choices": [{"index": 0, "text": "4", "finish_reason": "stop", "token_ids": [19, 2],
                     "prompt_token_ids": [1, 7, 8]}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
    prompt, opts = _prompt_opts()
    r = vb.completion_request(base, prompt, opts)
    assert seen[0]["path"] == "/v1/completions" and seen[0]["headers"]["Content-Type"] == "application/json"
    assert seen[0]["body"] == {"model": vb.SERVED_NAME, "prompt": [1, 7, 8], "max_tokens": 12,
                               "temperature": 0.0, "seed": 5, "return_token_ids": True}  # greedy, seeded
    assert {k: r[k] for k in ("prompt_id", "ok", "prompt_token_ids", "output_ids", "text", "finish_reason",
                              "completion_tokens")} == {
        "prompt_id": "p/1", "ok": True, "prompt_token_ids": [1, 7, 8], "output_ids": [19, 2], "text": "4",
        "finish_reason": "stop", "completion_tokens": 2}
    assert r["wall_s"] > 0
    assert vb.completion_body([1], *_prompt_opts(temperature=0.7)[1:])["temperature"] == 0.7


@pytest.mark.parametrize("status, answer, expect", [
    (400, {"error": {"message": "max_tokens is too large", "type": "BadRequestError", "code": 400}},
     "RuntimeError: HTTP 400: max_tokens is too large"),
    (500, {"object": "error", "message": "engine dead", "code": 500}, "RuntimeError: HTTP 500: engine dead"),
    (503, "upstream unavailable", "RuntimeError: HTTP 503: upstream unavailable"),
    (200, {"choices": []}, "IndexError"),
    (200, "not json", "JSONDecodeError"),
    (200, [1, 2], "ValueError: http"),
])
def test_completion_request_records_a_failed_request(chat_server, status, answer, expect):
    base, seen, state = chat_server
    state["reply"] = lambda body: (status, answer)
    r = vb.completion_request(base, *_prompt_opts())
    assert r["ok"] is False and r["prompt_id"] == "p/1" and r["error"].startswith(expect), r
    assert len(seen) == 1  # no retries


def test_completion_request_to_a_dead_port_is_recorded_not_raised():
    r = vb.completion_request(f"http://127.0.0.1:{free_port()}", *_prompt_opts())
    assert r["ok"] is False and "Connection refused" in r["error"], r


# ------------------------------------------------------------- what ran: runner, prompt tokens
@pytest.mark.parametrize("log, env, runner", [
    ("(EngineCore pid=9) INFO 12-04 [cpu_worker.py:162] Using V2 Model Runner\n", {}, "v2"),
    ("WARNING 12-04 [vllm.py:726] Model Runner V2 requires Triton; using the V1 model runner instead.\n", {}, "v1"),
    ("WARNING 12-04 [vllm.py:731] Model Runner V2 does not yet support parallel drafting for EAGLE speculative "
     "decoding; using the V1 model runner instead.\n", {}, "v1"),
    ("", {"VLLM_USE_V2_MODEL_RUNNER": "0"}, "v1"),  # an explicit choice: vLLM logs nothing
    ("", {}, "unknown"),  # e.g. VLLM_LOGGING_LEVEL=WARNING hid the V2 line
])
def test_model_runner_is_what_the_server_log_says(log, env, runner):
    from specconv.engines.vllm.server import model_runner

    assert model_runner(log, env) == runner


def _engine_run(algorithm: str, rendered: list):
    from types import SimpleNamespace

    from specconv.validate.gates import GateResult

    return SimpleNamespace(report={"algorithm": algorithm}, rendered=rendered), GateResult("acceptance", True)


def test_parallel_drafting_under_a_sequential_runner_is_a_finding():
    """P-EAGLE's description says only V1 drafts it in one pass: a run reported on V2 is the
    ``sequential-drafting-runner`` finding (a G3 warning, the gate still passes); on V1, or with
    the runner unknown, there is none; DFlash on V2 is no finding."""
    from specconv.format.algorithms import algorithm
    from specconv.validate.gates import served_engine_checks

    ids = [("p", [1, 2])]
    run, g3 = _engine_run("peagle", ids)
    assert served_engine_checks(run, g3, "vLLM", [[1, 2]], "v2", algorithm("peagle").vllm.runners) == {
        "prompt_tokens": "ids"}
    assert [f["code"] for f in run.report["findings"]] == ["sequential-drafting-runner"]
    assert run.report["findings"][0]["level"] == "warning" and "model runner v2" in g3.warnings[0]
    assert g3.passed is True
    for alg, runner in (("peagle", "v1"), ("peagle", "unknown"), ("dflash", "v2")):
        run, g3 = _engine_run(alg, ids)
        served_engine_checks(run, g3, "vLLM", [[1, 2]], runner, algorithm(alg).vllm.runners)
        assert "findings" not in run.report and not g3.warnings


def test_other_prompt_tokens_fail_g3():
    from specconv.validate.gates import served_engine_checks

    run, g3 = _engine_run("dflash", [("a", [1, 2, 3]), ("b", [4, 5])])
    assert served_engine_checks(run, g3, "llama-server", [3, 1], None) == {"prompt_tokens": "count"}
    assert g3.passed is False and g3.errors == [
        "llama-server did not see specconv's prompt tokens: b: the engine evaluated 1 prompt tokens, specconv sent 2"]
    run, g3 = _engine_run("dflash", [("a", [1, 2, 3])])
    assert served_engine_checks(run, g3, "vLLM", [None], None) == {"prompt_tokens": None} and g3.passed is True
