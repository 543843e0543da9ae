"""The verifier: its config and the few tensors a conversion or a drafter needs, local or Hub (from
the Hub: ``config.json``, the index and, on demand, only the shards holding the tensors asked for).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import hub as _hub
from .errors import InvalidInputError
from .fileio import check_no_dangling_links, read_json_object
from .hub import is_hub_id
from .values import is_int

if TYPE_CHECKING:
    from .tensors import TensorInfo, TensorStore

_TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config")

# speculators ``src/speculators/utils/loading.py`` (``_WEIGHT_ALIASES``), in its order
EMBED_SUFFIXES = ("embed_tokens.weight", "tok_embeddings.weight", "llm.embed.weight", "backbone.embeddings.weight")
LM_HEAD_SUFFIXES = ("lm_head.weight", "output.weight", "llm.unembed.weight")
NORM_SUFFIXES = ("model.norm.weight", "llm.norm.weight", "backbone.norm_f.weight", "norm.weight")
_ROLE_SUFFIXES = {"embed": EMBED_SUFFIXES, "lm_head": LM_HEAD_SUFFIXES, "norm": NORM_SUFFIXES}
_ROLE_WORDS = {"embed": "input embedding", "lm_head": "LM head", "norm": "final norm"}
_NOT_TEXT = re.compile(r"(vision|visual|mtp|audio)")
_PER_LAYER = re.compile(r"(?:^|\.)(?:layers?|h|blocks?)\.\d+\.")
#: How a failed read of a single-file Hub checkpoint names it.
_SINGLE_FILE = _hub.Wanted("model.safetensors / model.safetensors.index.json", code="verifier_tensor_missing")


def unwrap_text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Return the language-model part of a (possibly multimodal) HF config."""
    for key in _TEXT_CONFIG_KEYS:
        sub = cfg.get(key)
        if isinstance(sub, dict) and "hidden_size" in sub:
            merged = dict(sub)
            merged.setdefault("architectures", cfg.get("architectures", []))
            return merged
    return cfg


