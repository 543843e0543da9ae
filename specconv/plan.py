"""The one in-memory description of a conversion, from a converter's ``plan`` to the writer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

#: What happened to a tensor on its way to the output: copied / renamed / reshaped keep its bytes, sliced
#: selects rows (``markov_w2`` by ``t2d``), generated builds it from others (``t2d`` from ``d2t``).
Fate = Literal["copied", "renamed", "reshaped", "sliced", "generated", "from_verifier"]
Origin = Literal["source", "verifier", "generated"]


@dataclass
class TensorPlan:
    """One output tensor: ``source`` its name in the source (or verifier) store (None: generated),
    ``dtype`` / ``src_dtype`` safetensors dtypes (differing: a cast), ``produce`` the exact bytes of
    anything that is not a byte-range copy (called once, at write time)."""

    out: str
    fate: Fate
    origin: Origin
    source: str | None
    shape: tuple[int, ...]
    dtype: str
    src_dtype: str
    produce: Callable[[], bytes] | None = None
    note: str = ""

    @property
    def cast(self) -> bool:
        return self.dtype != self.src_dtype

    @property
    def source_name(self) -> str:
        """``source`` of a tensor read from a store (a generated one has none: AssertionError)."""
        assert self.source is not None, f"tensor {self.out!r} is generated: it has no source tensor"
        return self.source

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"fate": self.fate, "origin": self.origin, "source": self.source,
                             "shape": list(self.shape), "dtype": self.dtype}
        if self.cast:
            d["cast_from"] = self.src_dtype
        if self.note:
            d["note"] = self.note
        return d


@dataclass
class DroppedTensor:
    """A source tensor deliberately not carried over, with the reason (never silent)."""

    name: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "fate": "dropped", "reason": self.reason}


@dataclass
class LayerIdConversion:
    """How aux hidden-state layer ids were obtained (vLLM \
``vllm/transformers_utils/configs/speculators/algos.py``: capture ids)."""

    source_key: str | None  # e.g. "dflash_config.target_layer_ids"
    source_convention: str  # "z-lab" (0-based layer outputs, -1 = embeddings) | "speculators" | "override"
    source_ids: list[int] | None
    speculators_ids: list[int]
    rule: str  # e.g. "+1 (z-lab → speculators); -1 → 0"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ConversionPlan:
    """Everything the writer needs; produced by a converter's ``plan``."""

    format_id: str
    algorithm: str
    config: Any  # specconv.format.SpeculatorsDraftConfig
    tensors: list[TensorPlan]
    source_dir: Path
    source_files: list[Path]
    dropped: list[DroppedTensor] = field(default_factory=list)
    findings: list[Any] = field(default_factory=list)  # specconv.format.Finding
    layer_ids: LayerIdConversion | None = None
    options: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def tensor_fates(self) -> dict[str, dict[str, Any]]:
        """``{out name: fate dict}`` plus dropped source tensors under their source name."""
        fates = {t.out: t.to_dict() for t in self.tensors}
        for d in self.dropped:
            fates[f"<dropped>{d.name}"] = d.to_dict()
        return fates
