"""Run the verifier (a transformers causal LM) and capture aux hidden states by forward hooks.

Capture convention as vLLM ``vllm/model_executor/models/llama.py`` (``LlamaModel.forward`` records
the residual stream entering each layer of ``aux_hidden_state_layers``); ``docs/validate.md``, "Harness".
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError
from ..extras import quiet_library_bars

log = logging.getLogger("specconv.validate")

_DTYPES = ("float32", "bfloat16", "float16", "float64")


def torch_dtype(name: str | Any):
    """torch.dtype of a name in ``_DTYPES`` (or a torch dtype); InvalidInputError for another name."""
    import torch

    if isinstance(name, torch.dtype):
        return name
    if name not in _DTYPES:
        raise InvalidInputError(f"unknown dtype {name!r}; use one of {', '.join(_DTYPES[:3])}")
    return getattr(torch, name)


def resolve_device(device: str = "auto") -> str:
    """``auto`` → ``cuda`` when usable, else ``cpu``; InvalidInputError for unavailable cuda or another name."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InvalidInputError("--device cuda was requested but no CUDA device is available")
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise InvalidInputError(f"unknown device {device!r}; use auto, cpu or cuda")
    return device


@dataclass
class VerifyOutput:
    """One verifier forward: float32 ``logits [n, V]``; ``aux [n, A*H]`` in ``aux_layer_ids`` order
    (verifier dtype), None when none were requested."""

    logits: Any
    aux: Any | None


def _decoder_parts(model) -> tuple[Any, Any, Any]:
    """(embedding module, decoder layer ModuleList, final norm or None)."""
    base = None
    get_decoder = getattr(model, "get_decoder", None)
    if callable(get_decoder):
        try:
            base = get_decoder()
        except Exception:  # pragma: no cover - defensive (models without a decoder accessor)
            base = None
    if base is None:
        base = getattr(model, "model", None)
    layers = getattr(base, "layers", None) if base is not None else None
    if layers is None:
        raise InvalidInputError(
            f"cannot find the decoder layers of {type(model).__name__} "
            "(expected model.model.layers); this verifier architecture is not supported"
        )
    embed = model.get_input_embeddings()
    norm = getattr(base, "norm", None)
    return embed, layers, norm


