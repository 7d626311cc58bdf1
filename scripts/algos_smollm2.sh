#!/usr/bin/env bash
# Issue 27's "runs end to end on SmolLM2": a few steps of each newer preset and option on
# SmolLM2-135M-Instruct with the vLLM sampler (2-digit additions), one after another, and a table of
# what each step logged: reward, loss, entropy, the correction's weight and masked/clipped share.
#
#   scripts/algos_smollm2.sh [OUT_DIR]   (STEPS=2 PROMPTS=2 N=4 SAMPLER=vllm)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/algos}
RLFT=${RLFT:-.venv/bin/rlft}
PY=${PY:-.venv/bin/python}
STEPS=${STEPS:-2}
PROMPTS=${PROMPTS:-2}
N=${N:-4}
SAMPLER=${SAMPLER:-vllm}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd) RLFT=$(realpath "$RLFT")
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
echo "gemm_before $(gemm)" > "$OUT/gemm.txt"
: > "$OUT/timings.txt"

# name | overrides (space-separated)
RUNS=(
  "rloo|algo=rloo"
  "reinforce_pp|algo=reinforce_pp"
  "reinforce_pp_baseline|algo=reinforce_pp_baseline"
  "cispo|algo=cispo"
  "gmpo|algo=gmpo"
  "grpo_token_tis|algo=grpo algo.rollout_correction=token_tis"
  "grpo_seq_tis|algo=grpo algo.rollout_correction=seq_tis"
  "grpo_token_mask|algo=grpo algo.rollout_correction=token_mask algo.rollout_is_low=0.5 algo.rollout_is_high=5"
  "grpo_seq_mask|algo=grpo algo.rollout_correction=seq_mask algo.rollout_is_high=3"
  "grpo_entropy|algo=grpo algo.entropy_coef=0.01"
)
for spec in "${RUNS[@]}"; do
  name=${spec%%|*}
  read -r -a extra <<< "${spec#*|}"
  [ -e "$OUT/$name/metrics.jsonl" ] && continue
  timed "$name" "$RLFT" train model=smollm2_135m "sampler=$SAMPLER" "sampler.n=$N" "trainer.num_prompts=$PROMPTS" \
    "trainer.steps=$STEPS" trainer.eval_at_start=false data.num_eval=20 "${extra[@]}" "hydra.run.dir=$OUT/$name"
done
echo "gemm_after $(gemm)" >> "$OUT/gemm.txt"

"$PY" - "$OUT" "${RUNS[@]}" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print("| run | step | reward | loss | entropy | is_weight_mean | is clipped / masked frac | step s |")
print("|---|---|---|---|---|---|---|---|")
for spec in sys.argv[2:]:
    name = spec.split("|")[0]
    for r in (json.loads(l) for l in (out / name / "metrics.jsonl").read_text().splitlines() if l.strip()):
        if "loss" not in r:
            continue
        g = lambda k: f"{r[k]:.4g}" if k in r else "-"
        frac = r.get("rollout/is_clipped_frac", r.get("rollout/is_masked_frac"))
        print(f"| {name} | {r['step']} | {g('reward/mean')} | {g('loss')} | {g('entropy')} | "
              f"{g('rollout/is_weight_mean')} | {'-' if frac is None else f'{frac:.4g}'} | {g('time/step_s')} |")
EOF
cat "$OUT/gemm.txt" "$OUT/timings.txt"