@dataclass
class Verifier:
    """A resolved verifier: ``spec`` (a Hub id, or the local path made absolute), ``name_or_path``
    (recorded: ``--verifier-name``, else the Hub id, else the path), ``local_dir`` (holding
    ``config.json``), ``config`` (the unwrapped text config), ``raw_config`` (as on disk)."""

    spec: str
    name_or_path: str
    local_dir: Path
    config: dict[str, Any]
    raw_config: dict[str, Any]
    hub_id: str | None = None
    revision: str | None = None
    endpoint: str | None = None
    _store: TensorStore | None = field(default=None, repr=False)
    _weight_map: dict[str, str] | None = field(default=None, repr=False)
    _tensors: dict[str, Any] = field(default_factory=dict, repr=False)
    _shard_stores: dict[str, TensorStore] = field(default_factory=dict, repr=False)
    _copied_bytes: int = field(default=0, repr=False)

    # ---- facts -----------------------------------------------------------------
    def _int(self, key: str) -> int:
        v = self.config.get(key)
        if not is_int(v, minimum=1):
            raise InvalidInputError(f"verifier config {self.spec!r} has no positive integer {key!r} (got {v!r})",
                                    code="verifier_config")
        return v

    @property
    def model_ref(self) -> str:
        """What another process loads this verifier by: the Hub id, else the absolute local directory."""
        return self.hub_id or str(self.local_dir)

    @property
    def hidden_size(self) -> int:
        return self._int("hidden_size")

    @property
    def num_hidden_layers(self) -> int:
        return self._int("num_hidden_layers")

    @property
    def vocab_size(self) -> int:
        return self._int("vocab_size")

    @property
    def architectures(self) -> list[str]:
        return list(self.config.get("architectures") or self.raw_config.get("architectures") or [])

    @property
    def tie_word_embeddings(self) -> bool:
        return bool(self.config.get("tie_word_embeddings", self.raw_config.get("tie_word_embeddings")))

    def facts(self):
        """:class:`specconv.format.VerifierFacts` for the lint."""
        from .format import VerifierFacts

        return VerifierFacts.from_verifier(self, is_local_path=not is_hub_id(self.name_or_path))

    # ---- tensors ---------------------------------------------------------------
    def _names(self) -> list[str]:
        if self.hub_id is None:
            return self.store().names()
        return sorted(self._hub_weight_map())

    def _hub_weight_map(self) -> dict[str, str]:
        hub_id = self.hub_id
        assert hub_id is not None, "a local verifier has no Hub weight map"
        if self._weight_map is None:
            # absent (or not cached offline): a single-file checkpoint
            index_name = "model.safetensors.index.json"
            index_file = _hub.download_file(hub_id, index_name, revision=self.revision, missing_ok=True,
                                            endpoint_url=self.endpoint,
                                            wanted=_hub.Wanted(index_name, code="verifier_not_found"))
            if index_file is not None:
                try:
                    with open(index_file, encoding="utf-8") as f:
                        weight_map = json.load(f)["weight_map"]
                    self._weight_map = {str(k): str(v) for k, v in dict(weight_map).items()}
                except (OSError, ValueError, RecursionError, KeyError, TypeError) as e:
                    raise InvalidInputError(f"cannot read the weight map of {index_file} (verifier {self.hub_id}): "
                                            f"{type(e).__name__}: {e}", code="verifier_config") from e
            elif not _hub.is_offline():  # single-file checkpoint: its header, by range requests
                meta = _hub.safetensors_header(hub_id, "model.safetensors", revision=self.revision,
                                               endpoint_url=self.endpoint, wanted=_SINGLE_FILE)
                self._weight_map = {str(n): "model.safetensors" for n in meta.tensors}
            else:  # offline: the cached file's header
                single_file = _required_file(hub_id, "model.safetensors", revision=self.revision,
                                             endpoint_url=self.endpoint, wanted=_SINGLE_FILE)
                from .tensors import TensorStore

                self._weight_map = {n: "model.safetensors" for n in TensorStore.open(single_file).names()}
        return self._weight_map

    def store(self) -> TensorStore:
        """TensorStore over the verifier's local checkpoint (local verifiers only)."""
        if self._store is None:
            from .tensors import TensorStore

            self._store = TensorStore.open(self.local_dir)
        return self._store

    def find_tensor(self, role: str) -> str | None:
        """Name of the tensor playing ``role`` (``embed``, ``lm_head``, ``norm``), or None. Matched as
        speculators' ``src/speculators/utils/loading.py::_resolve_key`` (each alias: exact, then the
        shortest name ending in it; vision / audio / MTP towers and per-layer norms skipped); a tied
        ``lm_head`` falls back to the embedding. Raises SpecconvError: names not listable."""
        names = self._names()
        for suf in _ROLE_SUFFIXES[role]:
            hits = [n for n in names if n.endswith(suf) and not _NOT_TEXT.search(n)]
            if role == "norm":
                hits = [n for n in hits if not _PER_LAYER.search(n)]
            if hits:
                return suf if suf in hits else min(hits, key=len)
        if role == "lm_head" and self.tie_word_embeddings:
            return self.find_tensor("embed")
        return None

    def check_loadable(self) -> None:
        """Refuse (``verifier_tensor_names``) a verifier whose embedding / LM head / final norm have none of
        the names speculators loads (a GPT-2-style ``transformer.wte``); skipped when the names cannot be
        listed (a config-only dir, Hub weights not cached)."""
        from .errors import SpecconvError

        try:
            names = self._names()
        except SpecconvError:
            return
        if not names:
            return
        missing = [r for r in ("embed", "lm_head", "norm") if self.find_tensor(r) is None]
        if not missing:
            return
        looked = "; ".join(f"{_ROLE_WORDS[r]}: *{', *'.join(_ROLE_SUFFIXES[r])}" for r in missing)
        found = [n for n in names if not _PER_LAYER.search(n)]
        raise InvalidInputError(
            f"verifier {self.spec!r} has no {', '.join(_ROLE_WORDS[r] for r in missing)} under a name "
            f"speculators' verifier loader resolves (looked for {looked}); its non-layer tensors are: "
            f"{', '.join(found[:12]) or 'none'}{' ...' if len(found) > 12 else ''}",
            code="verifier_tensor_names",
            hint="use a verifier checkpoint with Llama/Qwen-style names (model.embed_tokens, model.norm, lm_head)")

    def read_tensor(self, name: str):
        """The verifier tensor ``name`` as a torch tensor (cached). Raises InvalidInputError: no such
        tensor or shard; MissingExtraError: no torch."""
        if name not in self._tensors:
            from .extras import require

            require("torch", "validate", feature="reading verifier tensors")
            self._tensors[name] = self.tensor_store(name).read_tensor(name)
        return self._tensors[name]

    def tensor_store(self, name: str) -> TensorStore:
        """The TensorStore holding tensor ``name`` (local, or its Hub shard's, opened once; reads counted)."""
        if self.hub_id is None:
            return self.store()
        path = str(self.tensor_info(name).file)
        if path not in self._shard_stores:
            from .tensors import TensorStore

            self._shard_stores[path] = TensorStore.open(path)
        return self._shard_stores[path]

    def read_bytes(self, name: str) -> bytes:
        """Raw bytes of verifier tensor ``name`` (counted in :attr:`bytes_read`)."""
        return self.tensor_store(name).read_bytes(name)

    def add_bytes_read(self, n: int) -> None:
        """Count ``n`` bytes of tensor data read outside its stores (the writer's copy engine)."""
        self._copied_bytes += int(n)

    @property
    def bytes_read(self) -> int:
        """Tensor-data bytes read from the verifier's weight files so far (headers not counted)."""
        stores = list(self._shard_stores.values()) + ([self._store] if self._store is not None else [])
        return self._copied_bytes + sum(getattr(st, "bytes_read", 0) for st in stores)

    def _role_tensor(self, role: str):
        name = self.find_tensor(role)
        if name is None:
            raise InvalidInputError(f"verifier {self.spec!r} has no {_ROLE_WORDS[role]} "
                                    f"(*{', *'.join(_ROLE_SUFFIXES[role])})", code="missing_tensor")
        return self.read_tensor(name)

    def embedding(self):
        """``[Vt, H]`` input embedding (the checkpoint's dtype)."""
        return self._role_tensor("embed")

    def lm_head(self):
        """``[Vt, H]`` LM head; the embedding (same tensor object) when the verifier ties them."""
        return self._role_tensor("lm_head")

    def tensor_info(self, name: str) -> TensorInfo:
        """TensorInfo of a verifier tensor, downloading only its shard from the Hub."""
        if self.hub_id is None:
            return self.store().info(name)
        from .tensors import TensorStore

        shard = self._hub_weight_map().get(name)
        if shard is None:
            raise InvalidInputError(f"verifier {self.hub_id} has no tensor {name!r}")
        shard_file = _required_file(self.hub_id, shard, revision=self.revision, endpoint_url=self.endpoint,
                                    wanted=_hub.Wanted(f"shard {shard} (holding {name})",
                                                       code="verifier_tensor_missing"))
        return TensorStore.open(shard_file).info(name)


