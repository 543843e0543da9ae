"""SGLang 0.5.23's own loader takes specconv's SGLang exports strictly: tensors and meaning.

Every export — the bundled drafter's conversion, the DFlash fixture formats, full-vocabulary
DSpark drafts (anchor-first, 1+N, without a confidence head), drafters saved by speculators
0.9.0, a mixed full / sliding-window layout — and the bundled z-lab original as it ships (the
oracle: SGLang loads z-lab's own layout) load in ONE subprocess of ``.venv-sglang`` (its import
costs 20–150 s), shared with ``test_sglang_runner``'s checks (``sglang_batch.py``). Two copies
whose config was edited after the export load without a missing tensor but resolve other
layers / another mask token: the meaning check fails them. Then
``validate --sglang-load-check`` end to end on a tiny z-lab drafter (a second subprocess), its
record kept by ``export sglang``, the card's SGLang line, and ``push --sglang-repo-id`` of both
repos to the loopback Hub double (a failed second push reports the first).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

import pytest
import sglang_batch

import fixtures_dflash as fd
import fixtures_dspark as fs
from cli_runner import invoke

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "smollm2-dflash-b8"
SMOL_HUB = "HuggingFaceTB/SmolLM2-135M-Instruct"
SGLANG_PY = REPO / ".venv-sglang" / "bin" / "python"
DFLASH_FORMATS = ("zlab_dflash", "specforge_dflash", "modelopt_dflash", "nemo_dflash", "muse_glimmer_dflash")

pytestmark = [pytest.mark.sglang, pytest.mark.slow,
              pytest.mark.skipif(not SGLANG_PY.is_file(), reason="no .venv-sglang: build it with `make sglang-venv`")]


def _export(d: Path, verifier: Path, hub: str) -> dict:
    from specconv.engines.sglang.export import export_sglang_dir

    return {"dir": d, "verifier": verifier, "hub": hub, "export": export_sglang_dir(d, verifier=str(verifier))}


def _edited_copy(src: Path, dst: Path, **config) -> Path:
    """An export whose config.json was changed after specconv wrote it (its record unchanged)."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(config)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst


def _mixed(conv: Path, dst: Path) -> Path:
    shutil.copytree(conv, dst, ignore=shutil.ignore_patterns("sglang"))
    cfg = json.loads((dst / "config.json").read_text())
    cfg["sliding_window_non_causal"] = False
    cfg["transformer_layer_config"].update(layer_types=["full_attention", "sliding_attention"], sliding_window=32,
                                           use_sliding_window=True)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst


def _drafters(root: Path, smol: Path, v: Path) -> dict[str, dict]:
    out = {"bundled": _export(Path(fd.api_convert(EXAMPLE, smol, root / "smol", name=SMOL_HUB).output), smol,
                              SMOL_HUB)}
    for fmt in DFLASH_FORMATS:
        conv = fd.api_convert(fd.make_source(root / "src", fmt, verifier_dir=v), v, root / "out" / fmt).output
        out[fmt] = _export(Path(conv), v, fd.HUB)
    out["mixed_layers"] = _export(_mixed(root / "out" / "zlab_dflash", root / "mixed"), v, fd.HUB)
    for name, kw in (("dspark", {}), ("dspark_1n", {"extra_cfg": {"sample_from_anchor": False}}),
                     ("dspark_no_confidence", {"enable_confidence_head": False})):
        src = fs.make_deepspec_dspark(root / "src" / name, v, target_layer_ids=(0, 2, 4), **kw)
        out[name] = _export(Path(fd.api_convert(src, v, root / "out" / name).output), v, fd.HUB)
    try:
        import speculators  # noqa: F401

        import fixtures_peagle as fp
    except ImportError:
        return out
    for name, alg, kw in (("speculators_dflash", "dflash", {}),
                          ("speculators_dspark", "dspark", {"sample_from_anchor": True}),
                          ("speculators_dspark_1n", "dspark", {"sample_from_anchor": False})):
        conv = fd.api_convert(fp.trainer_save_dir(root / "save" / name, {0: fp.build_speculators_block(
            v, root / "ref" / name, alg, **kw)}), v, root / "out" / name).output
        out[name] = _export(Path(conv), v, fd.HUB)
    return out


