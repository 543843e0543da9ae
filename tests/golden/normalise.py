"""The one normaliser of the golden files: what may differ between two runs or machines.

Everything specconv prints or writes is kept as is, except (applied recursively to JSON
values, dict keys included, and to the lines of Markdown files):

* **paths**: the scratch root of the run → ``<ROOT>``, the repository → ``<REPO>``, the
  SmolLM2 verifier dir → ``<SMOLLM2>``, ``$HOME`` → ``<HOME>``; a ``tempfile.mkdtemp``
  name (``<tmp>/<prefix><8 random chars>``) → ``<MKDTEMP:prefix>``; specconv's own temp /
  backup dirs ``.<out>.tmp-<pid>-<rand>`` / ``.old-`` → ``.<out>.tmp-<pid>-<rand>``; the
  loopback Hub double's ``http://127.0.0.1:<port>`` → ``<HUB>``;
* **times**: ISO-8601 timestamps inside strings → ``<time>``; the values of
  :data:`VOLATILE_KEYS` and of keys ending in :data:`VOLATILE_SUFFIXES` (durations, pids,
  host facts) → ``<volatile>``;
* **library versions**: every value of a ``versions`` dict except ``specconv``'s own, and
  :data:`VERSION_KEYS` values → ``<version>`` (installed libraries may differ per machine;
  a specconv version bump is a reviewed change);
* only for the *loose* cases (validate, export, release: numbers computed on the CPU, and
  files holding them): every float → ``<float>``, every sha256 / sha1 hex digest →
  ``<digest>``, the values of :data:`SIZE_KEYS` → ``<size>``; ints (counts), bools (gate
  results), other strings and the key structure stay exact.

Tensor files are recorded by sha256 (the conversions are byte-deterministic on one
machine; the random fixtures come from seeded ``torch`` generators, identical on the x86
AVX2/AVX-512 kernels).
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: keys whose values differ per run or host
VOLATILE_KEYS = frozenset({
    "created", "created_at", "timestamp", "date", "duration_s", "elapsed_s", "pid", "hostname",
    "cpu", "cpu_count", "num_threads", "vllm_port",
})
VOLATILE_SUFFIXES = ("_ms", "_seconds")
VERSION_KEYS = frozenset({"transformers_version"})
#: torch calls the vLLM loader check stubs only on some hosts (vLLM probes AMX on Intel CPUs)
HOST_STUBS = frozenset({"torch.cpu._is_amx_tile_supported"})
#: file sizes (loose cases only: a card or plot holding CPU-computed numbers)
SIZE_KEYS = frozenset({"size", "bytes", "bytes_to_upload", "total_size"})
_OWN_VERSION = "specconv"

_ISO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?")
_HUB_URL = re.compile(r"http://(?:127\.0\.0\.1|localhost):\d+")
_OUT_TMP = re.compile(r"\.(tmp|old)-\d+-[a-z0-9_]{8}")
_DIGEST = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def _mkdtemp_pattern() -> re.Pattern[str]:
    base = re.escape(os.path.realpath(tempfile.gettempdir()))
    alt = re.escape(tempfile.gettempdir())
    return re.compile(rf"(?:{base}|{alt})/([^/\s\"'`]*?)[a-z0-9_]{{8}}(?=[/\s\"'`),:;]|$)")


@dataclass
class Normaliser:
    """Replaces run- and host-specific values (see the module docstring).

    Args:
        paths: ``{literal path: placeholder}``; both the path and its realpath are replaced,
            longest first.
        loose: replace floats by ``<float>`` (CPU-computed numbers).
    """

    paths: dict[str, str] = field(default_factory=dict)
    loose: bool = False

    def __post_init__(self) -> None:
        subs: dict[str, str] = {}
        for p, tag in self.paths.items():
            for variant in {str(p), os.path.realpath(str(p))}:
                if variant and variant != "/":
                    subs.setdefault(variant, tag)
        self._subs = sorted(subs.items(), key=lambda kv: -len(kv[0]))
        self._mkdtemp = _mkdtemp_pattern()

    def with_loose(self, loose: bool = True) -> Normaliser:
        """The same substitutions, with float replacement on or off."""
        return Normaliser(dict(self.paths), loose=loose)

    def text(self, s: str) -> str:
        """Normalise one string (paths, mkdtemp names, Hub URL, timestamps)."""
        for literal, tag in self._subs:
            if literal in s:
                s = s.replace(literal, tag)
        s = self._mkdtemp.sub(lambda m: f"<MKDTEMP:{m.group(1)}>", s)
        s = _OUT_TMP.sub(lambda m: f".{m.group(1)}-<pid>-<rand>", s)
        s = _HUB_URL.sub("<HUB>", s)
        return _ISO_TIME.sub("<time>", s)

    def __call__(self, obj: Any, key: str | None = None) -> Any:
        """Normalise a JSON value; ``key`` is the dict key it sits under (None at the top)."""
        if key is not None and (key in VOLATILE_KEYS or key.endswith(VOLATILE_SUFFIXES)):
            return "<volatile>"
        if key in VERSION_KEYS and isinstance(obj, str):
            return "<version>"
        if self.loose and key in SIZE_KEYS and isinstance(obj, int):
            return "<size>"
        if isinstance(obj, dict):
            if key == "versions":
                return {k: (v if k == _OWN_VERSION else "<version>") for k, v in sorted(obj.items())}
            return {self.text(str(k)): self(v, str(k)) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
        if key == "stubs" and isinstance(obj, (list, tuple)):
            obj = [v for v in obj if v not in HOST_STUBS]
        if isinstance(obj, (list, tuple)):
            return [self(v) for v in obj]
        if isinstance(obj, str):
            return "<digest>" if self.loose and _DIGEST.fullmatch(obj) else self.text(obj)
        if isinstance(obj, float) and self.loose:
            return "<float>"
        return obj

    def argv(self, argv: list[Any]) -> list[str]:
        """Normalise a command line (paths)."""
        return [self.text(str(a)) for a in argv]

    def path(self, p: Path | str) -> str:
        """Normalise one path."""
        return self.text(str(p))
