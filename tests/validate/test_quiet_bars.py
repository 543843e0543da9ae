"""Library progress bars only on a TTY (README, docs/validate.md): loading the verifier with
stderr captured prints no tqdm bar (transformers' ``Loading weights ... 272/272``), whoever
loads it (``validate``, ``release``, a library caller)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

_LOAD = ("import sys; from specconv.validate.verifier_runner import VerifierRunner; "
         "VerifierRunner.load(sys.argv[1], device='cpu', dtype='float32', aux_layer_ids=[1])")


def _quiet_env() -> dict[str, str]:
    """This environment without the variables that would turn the bars off by themselves."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    return env


@pytest.mark.slow
def test_loading_the_verifier_prints_no_bar_when_stderr_is_not_a_tty(smollm2_dir):
    p = subprocess.run([sys.executable, "-c", _LOAD, str(smollm2_dir)], env=_quiet_env(), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Loading weights" not in p.stderr and "it/s]" not in p.stderr, p.stderr[-3000:]


def test_the_one_switch_quiets_a_tqdm_imported_before_or_after_it():
    """``quiet_library_bars`` (what every command and model-loading path calls) silences tqdm
    whether it was imported already (patched default) or is imported later (``TQDM_DISABLE``)."""
    before = ("import tqdm.auto, specconv.extras as x; x.quiet_library_bars(); x.quiet_library_bars(); "
              "list(tqdm.auto.tqdm(range(3), desc='bar'))")
    after = "import specconv.extras as x; x.quiet_library_bars(); import tqdm.auto; list(tqdm.auto.tqdm(range(3)))"
    for code in (before, after):
        p = subprocess.run([sys.executable, "-c", code], env=_quiet_env(), capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and p.stderr == "", p.stderr
