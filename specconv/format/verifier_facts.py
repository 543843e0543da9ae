"""What the lint needs to know about the verifier (:class:`VerifierFacts`); added special tokens as
transformers writes them (``tokenization_utils_base.py``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..tensors import TensorInfo, TensorStore

__all__ = ["VerifierFacts", "VerifierView", "is_hub_repo_id", "read_added_special_tokens"]

_SPECIAL_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
#: tokenizer files larger than this are not read for added tokens (a guard, not a limit
#: real tokenizers reach: Qwen3's tokenizer.json is about 11 MB).
_MAX_TOKENIZER_BYTES = 64 * 1024 * 1024


@runtime_checkable
class VerifierView(Protocol):
    """What converters, the lint and the stages below ``verifier`` read of the run's one
    resolved verifier. :class:`specconv.verifier.Verifier` is the implementation; rooms that
    may not import it (``format/``, ``converters/``) type their parameters with this."""

    spec: str
    name_or_path: str
    local_dir: Path
    config: dict[str, Any]
    raw_config: dict[str, Any]
    hub_id: str | None

    @property
    def hidden_size(self) -> int: ...
    @property
    def num_hidden_layers(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def architectures(self) -> list[str]: ...
    def find_tensor(self, role: str) -> str | None: ...
    def tensor_info(self, name: str) -> TensorInfo: ...
    def tensor_store(self, name: str) -> TensorStore: ...


def _int_id(v: Any) -> int | None:
    if isinstance(v, str) and v.isdigit():
        v = int(v)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _load_json(path: Path) -> Any:
    try:
        if not path.is_file() or path.stat().st_size > _MAX_TOKENIZER_BYTES:
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # unreadable tokenizer files only lose this check
        return None


def _added_from_config(data: Any) -> dict[int, str]:
    out: dict[int, str] = {}
    table = data.get("added_tokens_decoder") if isinstance(data, Mapping) else None
    for tid, entry in (table or {}).items():
        i = _int_id(tid)
        if i is not None and isinstance(entry, Mapping) and entry.get("special"):
            out[i] = str(entry.get("content", ""))
    return out


def _added_from_tokenizer(data: Any) -> dict[int, str]:
    out: dict[int, str] = {}
    entries = data.get("added_tokens") if isinstance(data, Mapping) else None
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, Mapping) and entry.get("special"):
            i = _int_id(entry.get("id"))
            if i is not None:
                out[i] = str(entry.get("content", ""))
    return out


def read_added_special_tokens(verifier_dir: str | os.PathLike[str] | None) -> dict[int, str]:
    """Id → text of the ``"special": true`` added tokens of ``tokenizer.json`` and ``tokenizer_config.json``
    (a missing or unreadable file contributes nothing)."""
    if verifier_dir is None:
        return {}
    d = Path(verifier_dir)
    out = _added_from_tokenizer(_load_json(d / "tokenizer.json"))
    out.update(_added_from_config(_load_json(d / "tokenizer_config.json")))
    return dict(sorted(out.items()))


@dataclass
class VerifierFacts:
    """What the lint needs to know about the verifier (``eos_token_id`` may be a list; ``embedding_rows``:
    known for local verifiers, a draft vocab equal to them matches a padded verifier)."""

    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    architectures: list[str] = field(default_factory=list)
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    name_or_path: str | None = None
    is_local_path: bool = False
    added_special_tokens: dict[int, str] = field(default_factory=dict)
    embedding_rows: int | None = None

    @classmethod
    def from_verifier(cls, verifier: VerifierView, *, is_local_path: bool) -> VerifierFacts:
        """Facts of a resolved Verifier (special ids whole from its unwrapped, then raw, config)."""
        def pick(key: str) -> Any:
            return verifier.config.get(key, verifier.raw_config.get(key))

        return cls(num_hidden_layers=verifier.num_hidden_layers, hidden_size=verifier.hidden_size,
                   vocab_size=verifier.vocab_size, architectures=verifier.architectures,
                   **{k: pick(k) for k in _SPECIAL_KEYS}, name_or_path=verifier.name_or_path,
                   is_local_path=is_local_path, added_special_tokens=read_added_special_tokens(verifier.local_dir),
                   embedding_rows=_local_embedding_rows(verifier))

    def special_token_ids(self) -> dict[int, str]:
        """Map special token id → role (``bos``/``eos``/``pad``; every id of an eos list)."""
        out: dict[int, str] = {}
        for role, v in (("bos", self.bos_token_id), ("eos", self.eos_token_id), ("pad", self.pad_token_id)):
            for tid in v if isinstance(v, (list, tuple)) else [v]:
                if isinstance(tid, int) and not isinstance(tid, bool):
                    out.setdefault(tid, role)
        return out


def _local_embedding_rows(verifier: VerifierView) -> int | None:
    """Rows of a local safetensors verifier's embedding (a header read); None for Hub verifiers, ``.bin``
    checkpoints (never unpickled) or no readable embedding."""
    from specconv.errors import SpecconvError

    d = getattr(verifier, "local_dir", None)
    if getattr(verifier, "hub_id", None) is not None or d is None or not any(
            (Path(d) / n).is_file() for n in ("model.safetensors", "model.safetensors.index.json")):
        return None
    try:
        name = verifier.find_tensor("embed")
        return None if name is None else int(verifier.tensor_info(name).shape[0])
    except SpecconvError:
        return None


from ..hub import is_hub_id as is_hub_repo_id  # noqa: E402  (re-exported; specconv.hub imports only stdlib + errors)
