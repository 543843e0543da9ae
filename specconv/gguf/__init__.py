"""GGUF drafters for llama.cpp's ``llama-server`` (``specconv export gguf``, ``validate --backend
llamacpp``): what is written, refused and checked is ``docs/llamacpp.md``; each module's part is
``docs/architecture.md``'s (``specconv/gguf/``). The room needs the ``gguf`` extra (PyPI ``gguf``
and the ``validate`` extra: transformers for the tokenizer, torch for the tensors).
"""
