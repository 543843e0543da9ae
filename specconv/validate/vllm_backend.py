"""``--backend vllm``: measure acceptance through a real ``vllm serve``.

How (speculators_format.md §8.1; validation.md §1.1):

* command line — for a **local** verifier the long form
  ``vllm serve <verifier> --speculative-config '{"model": <drafter dir>, "method": …,
  "num_speculative_tokens": K}'`` with ``method`` = ``eagle3`` + ``"parallel_drafting":
  true`` for P-EAGLE, ``dflash`` for DFlash, ``dspark`` for DSpark, and K =
  ``proposal_methods[0].speculative_tokens``; the short form ``vllm serve <drafter dir>``
  only when the recorded ``verifier.name_or_path`` is a Hub repo id and that id is what
  was passed as ``--verifier`` (vLLM ≥ 0.33 refuses local verifier paths there);
* counters — ``vllm:spec_decode_num_drafts``, ``…_num_draft_tokens``,
  ``…_num_accepted_tokens`` and the per-position vector
  ``…_num_accepted_tokens_per_pos{position="i"}`` are scraped from ``/metrics``
  (Prometheus text; counters carry a ``_total`` suffix, ``_created`` samples are
  ignored; label sets such as several engines are summed) before and after the
  workload, and the differences give the same metrics as the torch harness.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import time
from pathlib import Path
from typing import Any, Sequence

from ..errors import InvalidInputError

log = logging.getLogger("specconv.validate")

SERVED_NAME = "specconv-validate"

COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"

_LINE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\d+)?\s*$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def vllm_method(algorithm: str) -> dict[str, Any]:
    """``--speculative-config`` method keys for a Speculators algorithm (§8.1)."""
    if algorithm == "peagle":
        return {"method": "eagle3", "parallel_drafting": True}
    if algorithm in ("dflash", "dspark"):
        return {"method": algorithm}
    raise InvalidInputError(f"no vLLM method for speculators_model_type {algorithm!r}")


def build_serve_command(
    drafter_dir: str | Path,
    verifier_spec: str,
    *,
    port: int = 8011,
    dtype: str | None = None,
    seed: int = 0,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """Build the ``vllm serve`` argv for a Speculators drafter.

    Args:
        drafter_dir: the Speculators directory.
        verifier_spec: ``--verifier`` as given (local dir or Hub id).
        port: HTTP port.
        dtype: ``--dtype`` for vLLM (None = vLLM's default, the target's dtype).
        seed: ``--seed``.
        extra_args: appended verbatim.

    Raises:
        InvalidInputError: unreadable config or unknown algorithm.
    """
    from ..speculators import is_hub_repo_id, load_config

    d = Path(drafter_dir)
    cfg = load_config(d)
    algo = cfg.speculators_model_type
    k = int(cfg.speculative_tokens)
    recorded = cfg.speculators_config.verifier.name_or_path
    short = bool(recorded) and is_hub_repo_id(recorded) and verifier_spec == recorded
    if short:
        cmd = ["vllm", "serve", str(d)]
    else:
        spec_cfg = {"model": str(d.resolve()), **vllm_method(algo), "num_speculative_tokens": k}
        cmd = ["vllm", "serve", str(verifier_spec), "--speculative-config", json.dumps(spec_cfg, sort_keys=True)]
    cmd += ["--served-model-name", SERVED_NAME, "--port", str(port), "--seed", str(seed)]
    if dtype:
        cmd += ["--dtype", dtype]
    cmd += list(extra_args)
    return cmd


def parse_spec_counters(text: str) -> dict[str, Any]:
    """Parse the spec-decode counters out of Prometheus exposition text.

    Returns:
        ``{num_drafts, num_draft_tokens, num_accepted_tokens, accepted_per_pos: list}``
        (floats; summed over label sets; ``accepted_per_pos`` ordered by ``position``).
    """
    out: dict[str, Any] = {v: 0.0 for v in COUNTERS.values()}
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name = m.group("name")
        if name.endswith("_created"):
            continue
        base = name[: -len("_total")] if name.endswith("_total") else name
        try:
            val = float(m.group("value"))
        except ValueError:
            continue
        if base in COUNTERS:
            out[COUNTERS[base]] += val
        elif base == PER_POS:
            labels = dict(_LABEL.findall(m.group("labels") or ""))
            pos = int(labels.get("position", 0))
            per_pos[pos] = per_pos.get(pos, 0.0) + val
    out["accepted_per_pos"] = [per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)] if per_pos else []
    return out


def diff_counters(before: dict, after: dict) -> dict:
    """``after − before`` for the counters of :func:`parse_spec_counters`."""
    out = {k: after[k] - before.get(k, 0.0) for k in COUNTERS.values()}
    a, b = after.get("accepted_per_pos", []), before.get("accepted_per_pos", [])
    out["accepted_per_pos"] = [a[i] - (b[i] if i < len(b) else 0.0) for i in range(len(a))]
    return out


def metrics_from_vllm(before: dict, after: dict) -> dict:
    """τ, α, p_i, c_i from two counter scrapes (same definitions as the torch harness)."""
    from .metrics import metrics_from_counts

    d = diff_counters(before, after)
    m = metrics_from_counts(d["num_drafts"], d["num_draft_tokens"], d["num_accepted_tokens"], d["accepted_per_pos"])
    m["tau_pooled"] = m["acceptance_length"]
    return m


def _get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (localhost only)
            return r.status, r.read().decode()
    except (urllib.error.URLError, OSError):
        return 0, ""


def run_vllm_validation(drafter_dir: Path, verifier, prompts: Sequence[Any], opts, *, startup_timeout: float = 900.0) -> dict:
    """Start ``vllm serve``, send ``prompts`` through the OpenAI API, return metrics.

    Raises:
        InvalidInputError: vLLM or CUDA missing, the server failing to start.
    """
    import importlib.util
    import shutil
    import tempfile

    if importlib.util.find_spec("vllm") is None or shutil.which("vllm") is None:
        raise InvalidInputError("--backend vllm needs vLLM installed (pip install vllm) and a CUDA GPU")
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_cuda = False
    if not has_cuda:
        raise InvalidInputError("--backend vllm needs a CUDA GPU")
    from openai import OpenAI

    from .report import device_info

    cmd = build_serve_command(drafter_dir, verifier.spec, port=opts.vllm_port, dtype=opts.dtype, seed=opts.seed)
    base = f"http://127.0.0.1:{opts.vllm_port}"
    logf = tempfile.NamedTemporaryFile(prefix="specconv-vllm-", suffix=".log", delete=False)
    log.info("starting: %s (log %s)", " ".join(cmd), logf.name)
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT)
    try:
        t0 = time.monotonic()
        while True:
            if proc.poll() is not None:
                tail = Path(logf.name).read_text(errors="replace")[-3000:]
                raise InvalidInputError(f"vllm serve exited with {proc.returncode}:\n{tail}")
            if _get(base + "/health", 5)[0] == 200:
                break
            if time.monotonic() - t0 > startup_timeout:
                raise InvalidInputError(f"vllm serve did not become healthy in {startup_timeout:.0f} s (log {logf.name})")
            time.sleep(2)
        dev = device_info("cuda")
        before = parse_spec_counters(_get(base + "/metrics")[1])
        client = OpenAI(base_url=base + "/v1", api_key="EMPTY")
        completion_tokens, wall = 0, 0.0
        for p in prompts:
            ts = time.perf_counter()
            r = client.chat.completions.create(
                model=SERVED_NAME,
                messages=p.messages,
                max_tokens=opts.max_new_tokens,
                temperature=opts.temperature,
                seed=opts.seed,
            )
            wall += time.perf_counter() - ts
            completion_tokens += (r.usage.completion_tokens if r.usage else 0)
        time.sleep(1.0)  # counters are published asynchronously
        after = parse_spec_counters(_get(base + "/metrics")[1])
        m = metrics_from_vllm(before, after)
        m.update(
            {
                "n_requests": len(prompts),
                "n_output_tokens": completion_tokens,
                "request_ms_per_token": (wall * 1e3 / completion_tokens) if completion_tokens else None,
                "device": dev,
                "server": {"command": cmd, "log": logf.name},
                "convention": "vLLM counters: tau = 1 + accepted/num_drafts",
            }
        )
        return m
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        logf.close()
