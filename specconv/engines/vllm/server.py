"""What ``validate --backend vllm`` passes to the vLLM server it starts, and what it refuses
before anything starts (``docs/validate.md``, "Engine arguments" and "Validating a drafter for
a verifier that does not fit one GPU"). Standard library only (the CLI builds the options
without importing torch).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from ...errors import InvalidInputError, UsageError

#: Flags specconv sets on every server it starts (:func:`specconv.engines.vllm.serve.harness_args`,
#: the serve command), with vLLM's aliases (vLLM 0.32 ``vllm/engine/arg_utils.py``).
OWNED_FLAGS = {
    "--model": "--model", "--speculative-config": "--speculative-config", "-sc": "--speculative-config",
    "--served-model-name": "--served-model-name", "--port": "--port", "--host": "--host", "--seed": "--seed",
    "--dtype": "--dtype",
}
#: vLLM's parallel-size flags and aliases → the dedicated ``validate`` option that sets it.
PARALLEL_FLAGS = {
    "--tensor-parallel-size": "--tensor-parallel-size", "-tp": "--tensor-parallel-size",
    "--pipeline-parallel-size": "--pipeline-parallel-size", "-pp": "--pipeline-parallel-size",
    "--data-parallel-size": "--data-parallel-size", "-dp": "--data-parallel-size",
}
#: ``VllmServeOptions`` field → the ``validate`` flag (messages name the flag the user typed).
OPTION_FLAGS = {
    "tensor_parallel_size": "--tensor-parallel-size", "pipeline_parallel_size": "--pipeline-parallel-size",
    "data_parallel_size": "--data-parallel-size", "vllm_args": "--vllm-arg", "server_url": "--server-url",
    "api_key_env": "--api-key-env", "reference_url": "--reference-url",
    "allow_shared_server": "--allow-shared-server", "max_concurrency": "--max-concurrency",
}
#: Options that shape a server specconv starts: meaningless against ``--server-url``.
STARTUP_OPTIONS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "vllm_args")
EXECUTOR_FLAG = "--distributed-executor-backend"
HOST_IP_ENV = "VLLM_HOST_IP"
LOOPBACK = "127.0.0.1"
REDACTED = "***"
#: Flag and query-parameter names whose value is a secret (redacted wherever recorded).
_SECRET_NAME = re.compile(r"(key|token|secret|password|passwd|auth|credential|signature|sig)$", re.I)


@dataclass(frozen=True)
class VllmServeOptions:
    """The serving options of one ``--backend vllm`` run (the CLI flags of the same names).

    Attributes:
        tensor_parallel_size / pipeline_parallel_size / data_parallel_size: passed to the
            server specconv starts (None: not passed, vLLM's default 1).
        vllm_args: one argv word each, appended to that server's command line
            (``--vllm-arg=--max-model-len=2048``).
        server_url: measure this running OpenAI-compatible vLLM server instead of starting
            one (``http[s]://host:port``; nothing is started).
        api_key_env: name of the environment variable holding the server's API key (sent
            as ``Authorization: Bearer``; never recorded).
        reference_url: a plain (non-speculative) endpoint serving the verifier: G4 compares
            the greedy outputs with it.
        allow_shared_server: other traffic on ``server_url`` is reported, not a G3 failure.
        max_concurrency: requests in flight at once (1 = one after the other).
    """

    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    data_parallel_size: int | None = None
    vllm_args: tuple[str, ...] = field(default_factory=tuple)
    server_url: str | None = None
    api_key_env: str | None = None
    reference_url: str | None = None
    allow_shared_server: bool = False
    max_concurrency: int = 1

    @property
    def remote(self) -> bool:
        """True when a running server is measured (``--server-url``)."""
        return bool(self.server_url)

    #: the key the report's ``options`` holds :meth:`recorded` under (the engine's key)
    report_key = "vllm"

    def recorded(self) -> dict[str, Any]:
        """The options as a report may hold them: URLs without userinfo or secret query
        values, ``--vllm-arg`` words redacted (:func:`redact_argv`)."""
        out = {name: getattr(self, name) for name in OPTION_FLAGS}
        out.update(vllm_args=redact_argv(self.vllm_args), server_url=redact_url(self.server_url),
                   reference_url=redact_url(self.reference_url))
        return out

    def given(self) -> list[str]:
        """The ``validate`` flags of the options that differ from their defaults."""
        defaults = VllmServeOptions()
        return [flag for name, flag in OPTION_FLAGS.items() if getattr(self, name) != getattr(defaults, name)]


def flag_name(word: str) -> str:
    """The flag an argv word sets, as vLLM's parser reads it: ``--x=v`` → ``--x``,
    ``--x_y`` → ``--x-y``; a word that is not a flag is returned unchanged."""
    if not word.startswith("-") or word == "-":
        return word
    name = word.split("=", 1)[0]
    return name[:2] + name[2:].replace("_", "-") if name.startswith("--") else name


def check_vllm_args(words: Sequence[str]) -> None:
    """Refuse ``--vllm-arg`` words that would override what specconv sets (exit 2).

    Raises:
        UsageError: a flag specconv sets itself (``--model``, ``--speculative-config`` /
            ``-sc``, ``--served-model-name``, ``--port``, ``--host``, ``--seed``, ``--dtype``)
            or a parallel size (``--tensor-parallel-size`` / ``-tp``, ``-pp``, ``-dp`` …),
            in any form (``--x v``, ``--x=v``, underscores, vLLM's dotted ``--x.key v``:
            ``vllm/utils/argparse_utils.py`` merges it into the JSON flag).
    """
    for w in words:
        name = flag_name(w).split(".", 1)[0]  # vLLM merges --speculative-config.KEY V into the JSON flag
        if name in OWNED_FLAGS:
            raise UsageError(f"--vllm-arg {w}: specconv sets {OWNED_FLAGS[name]} itself "
                             "(the verifier, the drafter, port, host, seed and --dtype come from "
                             "validate's own options)")
        if name in PARALLEL_FLAGS:
            raise UsageError(f"--vllm-arg {w}: pass the parallel size as validate's own {PARALLEL_FLAGS[name]} "
                             "(it is checked against the heads before start-up and recorded)")


def check_options(backend: str, vopts: VllmServeOptions | None, vllm_python: str | None = None) -> None:
    """The option refusals of ``--backend vllm`` (exit 2), before anything is read or started.

    Raises:
        UsageError: a serving option without ``--backend vllm``; ``--server-url`` with a
            start-up option or ``--vllm-python``; ``--api-key-env`` / ``--allow-shared-server``
            without ``--server-url``; a bad ``--vllm-arg`` (:func:`check_vllm_args`); a URL
            that is not ``http(s)://host[:port]``; a concurrency below 1.
    """
    if vopts is None:
        return
    given = vopts.given()
    if backend != "vllm":
        if given:
            raise UsageError(f"{', '.join(given)} need(s) --backend vllm")
        return
    if vopts.remote:
        clash = ([OPTION_FLAGS[n] for n in STARTUP_OPTIONS if getattr(vopts, n)]
                 + (["--vllm-python"] if vllm_python else []))
        if clash:
            raise UsageError(f"--server-url measures a running server: {', '.join(clash)} would shape a server "
                             "specconv starts, and none is started")
    else:
        lone = [OPTION_FLAGS[n] for n in ("api_key_env", "allow_shared_server") if getattr(vopts, n)]
        if lone:
            raise UsageError(f"{', '.join(lone)} only apply with --server-url")
    for name in ("server_url", "reference_url"):
        url = getattr(vopts, name)
        if url:
            check_url(url, OPTION_FLAGS[name])
    if vopts.max_concurrency < 1:
        raise UsageError("--max-concurrency must be at least 1")
    check_vllm_args(vopts.vllm_args)


def check_url(url: str, flag: str) -> None:
    """``http[s]://host[:port][/path]`` (no query string, no fragment) or a usage error naming
    ``flag`` (the URL redacted)."""
    try:
        u = urllib.parse.urlsplit(url)
        u.port  # noqa: B018 - raises on a non-numeric port
    except ValueError as e:
        raise UsageError(f"{flag} {redact_url(url)}: {e}") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise UsageError(f"{flag} {redact_url(url)}: expected http(s)://HOST[:PORT]")
    if u.query or u.fragment:  # a key in a query string would travel into every request URL and error
        raise UsageError(f"{flag} {redact_url(url)}: a query string or fragment is not accepted "
                         "(pass a key with --api-key-env NAME)")


def _heads(cfg: dict[str, Any], what: str) -> tuple[int, int]:
    h = cfg.get("num_attention_heads")
    kv = cfg.get("num_key_value_heads") or h
    if not isinstance(h, int) or not isinstance(kv, int) or h < 1 or kv < 1:
        raise InvalidInputError(f"{what} has no positive num_attention_heads / num_key_value_heads "
                                f"({h!r} / {kv!r}): the tensor-parallel size cannot be checked",
                                code="vllm_parallel_size")
    return h, kv


def parallel_size_problems(tp: int, heads: dict[str, tuple[int, int]]) -> list[str]:
    """Why vLLM would refuse ``--tensor-parallel-size tp`` for these models.

    Args:
        tp: the tensor-parallel size.
        heads: model name → (attention heads, KV heads).

    Returns:
        One sentence per violated rule (empty: vLLM accepts the size): attention heads
        not divisible by ``tp``; KV heads neither divisible by ``tp`` (tp ≤ KV) nor
        dividing it (tp > KV: vLLM replicates them).
    """
    out = []
    for what, (h, kv) in heads.items():
        if h % tp:
            out.append(f"the {what}'s {h} attention heads are not divisible by tensor parallel size {tp}")
        if (kv % tp) if tp <= kv else (tp % kv):
            out.append(f"the {what}'s {kv} KV heads are neither divisible by tensor parallel size {tp} nor divide it")
    return out


def check_parallel_sizes(vopts: VllmServeOptions | None, verifier_config: dict, drafter_layer_config: dict) -> None:
    """Refuse a tensor-parallel size vLLM would refuse at start-up (exit 3), naming the numbers.

    Args:
        vopts: the run's serving options (None or no TP: nothing to check).
        verifier_config: the verifier's text config (``num_attention_heads``,
            ``num_key_value_heads``).
        drafter_layer_config: the drafter's ``transformer_layer_config``.

    Raises:
        InvalidInputError: ``vllm_parallel_size`` naming each model's heads and the size.
    """
    tp = vopts.tensor_parallel_size if vopts else None
    if not tp or tp == 1:
        return
    problems = parallel_size_problems(tp, {"verifier": _heads(verifier_config, "the verifier config"),
                                           "drafter": _heads(drafter_layer_config,
                                                             "the drafter's transformer_layer_config")})
    if problems:
        raise InvalidInputError(f"--tensor-parallel-size {tp}: vLLM would refuse it: " + "; ".join(problems),
                                code="vllm_parallel_size",
                                hint="pick a size that divides the attention heads (and the KV heads, "
                                     "or a multiple of them)")


def engine_argv(vopts: VllmServeOptions | None) -> list[str]:
    """The argv words the parallel sizes and ``--vllm-arg`` add to the server command."""
    if vopts is None:
        return []
    out: list[str] = []
    for name in STARTUP_OPTIONS[:3]:
        if getattr(vopts, name):
            out += [OPTION_FLAGS[name], str(getattr(vopts, name))]
    return out + list(vopts.vllm_args)


def executor_backend(argv: Sequence[str]) -> str | None:
    """The ``--distributed-executor-backend`` an argv names (``mp``, ``ray``, ``uni`` …), else None
    (vLLM picks: ``uni`` for one worker, ``mp`` for several on one node)."""
    words = list(argv)
    for i, w in enumerate(words):
        if flag_name(w) == EXECUTOR_FLAG:
            return w.split("=", 1)[1] if "=" in w else (words[i + 1] if i + 1 < len(words) else None)
    return None


def server_env_overrides(argv: Sequence[str], env: dict[str, str]) -> dict[str, str]:
    """The environment ``VllmServer`` adds for ``argv``: ``VLLM_HOST_IP=127.0.0.1`` unless it is
    already in ``env`` or the executor is Ray (its cluster's addresses are the user's)."""
    if HOST_IP_ENV in env or executor_backend(argv) == "ray":
        return {}
    return {HOST_IP_ENV: LOOPBACK}


# ------------------------------------------------------------ model runner and sampling methods
#: The environment variable choosing vLLM's model runner (vLLM 0.33 ``vllm/envs.py``).
RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
#: Log lines that say which model runner a vLLM server chose: V2 logs "Using V2 Model Runner"
#: (``v1/worker/{cpu,gpu}_worker.py``); the automatic choice logs why it fell back to V1
#: (``config/vllm.py`` ``VllmConfig.use_v2_model_runner``).
RUNNER_V2_LOG = "Using V2 Model Runner"
RUNNER_V1_LOG = "using the V1 model runner instead"
#: ``speculative_config`` fields of the sampling methods (vLLM 0.33 ``config/speculative.py``).
SAMPLE_METHOD_FIELDS = ("draft_sample_method", "rejection_sample_method")
#: Rejection methods that keep the verifier's distribution: ``standard`` (probabilistic rejection
#: sampling) and ``block`` (block verification). ``synthetic`` accepts drafts at a set rate and
#: ``fly`` is lossy (vLLM 0.33 ``config/speculative.py`` ``RejectionSampleMethod``).
LOSSLESS_REJECTION_METHODS = ("standard", "block")


def model_runner(log_text: str, env: dict[str, str]) -> str:
    """The model runner a server specconv started ran: ``v2`` when its log says "Using V2
    Model Runner", ``v1`` when the log says it fell back to V1 or ``VLLM_USE_V2_MODEL_RUNNER``
    is set false (vLLM then logs nothing), else ``unknown``."""
    if RUNNER_V2_LOG in log_text:
        return "v2"
    if RUNNER_V1_LOG in log_text or env.get(RUNNER_ENV, "").strip().lower() in ("0", "false"):
        return "v1"
    return "unknown"


def check_rejection_method(method: str | None, where: str) -> None:
    """Refuse a server whose rejection sampling is not lossless (exit 3): τ and G4 would measure
    the sampler, not the drafter. None (not reported) passes.

    Raises:
        InvalidInputError: ``vllm_lossy_rejection``, naming the method and ``where``.
    """
    if method is not None and method not in LOSSLESS_REJECTION_METHODS:
        raise InvalidInputError(
            f"{where} runs rejection_sample_method {method!r}: acceptance there is "
            f"{'synthetic' if method == 'synthetic' else 'lossy or unknown to specconv'}, so τ and losslessness "
            f"would not be the drafter's (lossless methods: {', '.join(LOSSLESS_REJECTION_METHODS)})",
            code="vllm_lossy_rejection", hint="measure a server started with the default rejection_sample_method")


# --------------------------------------------------------------------- vLLM's start-up reason
_LOG_PREFIX = re.compile(r"^\((?:\w+ )?pid=\d+\)\s*(?:(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \S+ \S+ \[[^]]*\]\s*)?")
_PYDANTIC = re.compile(r"^\s*Value error, (?P<msg>.*?)(?: \[type=\w+.*)?$")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?(?P<type>[A-Z]\w*(?:Error|Exception))(?::\s*(?P<msg>.*))?$")
#: An exception quoted at the end of another line: ``python -m``'s "<python>: Error while finding
#: module specification for 'vllm.entrypoints.openai.api_server' (ModuleNotFoundError: No module
#: named 'vllm')" (an interpreter without vLLM).
_QUOTED = re.compile(r"\((?P<type>[A-Z]\w*(?:Error|Exception)): (?P<msg>.+)\)$")
#: Wrappers vLLM raises around the root cause (its message points elsewhere in the log).
_WRAPPERS = ("See root cause above", "Engine core initialization failed", "Failed core proc",
             "validation error for", "Worker failed", "engine process failed to start",
             "EngineCore encountered an issue", "stack trace above", "stack trace (above)")


def _reason_of(line: str) -> tuple[int, str] | None:
    """``(rank, reason)`` of one log line (prefix removed) by :func:`startup_reason`'s patterns, in
    their order (0 wins); None for a line that says no reason or only wraps one."""
    m = _PYDANTIC.match(line)
    if m:
        return 0, m.group("msg").strip()
    for rank, m in ((1, _EXCEPTION.match(line.strip())), (2, _QUOTED.search(line.strip()))):
        if m and m.group("msg") and not any(w in m.group("msg") for w in _WRAPPERS):
            return rank, f"{m.group('type')}: {m.group('msg').strip()}"
    return None


def startup_reason(log_text: str) -> str | None:
    """vLLM's own reason for failing, at start-up or while serving, out of its log.

    Ordered patterns, the first that matches anywhere wins (the last line it matches):
    a pydantic config refusal (``Value error, <reason> [type=value_error …]``); an exception
    line (``ValueError: <reason>``, ``RuntimeError: Unsupported CPU attention configuration:
    head_dim=16 …``) that is not one of vLLM's wrappers ("Engine core initialization failed.
    See root cause above", "Worker failed with error …", ``EngineDeadError`` …); an exception
    quoted at a line's end (``python -m``'s "… (ModuleNotFoundError: No module named
    'vllm')"). The ``(EngineCore pid=N)`` / log-level prefix is removed first.

    Returns:
        ``"<reason>"`` or ``"<Type>: <reason>"``; None when the log names no exception.
    """
    best: dict[int, str] = {}
    for raw in log_text.splitlines():
        found = _reason_of(_LOG_PREFIX.sub("", raw).rstrip())
        if found is not None:
            best[found[0]] = found[1]
    return best[min(best)] if best else None


# ------------------------------------------------------------------------------ redaction
@overload
def redact_url(url: str) -> str: ...


@overload
def redact_url(url: None) -> None: ...


def redact_url(url: str | None) -> str | None:
    """``url`` without userinfo (``user:pass@``) and with secret query values replaced."""
    if not url:
        return url
    try:
        u = urllib.parse.urlsplit(url)
    except ValueError:
        return REDACTED
    netloc = u.netloc.rsplit("@", 1)[-1]
    if u.username or u.password:
        netloc = f"{REDACTED}@{netloc}"
    query = urllib.parse.urlencode([(k, REDACTED if _SECRET_NAME.search(k) else v)
                                    for k, v in urllib.parse.parse_qsl(u.query, keep_blank_values=True)])
    return urllib.parse.urlunsplit((u.scheme, netloc, u.path, query, u.fragment))


def redact_argv(argv: Sequence[str], secrets: Sequence[str] = ()) -> list[str]:
    """``argv`` as it may be recorded: the value of every flag named like a secret
    (``--api-key``, ``--hf-token`` …, both ``--x v`` and ``--x=v``) replaced, URLs without
    userinfo, and every literal in ``secrets`` (e.g. the key read from ``--api-key-env``)
    replaced wherever it occurs."""
    out: list[str] = []
    hide_next = False
    for w in map(str, argv):
        name = flag_name(w)
        if hide_next and not w.startswith("--"):
            out.append(REDACTED)
        elif name.startswith("-") and "=" in w and _SECRET_NAME.search(name):
            out.append(f"{w.split('=', 1)[0]}={REDACTED}")
        else:
            out.append(redact_url(w) if "://" in w else w)
        hide_next = name.startswith("-") and "=" not in w and bool(_SECRET_NAME.search(name))
    for s in (s for s in secrets if s):
        out = [w.replace(s, REDACTED) for w in out]
    return out
