#!/usr/bin/env bash
# The prepared GPU check (one call on a lent machine, under 8 minutes): the CUDA tests, one step
# breakdown on CUDA, then a 1-GPU torchrun run (NCCL). Needs a Python with torch (CUDA) and rlft's
# dependencies importable; pass PY=/path/to/python when they live in another environment. On a machine
# without a package index (the lent H200 has torch, transformers, peft, rich): copy hydra/, omegaconf/ and
# antlr4/ from a venv into a carried folder on PYTHONPATH, and for model=tiny (which takes SmolLM2's
# tokenizer) a RLFT_CACHE holding models/SmolLM2-135M-Instruct without model.safetensors.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
"$PY" -c "import torch, transformers, peft; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0), 'transformers', transformers.__version__, 'peft', peft.__version__)"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
timeout 300 "$PY" -m pytest -q -m gpu tests/gpu -p no:cacheprovider -o addopts="-ra" 2>&1 | tail -60
timeout 90 "$PY" scripts/bench_step.py --steps 3 --warmup 1 sampler=hf model=tiny trainer.device=cuda \
    trainer.num_prompts=4 sampler.n=8 sampler.max_new_tokens=64 2>&1 | tail -20
# Issue 15: one rank under torchrun on CUDA (NCCL), 3 steps, checkpoint with world_size 1. (FSDP2 needs 2+
# ranks, and NCCL refuses two ranks on one GPU: FSDP2 on CUDA waits for a machine with 2 GPUs.)
run=$(mktemp -d)
timeout 90 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m rlft train sampler=hf model=tiny \
    trainer.device=cuda trainer.steps=3 trainer.num_prompts=2 sampler.n=4 sampler.max_new_tokens=16 \
    data.num_eval=4 logger.console=false "hydra.run.dir=$run" 2>&1 | tail -5
"$PY" -c "import json,sys; s=json.load(open('$run/checkpoints/step_000003/trainer_state.json')); print('torchrun 1 GPU ddp: step', s['step'], 'world', s['world_size'])"