def _load_model(verifier: str | Path, *, device: str, dtype, attn_implementation: str, device_map: str | None,
                local_files_only: bool):
    """The model in eval mode on ``device`` (or placed by ``device_map``); InvalidInputError: bad attention
    implementation, ``device_map`` without CUDA, or an unloadable checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM

    quiet_library_bars()  # "Loading weights" bars only on a TTY
    if attn_implementation not in ("eager", "sdpa"):
        raise InvalidInputError(f"attention implementation must be eager or sdpa, not {attn_implementation!r}")
    kwargs: dict[str, Any] = {"dtype": torch_dtype(dtype), "attn_implementation": attn_implementation,
                              "local_files_only": local_files_only}
    if device_map is not None:
        if not torch.cuda.is_available():
            raise InvalidInputError("device_map='auto' needs CUDA; use --device cpu")
        kwargs["device_map"] = device_map
    try:  # typed as a Module: transformers' @wraps-decorated PreTrainedModel.to does not bind self for mypy
        model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(str(verifier), **kwargs)
    except (OSError, ValueError) as e:
        raise InvalidInputError(f"cannot load verifier {verifier}: {e}") from e
    if device_map is None:
        model = model.to(device)
    return model.eval()


class VerifierRunner:
    """A loaded verifier (eval mode; ``tokenizer`` may be None) plus aux capture and KV-cache helpers."""

    def __init__(self, model, tokenizer=None, aux_layer_ids: Sequence[int] = (), device: str = "cpu"):
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        cfg = model.config
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        self.config = text_cfg
        self.embed, self.layers, self.norm = _decoder_parts(model)
        self.num_layers = len(self.layers)
        self.hidden_size = int(text_cfg.hidden_size)
        self.vocab_size = (int(model.get_output_embeddings().weight.shape[0])
                           if model.get_output_embeddings() is not None else int(text_cfg.vocab_size))
        self.dtype = next(model.parameters()).dtype
        self._captured: dict[int, Any] = {}
        self._hooks: list[Any] = []
        self.aux_layer_ids: list[int] = []
        self.set_aux_layer_ids(aux_layer_ids)

    @classmethod
    def load(cls, verifier: str | Path, *, device: str = "cpu", dtype: str | Any = "float32",
             attn_implementation: str = "sdpa", aux_layer_ids: Sequence[int] = (), device_map: str | None = None,
             local_files_only: bool = True) -> VerifierRunner:
        """Load a local dir or cached Hub id; ``device_map="auto"`` shards over the GPUs (accelerate, CUDA).

        Raises InvalidInputError: the verifier cannot be loaded (the message names the path).
        """
        from transformers import AutoTokenizer

        model = _load_model(verifier, device=device, dtype=dtype, attn_implementation=attn_implementation,
                            device_map=device_map, local_files_only=local_files_only)
        try:
            tok = AutoTokenizer.from_pretrained(str(verifier), local_files_only=local_files_only)
        except (OSError, ValueError) as e:
            log.warning("verifier %s has no loadable tokenizer (%s)", verifier, e)
            tok = None
        in_device = device
        if device_map is not None:
            in_device = str(model.get_input_embeddings().weight.device)
        return cls(model, tok, aux_layer_ids=aux_layer_ids, device=in_device)

    def set_aux_layer_ids(self, ids: Sequence[int]) -> None:
        """(Re)install capture hooks for ``ids``; InvalidInputError for an id outside ``[0, N]``."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        ids = [int(i) for i in ids]
        for i in ids:
            if not 0 <= i <= self.num_layers:
                raise InvalidInputError(
                    f"aux hidden-state layer id {i} is outside [0, {self.num_layers}] for this "
                    f"{self.num_layers}-layer verifier (speculators convention: 0 = embeddings, "
                    f"{self.num_layers} = final pre-norm hidden state)"
                )
        self.aux_layer_ids = ids

        def save(key):
            def hook(_mod, _inp, out):
                self._captured[key] = out[0] if isinstance(out, tuple) else out

            return hook

        for i in sorted(set(ids)):
            mod = self.embed if i == 0 else self.layers[i - 1]
            self._hooks.append(mod.register_forward_hook(save(i)))

    def close(self) -> None:
        """Remove the capture hooks."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def new_cache(self):
        """Return an empty ``DynamicCache`` for this verifier."""
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self.model.config)
        except TypeError:  # older transformers
            return DynamicCache()

    @staticmethod
    def cache_length(cache) -> int:
        """Number of positions currently held in ``cache``."""
        return int(cache.get_seq_length())

    @staticmethod
    def crop(cache, length: int) -> None:
        """Shorten ``cache`` to its first ``length`` positions (no-op if already that short)."""
        remove = int(cache.get_seq_length()) - int(length)
        if remove > 0:
            cache.crop(-remove)

    def forward(self, tokens, cache=None, *, start: int | None = None, capture: bool = True) -> VerifyOutput:
        """Run ``tokens`` (long ``[1, n]`` or ints) at positions ``start..`` (default: the cache length),
        extending ``cache`` in place (None: stateless)."""
        import torch

        if not torch.is_tensor(tokens):
            tokens = torch.tensor([list(tokens)], dtype=torch.long)
        if tokens.dim() == 1:
            tokens = tokens[None]
        tokens = tokens.to(self.device)
        n = tokens.shape[1]
        if start is None:
            start = self.cache_length(cache) if cache is not None else 0
        pos = torch.arange(start, start + n, device=self.device)[None]
        self._captured = {}
        with torch.inference_mode():
            out = self.model(input_ids=tokens, position_ids=pos, past_key_values=cache, use_cache=cache is not None)
        logits = out.logits[0].float()
        aux = None
        if capture and self.aux_layer_ids:
            parts = [self._captured[i][0] for i in self.aux_layer_ids]
            dev = parts[0].device
            aux = torch.cat([p.to(dev) for p in parts], dim=-1)
        self._captured = {}
        return VerifyOutput(logits=logits, aux=aux)

    def hidden_state(self, tokens, layer_id: int):
        """Stateless forward returning the Speculators-id ``layer_id`` hidden state [n, H] (tests)."""
        saved = list(self.aux_layer_ids)
        try:
            self.set_aux_layer_ids([layer_id])
            return self.forward(tokens, None).aux
        finally:
            self.set_aux_layer_ids(saved)

    def stop_token_ids(self) -> list[int]:
        """eos id(s) of config, generation config and tokenizer, plus the template's turn-closing token."""
        ids: set[int] = set()

        def add(v):
            if v is None:
                return
            if isinstance(v, (list, tuple)):
                for x in v:
                    add(x)
            else:
                ids.add(int(v))

        add(getattr(self.config, "eos_token_id", None))
        gen = getattr(self.model, "generation_config", None)
        if gen is not None:
            add(getattr(gen, "eos_token_id", None))
        tok = self.tokenizer
        if tok is not None:
            add(getattr(tok, "eos_token_id", None))
            vocab = tok.get_vocab() if hasattr(tok, "get_vocab") else {}
            for name in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>"):
                if name in vocab:
                    tmpl = getattr(tok, "chat_template", None) or ""
                    if name in tmpl or name == getattr(tok, "eos_token", None):
                        ids.add(int(vocab[name]))
        return sorted(ids)
