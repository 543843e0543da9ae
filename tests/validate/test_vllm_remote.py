"""``validate --backend vllm --server-url`` against a loopback stand-in for a running vLLM
server (issue 16 items 2–6): it serves the real shapes — ``/v1/models`` (``id``, ``root``),
``/version``, ``/metrics`` as Prometheus text with vLLM's own counter names (``_total`` and
``_created`` samples, ``engine`` / ``position`` / ``finished_reason`` labels, vLLM 0.32
``vllm/v1/spec_decode/metrics.py``, ``vllm/v1/metrics/loggers.py``) and
``/v1/completions`` (a token-id ``prompt``) with ``token_ids``, ``prompt_token_ids``, ``usage`` and
``system_fingerprint``, and, when told to, the dev-mode ``/server_info?config_format=json`` with its
``speculative_config`` (vLLM 0.32 / 0.33 ``entrypoints/serve/dev/server_info``). The real server
is in tests/validate/test_vllm_serve.py (TP 3)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from cli_runner import validate
from vllm_double import FakeVllm, serve_fake


@pytest.fixture
def fake():
    servers = []

    def start(**kw) -> tuple[FakeVllm, str]:
        state = FakeVllm(**kw)
        srv, url = serve_fake(state)
        servers.append(srv)
        return state, url

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


@pytest.fixture(scope="module")
def converted(tmp_path_factory, bundled_drafter) -> Path:
    """A copy of the bundled drafter's conversion for this module (a measuring run writes its record and card)."""
    import shutil

    return Path(shutil.copytree(bundled_drafter, tmp_path_factory.mktemp("remote") / "dflash"))


def _validate(d: Path, verifier: Path, tmp_path: Path, *args: str, env: dict | None = None):
    r = validate(d, verifier, "--backend", "vllm", "--num-prompts", "3", "--max-new-tokens", "8",
                 "--report-dir", tmp_path / "rep", *args, env=env, catch=True)
    return r, r.json


def _snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


@pytest.mark.slow
def test_server_url_run_measures_records_apart_and_redacts(fake, converted, smollm2_dir, tmp_path):
    state, url = fake(key="sk-test-123")
    _, ref = fake(spec=False)  # the plain reference endpoint (same greedy outputs)
    userinfo = url.replace("http://", "http://alice:pw@")
    r, out = _validate(converted, smollm2_dir, tmp_path, "--server-url", userinfo, "--api-key-env", "MY_KEY",
                       "--reference-url", ref, "--max-concurrency", "2", env={"MY_KEY": "sk-test-123"})
    assert r.code == 0, r.output
    assert out["gates"] == {"structure": True, "acceptance": True, "lossless": True}
    # 3 drafts of K=7 per request, 2 accepted: tau = 1 + 6 / 9
    assert out["num_drafts"] == 9 and out["acceptance_length"] == pytest.approx(1 + 6 / 9)
    serve = {k: v for k, v in out["vllm_serve"].items() if k != "server"}
    assert serve == {"distribution": None, "version": "0.32.0", "tau": pytest.approx(1 + 6 / 9), "mode": "remote",
                     "tensor_parallel_size": 3, "pipeline_parallel_size": None, "data_parallel_size": None,
                     "executor_backend": None, "engine_args": None, "concurrency": 2,
                     "other_traffic": {"requests": 0.0, "generation_tokens": 0.0},
                     "url": url.replace("http://", "http://***@"), "runner": "unknown", "draft_sample_method": None,
                     "rejection_sample_method": None, "prompt_tokens": "ids", "draft_tokens_per_step": 7.0}
    # requests went to the /v1/models id with the key; the warm-up came before the measured window
    posts = [s for s in state.seen if s[0] == "POST"]
    assert len(posts) == 4 and all(a == "Bearer sk-test-123" for _, _, a in posts)
    assert {p for _, p, _ in posts} == {"/v1/completions"}
    # the server got the run's one rendering (the torch reference of G4 decodes the same ids)
    from specconv.validate.run import rendered_digest

    # (two requests in flight: the server may see them in either order)
    seen = state.prompts[1:]
    assert any(rendered_digest(list(zip(out["prompts"]["ids"], order,
                                        strict=True))) == out["prompts"]["rendered_sha256"]
               for order in itertools.permutations(seen))
    assert sorted(len(q) for q in seen) == sorted(out["prompts"]["token_counts"])
    rep = (tmp_path / "rep" / "validation.json").read_text()
    rec = (converted / "specconv.json").read_text()
    for text in (rep, rec, r.stdout, (converted / "README.md").read_text()):
        assert "sk-test-123" not in text and "alice" not in text and ":pw@" not in text
    v = json.loads(rec)["validation"]
    assert v.get("passed") is None and "files" not in v  # nothing for push/release to accept
    assert v["remote"]["vllm_serve"]["mode"] == "remote" and v["remote"]["passed"] is True
    assert "endpoint not started by specconv; drafter identity not verified" in (converted / "README.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("kw, code, message", [
    ({"root": "Qwen/Qwen3-8B"}, "vllm_wrong_model",
     "serves served-name (root Qwen/Qwen3-8B), not the drafter's verifier"),
    ({"spec": False}, "vllm_no_spec_decode", "has no vllm:spec_decode_* counters"),
    ({"k": 4}, "vllm_wrong_k", "drafts 4 tokens per draft (12 / 3), the drafter's K is 7"),
])
def test_contradictions_are_exit_3_and_write_nothing(fake, converted, smollm2_dir, tmp_path, kw, code, message):
    before = _snapshot(converted)
    _, url = fake(**kw)
    r, out = _validate(converted, smollm2_dir, tmp_path, "--server-url", url)
    assert r.code == 3, r.output
    assert out["error"] == code and message in out["message"]
    assert _snapshot(converted) == before and not (tmp_path / "rep").exists()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["synthetic", "fly"])
