"""Tensor names a Speculators drafter may hold, as full-match regexes over the saved names
(no ``model.`` prefix): the converters accept exactly these for their output, and
:func:`specconv.format.tensors.expected_tensors` lists concrete names of the same families
(``tests/format/test_format.py`` checks that each expected name matches its algorithm's patterns).

Names: speculators 0.9.0 ``src/speculators/models/{peagle,dflash,dspark}/core.py`` and the
vLLM 0.33 draft models under ``vllm/model_executor/models/`` (what their ``load_weights``
map). Standard library only, so the converter registry imports it without pydantic.
"""

from __future__ import annotations

#: Decoder-layer tensors (Llama/Qwen3 layers; q/k norms for Qwen3).
LAYER_PATTERNS: tuple[str, ...] = (
    r"layers\.\d+\.(input_layernorm|post_attention_layernorm|hidden_norm)\.weight",
    r"layers\.\d+\.self_attn\.(q|k|v|o)_proj\.(weight|bias)",
    r"layers\.\d+\.self_attn\.(q|k)_norm\.weight",
    r"layers\.\d+\.mlp\.(gate|up|down)_proj\.weight",
)
#: DFlash / DSpark body: layers, the aux projection, its norm and the final norm.
BLOCK_BODY_PATTERNS: tuple[str, ...] = LAYER_PATTERNS + (r"fc\.weight", r"hidden_norm\.weight", r"norm\.weight")
#: Embedding / LM head: identical to the verifier's when present in a full-vocab block drafter.
VERIFIER_SHARED_PATTERNS: tuple[str, ...] = (r"embed_tokens\.weight", r"lm_head\.weight")
#: DSpark's Markov and confidence heads.
DSPARK_HEAD_PATTERNS: tuple[str, ...] = (
    r"markov_head\.markov_w1\.weight",
    r"markov_head\.markov_w2\.weight",
    r"markov_head\.gate_proj\.(weight|bias)",
    r"markov_head\.joint_proj\.(weight|bias)",
    r"confidence_head\.proj\.(weight|bias)",
)
#: DFlash2's per-layer convolutions and candidate selector (speculators 0.9.0 ``models/dflash2/``; bare codebook names).
DFLASH2_PATTERNS: tuple[str, ...] = (
    r"layers\.\d+\.(attention_conv|mlp_conv)\.base_kernel",
    r"layers\.\d+\.(attention_conv|mlp_conv)\.kernel_projection\.weight",
    r"candidate_selector\.hidden_projection\.weight",
    r"candidate_selector\.(predecessor|successor)_codebook",
)
#: Vocabulary maps of a pruned draft vocabulary.
VOCAB_MAP_PATTERNS: tuple[str, ...] = (r"d2t", r"t2d")
#: Everything a P-EAGLE draft may hold.
PEAGLE_PATTERNS: tuple[str, ...] = LAYER_PATTERNS + (
    r"fc\.weight",
    r"norm\.weight",
    r"embed_tokens\.weight",
    r"lm_head\.weight",
    r"mask_hidden",
    r"input_norm\.weight",
    r"fc_norm\.\d+\.weight",
) + VOCAB_MAP_PATTERNS