def sglang_jobs(root: Path, smollm2_dir: Path, tiny_verifier_dir: Path):
    """The runner's checks of every export, the broken copies and the oracle, and how the
    results become ``checked`` (``tests/sglang_check/sglang_batch.py`` runs them with the room's
    other checks in one subprocess)."""
    from specconv.engines.sglang.check import export_job, judge
    from specconv.engines.sglang.layout import LAUNCHER, launch_argv

    good = _drafters(root, smollm2_dir, tiny_verifier_dir)
    bundled = good["bundled"]["dir"] / "sglang"
    broken = {"other_layers": _edited_copy(bundled, root / "b1", dflash_config={"mask_token_id": 16,
                                                                               "target_layer_ids": [2, 15, 28]}),
              "other_mask": _edited_copy(bundled, root / "b2", dflash_config={"mask_token_id": 17,
                                                                             "target_layer_ids": [1, 14, 27]})}
    entries = {}
    for name, g in good.items():
        argv = launch_argv(g["hub"], str(g["dir"] / "sglang"), g["export"].algorithm)
        assert argv[:3] == list(LAUNCHER)
        entries[name] = export_job(g["dir"] / "sglang", g["verifier"], argv[3:])
    for name, d in broken.items():
        entries[name] = export_job(d, smollm2_dir)
    jobs = [job for job, _, _ in entries.values()] + [{"dir": str(EXAMPLE), "verifier": str(smollm2_dir), "env": {}}]

    def finish(result):
        out = {name: {**good.get(name, {}), "payload": judge(result["env"], r, meta["expected"], files)}
               for (name, (_, meta, files)), r in zip(entries.items(), result["results"], strict=False)}
        out["zlab_original"] = {"raw": result["results"][-1]}
        return out, result["env"]

    return jobs, finish


@pytest.fixture(scope="module")
def checked(request):
    """``{name: {dir, export, payload}}`` for every export, the broken copies and the oracle."""
    return sglang_batch.share(request, __name__)


GOOD = ("bundled", *DFLASH_FORMATS, "mixed_layers", "dspark", "dspark_1n", "dspark_no_confidence",
        "speculators_dflash", "speculators_dspark", "speculators_dspark_1n")


def _good(checked, name):
    runs, _ = checked
    if name not in runs:
        pytest.skip(f"{name}: speculators 0.9.0 not installed")
    return runs[name]


@pytest.mark.parametrize("name", GOOD)
def test_every_export_loads_strictly_and_resolves_as_the_speculators_dir(checked, name):
    g = _good(checked, name)
    p = g["payload"]
    assert p["ok"], (p["errors"], p["mismatches"])
    assert p["unfilled_params"] == [] and p["unconsumed_tensors"] == [] and p["mismatches"] == []
    assert p["class"] == g["export"].architecture and (p["distribution"], p["version"]) == ("sglang", "0.5.23")
    assert p["files"] == g["export"].files  # the bytes that were loaded are the export's
    assert set(p["stubs"]) <= {"torchvision", "vllm._custom_ops"}
    # SGLang captures exactly the verifier layers the Speculators dir names
    spec = json.loads((g["dir"] / "config.json").read_text())
    assert p["resolved"]["capture_layer_inputs"] == spec["aux_hidden_state_layer_ids"]


def test_the_bundled_export_resolves_like_the_zlab_original(checked):
    runs, _ = checked
    ours, oracle = runs["bundled"]["payload"], runs["zlab_original"]["raw"]
    assert oracle["ok"] and oracle["unconsumed_tensors"] == [] and oracle["unfilled_params"] == []
    assert ours["checkpoint_tensors"] == oracle["checkpoint_tensors"] == 25
    keys = ("captured_layer_ids", "block_size", "block_slots", "drafts_per_block", "mask_token_id", "draft_rows",
            "sample_from_anchor", "layer_causal", "sliding_window_left", "num_target_layers")
    assert {k: ours["resolved"][k] for k in keys} == {k: oracle["resolved"][k] for k in keys}
    assert ours["resolved"]["captured_layer_ids"] == [1, 14, 27]
    assert (ours["resolved"]["block_size"], ours["resolved"]["mask_token_id"]) == (8, 16)


@pytest.mark.parametrize("name", ("bundled", "zlab_dflash", "speculators_dflash"))
def test_sglangs_dflash_path_drafts_block_rows_1_onward(checked, name):
    """The block layout SGLang's DFlash path assumes, from running its own draft sampler
    (srt/speculative/dflash_worker_v2.py): rows 1..B-1, i.e. sample_from_anchor false —
    the one value the description lets through."""
    from specconv.format.algorithms import algorithm

    r = _good(checked, name)["payload"]["resolved"]
    assert r["draft_rows"] == list(range(1, r["block_slots"]))
    assert r["sample_from_anchor"] is algorithm("dflash").sglang.sample_from_anchor is False


