"""Converter base class, source description and the registry decorator (docs/adding_a_converter.md)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from specconv.errors import InvalidInputError, UnsupportedFormatError
from specconv.fileio import check_no_dangling_links, read_json_object
from specconv.plan import ConversionPlan

if TYPE_CHECKING:
    from specconv.format.verifier_facts import VerifierView

#: ``dflash_config.projector_type`` values (NVIDIA/Model-Optimizer ``modelopt/torch/export/plugins/hf_spec_export.py``,
#: SpecForge DSpark, Domino): source facts that happen to spell algorithm names.
PROJECTOR_DFLASH = "dflash"
PROJECTOR_DSPARK = "dspark"
PROJECTOR_DOMINO = "domino"

#: Registered converter classes, in registration order (see :func:`ordered`).
REGISTRY: dict[str, type[Converter]] = {}


@dataclass
class ConvertOptions:
    """The ``convert`` flags that may change meaning (docs/cli.md), each recorded in ``specconv.json``;
    ``dtype`` is ``keep`` | ``bfloat16`` | ``float16`` | ``float32``."""

    mask_token_id: int | None = None
    aux_layer_ids: list[int] | None = None
    dtype: str = "keep"
    speculative_tokens: int | None = None
    sample_from_anchor: bool | None = None
    vocab_mapping: Path | None = None
    draft_config: Path | None = None
    allow_unpickle: bool = False
    checkpoint: str | None = None
    algorithm: str | None = None
    norm_before_residual: bool | None = None
    sliding_window_non_causal: bool = False

    #: Options that never change how a source is read; every other set option decides a written config value.
    NOT_READING: ClassVar[tuple[str, ...]] = ("dtype", "checkpoint", "algorithm", "allow_unpickle")

    def to_dict(self) -> dict[str, Any]:
        """The options given, as ``specconv.json`` records them: ``dtype`` always, every other
        option unless unset (``None``, or ``False`` for an on/off flag); a ``--no-X`` of a
        tri-state flag (``--no-sample-from-anchor``) is a decision and is kept as ``false``."""
        d = {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}
        off = {f.name for f in fields(self) if f.default is False}
        return {k: v for k, v in d.items() if k == "dtype" or not (v is None or (v is False and k in off))}

    def decides_reading(self) -> bool:
        """True when a set option decides a value of the written config (a flag such as
        ``--sample-from-anchor``), so a source read without these options reads otherwise."""
        return any(k not in self.NOT_READING for k in self.to_dict())


def _non_finite(obj: Any, path: str = "") -> str | None:
    """Dotted key of the first NaN / Infinity in a parsed config (``None`` when all finite): Python's
    ``json`` accepts them, pydantic would write them back as ``null``."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return path or "<root>"
    items: Iterable[tuple[Any, Any]]
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, list):
        items = ((f"[{i}]", v) for i, v in enumerate(obj))
    else:
        return None
    for k, v in items:
        sub = f"{path}{k}" if str(k).startswith("[") else (f"{path}.{k}" if path else str(k))
        if (hit := _non_finite(v, sub)) is not None:
            return hit
    return None


@dataclass
class SourceInfo:
    """What detection may look at: the source dir (after ``--subfolder`` / checkpoint selection), its parsed
    ``config.json`` (or ``None``), every file under it (relative, sorted) and tensor *headers*."""

    path: Path
    config: dict[str, Any] | None
    files: list[str]
    _store: Any = field(default=None, repr=False)
    _store_error: Exception | None = field(default=None, repr=False)

    @classmethod
    def open(cls, path: Path) -> SourceInfo:
        path = Path(path)
        if not path.is_dir():
            raise InvalidInputError(f"source {path} is not a directory")
        check_no_dangling_links(path, "source")  # a deleted cache blob is no missing config / weights
        cfg = None
        cfg_path = path / "config.json"
        if cfg_path.is_file():
            cfg = read_json_object(cfg_path, unreadable="cannot parse {path}: {error}",
                                   not_object="{path} is not a JSON object")
            try:
                key = _non_finite(cfg)
            except RecursionError:
                raise InvalidInputError(f"cannot parse {cfg_path}: nested too deeply") from None
            if key is not None:
                raise InvalidInputError(f"{cfg_path}: {key} is NaN or Infinity, which is not valid JSON")
            archs = cfg.get("architectures")
            if archs is not None and not isinstance(archs, str) and not (
                isinstance(archs, list) and all(isinstance(a, str) for a in archs)
            ):
                raise InvalidInputError(f"{cfg_path}: 'architectures' must be a list of strings, got {archs!r}")
        # Filter relative to the source dir: a Hub-cache source lives under ~/.cache/huggingface
        rels = (p.relative_to(path) for p in path.rglob("*") if p.is_file())
        files = sorted(str(r) for r in rels if ".cache" not in r.parts)
        return cls(path=path, config=cfg, files=files)

    # -- tensors (headers only) --------------------------------------------------
    def has_weights(self) -> bool:
        return any(f.endswith((".safetensors", ".bin")) for f in self.files if "/" not in f)

    @property
    def store(self):
        """TensorStore of the checkpoint (headers parsed lazily; raises if none)."""
        if self._store is None:
            from specconv.tensors import TensorStore

            self._store = TensorStore.open(self.path)
        return self._store

    def tensor_names(self) -> list[str]:
        """Tensor names, or ``[]`` when the dir has no readable weights."""
        if not self.has_weights():
            return []
        try:
            return self.store.names()
        except InvalidInputError as e:
            self._store_error = e
            return []

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.store.info(name).shape)

    def cfg(self, key: str, default: Any = None) -> Any:
        return (self.config or {}).get(key, default)

    def locations(self, *keys: str) -> list[tuple[str, Any]]:
        """``[(key, value)]`` of config ``keys``, the locations a layout names (value None where
        absent): ``outer.key`` reads ``key`` of the object at ``outer`` (None when that is no object)."""
        found = []
        for key in keys:
            outer, _, inner = key.rpartition(".")
            holder = self.cfg(outer) if outer else (self.config or {})
            found.append((key, holder.get(inner) if isinstance(holder, dict) else None))
        return found

    @property
    def architectures(self) -> list[str]:
        a = self.cfg("architectures") or []
        return list(a) if isinstance(a, list) else [str(a)]

    @property
    def dflash_config(self) -> dict[str, Any]:
        d = self.cfg("dflash_config")
        return d if isinstance(d, dict) else {}

    @property
    def projector_type(self) -> Any:
        """``dflash_config.projector_type`` as read (None when absent; see :data:`PROJECTOR_DFLASH`)."""
        return self.dflash_config.get("projector_type")


