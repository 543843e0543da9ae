"""``validate --backend vllm --server-url URL``: measure a vLLM server that is already running
(``docs/validate.md``, "Measuring a running server"), and the plain endpoint of ``--reference-url``
(:func:`reference_url_outputs`; "G4 with ``--backend vllm``").
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import InvalidInputError, UsageError
from . import serve_options

if TYPE_CHECKING:
    from ...verifier import Verifier

log = logging.getLogger("specconv.validate")

#: The card's and the record's label of a ``--server-url`` run.
REMOTE_LABEL = "endpoint not started by specconv; drafter identity not verified"
_FINGERPRINT = re.compile(r"-(tp|pp|dp)(\d+)(?=-)")
_SIZE_KEYS = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size", "dp": "data_parallel_size"}


class Endpoint:
    """An OpenAI-compatible server at ``url`` (``http[s]://[user:pass@]host:port``), with the
    bearer key of ``--api-key-env`` when given, else HTTP Basic auth from the URL's userinfo.
    Its :attr:`label` (what messages and records show) is the URL without userinfo."""

    def __init__(self, url: str, api_key: str | None = None):
        import base64
        import urllib.parse

        from .server import redact_url

        u = urllib.parse.urlsplit(url.rstrip("/"))
        self.base = urllib.parse.urlunsplit((u.scheme, u.netloc.rsplit("@", 1)[-1], u.path, u.query, ""))
        self.label = redact_url(url.rstrip("/"))
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        if u.username is not None and not api_key:
            basic = f"{urllib.parse.unquote(u.username)}:{urllib.parse.unquote(u.password or '')}"
            self.headers = {"Authorization": "Basic " + base64.b64encode(basic.encode()).decode()}

    def get(self, path: str, timeout: float = 30.0) -> str:
        """The body of ``GET path``.

        Raises:
            InvalidInputError: ``vllm_unreachable`` (no answer), ``vllm_http_error`` (not 200).
        """
        from ..local_server import http_get

        status, body = http_get(self.base + path, timeout, headers=self.headers)
        if status == 0:
            raise InvalidInputError(f"--server-url {self.label}: no answer to GET {path}", code="vllm_unreachable",
                                    hint="is the server running and reachable from here?")
        if status != 200:
            hint = "set --api-key-env NAME to the variable holding its key" if status in (401, 403) else None
            raise InvalidInputError(f"--server-url {self.label}: GET {path} answered HTTP {status}",
                                    code="vllm_http_error", hint=hint)
        return body

    def sample_methods(self) -> dict[str, str | None]:
        """``draft_sample_method`` / ``rejection_sample_method`` of the server's
        ``speculative_config`` as its ``GET /server_info?config_format=json`` reports them (vLLM
        0.33 ``entrypoints/serve/dev/server_info``, served only with ``VLLM_SERVER_DEV_MODE=1``);
        None for each it does not report (no such endpoint, another answer)."""
        from ..local_server import http_get
        from .server import SAMPLE_METHOD_FIELDS

        status, body = http_get(self.base + "/server_info?config_format=json", 30.0, headers=self.headers)
        try:
            spec = (json.loads(body).get("vllm_config") or {}).get("speculative_config") if status == 200 else None
        except (ValueError, AttributeError):
            spec = None
        spec = spec if isinstance(spec, dict) else {}
        return {k: spec.get(k) if isinstance(spec.get(k), str) else None for k in SAMPLE_METHOD_FIELDS}

    def counters(self) -> dict:
        """The parsed ``/metrics`` page (:func:`specconv.engines.vllm.serve.parse_spec_counters`)."""
        from .serve import parse_spec_counters

        return parse_spec_counters(self.get("/metrics"))


def api_key(env_name: str | None) -> str | None:
    """The key held by the variable ``--api-key-env`` names (never logged or recorded).

    Raises:
        UsageError: the variable is not set.
    """
    if not env_name:
        return None
    key = os.environ.get(env_name)
    if not key:
        raise UsageError(f"--api-key-env {env_name}: ${env_name} is not set")
    return key


def verifier_names(drafter_dir: Path, verifier: Verifier) -> set[str]:
    """What a server's ``/v1/models`` ``root`` may say for the drafter's verifier: the
    recorded ``speculators_config.verifier.name_or_path``, ``--verifier`` as given, the
    resolved Hub id and local dir."""
    from ...format import load_config

    recorded = load_config(drafter_dir).speculators_config.verifier.name_or_path
    names = {recorded, verifier.spec, verifier.name_or_path, verifier.hub_id, str(verifier.local_dir)}
    return {str(n) for n in names if n}


def _same_model(root: str, names: set[str]) -> bool:
    if root in names:
        return True
    try:
        return any(Path(root).resolve() == Path(n).resolve()
                   for n in names if Path(n).is_absolute() and Path(root).is_absolute())
    except OSError:
        return False


def check_model(ep: Endpoint, names: set[str]) -> dict:
    """The ``/v1/models`` entry serving the drafter's verifier (its ``id`` names the requests).

    Raises:
        InvalidInputError: ``vllm_wrong_model`` — no entry's ``root`` is the verifier
            (the message names what the server serves); unreadable answer.
    """
    try:
        data = json.loads(ep.get("/v1/models")).get("data")
        served = [(str(m["id"]), str(m.get("root") or m["id"])) for m in data]
    except (ValueError, TypeError, KeyError, AttributeError):
        raise InvalidInputError(f"--server-url {ep.label}: /v1/models is not an OpenAI model list",
                                code="vllm_wrong_model") from None
    for mid, root in served:
        if _same_model(root, names):
            return {"id": mid, "root": root}
    raise InvalidInputError(
        f"--server-url {ep.label} serves {', '.join(f'{m} (root {r})' for m, r in served) or 'no model'}, "
        f"not the drafter's verifier ({', '.join(sorted(names))})", code="vllm_wrong_model")


def check_speculating(ep: Endpoint, before: dict, after: dict, k: int, *, allow_fewer: bool = False) -> float:
    """The counters exist and one warm-up request drafted ``k`` tokens per draft.

    Args:
        allow_fewer: accept a server drafting fewer than ``k`` tokens per draft (``validate --compare``:
            the comparison judges what it costs, as drafting cut short, instead of refusing it).

    Returns:
        The tokens drafted per draft (Δdraft tokens / Δdrafts).

    Raises:
        InvalidInputError: ``vllm_no_spec_decode`` (no ``vllm:spec_decode_*`` counters, or
            none moved), ``vllm_wrong_k`` (Δdraft tokens / Δdrafts ≠ ``k``; above ``k`` even when
            ``allow_fewer``: another drafter).
    """
    if not after.get("spec_counters"):
        raise InvalidInputError(f"--server-url {ep.label}: /metrics has no vllm:spec_decode_* counters: "
                                "the server does not run speculative decoding", code="vllm_no_spec_decode")
    drafts = after["num_drafts"] - before["num_drafts"]
    tokens = after["num_draft_tokens"] - before["num_draft_tokens"]
    if drafts <= 0:
        raise InvalidInputError(f"--server-url {ep.label}: a warm-up request moved no vllm:spec_decode_num_drafts: "
                                "the server did not speculate", code="vllm_no_spec_decode")
    per = tokens / drafts
    if abs(per - k) > 1e-9 and not (allow_fewer and per < k):
        raise InvalidInputError(f"--server-url {ep.label}: the server drafts {tokens / drafts:g} tokens per draft "
                                f"({tokens:g} / {drafts:g}), the drafter's K is {k}: it serves another drafter "
                                "or another num_speculative_tokens", code="vllm_wrong_k")
    return per


def _draft_tokens_per_step(ep: Endpoint, before: dict, after: dict, drafter_dir: Path, opts: Any) -> float:
    """:func:`check_speculating` against the drafter's K; under ``validate --compare`` a server drafting fewer
    tokens per step is measured (and said), not refused."""
    from ...format import load_config

    k = load_config(drafter_dir).speculative_tokens
    per = check_speculating(ep, before, after, k, allow_fewer=bool(getattr(opts, "compare", ())))
    if per < k:
        log.warning("--server-url %s drafts %g tokens per step, the drafter's K is %d: compared as served",
                    ep.label, per, k)
    return per


def fingerprint_sizes(fingerprint: str | None) -> dict[str, int | None]:
    """The parallel sizes a ``system_fingerprint`` says (vLLM's ``full`` mode:
    ``vllm-<version>[-tpN][-ppN][-dpN]-<hash8>``); None for each it does not say (the
    ``hash`` mode and a size of 1 look alike, so an absent size is unknown, not 1)."""
    found = {k: int(v) for k, v in _FINGERPRINT.findall(fingerprint or "")}
    return {name: found.get(key) for key, name in _SIZE_KEYS.items()}


def _fingerprint(reqs: Sequence[dict]) -> str | None:
    return next((r.get("system_fingerprint") for r in reqs if r.get("system_fingerprint")), None)


def run_remote_validation(drafter_dir: Path, verifier: Verifier, prompts: Sequence[tuple[str, list[int]]],
                          opts: Any) -> dict:
    """Measure the running server of ``--server-url`` with the run's rendered prompts
    (the pre-checks of the module docstring first); the same keys as
    :func:`specconv.engines.vllm.serve.run_vllm_validation`, ``serving.mode`` = ``remote``,
    ``serving.runner`` = ``unknown`` (a running server does not say).

    Raises:
        InvalidInputError: unreachable URL, another model, a lossy or synthetic rejection
            method it reports (``vllm_lossy_rejection``), no speculative decoding, another K, a
            request not served. UsageError: ``--api-key-env`` names an unset variable.
    """
    from ..served import settled as scrape_settled
    from .serve import (
        _served_details,
        _version,
        check_served,
        completion_request,
        measure,
        metrics_from_vllm,
        other_traffic,
        serving_facts,
    )
    from .server import check_rejection_method
    vopts = serve_options(opts)
    key = api_key(vopts.api_key_env)
    ep = Endpoint(vopts.server_url, key)
    model = check_model(ep, verifier_names(drafter_dir, verifier))
    methods = ep.sample_methods()
    check_rejection_method(methods["rejection_sample_method"], f"--server-url {ep.label}")
    version = _version(ep.get("/version"))
    pre = ep.counters()
    warm = completion_request(ep.base, prompts[0], opts, model=model["id"], headers=ep.headers)
    check_served([warm])
    settled = scrape_settled(ep.counters)
    per_step = _draft_tokens_per_step(ep, pre, settled, drafter_dir, opts)
    reqs, wall, before, after = measure(ep.base, prompts, opts, read=ep.counters, concurrency=vopts.max_concurrency,
                                        model=model["id"], headers=ep.headers)
    check_served(reqs)
    m = metrics_from_vllm(before, after)
    fp = _fingerprint([warm, *reqs])
    m["serving"] = serving_facts("remote", fingerprint_sizes(fp), None, None, vopts.max_concurrency,
                                 other_traffic(before, after, reqs), url=ep.label,
                                 engine={"runner": "unknown", **methods})
    m["serving"]["draft_tokens_per_step"] = per_step
    m.update(_served_details(reqs, wall, None, {
        "url": ep.label, "model": model, "system_fingerprint": fp, "identity": REMOTE_LABEL,
        "versions": {"distribution": None, "vllm.__version__": version}}))
    return m


def traffic_check(g3: Any, traffic: dict | None, allow_shared: bool) -> None:
    """Other traffic on the server fails G3 (``g3`` mutated) unless ``--allow-shared-server``;
    the excess is in ``g3.details["other_traffic"]`` either way."""
    g3.details["other_traffic"] = traffic
    excess = {k: v for k, v in (traffic or {}).items() if v > 0}
    if not excess:
        return
    msg = ("the server counted more work than this run sent (" + ", ".join(f"{k} +{v:g}" for k, v in excess.items())
           + "): other traffic shares its spec-decode counters, so τ is not this run's alone")
    if allow_shared:
        g3.warnings.append(msg + " (--allow-shared-server)")
    else:
        g3.errors.append(msg + "; pass --allow-shared-server to accept it")
        g3.passed = False


# --------------------------------------------------------------------- G4's plain reference
def reference_url_outputs(drafter_dir: Path, verifier: Verifier, prompts: Sequence[tuple[str, list[int]]], opts: Any,
                          url: str) -> list[list[int]]:
    """The greedy outputs of the plain endpoint ``--reference-url`` for the run's rendered
    prompts (its model must be the verifier; its key is ``--api-key-env``'s too); the reference of
    ``specconv.validate``'s G4 for ``--backend vllm``.

    Raises:
        InvalidInputError: unreachable URL, another model, a request not served.
    """
    from .serve import check_served, send_requests

    vopts = serve_options(opts)
    ep = Endpoint(url, api_key(vopts.api_key_env))
    model = check_model(ep, verifier_names(drafter_dir, verifier))
    reqs, _ = send_requests(ep.base, prompts, opts, model=model["id"], headers=ep.headers,
                            concurrency=vopts.max_concurrency)
    check_served(reqs)
    return [r["output_ids"] or [] for r in reqs]


# ------------------------------------------------------------------------------ recording
def record_section(drafter_dir: Path, section: Any) -> Any:
    """The ``validation`` section to record for this run's ``section``
    (:func:`specconv.validate.report.validation_section`): itself for a run on a server specconv
    started (or no server); for a ``--server-url`` run the section already recorded, untouched,
    with only ``remote`` set to this run (a remote run never satisfies ``push`` / ``release``,
    whose gates read the section's ``passed`` and ``files``)."""
    from ...record import read_record

    serve = section.vllm_serve.model_dump(exclude_none=True) if section.vllm_serve is not None else {}
    if serve.get("mode") != "remote":
        return section
    summary = section.model_dump(exclude_none=True)
    try:
        v = read_record(drafter_dir, missing_ok=True).validation
        recorded = v.model_dump(exclude_none=True) if v is not None else {}
    except InvalidInputError:
        recorded = {}
    keep = ("passed", "gates", "acceptance_length", "acceptance_at_pos", "report", "created", "prompts",
            "chat_template", "findings", "max_new_tokens", "temperature", "specconv_version")
    recorded["remote"] = {**{k: summary.get(k) for k in keep if k in summary}, "vllm_serve": serve,
                          "identity": REMOTE_LABEL}
    return recorded
