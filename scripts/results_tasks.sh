#!/usr/bin/env bash
# docs/results.md "Learning: GSM8K, countdown and 3-digit mixed arithmetic, 8 minutes each".
# One after another (never in parallel): the CPU model and an fp32 GEMM figure, SmolLM2-135M's
# greedy GSM8K accuracy on 200 test problems, three 8-minute DAPO runs (GSM8K, countdown, 3-digit
# + - * arithmetic) each evaluated at its start and at the step that ends the budget, the GEMM
# figure again, then a summary table. About 45 minutes on 2 CPU cores.
#
#   scripts/results_tasks.sh [OUT_DIR]     (make results-tasks RUNS=DIR: OUT_DIR=DIR/tasks)
#
# GSM8K is read from ../shared/data/gsm8k/{train,test}.jsonl (GSM8K=DIR to change it).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/tasks}
GSM8K=${GSM8K:-../shared/data/gsm8k}
RLFT=${RLFT:-.venv/bin/rlft}
PY=${PY:-.venv/bin/python}
SAMPLER=${SAMPLER:-vllm}
MINUTES=${MINUTES:-8}
mkdir -p "$OUT"
for d in gsm8k countdown arith3; do
  if [ -e "$OUT/$d" ]; then echo "$OUT/$d exists: choose another OUT_DIR" >&2; exit 2; fi
done

# shellcheck source=scripts/lib.sh
source scripts/lib.sh

grep -m1 "model name" /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' > "$OUT/cpu.txt"
echo "gemm_before $(gemm)" > "$OUT/gemm.txt"
: > "$OUT/timings.txt"

GSM=(data=gsm8k "data.path=$GSM8K/train.jsonl" "data.eval_path=$GSM8K/test.jsonl" sampler.max_new_tokens=256)
COMMON=(model=smollm2_135m algo=dapo "sampler=$SAMPLER" trainer.steps=1000 "trainer.max_minutes=$MINUTES"
        trainer.eval_every=0 trainer.eval_at_start=true)

# 1. Base greedy accuracy on the first 200 GSM8K test problems.
timed gsm8k_base "$RLFT" eval model=smollm2_135m "sampler=$SAMPLER" "${GSM[@]}" data.num_eval=200 \
  --samples 0 --out "$OUT/gsm8k_base.json"

# 2. Three 8-minute DAPO runs.
timed gsm8k "$RLFT" train "${COMMON[@]}" "${GSM[@]}" data.num_eval=50 trainer.num_prompts=4 sampler.n=4 \
  "hydra.run.dir=$OUT/gsm8k"
timed countdown "$RLFT" train "${COMMON[@]}" data=countdown reward=countdown data.num_eval=100 \
  trainer.num_prompts=4 sampler.n=8 sampler.max_new_tokens=128 "hydra.run.dir=$OUT/countdown"
timed arith3 "$RLFT" train "${COMMON[@]}" data=arithmetic data.digits=3 'data.ops=[+,-,*]' data.num_eval=100 \
  trainer.num_prompts=4 sampler.n=8 sampler.max_new_tokens=32 "hydra.run.dir=$OUT/arith3"

echo "gemm_after $(gemm)" >> "$OUT/gemm.txt"

# 3. Summary.
"$PY" - "$OUT" <<'EOF'
import json, re, sys
from pathlib import Path

out = Path(sys.argv[1])
print("CPU:", (out / "cpu.txt").read_text().strip())
print("fp32 GEMM 1024x576x1536 (GFLOP/s):", " / ".join(l.split()[1] for l in (out / "gemm.txt").read_text().split("\n") if l))
timings = dict(l.split() for l in (out / "timings.txt").read_text().splitlines() if l)
base = json.loads((out / "gsm8k_base.json").read_text())
print(f"gsm8k base, {base['problems']} problems, greedy: {base['eval/accuracy']:.3f} "
      f"(mean {base['eval/mean_tokens']:.0f} tokens; {int(timings['gsm8k_base']) / 60:.1f} min)")
print("| task | base accuracy | after budget | steps (with an update) | reward/mean first -> last | train min | final eval s | wall min | dtype |")
for name in ("gsm8k", "countdown", "arith3"):
    rows = [json.loads(l) for l in (out / name / "metrics.jsonl").read_text().splitlines() if l.strip()]
    first = next(r for r in rows if r.get("step") == 0)
    steps = [r for r in rows if r.get("step", 0) > 0]
    last = steps[-1]
    rewards = [r["reward/mean"] for r in steps if "reward/mean" in r]
    train_min = sum(r.get("time/step_s", 0.0) for r in steps) / 60
    log = (out / name / "train.log").read_text()
    dtype = re.search(r"model\.dtype=auto: (\w+)", log)
    updates = sum(1 for r in steps if r.get("update/skipped") == 0.0)
    print(f"| {name} | {first['eval/accuracy']:.3f} | {last['eval/accuracy']:.3f} | {last['step']} ({updates}) | "
          f"{rewards[0]:.3f} -> {rewards[-1]:.3f} | {train_min:.1f} | "
          f"{last.get('time/eval_s', float('nan')):.0f} | "
          f"{int(timings[name]) / 60:.1f} | {dtype.group(1) if dtype else '?'} |")
EOF
