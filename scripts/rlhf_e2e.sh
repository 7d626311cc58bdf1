#!/usr/bin/env bash
# docs/results.md "RLHF end to end on CPU": preference pairs -> a reward model -> PPO and GRPO
# trained by that reward model alone, the rule checker (math_correct) only watching.
# One after another (never in parallel) on SmolLM2-135M-Instruct, 2-digit additions:
#   1. scripts/rlhf_pairs.py: 8 replies per problem sampled from the base model, a correct one paired
#      with a wrong one (the pairs of the last quarter of the problems held out);
#   2. rlft rm: a Bradley-Terry reward model (LoRA) on those pairs, held-out pairwise accuracy;
#   3. rlft train algo=grpo and algo=ppo with reward=model (no reward function), reward.gold=math_correct
#      logged beside reward/model, greedy held-out accuracy (the rule checker) at the start and end;
#   4. the GEMM figure before and after, a summary table and the model-vs-gold plots.
#
#   scripts/rlhf_e2e.sh [OUT_DIR]      (STEPS=40 RM_STEPS=150 EVAL=10 RM_EVAL=25 SAMPLER=vllm; PAIRS=DIR to reuse
#                                        pairs, RM_RUN=DIR to reuse an rlft rm run directory instead of step 2)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/rlhf}
RLFT=${RLFT:-.venv/bin/rlft}
PY=${PY:-.venv/bin/python}
STEPS=${STEPS:-40}
RM_STEPS=${RM_STEPS:-150}
RM_EVAL=${RM_EVAL:-25}
EVAL=${EVAL:-10}
SAMPLER=${SAMPLER:-vllm}
PAIRS=${PAIRS:-$OUT/pairs}
RM_RUN=${RM_RUN:-}
mkdir -p "$OUT"
for d in $([ -z "$RM_RUN" ] && echo rm) grpo ppo; do
  if [ -e "$OUT/$d" ]; then echo "$OUT/$d exists: choose another OUT_DIR" >&2; exit 2; fi
done
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
grep -m1 "model name" /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' > "$OUT/cpu.txt"
echo "gemm_before $(gemm)" > "$OUT/gemm.txt"
: > "$OUT/timings.txt"

if [ ! -s "$PAIRS/train.jsonl" ]; then
  timed pairs "$PY" scripts/rlhf_pairs.py "$PAIRS" --problems 400 --held-out 0.25 --samples 8
fi
if [ -z "$RM_RUN" ]; then
  RM_RUN="$OUT/rm"
  timed rm "$RLFT" rm model=smollm2_135m "data.path=$PAIRS/train.jsonl" "data.eval_path=$PAIRS/eval.jsonl" \
    "trainer.steps=$RM_STEPS" trainer.batch_size=8 "trainer.eval_every=$RM_EVAL" "hydra.run.dir=$RM_RUN"
fi
RM="$RM_RUN/reward_model"
COMMON=(model=smollm2_135m reward=model "reward.models=[{path: '$RM'}]" reward.gold=math_correct "sampler=$SAMPLER"
        "trainer.steps=$STEPS" "trainer.eval_every=$EVAL" trainer.eval_at_start=true)
timed grpo "$RLFT" train algo=grpo "${COMMON[@]}" "hydra.run.dir=$OUT/grpo"
timed ppo "$RLFT" train algo=ppo "${COMMON[@]}" "hydra.run.dir=$OUT/ppo"
echo "gemm_after $(gemm)" >> "$OUT/gemm.txt"

"$PY" scripts/plot_runs.py "$OUT/rlhf" grpo="$OUT/grpo" ppo="$OUT/ppo"
"$PY" - "$OUT" "$RM_RUN" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = [json.loads(l) for l in (Path(sys.argv[2]) / "metrics.jsonl").read_text().splitlines() if l.strip()]
acc = [r["eval/rm_accuracy"] for r in rows if "eval/rm_accuracy" in r]
print(f"reward model: held-out pairwise accuracy {acc[0]:.3f} -> {acc[-1]:.3f} ({len(acc)} evaluations)")
print("| run | greedy accuracy first -> last | reward/model first -> last | reward/gold first -> last | steps |")
print("|---|---|---|---|---|")
for name in ("grpo", "ppo"):
    recs = [json.loads(l) for l in (out / name / "metrics.jsonl").read_text().splitlines() if l.strip()]
    ev = [r["eval/accuracy"] for r in recs if "eval/accuracy" in r]
    m = [r["reward/model"] for r in recs if "reward/model" in r]
    g = [r["reward/gold"] for r in recs if "reward/gold" in r]
    steps = max(r["step"] for r in recs)
    print(f"| {name} | {ev[0]:.3f} -> {ev[-1]:.3f} | {m[0]:.3f} -> {m[-1]:.3f} | {g[0]:.3f} -> {g[-1]:.3f} | {steps} |")
EOF
cat "$OUT/cpu.txt" "$OUT/gemm.txt" "$OUT/timings.txt"
