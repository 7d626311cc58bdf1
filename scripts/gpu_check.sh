#!/usr/bin/env bash
# The prepared GPU check (one call on a lent machine, well under 10 minutes): the CUDA tests, one
# step breakdown on CUDA, then a 1-GPU torchrun run (NCCL). Needs a Python with torch (CUDA) and rlft's dependencies importable; pass
# PY=/path/to/python when they live in another environment.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
timeout 420 "$PY" -m pytest -q -m gpu tests/gpu -x -p no:cacheprovider 2>&1 | tail -40
timeout 150 "$PY" scripts/bench_step.py --steps 3 --warmup 1 sampler=hf model=tiny trainer.device=cuda \
    trainer.num_prompts=4 sampler.n=8 sampler.max_new_tokens=64 2>&1 | tail -20
# Issue 15: one rank under torchrun on CUDA (NCCL), 3 steps, checkpoint with world_size 1.
run=$(mktemp -d)
timeout 150 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m rlft train sampler=hf model=tiny \
    trainer.device=cuda trainer.steps=3 trainer.num_prompts=2 sampler.n=4 sampler.max_new_tokens=16 data.num_eval=4 \
    logger.console=false "hydra.run.dir=$run" 2>&1 | tail -5
"$PY" -c "import json,sys; s=json.load(open('$run/checkpoints/step_000003/trainer_state.json')); print('torchrun 1 GPU: step', s['step'], 'world', s['world_size'])"