def refuse_unsupported_layer_keys(src: SourceInfo, format_id: str, *, cfg: dict[str, Any] | None = None,
                                  file: Path | str | None = None) -> None:
    """Refuse a truthy :data:`specconv.format.facts.UNSUPPORTED_LAYER_KEYS` in the source config as read
    (docs/formats.md); ``cfg`` / ``file`` name another config the source is read with (``--draft-config``).

    Raises:
        UnsupportedFormatError: ``unsupported_layer_key``, naming each key, where it sat and the config file.
    """
    from specconv.format.facts import unsupported_layer_keys

    hits = unsupported_layer_keys(src.config if cfg is None else cfg)
    if hits:
        keys = ", ".join(f"{where}={value!r}" for where, value in hits)
        raise UnsupportedFormatError(
            f"{file or src.path / 'config.json'}: {keys}: gated attention (an output gate with its own "
            "weights) has no place in "
            "a Speculators / vLLM drafter layer (a plain Llama / Qwen3 layer); the conversion would not be faithful",
            format_id=format_id, code="unsupported_layer_key",
        )


def _refusing_layer_keys(plan: Any) -> Any:
    """Wrap a converter's ``plan`` so that :func:`refuse_unsupported_layer_keys` runs first and
    ``--sliding-window-non-causal`` (:mod:`._layout_flags`) applies to every plan."""
    import functools

    @functools.wraps(plan)
    def checked(self: Converter, src: SourceInfo, verifier: VerifierView | None,
                opts: ConvertOptions) -> ConversionPlan:
        from ._layout_flags import apply_sliding_window_non_causal

        refuse_unsupported_layer_keys(src, self.format_id)
        return apply_sliding_window_non_causal(plan(self, src, verifier, opts), opts)

    checked.checks_layer_keys = True  # type: ignore[attr-defined]
    return checked


class Converter:
    """One source format: subclasses set the class attributes (rendered into docs/formats.md) and
    implement ``plan``, which ``__init_subclass__`` wraps with :func:`refuse_unsupported_layer_keys`
    before (a key a converter drops would be invisible to the lint) and ``--sliding-window-non-causal`` after."""

    format_id: ClassVar[str]
    algorithm: ClassVar[str]
    title: ClassVar[str]
    detection: ClassVar[str]
    mapping: ClassVar[str] = ""
    spec_ref: ClassVar[str] = ""
    supported: ClassVar[bool] = True
    refusal: ClassVar[str] = ""
    #: ``"module:Class"`` of the producer's own model, G2's source reference (its forward and, when it has one,
    #: ``propose``: :class:`specconv.validate.zlab_reference.ZLabDFlashReference`); None: the source converted afresh
    reference_model: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("plan")
        if own is not None and not getattr(own, "checks_layer_keys", False):
            cls.plan = _refusing_layer_keys(own)  # type: ignore[method-assign]

    @classmethod
    def detect(cls, src: SourceInfo) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def plan(self, src: SourceInfo, verifier: VerifierView | None, opts: ConvertOptions) -> ConversionPlan:
        """Map the source to a :class:`ConversionPlan` (no files written).

        Raises:
            UnsupportedFormatError: refused formats (``supported = False``).
            InvalidInputError: inconsistent checkpoint or flags; names key/tensor/flag.
        """
        raise UnsupportedFormatError(f"{self.title} ({self.format_id}) is not supported: {self.refusal}",
                                     format_id=self.format_id)

    @classmethod
    def describe(cls) -> dict[str, Any]:
        return {"format": cls.format_id, "algorithm": cls.algorithm, "title": cls.title, "supported": cls.supported,
                "detection": cls.detection, "mapping": cls.mapping if cls.supported else cls.refusal,
                "spec_ref": cls.spec_ref}


class RefusedFormat(Converter):
    """A format recognised and refused by name: the inherited ``plan`` raises naming ``refusal``."""

    supported: ClassVar[bool] = False


def register(cls: type[Converter]) -> type[Converter]:
    """Class decorator: add a converter to :data:`REGISTRY` (ids must be unique)."""
    fid = cls.format_id
    if fid in REGISTRY and REGISTRY[fid] is not cls:
        raise RuntimeError(f"duplicate converter format id {fid!r}")
    REGISTRY[fid] = cls
    return cls


def ordered() -> list[type[Converter]]:
    """Registered converters in listing order: as the detection routes reach them
    (:func:`specconv.converters.dispatch.all_ids`), then any unrouted one by id."""
    from .dispatch import all_ids

    routed = [REGISTRY[i] for i in all_ids() if i in REGISTRY]
    return routed + sorted((c for c in REGISTRY.values() if c not in routed), key=lambda c: c.format_id)
