"""The verifier's tokenizer as llama.cpp's converter writes it into a drafter GGUF (``tokenizer.ggml.*``;
GPT-2 BPE only, at ggml-org/llama.cpp@0c1e57098: docs/llamacpp.md, "The tokenizer and the tensor bytes").
"""

from __future__ import annotations

import json
from hashlib import sha256
from pathlib import Path
from typing import Any

from .layout import refuse

__all__ = ["ARCH_RULES", "CHKTXT", "PRE_TOKENIZERS", "add_flags", "add_tokenizer", "vocab_base"]

#: The text whose token ids name the BPE pre-tokenizer (``conversion/base.py``
#: ``get_vocab_base_pre``, ``chktxt``; 350 characters).
CHKTXT = ('\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n\U0001f680 (normal) \U0001f636\u200d\U0001f32b\ufe0f '
          '(multiple emojis concatenated) \u2705 \U0001f999\U0001f999 3 33 333 3333 33333 333333 3333333 33333333 '
          '3.3 3..3 3...3 \u1780\u17b6\u1793\u17cb\u178f\u17c2\u1796\u17b7\u179f\u17c1\u179f\u17a2\u17b6\u1785'
          '\U0001f601 ?\u6211\u60f3\u5728apple\u5de5\u4f5c1314151\u5929\uff5e ------======= \u043d\u0435\u0449'
          '\u043e \u043d\u0430 \u0411\u044a\u043b\u0433\u0430\u0440\u0441\u043a\u0438 \'\'\'\'\'\'```````""""......'
          '!!!!!!?????? I\'ve been \'told he\'s there, \'RE you sure? \'M not sure I\'ll make it, \'D you like some '
          'tea? We\'Ve a\'lL')
#: sha256 of ``str(tokenizer.encode(CHKTXT))`` → ``tokenizer.ggml.pre``: the entries of the tested
#: converter's table for the verifier families specconv converts for (``get_vocab_base_pre``;
#: its ``ref:`` model in the comment). Only ``smollm`` is exercised here (tests/gguf/test_export_gguf.py).
PRE_TOKENIZERS = {
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",  # HuggingFaceTB/SmolLM-135M
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",  # meta-llama/Meta-Llama-3-8B
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",  # Qwen/Qwen1.5-7B
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",  # Qwen/Qwen3-Embedding-0.6B
}
#: verifier ``architectures[0]`` → what its converter class adds around ``_set_vocab_gpt2``
#: (``conversion/llama.py`` ``LlamaModel.set_vocab``; ``conversion/qwen.py`` ``Qwen2Model.set_vocab``
#: adds nothing).
ARCH_RULES: dict[str, dict[str, Any]] = {
    "LlamaForCausalLM": {"add_space_prefix_from_config": True, "no_bos_for_vocab": 49152},
    "Qwen2ForCausalLM": {}, "Qwen3ForCausalLM": {}, "Qwen3MoeForCausalLM": {},
}
#: ``gguf.TokenType`` values (the GGUF format's token types).
_NORMAL, _CONTROL, _USER_DEFINED, _UNUSED = 1, 3, 4, 5
_SPECIAL_LOOKING = ("<pad>", "<mask>", "<2mass>", "[@BOS@]")


def _read_json(p: Path) -> dict:
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise refuse("tokenizer", f"{p}: cannot read ({e})") from e
    return d if isinstance(d, dict) else {}


def check_tokenizer(verifier_dir: Path, architecture: str | None) -> tuple[dict, dict, dict[str, Any]]:
    """The verifier's ``tokenizer.json`` and ``tokenizer_config.json`` when specconv can write
    them as llama.cpp's converter would, and the architecture's :data:`ARCH_RULES`; else a refusal
    naming why.

    Raises:
        UnsupportedFormatError: ``gguf_tokenizer`` (exit 3).
    """
    if architecture not in ARCH_RULES:
        raise refuse("tokenizer", f"verifier architecture {architecture!r}: specconv writes the tokenizer the way "
                     f"llama.cpp's converter does for {', '.join(ARCH_RULES)} only")
    if (verifier_dir / "tokenizer.model").is_file():
        raise refuse("tokenizer", f"{verifier_dir}/tokenizer.model: a SentencePiece vocabulary (llama.cpp's "
                     "converter writes it through sentencepiece; specconv writes GPT-2 BPE only)")
    tj = _read_json(verifier_dir / "tokenizer.json") if (verifier_dir / "tokenizer.json").is_file() else {}
    model = tj.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        raise refuse("tokenizer", f"{verifier_dir}/tokenizer.json: model {model.get('type')!r} (byte_fallback "
                     f"{model.get('byte_fallback')!r}); specconv writes GPT-2 BPE tokenizers only")
    norm = json.dumps(tj.get("normalizer") or {})
    if any(t in norm for t in ('"Lowercase"', '"StripAccents"', '"BertNormalizer"')):
        raise refuse("tokenizer", f"{verifier_dir}/tokenizer.json: a lowercasing / accent-stripping normalizer, "
                     "which llama.cpp's converter records and specconv does not write")
    tc = (_read_json(verifier_dir / "tokenizer_config.json") if (verifier_dir / "tokenizer_config.json").is_file()
          else {})
    return tj, tc, ARCH_RULES[architecture]


