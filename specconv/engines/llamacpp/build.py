"""llama.cpp for this machine: the build key, the cached build dir and the build (``make llama-cpp``;
docs/engines.md, "llama.cpp build"). Standard library only.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from ...fileio import atomic_write
from ...offline import cache_dir

REPO = Path(__file__).resolve().parents[3]
REQUIREMENTS = REPO / "requirements" / "llama-cpp.txt"
CONVERTER_REQUIREMENTS = REPO / "requirements" / "llama-cpp-converter.txt"
#: The cmake configure flags (llama.cpp's own CPU build, docs/build.md upstream, plus a static link; docs/engines.md).
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
               "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_UI=OFF")
#: cmake targets built; each lands in ``bin/``.
TARGETS = ("llama-server",)
#: Files and folders of ``vendor/llama.cpp`` copied into ``convert/``.
CONVERTER_FILES = ("convert_hf_to_gguf.py", "conversion", "gguf-py", "LICENSE")
INFO = "build-info.json"
#: Part of the key: bump it when what a build writes into its dir changes.
KEY_VERSION = 1


# ------------------------------------------------------------------ key inputs
def pinned_sdist(path: Path = REQUIREMENTS) -> tuple[str, str]:
    """The one requirement line of ``requirements/llama-cpp.txt``: ``(requirement, sha256)``.

    Raises:
        ValueError: the file does not hold exactly one ``NAME==VERSION --hash=sha256:HEX`` line.
    """
    pins = converter_pins(path)
    m = re.fullmatch(r"([A-Za-z0-9._-]+==[A-Za-z0-9._+-]+)\s+--hash=sha256:([0-9a-f]{64})", pins[0]) if len(pins) == 1 else None
    if m is None:
        raise ValueError(f"{path}: expected one 'NAME==VERSION --hash=sha256:HEX' line, got {pins!r}")
    return m.group(1), m.group(2)


def converter_pins(path: Path = CONVERTER_REQUIREMENTS) -> list[str]:
    """The non-comment lines of ``path`` (default: the ``NAME==VERSION`` pins installed into ``site/``)."""
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """The sorted instruction-set flags of the first CPU in ``/proc/cpuinfo`` ([] when absent)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    m = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, re.M)
    return sorted(set(m.group(1).split())) if m else []


def compiler_versions() -> dict[str, str]:
    """First ``--version`` line of the C and C++ compilers cmake picks (``$CC``/``$CXX``, else cc/c++)."""
    out = {}
    for var, default in (("CC", "cc"), ("CXX", "c++")):
        exe = os.environ.get(var) or default
        try:
            res = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
            line = (res.stdout or res.stderr).splitlines()[0].strip() if res.returncode == 0 else ""
        except (OSError, subprocess.SubprocessError, IndexError):
            line = ""
        out[var] = f"{exe}: {line or 'not found'}"
    return out


def key_inputs() -> dict:
    """Everything the build depends on (the CPU flags as their sha256)."""
    req, sha = pinned_sdist()
    return {"key_version": KEY_VERSION, "sdist": req, "sdist_sha256": sha, "converter_pins": converter_pins(),
            "cmake_flags": list(CMAKE_FLAGS), "targets": list(TARGETS), "compilers": compiler_versions(),
            "cpu_flags_sha256": hashlib.sha256(" ".join(cpu_flags()).encode()).hexdigest()}


def build_key(inputs: dict | None = None) -> str:
    """``<version>-<16 hex>``: the sdist version and a sha256 over :func:`key_inputs`."""
    inputs = key_inputs() if inputs is None else inputs
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
    return f"{inputs['sdist'].split('==')[1]}-{digest}"


# ------------------------------------------------------------------ lookup
def cache_root() -> Path:
    """``$SPECCONV_CACHE/llama.cpp`` (created)."""
    p = cache_dir() / "llama.cpp"
    p.mkdir(parents=True, exist_ok=True)
    return p


def expected_dir() -> Path:
    """Where this machine's build lives, whether or not it has been built (nothing is created)."""
    return cache_dir() / "llama.cpp" / build_key()


def build_dir() -> Path | None:
    """This machine's complete build dir, or None when it has not been built or the requirement
    files are absent (an installed wheel carries no ``requirements/``)."""
    if not REQUIREMENTS.is_file() or not CONVERTER_REQUIREMENTS.is_file():
        return None
    d = expected_dir()
    return d if (d / INFO).is_file() and all((d / "bin" / t).is_file() for t in TARGETS) else None


def paths(d: Path) -> dict[str, Path]:
    """The files of build dir ``d`` that callers use (docs/engines.md, "llama.cpp build")."""
    return {"server": d / "bin" / "llama-server", "converter": d / "convert" / "convert_hf_to_gguf.py",
            "gguf_py": d / "convert" / "gguf-py", "site": d / "site"}


# ------------------------------------------------------------------ build
@contextmanager
def _locked(root: Path):
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(cmd: list[str], log, **kw) -> None:
    print("+ " + " ".join(cmd), file=log, flush=True)
    subprocess.run(cmd, check=True, **kw)