def test_a_lossy_or_synthetic_rejection_method_is_refused(fake, converted, smollm2_dir, tmp_path, method):
    """A server reporting ``rejection_sample_method: synthetic`` (accepts drafts at a set rate) or
    ``fly`` (lossy) is refused before any request: τ would not be the drafter's."""
    before = _snapshot(converted)
    state, url = fake(server_info={"method": "dflash", "draft_sample_method": "greedy",
                                   "rejection_sample_method": method})
    r, out = _validate(converted, smollm2_dir, tmp_path, "--server-url", url)
    assert r.code == 3, r.output
    assert out["error"] == "vllm_lossy_rejection" and f"rejection_sample_method {method!r}" in out["message"]
    assert not [s for s in state.seen if s[0] == "POST"]  # refused before the warm-up
    assert _snapshot(converted) == before and not (tmp_path / "rep").exists()


@pytest.mark.slow
def test_reported_sample_methods_are_recorded(fake, converted, smollm2_dir, tmp_path):
    _, url = fake(server_info={"draft_sample_method": "probabilistic", "rejection_sample_method": "standard"})
    _, ref = fake(spec=False)
    r, out = _validate(converted, smollm2_dir, tmp_path, "--server-url", url, "--reference-url", ref)
    assert r.code == 0, r.output
    serve = out["vllm_serve"]
    assert (serve["draft_sample_method"], serve["rejection_sample_method"], serve["runner"]) == (
        "probabilistic", "standard", "unknown")
    rec = json.loads((converted / "specconv.json").read_text())["validation"]["remote"]
    assert rec["vllm_serve"]["rejection_sample_method"] == "standard"
    assert rec["chat_template"]["source"] == "verifier" and rec["chat_template"]["sha256"]


@pytest.mark.slow
def test_a_server_that_saw_other_prompt_tokens_fails_g3(fake, converted, smollm2_dir, tmp_path):
    """The server answers with prompt ids other than those specconv rendered and sent: G3 fails."""
    _, url = fake(prompt_echo=[7, 7, 7])
    _, ref = fake(spec=False)
    r, out = _validate(converted, smollm2_dir, tmp_path, "--server-url", url, "--reference-url", ref)
    assert r.code == 4, r.output
    g3 = next(g for g in out["gate_results"] if g["name"] == "acceptance")
    assert g3["passed"] is False
    assert any("vLLM did not see specconv's prompt tokens" in e and "differs from specconv's at token 0" in e
               for e in g3["errors"]), g3["errors"]


@pytest.mark.slow
def test_unreachable_url_is_exit_3(converted, smollm2_dir, tmp_path):
    from specconv.engines.local_server import free_port

    before = _snapshot(converted)
    r, out = _validate(converted, smollm2_dir, tmp_path, "--server-url", f"http://127.0.0.1:{free_port()}")
    assert r.code == 3 and out["error"] == "vllm_unreachable", r.output
    assert _snapshot(converted) == before