def vocab_base(tokenizer: Any, vocab_size: int) -> tuple[list[str], list[int], str]:
    """Tokens, token types and the pre-tokenizer name (``get_vocab_base`` / ``get_vocab_base_pre``)
    of transformers' ``tokenizer`` over the draft config's ``vocab_size``.

    Raises:
        UnsupportedFormatError: ``gguf_tokenizer``: a pre-tokenizer hash not in :data:`PRE_TOKENIZERS`.
    """
    chkhsh = sha256(str(tokenizer.encode(CHKTXT)).encode()).hexdigest()
    if chkhsh not in PRE_TOKENIZERS:
        raise refuse("tokenizer", f"BPE pre-tokenizer with hash {chkhsh} is not one specconv knows "
                     f"(known: {', '.join(sorted(set(PRE_TOKENIZERS.values())))})")
    reverse = {i: t for t, i in tokenizer.vocab.items()}
    added, decoder = tokenizer.get_added_vocab(), tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(_UNUSED)
            continue
        tok = reverse[i]
        kind = _NORMAL
        if tok in added:
            if not decoder[i].normalized:
                tok = tokenizer.decode(tokenizer.encode(tok, add_special_tokens=False))
            if decoder[i].special or _looks_special(tok):
                kind = _CONTROL
            else:
                tok, kind = tok.replace("\u2581", " "), _USER_DEFINED
        tokens.append(tok)
        types.append(kind)
    return tokens, types, PRE_TOKENIZERS[chkhsh]


def _looks_special(tok: str) -> bool:
    """``does_token_look_special`` of the converter."""
    return (tok in _SPECIAL_LOOKING or (tok.startswith("<|") and tok.endswith("|>"))
            or (tok.startswith("<\uff5c") and tok.endswith("\uff5c>"))
            or (tok.startswith("<unused") and tok.endswith(">")))


def _content(entry: Any) -> str | None:
    return entry if isinstance(entry, str) else entry.get("content") if isinstance(entry, dict) else None


def add_flags(tj: dict, tc: dict) -> dict[str, bool]:
    """``add_bos`` / ``add_eos`` / ``add_sep`` as the tested converter's ``SpecialVocab`` sets them:
    the tokenizer's post-processor first (``ByteLevel`` → bos/eos false unless set; ``RobertaProcessing``
    → all true; ``TemplateProcessing`` → bos when its single template starts with the bos/cls
    token, eos when it ends with the eos token), then ``tokenizer_config``'s ``add_<typ>_token``
    for what the post-processor left unset.

    Raises:
        UnsupportedFormatError: a template whose trailing special token is not the eos token
            (the converter then rewrites the eos / eot ids: not written by specconv).
    """
    flags: dict[str, bool] = {}
    bos, cls, eos = (_content(tc.get(k)) for k in ("bos_token", "cls_token", "eos_token"))
    pp = tj.get("post_processor") or {}
    for proc in pp.get("processors", [pp]) if pp else []:
        kind, single = proc.get("type"), proc.get("single") or []
        if kind == "ByteLevel":
            flags.setdefault("bos", False)
            flags.setdefault("eos", False)
        elif kind == "RobertaProcessing":
            flags.update(bos=True, eos=True, sep=True)
        elif kind == "TemplateProcessing" and len(single) > 1:
            first, last = (single[j].get("SpecialToken", {}).get("id") for j in (0, -1))
            if first:
                flags["bos"] = first in (bos, cls) or not bos
            if last and last != eos:
                raise refuse("tokenizer", f"tokenizer.json: TemplateProcessing ends with {last!r}, not the eos token")
            if last:
                flags["eos"] = True
    for typ in ("bos", "eos", "unk", "sep", "pad", "cls", "mask"):
        value = tc.get(f"add_{typ}_token")
        if isinstance(value, bool) and typ not in flags:
            flags[typ] = value
    return flags


def add_tokenizer(writer: Any, verifier_dir: Path, architecture: str | None, vocab_size: int) -> None:
    """Write the verifier's tokenizer keys into ``writer`` (a ``gguf.GGUFWriter``), in the
    converter's order: the target class's ``add_space_prefix``, model, pre, tokens, types, then
    merges / special ids / add flags / chat template, then the class's late additions.

    Raises:
        UnsupportedFormatError: ``gguf_tokenizer`` (:func:`check_tokenizer`).
    """
    from transformers import AutoTokenizer

    import gguf

    tj, tc, rules = check_tokenizer(verifier_dir, architecture)
    if rules.get("add_space_prefix_from_config") and isinstance(tc.get("add_prefix_space"), bool):
        writer.add_add_space_prefix(tc["add_prefix_space"])
    tokens, types, pre = vocab_base(AutoTokenizer.from_pretrained(str(verifier_dir)), vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = gguf.SpecialVocab(verifier_dir, load_merges=True)
    special.add_special_token = add_flags(tj, tc)
    if rules.get("no_bos_for_vocab") == vocab_size:  # written after the gpt2 keys there: it wins
        special.add_special_token["bos"] = False
    special.add_to_gguf(writer, quiet=True)