def test_dspark_block_layouts_and_heads(checked):
    runs, _ = checked
    anchor, one_n, bare = (runs[n]["payload"] for n in ("dspark", "dspark_1n", "dspark_no_confidence"))
    assert (anchor["resolved"]["block_slots"], anchor["resolved"]["drafts_per_block"]) == (4, 4)
    assert (one_n["resolved"]["block_slots"], one_n["resolved"]["drafts_per_block"]) == (4, 3)
    assert anchor["resolved"]["sample_from_anchor"] is True and one_n["resolved"]["sample_from_anchor"] is False
    for p in (anchor, one_n):  # the confidence head loads only with the env the card prints
        assert p["env"] == {"SGLANG_RAGGED_VERIFY_MODE": "compact"} and p["resolved"]["confidence_head"] is True
    assert bare["env"] == {} and bare["resolved"]["confidence_head"] is False  # SGLang's default, static
    assert anchor["checkpoint_tensors"] == bare["checkpoint_tensors"] + 2  # confidence weight + bias
    for p in (anchor, one_n, bare):  # the verifier's own embedding / LM head: SGLang takes them from the target
        assert p["target_supplied_skipped"] == ["embed_tokens.weight", "lm_head.weight"]


def test_mixed_full_and_causal_sliding_layers_keep_their_causality(checked):
    r = checked[0]["mixed_layers"]["payload"]["resolved"]
    assert r["layer_causal"] == [False, True] and r["sliding_window_left"] == [-1, 31]


@pytest.mark.parametrize("name, key", [("other_layers", "captured_layer_ids"), ("other_mask", "mask_token_id")])
def test_a_load_that_reads_another_meaning_fails(checked, name, key):
    p = checked[0][name]["payload"]
    assert p["errors"] == [] and p["unconsumed_tensors"] == []  # every tensor loaded ...
    assert not p["ok"] and any(m.startswith(key + ":") for m in p["mismatches"])  # ... but not the same drafter


@pytest.mark.parametrize("name", ("bundled", "dspark"))
def test_sglangs_parser_reads_the_serve_line_the_card_prints(checked, name):
    from specconv.engines.card import write_local_card
    from specconv.engines.sglang.export import record_sglang_check

    g = checked[0][name]
    p = g["payload"]
    assert p["serve_args"]["speculative_algorithm"] == g["export"].speculative_algorithm
    assert p["serve_args"]["model_path"] == g["hub"] and p["serve_args"]["ragged_verify_mode_known"]
    record_sglang_check(g["dir"], g["export"], p)
    card = write_local_card(g["dir"]).read_text()
    words = shlex.split(card.split("## SGLang", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", ""))
    env = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))
    argv = [w for w in words if w not in {f"{k}={v}" for k, v in env.items()}]
    assert env == p["env"] and env.get("SGLANG_RAGGED_VERIFY_MODE") == p["serve_args"]["ragged_verify_mode"]
    assert argv[argv.index("--model-path") + 1] == p["serve_args"]["model_path"]
    assert argv[argv.index("--speculative-algorithm") + 1] == p["serve_args"]["speculative_algorithm"]
    assert argv[argv.index("--speculative-draft-model-path") + 1] == "./sglang"  # the local card: DIR's export


# ------------------------------------------------------------------ validate → export → push, end to end
@pytest.fixture(scope="module")
def validated(tmp_path_factory, smollm2_dir):
    """A tiny z-lab DFlash (written by z-lab's dflash) converted with a Hub verifier name and
    validated with ``--sglang-load-check``, from another directory with a relative ``--verifier``
    that looks like a Hub id (``tiny/verifier``; issue 24)."""
    pytest.importorskip("dflash")
    from conftest import make_validate_set

    root = tmp_path_factory.mktemp("sglang_validate")
    tiny = make_validate_set(root / "tiny", smollm2_dir)
    d = root / "drafter"
    fd.api_convert(tiny["zlab"], tiny["verifier"], d, name="org/tiny-llama")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        r = invoke("validate", "drafter", "--verifier", "tiny/verifier", "--prompts", "tiny/prompts.jsonl",
                   "--num-prompts", "1", "--max-new-tokens", "4", "--device", "cpu",
                   "--report-dir", d / "report", "--sglang-load-check")
    return d, r.code, json.loads(r.stdout)


def test_validate_sglang_load_check_records_under_export_not_validation(validated):
    from specconv.record import read_record

    d, code, report = validated
    assert code == 0, report.get("message")
    assert report["sglang_load"]["ok"] and report["sglang_load"]["class"] == "DFlashDraftModel"
    rec = read_record(d)
    assert rec.validation.passed is True and "sglang" not in rec.validation.model_dump()
    exp = rec.export.sglang
    assert exp.check["ok"] and exp.output is None  # checked in a temp dir; DIR holds no export yet
    assert exp.check["files"] == exp.files and exp.check["resolved"]["capture_layer_inputs"] == [1, 3]
    assert "## SGLang" not in (d / "README.md").read_text()  # no export in DIR: no serve line


