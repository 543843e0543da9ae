"""``validate --backend vllm --server-url URL``: measure a vLLM server that is already running
(``docs/validate.md``, "Measuring a running server"), and the losslessness reference of every
``--backend vllm`` run (:func:`lossless_gate`; "G4 with ``--backend vllm``").
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import InvalidInputError, UsageError

if TYPE_CHECKING:
    from ..verifier import Verifier

log = logging.getLogger("specconv.validate")

#: The card's and the record's label of a ``--server-url`` run.
REMOTE_LABEL = "endpoint not started by specconv; drafter identity not verified"
#: G4 against a reference: Σ common prefix / Σ longer output (the serving tests' rule).
MIN_TOKEN_AGREEMENT = 0.90
_FINGERPRINT = re.compile(r"-(tp|pp|dp)(\d+)(?=-)")
_SIZE_KEYS = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size", "dp": "data_parallel_size"}


class Endpoint:
    """An OpenAI-compatible server at ``url`` (``http[s]://[user:pass@]host:port``), with the
    bearer key of ``--api-key-env`` when given, else HTTP Basic auth from the URL's userinfo.
    Its :attr:`label` (what messages and records show) is the URL without userinfo."""

    def __init__(self, url: str, api_key: str | None = None):
        import base64
        import urllib.parse

        from .vllm_server import redact_url

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
        from .local_server import http_get

        status, body = http_get(self.base + path, timeout, headers=self.headers)
        if status == 0:
            raise InvalidInputError(f"--server-url {self.label}: no answer to GET {path}", code="vllm_unreachable",
                                    hint="is the server running and reachable from here?")
        if status != 200:
            hint = "set --api-key-env NAME to the variable holding its key" if status in (401, 403) else None
            raise InvalidInputError(f"--server-url {self.label}: GET {path} answered HTTP {status}",
                                    code="vllm_http_error", hint=hint)
        return body

    def counters(self) -> dict:
        """The parsed ``/metrics`` page (:func:`specconv.validate.vllm_backend.parse_spec_counters`)."""
        from .vllm_backend import parse_spec_counters

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
    from ..format import load_config

    recorded = load_config(drafter_dir).speculators_config.verifier.name_or_path
    names = {recorded, verifier.spec, verifier.name_or_path, verifier.hub_id, str(verifier.local_dir)}
    return {str(n) for n in names if n}


def _same_model(root: str, names: set[str]) -> bool:
    if root in names:
        return True
    try:
        return any(Path(root).resolve() == Path(n).resolve() for n in names if Path(n).is_absolute() and Path(root).is_absolute())
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


def check_speculating(ep: Endpoint, before: dict, after: dict, k: int) -> None:
    """The counters exist and one warm-up request drafted ``k`` tokens per draft.

    Raises:
        InvalidInputError: ``vllm_no_spec_decode`` (no ``vllm:spec_decode_*`` counters, or
            none moved), ``vllm_wrong_k`` (Δdraft tokens / Δdrafts ≠ ``k``).
    """
    if not after.get("spec_counters"):
        raise InvalidInputError(f"--server-url {ep.label}: /metrics has no vllm:spec_decode_* counters: "
                                "the server does not run speculative decoding", code="vllm_no_spec_decode")
    drafts = after["num_drafts"] - before["num_drafts"]
    tokens = after["num_draft_tokens"] - before["num_draft_tokens"]
    if drafts <= 0:
        raise InvalidInputError(f"--server-url {ep.label}: a warm-up request moved no vllm:spec_decode_num_drafts: "
                                "the server did not speculate", code="vllm_no_spec_decode")
    if abs(tokens / drafts - k) > 1e-9:
        raise InvalidInputError(f"--server-url {ep.label}: the server drafts {tokens / drafts:g} tokens per draft "
                                f"({tokens:g} / {drafts:g}), the drafter's K is {k}: it serves another drafter "
                                "or another num_speculative_tokens", code="vllm_wrong_k")


def fingerprint_sizes(fingerprint: str | None) -> dict[str, int | None]:
    """The parallel sizes a ``system_fingerprint`` says (vLLM's ``full`` mode:
    ``vllm-<version>[-tpN][-ppN][-dpN]-<hash8>``); None for each it does not say (the
    ``hash`` mode and a size of 1 look alike, so an absent size is unknown, not 1)."""
    found = {k: int(v) for k, v in _FINGERPRINT.findall(fingerprint or "")}
    return {name: found.get(key) for key, name in _SIZE_KEYS.items()}


def _fingerprint(reqs: Sequence[dict]) -> str | None:
    return next((r.get("system_fingerprint") for r in reqs if r.get("system_fingerprint")), None)


def run_remote_validation(drafter_dir: Path, verifier: Verifier, prompts: Sequence[Any], opts: Any) -> dict:
    """Measure the running server of ``opts.vllm.server_url`` (the pre-checks of the module
    docstring first); the same keys as :func:`specconv.validate.vllm_backend.run_vllm_validation`,
    ``serving.mode`` = ``remote``.

    Raises:
        InvalidInputError: unreachable URL, another model, no speculative decoding, another
            K, a request not served. UsageError: ``--api-key-env`` names an unset variable.
    """
    from ..format import load_config
    from .vllm_backend import (_served_details, _version, check_served, chat_request, measure, metrics_from_vllm,
                               other_traffic, scrape_settled, serving_facts)
    vopts = opts.vllm
    key = api_key(vopts.api_key_env)
    ep = Endpoint(vopts.server_url, key)
    model = check_model(ep, verifier_names(drafter_dir, verifier))
    version = _version(ep.get("/version"))
    pre = ep.counters()
    warm = chat_request(ep.base, prompts[0], opts, model=model["id"], headers=ep.headers)
    check_served([warm])
    settled = scrape_settled(ep.counters)
    check_speculating(ep, pre, settled, load_config(drafter_dir).speculative_tokens)
    reqs, wall, before, after = measure(ep.base, prompts, opts, read=ep.counters, concurrency=vopts.max_concurrency,
                                        model=model["id"], headers=ep.headers)
    check_served(reqs)
    m = metrics_from_vllm(before, after)
    fp = _fingerprint([warm, *reqs])
    m["serving"] = serving_facts("remote", fingerprint_sizes(fp), None, None, vopts.max_concurrency,
                                 other_traffic(before, after, reqs), url=ep.label)
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


# ------------------------------------------------------------------------- G4 (losslessness)
def lossless_gate(run: Any, vm: dict) -> Any:
    """G4 of a ``--backend vllm`` run: the server's greedy outputs against a non-speculative
    reference (``--reference-url``, else specconv's torch loop when the verifier fits
    here); skipped with "not checked: <reason>" otherwise.

    Passes when the outputs agree on ≥ :data:`MIN_TOKEN_AGREEMENT` of the tokens (common
    prefix per request / the longer output: vLLM's and transformers' kernels may flip a
    near-tie); divergences are warnings.
    """
    from .gates import GateResult, skipped
    from .vllm_backend import token_agreement

    if run.options.temperature > 0:
        return skipped("lossless", "not checked: T > 0 (greedy outputs only)")
    vopts = getattr(run.options, "vllm", None)
    ref, source = (_reference_url_outputs(run, vopts.reference_url), "reference_url") if vopts and vopts.reference_url \
        else (_torch_reference_outputs(run), "torch")
    if isinstance(ref, str):
        return skipped("lossless", f"not checked: {ref}")
    agree = token_agreement([r["output_ids"] for r in vm["requests"]], ref)
    g = GateResult(name="lossless", passed=agree["agreement"] >= MIN_TOKEN_AGREEMENT,
                   details={"reference": source, **agree, "min_agreement": MIN_TOKEN_AGREEMENT})
    diverged = [f"{r['prompt_id']}: first divergence at token {d}" for r, d in zip(vm["requests"], agree["first_divergence"])
                if d is not None]
    (g.warnings if g.passed else g.errors).extend(diverged[:5])
    return g


def _reference_url_outputs(run: Any, url: str) -> list[list[int]]:
    """The greedy outputs of the plain endpoint ``--reference-url`` (its model must be the
    verifier; its key is ``--api-key-env``'s too)."""
    from .vllm_backend import check_served, send_requests

    vopts = run.options.vllm
    ep = Endpoint(url, api_key(vopts.api_key_env))
    model = check_model(ep, verifier_names(run.drafter_dir, run.verifier))
    reqs, _ = send_requests(ep.base, run.prompts, run.options, model=model["id"], headers=ep.headers,
                            concurrency=vopts.max_concurrency)
    check_served(reqs)
    return [r["output_ids"] or [] for r in reqs]


def available_memory(meminfo: str = "/proc/meminfo") -> int:
    """Bytes of memory a new process can use: Linux's ``MemAvailable`` (free memory plus the
    page cache it may reclaim), else the free pages (``SC_AVPHYS_PAGES``, which leaves the
    page cache out and reads low on a busy machine)."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def fits_here(verifier: Verifier, dtype: str, device: str) -> str | None:
    """None when the verifier's weights fit on ``device`` here (CUDA: the torch backend's
    placement rule; CPU: 1.15 × the weights + 1 GiB ≤ :func:`available_memory`), else why not."""
    from ..errors import SpecconvError
    from .torch_backend import _float_numel, plan_placement

    if verifier.hub_id is not None:
        return f"the verifier {verifier.hub_id} is a Hub id; its weights are not read here"
    try:
        if str(device).startswith("cuda"):
            plan_placement(verifier, Path(verifier.local_dir), device, dtype)
            return None
        need = _float_numel(verifier.store()) * (4 if dtype == "float32" else 2)
        avail = available_memory()
    except (SpecconvError, OSError, ValueError) as e:
        return getattr(e, "message", str(e))
    if need * 1.15 + 2**30 > avail:
        return f"the verifier needs {need / 2**30:.1f} GiB at {dtype}, {avail / 2**30:.1f} GiB is available here"
    return None


def _torch_reference_outputs(run: Any) -> list[list[int]] | str:
    """Plain greedy decoding of the prompts with specconv's torch loop, or why it cannot run."""
    from ..errors import SpecconvError
    from ..extras import require

    try:
        require("transformers", "validate", feature="the losslessness reference of --backend vllm")
        from .loop import run_requests
        from .torch_backend import _render_all
        from .verifier_runner import VerifierRunner, resolve_device
    except SpecconvError as e:
        return e.message
    opts = run.options
    device = resolve_device(opts.device)
    why = fits_here(run.verifier, opts.dtype, device)
    if why:
        return why
    run.progress("plain decode (torch reference)", 0, 1)
    try:  # the reference is optional: a verifier transformers cannot load or render is "not checked"
        runner = VerifierRunner.load(run.verifier.local_dir, device=device, dtype=opts.dtype,
                                     attn_implementation=opts.attn_implementation)
    except SpecconvError as e:
        return f"the torch reference cannot load the verifier: {e.message}"
    try:
        rendered = _render_all(run.prompts, runner.tokenizer)
        res = run_requests(runner, None, rendered, max_new_tokens=opts.max_new_tokens, temperature=0.0,
                           stop_token_ids=runner.stop_token_ids(), seed=opts.seed)
    except SpecconvError as e:
        return f"the torch reference cannot run: {e.message}"
    finally:
        runner.close()
    return [list(r.output_ids) for r in res]


# ------------------------------------------------------------------------------ recording
def record_section(drafter_dir: Path, section: Any) -> Any:
    """The ``validation`` section to record for this run's ``section``
    (:func:`specconv.validate.report.validation_section`): itself for a run on a server specconv
    started (or no server); for a ``--server-url`` run the section already recorded, untouched,
    with only ``remote`` set to this run (a remote run never satisfies ``push`` / ``release``,
    whose gates read the section's ``passed`` and ``files``)."""
    from ..record import read_record

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
            "max_new_tokens", "temperature", "specconv_version")
    recorded["remote"] = {**{k: summary.get(k) for k in keep if k in summary}, "vllm_serve": serve,
                          "identity": REMOTE_LABEL}
    return recorded