def _required_file(repo_id: str, filename: str, *, revision: str | None, endpoint_url: str | None,
                   wanted: _hub.Wanted) -> Path:
    """:func:`specconv.hub.download_file` of a file that must be there (absent: the Hub's error)."""
    path = _hub.download_file(repo_id, filename, revision=revision, endpoint_url=endpoint_url, wanted=wanted)
    assert path is not None  # not missing_ok: an absent file raises
    return path


def _read_config(p: Path) -> dict[str, Any]:
    return read_json_object(p, code="verifier_config", unreadable="cannot read verifier config {path}: {error}",
                            not_object="verifier config {path} is not a JSON object")


def resolve_verifier(spec: str, *, name: str | None = None, revision: str | None = None,
                     endpoint: str | None = None) -> Verifier:
    """Resolve ``--verifier`` (local dir or Hub id; ``name``: ``--verifier-name``), read its config and
    :meth:`Verifier.check_loadable`. A local path is made absolute here, once (symlinks kept).

    Raises:
        InvalidInputError: no or unreadable config, Hub id not reachable, unloadable tensor names;
            the Hub's errors (:mod:`specconv.hub`).
    """
    if not spec or not spec.strip():
        raise InvalidInputError("--verifier is empty: give a local directory or a Hub repo id",
                                code="verifier_not_found")
    p = Path(spec).expanduser()
    if p.exists():
        p = Path(os.path.abspath(p))  # not .resolve(): a symlinked path is recorded as given
        v = _local_verifier(str(p), p.parent if p.is_file() else p, name)
    elif not is_hub_id(spec):
        raise InvalidInputError(f"verifier {spec!r} is neither an existing directory nor a Hub repo id "
                                "(namespace/name)", code="verifier_not_found")
    else:
        v = _hub_verifier(spec, name, revision, endpoint)
    v.check_loadable()
    return v


def _local_verifier(spec: str, p: Path, name: str | None) -> Verifier:
    cfg_path = p / "config.json"
    check_no_dangling_links(p, "verifier")  # a deleted cache blob is no missing config / weights
    if not cfg_path.is_file():
        raise InvalidInputError(f"verifier dir {p} has no config.json", code="verifier_config")
    raw = _read_config(cfg_path)
    return Verifier(spec=spec, name_or_path=name or str(p.resolve()), local_dir=p,
                    config=unwrap_text_config(raw), raw_config=raw)


def _hub_verifier(spec: str, name: str | None, revision: str | None, endpoint: str | None) -> Verifier:
    cfg_file = _required_file(spec, "config.json", revision=revision, endpoint_url=endpoint, wanted=_hub.Wanted(
        "config.json", code="verifier_not_found", role="verifier",
        hint="pass a local verifier directory with --verifier and its Hub id with --verifier-name"))
    raw = _read_config(Path(cfg_file))
    return Verifier(spec=spec, name_or_path=name or spec, local_dir=Path(cfg_file).parent,
                    config=unwrap_text_config(raw), raw_config=raw, hub_id=spec, revision=revision,
                    endpoint=endpoint)