def test_export_keeps_the_check_of_the_same_bytes_and_push_publishes_both(validated, tmp_path):
    from test_publish import TOKEN, _cli

    from hub_double import HubDouble
    from specconv.record import read_record

    d, code, _ = validated
    assert code == 0
    r = invoke("export", "sglang", d)
    assert r.code == 0, r.stdout
    assert read_record(d).export.sglang.check["ok"]  # same bytes: the check is kept
    assert "## SGLang" in (d / "README.md").read_text()
    double = HubDouble(token=TOKEN).start()
    try:
        double.fault("POST", r"org/tiny-sglang/commit", 500, count=-1)
        code, out, text = _cli(tmp_path, double, "push", d, "--repo-id", "org/tiny", "--sglang-repo-id",
                               "org/tiny-sglang", "--max-retries", "0")
        assert code == 7, text[-2000:]  # the second push failed; the first is reported
        assert out["status"] == "published" and out["commit_oid"] == double.repos["org/tiny"].sha
        assert out["sglang"]["repo_id"] == "org/tiny-sglang" and out["commit_oid"][:12] in out["message"]
        double.faults.clear()
        code, out, text = _cli(tmp_path, double, "push", d, "--repo-id", "org/tiny", "--sglang-repo-id",
                               "org/tiny-sglang")
        assert code == 0, text[-2000:]
        spec, sgl = double.repos["org/tiny"].files, double.repos["org/tiny-sglang"].files
    finally:
        double.stop()
    assert out["status"] == "unchanged" and out["sglang"]["status"] == "published"
    assert not [f for f in spec if f.startswith("sglang/")]  # the Speculators repo never holds it
    assert sgl["model.safetensors"] == (d / "model.safetensors").read_bytes()
    assert json.loads(sgl["config.json"])["architectures"] == ["DFlashDraftModel"]
    card = sgl["README.md"].decode()
    assert ("[`org/tiny`](https://huggingface.co/org/tiny)" in card
            and "--speculative-draft-model-path org/tiny-sglang" in card)
    assert "https://huggingface.co/org/tiny-sglang" in spec["README.md"].decode()  # the Speculators card names it
    assert read_record(d).publish.model_dump()["sglang"]["repo_id"] == "org/tiny-sglang"
    # every card's SGLang line, as printed, through SGLang's own parser (issue 24, "Done when")
    lines = {"local Speculators card": (d / "README.md").read_text(),
             "pushed Speculators card": spec["README.md"].decode(),
             "SGLang repo card": card}
    parsed = _sglang_parse(lines)
    drafts = {"local Speculators card": "./sglang", "pushed Speculators card": "org/tiny-sglang",
              "SGLang repo card": "org/tiny-sglang"}
    for name, got in parsed.items():
        assert "error" not in got, (name, got)
        assert (got["model_path"], got["speculative_algorithm"], got["speculative_draft_model_path"]) == (
            "org/tiny-llama", "DFLASH", drafts[name]), (name, got)


def _sglang_line(card: str) -> tuple[dict[str, str], list[str]]:
    """The card's ``python -m sglang.launch_server`` line as a shell splits it: ``(env, argv after the launcher)``."""
    from specconv.engines.sglang.layout import LAUNCHER

    (block,) = [b for b in card.split("```bash\n")[1:] if "sglang.launch_server" in b.split("```", 1)[0]]
    words = shlex.split(block.split("```", 1)[0].replace("\\\n", ""))
    i = words.index(LAUNCHER[0])
    assert words[i:i + 3] == list(LAUNCHER), words
    return dict(w.split("=", 1) for w in words[:i]), words[i + 3:]


def _sglang_parse(cards: dict[str, str]) -> dict[str, dict]:
    """Each card's SGLang line through SGLang 0.5.23's own parser (``runner.parse_serve_argv``:
    ``ServerArgs.add_cli_args``), in one subprocess of ``.venv-sglang``."""
    import subprocess

    jobs = {name: _sglang_line(text) for name, text in cards.items()}
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import runner\n"
            "out = {}\n"
            "for name, (env, argv) in json.loads(sys.argv[2]).items():\n"
            "    try: out[name] = runner.parse_serve_argv(argv, env)\n"
            "    except BaseException as e: out[name] = {'error': f'{type(e).__name__}: {e}'}\n"
            "print(json.dumps(out))")
    p = subprocess.run([str(SGLANG_PY), "-c", code, str(REPO / "specconv" / "engines" / "sglang"), json.dumps(jobs)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])