def fetch_sdist(work: Path, log=sys.stderr) -> Path:
    """``pip download`` the pinned sdist into ``work/dl`` and check its sha256.

    Raises:
        RuntimeError: the file's sha256 differs from ``requirements/llama-cpp.txt``.
    """
    req, sha = pinned_sdist()
    dl = work / "dl"
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
          "-r", str(REQUIREMENTS), "-d", str(dl)], log)
    (path,) = dl.glob("*.tar.gz")
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if h.hexdigest() != sha:
        raise RuntimeError(f"{path.name}: sha256 {h.hexdigest()} != {sha} pinned in {REQUIREMENTS}")
    return path


def extract_llama_cpp(sdist: Path, work: Path) -> Path:
    """Extract the sdist (tarfile's ``data`` filter); returns its ``vendor/llama.cpp``."""
    with tarfile.open(sdist) as tf:
        tf.extractall(work / "src", filter="data")
    (src,) = (work / "src").glob("*/vendor/llama.cpp")
    return src


def compile_targets(src: Path, work: Path, jobs: int, log=sys.stderr) -> Path:
    """cmake configure with :data:`CMAKE_FLAGS` and build :data:`TARGETS`; returns ``build/bin``."""
    build = work / "build"
    _run(["cmake", "-S", str(src), "-B", str(build), *CMAKE_FLAGS], log, stdout=log)
    _run(["cmake", "--build", str(build), "-j", str(jobs), "--target", *TARGETS], log, stdout=log)
    return build / "bin"


def assemble(src: Path, bin_dir: Path, out: Path, log=sys.stderr) -> dict:
    """Copy the targets and the converter into ``out`` and pip-install the converter pins into
    ``out/site``; returns ``llama-server --version``'s output lines."""
    (out / "bin").mkdir(parents=True)
    for t in TARGETS:
        shutil.copy2(bin_dir / t, out / "bin" / t)
    for name in CONVERTER_FILES:
        s, dst = src / name, out / "convert" / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(s, dst, ignore=shutil.ignore_patterns("__pycache__", "tests")) if s.is_dir() else shutil.copy2(s, dst)
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target",
          str(out / "site"), *converter_pins()], log)
    res = subprocess.run([str(out / "bin" / "llama-server"), "--version"], capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise RuntimeError(f"llama-server --version exited {res.returncode}: {res.stderr.strip()[:500]}")
    return {"llama_server_version": (res.stdout + res.stderr).strip().splitlines()}


def build(jobs: int | None = None, log=sys.stderr) -> Path:
    """Build this machine's key dir unless it exists (docs/engines.md); returns it.

    Raises:
        subprocess.CalledProcessError: pip, cmake or the compiler failed.
        RuntimeError: the sdist's sha256 is not the pinned one, or the server does not run.
    """
    root, inputs = cache_root(), key_inputs()
    key = build_key(inputs)
    with _locked(root):
        if build_dir() is not None:
            print(f"llama.cpp: {root / key} is up to date", file=log)
            atomic_write(root / "current", key + "\n")
            return root / key
        for stale in root.glob(".tmp-*"):  # a killed build's; nobody else builds while we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        t0 = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=root))
        try:
            src = extract_llama_cpp(fetch_sdist(work, log), work)
            bin_dir = compile_targets(src, work, jobs or os.cpu_count() or 2, log)
            info = assemble(src, bin_dir, work / "out", log)
            info.update(key=key, inputs=inputs, cmake_line=_cmake_line(), seconds=round(time.monotonic() - t0, 1),
                        bytes=sum(p.stat().st_size for p in (work / "out").rglob("*")
                                  if p.is_file() and not p.is_symlink()), built_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
            atomic_write(work / "out" / INFO, json.dumps(info, indent=2, sort_keys=True) + "\n")
            os.rename(work / "out", root / key)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        atomic_write(root / "current", key + "\n")
        print(f"llama.cpp: built {root / key} in {info['seconds']} s", file=log)
        return root / key


def _cmake_line() -> str:
    return "cmake -S vendor/llama.cpp -B build " + " ".join(CMAKE_FLAGS) + " && cmake --build build -j N --target " + " ".join(TARGETS)


def main(argv: list[str]) -> int:
    """``python -m specconv.engines.llamacpp.build key|inputs|dir|stamp|cmake-line|build [-j N]``."""
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "build":
        jobs = int(argv[3]) if len(argv) > 3 and argv[2] == "-j" else None
        build(jobs)
        return 0
    show = {"key": build_key, "inputs": lambda: json.dumps(key_inputs(), indent=2, sort_keys=True),
            "dir": expected_dir, "stamp": lambda: expected_dir() / INFO, "cmake-line": _cmake_line}
    if cmd not in show:
        print((main.__doc__ or "").split("\n")[0].strip(), file=sys.stderr)
        return 2
    print(show[cmd]())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