@pytest.mark.slow
def test_missing_key_is_an_auth_refusal(fake, converted, smollm2_dir, tmp_path):
    _, url = fake(key="k")
    r, out = _validate(converted, smollm2_dir, tmp_path, "--server-url", url)
    assert r.code == 3 and "HTTP 401" in out["message"] and "--api-key-env" in out["hint"], r.output
    r, out = _validate(converted, smollm2_dir, tmp_path, "--server-url", url, "--api-key-env", "UNSET_VAR_I16",
                       env={"UNSET_VAR_I16": ""})
    assert r.code == 2 and "$UNSET_VAR_I16 is not set" in out["message"]


@pytest.mark.slow
def test_other_traffic_fails_g3_unless_allowed(fake, converted, smollm2_dir, tmp_path):
    _, url = fake(extra_requests=1)
    _, ref = fake(spec=False)
    r, out = _validate(converted, smollm2_dir, tmp_path, "--server-url", url, "--reference-url", ref)
    assert r.code == 4, r.output
    g3 = next(g for g in out["gate_results"] if g["name"] == "acceptance")
    assert g3["details"]["other_traffic"] == {"requests": 3.0, "generation_tokens": 30.0}
    assert "other traffic" in g3["errors"][0] and "--allow-shared-server" in g3["errors"][0]
    r, out = _validate(converted, smollm2_dir, tmp_path, "--server-url", url, "--reference-url", ref,
                       "--allow-shared-server")
    assert r.code == 0, r.output
    assert out["vllm_serve"]["other_traffic"] == {"requests": 3.0, "generation_tokens": 30.0}


@pytest.mark.slow
def test_lossless_against_a_reference_that_disagrees(fake, converted, smollm2_dir, tmp_path):
    _, url = fake()
    _, ref = fake(spec=False, output=[504, 9, 9, 9])
    r, out = _validate(converted, smollm2_dir, tmp_path, "--server-url", url, "--reference-url", ref)
    assert r.code == 4, r.output
    g4 = next(g for g in out["gate_results"] if g["name"] == "lossless")
    assert g4["details"]["agreement"] == pytest.approx(0.25) and g4["details"]["reference"] == "reference_url"
    assert "first divergence at token 1" in g4["errors"][0]


def test_fingerprint_sizes_only_when_said():
    from specconv.engines.vllm.remote import fingerprint_sizes

    assert fingerprint_sizes("vllm-0.32.0-tp3-pp2-0123abcd") == {
        "tensor_parallel_size": 3, "pipeline_parallel_size": 2, "data_parallel_size": None}
    assert fingerprint_sizes("vllm-0.32.0-0123abcd") == {
        "tensor_parallel_size": None, "pipeline_parallel_size": None, "data_parallel_size": None}
    assert fingerprint_sizes(None)["tensor_parallel_size"] is None


def test_available_memory_reads_memavailable(tmp_path):
    from specconv.validate.served import available_memory

    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       24683584 kB\nMemFree:          900000 kB\nMemAvailable:   20341356 kB\n")
    assert available_memory(str(info)) == 20341356 * 1024  # not MemFree: the page cache is reclaimable
    assert available_memory(str(tmp_path / "absent")) > 0


def test_fewer_drafts_per_step_are_measured_only_when_comparing():
    """``validate --compare`` measures a server drafting fewer than K tokens per step (the comparison
    judges it: drafting cut short); a plain run refuses it, and more than K is refused either way."""
    from specconv.engines.vllm.remote import Endpoint, check_speculating
    from specconv.errors import InvalidInputError

    ep = Endpoint("http://127.0.0.1:9")
    before = {"spec_counters": {"x": 1.0}, "num_drafts": 2.0, "num_draft_tokens": 14.0}
    fewer = {**before, "num_drafts": 5.0, "num_draft_tokens": 17.0}
    more = {**before, "num_drafts": 5.0, "num_draft_tokens": 38.0}
    assert check_speculating(ep, before, {**before, "num_drafts": 5.0, "num_draft_tokens": 35.0}, 7) == 7
    with pytest.raises(InvalidInputError) as e:
        check_speculating(ep, before, fewer, 7)
    assert e.value.code == "vllm_wrong_k"
    assert check_speculating(ep, before, fewer, 7, allow_fewer=True) == 1
    with pytest.raises(InvalidInputError) as e:
        check_speculating(ep, before, more, 7, allow_fewer=True)
    assert e.value.code == "vllm_wrong_k" and "drafts 8 tokens per draft" in str(e.value)
