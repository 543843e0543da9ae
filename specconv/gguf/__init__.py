"""GGUF drafters for llama.cpp's ``llama-server`` (``specconv export gguf``, docs/llamacpp.md).

A Speculators DFlash or DSpark dir becomes one ``drafter-<dtype>.gguf`` in llama.cpp's
``dflash`` architecture, checked by llama.cpp itself:

* :mod:`.layout` — what llama.cpp can represent (refusals by name) and the GGUF plan: every
  metadata key and every tensor with its GGML type, from the typed config and the
  algorithm description's llama.cpp facts (:class:`specconv.format.algorithms.LlamaCppFacts`);
* :mod:`.vocab` — the verifier's tokenizer as llama.cpp's converter writes it
  (``tokenizer.ggml.*``, GPT-2 BPE);
* :mod:`.writer` — the file, through PyPI ``gguf`` (``GGUFWriter``, ``quants``);
* :mod:`.target` — the verifier GGUF ``llama-server -m`` serves (``--verifier-gguf``):
  its header facts and the refusals that depend on it;
* :mod:`.server`, :mod:`.check` — ``llama-server`` on 127.0.0.1 with and without ``-md``,
  greedy outputs compared, τ from its ``/metrics`` counters;
* :mod:`.export` — ``OUT/`` (a temp dir renamed at the end), ``gguf_meta.json``, the
  ``export.gguf`` record section.

The room needs the ``gguf`` extra (PyPI ``gguf``) and the ``validate`` extra (transformers for
the tokenizer, torch for the tensors); ``validate --backend llamacpp``
(:mod:`specconv.gguf.backend`) runs the same check next to the torch loop.
"""
