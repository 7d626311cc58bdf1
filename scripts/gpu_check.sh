#!/usr/bin/env bash
# The prepared GPU check (one call on a lent machine, well under 10 minutes): the CUDA tests, then one
# step breakdown on CUDA. Needs a Python with torch (CUDA) and rlft's dependencies importable; pass
# PY=/path/to/python when they live in another environment.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
timeout 420 "$PY" -m pytest -q -m gpu tests/gpu -x -p no:cacheprovider 2>&1 | tail -40
timeout 150 "$PY" scripts/bench_step.py --steps 3 --warmup 1 sampler=hf model=tiny trainer.device=cuda \
    trainer.num_prompts=4 sampler.n=8 sampler.max_new_tokens=64 2>&1 | tail -20
