"""Verifier access: config and the few tensors a conversion needs, local or from the Hub.

``--verifier`` is a local directory or a Hub repo id. From the Hub only ``config.json``,
the safetensors index and — on demand — the shards holding the tensors a converter asks
for (embedding, LM head, final norm) are fetched, through ``huggingface_hub`` so its
cache and ``HF_HUB_OFFLINE`` are respected. Multimodal verifiers are unwrapped
(``text_config`` / ``llm_config`` / ``language_config``).

Facts used (speculators_format.md §2.2, §7.3): ``hidden_size`` must equal the draft's;
aux ids must lie in ``[0, num_hidden_layers]``; the draft's target vocab must equal
``vocab_size``; the mask token must be ``< vocab_size``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InvalidInputError

_TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config")
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")

EMBED_SUFFIXES = ("embed_tokens.weight", "tok_embeddings.weight", "wte.weight", "llm.embed.weight")
LM_HEAD_SUFFIXES = ("lm_head.weight", "output.weight")
NORM_SUFFIXES = ("model.norm.weight", "norm.weight", "norm_f.weight", "ln_f.weight")


def is_hub_id(spec: str) -> bool:
    """True when ``spec`` looks like ``owner/name`` and is not an existing local path."""
    return bool(_HUB_ID_RE.match(spec)) and not os.path.exists(spec)


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
    """A resolved verifier.

    Attributes:
        spec: the ``--verifier`` value as given.
        name_or_path: what is recorded as ``speculators_config.verifier.name_or_path``
            (``--verifier-name`` when given, else the Hub id, else the local path).
        local_dir: directory holding ``config.json`` (a Hub cache snapshot for Hub ids).
        config: the text config (unwrapped), a dict.
        raw_config: the config as on disk.
        hub_id: repo id when fetched from the Hub.
    """

    spec: str
    name_or_path: str
    local_dir: Path
    config: dict[str, Any]
    raw_config: dict[str, Any]
    hub_id: str | None = None
    revision: str | None = None
    _store: Any = field(default=None, repr=False)
    _weight_map: dict[str, str] | None = field(default=None, repr=False)

    # ---- facts -----------------------------------------------------------------
    def _int(self, key: str) -> int:
        v = self.config.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise InvalidInputError(
                f"verifier config {self.spec!r} has no positive integer {key!r} (got {v!r})",
                code="verifier_config",
            )
        return v

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
        v = self.config.get("tie_word_embeddings", self.raw_config.get("tie_word_embeddings"))
        return bool(v) if v is not None else False

    def special_token_ids(self) -> dict[str, int | None]:
        def one(k: str) -> int | None:
            v = self.config.get(k, self.raw_config.get(k))
            if isinstance(v, list):
                v = v[0] if v else None
            return v if isinstance(v, int) else None

        return {k: one(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}

    def facts(self):
        """Return :class:`specconv.format.VerifierFacts` for the lint (every eos id of a
        list, and the tokenizer's added special tokens when the files are present)."""
        from .format import VerifierFacts

        return VerifierFacts.from_verifier(self, is_local_path=not is_hub_id(self.name_or_path))

    # ---- tensors ---------------------------------------------------------------
    def _names(self) -> list[str]:
        if self.hub_id is None:
            return self.store().names()
        return sorted(self._hub_weight_map())

    def _hub_weight_map(self) -> dict[str, str]:
        if self._weight_map is None:
            from huggingface_hub import hf_hub_download
            from huggingface_hub.errors import EntryNotFoundError

            try:
                idx = hf_hub_download(self.hub_id, "model.safetensors.index.json", revision=self.revision)
            except EntryNotFoundError:  # also LocalEntryNotFoundError: not in the offline cache
                idx = None
            except Exception as e:  # network, auth
                raise hub_error("model.safetensors.index.json", self.hub_id, e, code="verifier_not_found") from e
            if idx is not None:
                try:
                    with open(idx, encoding="utf-8") as f:
                        wm = json.load(f)["weight_map"]
                    self._weight_map = {str(k): str(v) for k, v in dict(wm).items()}
                except (OSError, ValueError, RecursionError, KeyError, TypeError) as e:
                    raise InvalidInputError(f"cannot read the weight map of {idx} (verifier {self.hub_id}): "
                                            f"{type(e).__name__}: {e}", code="verifier_config") from e
            else:
                # single-file checkpoint: read its header only after download
                try:
                    p = hf_hub_download(self.hub_id, "model.safetensors", revision=self.revision)
                except Exception as e:
                    raise hub_error("model.safetensors / model.safetensors.index.json", self.hub_id, e,
                                    code="verifier_tensor_missing") from e
                from .tensors import TensorStore

                st = TensorStore.open(p)
                self._weight_map = {n: "model.safetensors" for n in st.names()}
        return self._weight_map

    def store(self):
        """TensorStore over the verifier's local checkpoint (local verifiers only)."""
        if self._store is None:
            from .tensors import TensorStore

            self._store = TensorStore.open(self.local_dir)
        return self._store

    def find_tensor(self, role: str) -> str | None:
        """Name of the verifier tensor playing ``role`` (``embed``, ``lm_head``, ``norm``).

        Matching is by exact name, then shortest suffix match (as speculators'
        ``convert/utils.py`` does). ``lm_head`` falls back to the embedding when the
        verifier ties them. Returns ``None`` when absent.
        """
        suffixes = {"embed": EMBED_SUFFIXES, "lm_head": LM_HEAD_SUFFIXES, "norm": NORM_SUFFIXES}[role]
        names = self._names()
        for suf in suffixes:
            hits = [n for n in names if n == suf or n.endswith("." + suf) or n.endswith(suf)]
            # skip vision towers / draft heads of multimodal verifiers
            hits = [n for n in hits if not re.search(r"(vision|visual|mtp|audio)", n)]
            if role == "norm":
                hits = [n for n in hits if not re.search(r"layers?\.\d+\.", n)]
            if hits:
                return min(hits, key=len)
        if role == "lm_head" and self.tie_word_embeddings:
            return self.find_tensor("embed")
        return None

    def tensor_info(self, name: str):
        """TensorInfo of a verifier tensor, downloading only its shard from the Hub."""
        if self.hub_id is None:
            return self.store().info(name)
        from huggingface_hub import hf_hub_download

        from .tensors import TensorStore

        shard = self._hub_weight_map().get(name)
        if shard is None:
            raise InvalidInputError(f"verifier {self.hub_id} has no tensor {name!r}")
        try:
            p = hf_hub_download(self.hub_id, shard, revision=self.revision)
        except Exception as e:  # not cached (offline), network, auth
            raise hub_error(f"shard {shard} (holding {name})", self.hub_id, e, code="verifier_tensor_missing") from e
        return TensorStore.open(p).info(name)


def hub_unavailable(what: str, repo: str, e: Exception) -> str:
    """Message for a Hub file that could not be had.

    In offline mode (``HF_HUB_OFFLINE=1``, read by ``huggingface_hub.constants``) a file
    missing from the local cache raises ``LocalEntryNotFoundError`` whose own text blames
    the network; say instead that it is not cached and where the cache is.
    """
    from huggingface_hub import constants
    from huggingface_hub import errors as hf_errors

    incomplete = getattr(hf_errors, "IncompleteSnapshotError", ())  # its own message lists the missing files
    if (constants.is_offline_mode() and isinstance(e, hf_errors.LocalEntryNotFoundError)
            and not isinstance(e, incomplete)):
        return (f"{what} of {repo!r} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) "
                "and offline mode (HF_HUB_OFFLINE=1) forbids downloading it")
    return f"cannot fetch {what} of {repo!r} from the Hub: {type(e).__name__}: {e}"


def hub_error(what: str, repo: str, e: Exception, *, code: str, hint: str | None = None):
    """The project error for a failed Hub download, with the documented exit code.

    * 401/403 or a gated repo → :class:`HubAuthError` (exit 5);
    * 429/5xx, or a connection failure while online (huggingface_hub reports it as
      ``LocalEntryNotFoundError`` after its own retries) → :class:`TransientRemoteError` (7);
    * anything else (missing repo/file, not cached in offline mode) → ``InvalidInputError`` (3).
    """
    from huggingface_hub import constants
    from huggingface_hub import errors as hf_errors

    from .errors import HubAuthError, TransientRemoteError

    msg = hub_unavailable(what, repo, e)
    status = getattr(getattr(e, "response", None), "status_code", None)
    if isinstance(e, hf_errors.GatedRepoError) or status in (401, 403):
        return HubAuthError(msg, code="hub_auth", hint="log in with `hf auth login` or set HF_TOKEN")
    transient_http = isinstance(e, hf_errors.HfHubHTTPError) and status is not None and (status == 429 or status >= 500)
    offline_miss = isinstance(e, hf_errors.LocalEntryNotFoundError) and not constants.is_offline_mode()
    incomplete = getattr(hf_errors, "IncompleteSnapshotError", ())
    if transient_http or (offline_miss and not isinstance(e, incomplete)) or isinstance(e, (ConnectionError, TimeoutError)):
        return TransientRemoteError(msg, code="hub_unreachable", hint=hint)
    return InvalidInputError(msg, code=code, hint=hint)


def _read_json(p: Path) -> dict[str, Any]:
    try:
        with open(p, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, nesting
        raise InvalidInputError(f"cannot read verifier config {p}: {e}", code="verifier_config") from e
    if not isinstance(d, dict):
        raise InvalidInputError(f"verifier config {p} is not a JSON object", code="verifier_config")
    return d


def resolve_verifier(spec: str, *, name: str | None = None, revision: str | None = None) -> Verifier:
    """Resolve ``--verifier`` (local dir or Hub id) and read its config.

    Args:
        spec: local directory (containing ``config.json``) or Hub repo id.
        name: ``--verifier-name``: the Hub id to record when ``spec`` is local.
        revision: Hub revision for Hub ids.

    Raises:
        InvalidInputError: no config, unreadable config, Hub id not reachable.
    """
    if not spec or not spec.strip():
        raise InvalidInputError("--verifier is empty: give a local directory or a Hub repo id", code="verifier_not_found")
    p = Path(spec).expanduser()
    if p.exists():
        if p.is_file():
            p = p.parent
        cfg_path = p / "config.json"
        if not cfg_path.is_file():
            raise InvalidInputError(f"verifier dir {p} has no config.json", code="verifier_config")
        raw = _read_json(cfg_path)
        return Verifier(
            spec=spec,
            name_or_path=name or str(p.resolve()),
            local_dir=p,
            config=unwrap_text_config(raw),
            raw_config=raw,
        )
    if not is_hub_id(spec):
        raise InvalidInputError(
            f"verifier {spec!r} is neither an existing directory nor a Hub repo id (owner/name)",
            code="verifier_not_found",
        )
    from huggingface_hub import hf_hub_download

    try:
        cfg_file = hf_hub_download(spec, "config.json", revision=revision)
    except Exception as e:  # network, offline mode, missing repo
        err = hub_error("config.json", spec, e, code="verifier_not_found",
                        hint="pass a local verifier directory with --verifier and its Hub id with --verifier-name")
        err.message = "verifier: " + err.message
        raise err from e
    raw = _read_json(Path(cfg_file))
    return Verifier(
        spec=spec,
        name_or_path=name or spec,
        local_dir=Path(cfg_file).parent,
        config=unwrap_text_config(raw),
        raw_config=raw,
        hub_id=spec,
        revision=revision,
    )
