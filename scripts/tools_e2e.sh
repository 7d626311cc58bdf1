#!/usr/bin/env bash
# docs/results.md "Tools: 3-digit multiplication with a calculator": a task SmolLM2-135M-Instruct fails
# alone but can solve with a tool, before and after a fixed budget of GRPO with tools=[calculator].
# One after another (never in parallel):
#   1. scripts/tool_task.py: training and held-out 3-digit multiplications, prompts with one worked
#      demonstration of a calculator call (and the held-out questions alone, for the no-tool baseline);
#   2. rlft eval of the base model on the questions alone, no tool (greedy accuracy);
#   3. rlft train algo=grpo tools=[calculator] reward.fns=[math_correct]: greedy held-out accuracy,
#      tool calls, turns and the policy's share of the episode tokens at step 0 and every EVAL steps;
#   4. the GEMM figure before and after and a summary table.
#
#   scripts/tools_e2e.sh [OUT_DIR]   (STEPS=20 EVAL=0 (0: at the start and the end) HELD_OUT=50 PROMPTS=2
#                                     TEMPERATURE=0.7 SAMPLER=vllm ALGO=grpo TOOL=calculator)
#   TOOL=python: the same task with the python tool (in its sandbox, episode.python_sandbox=bwrap) instead.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/tools}
RLFT=${RLFT:-.venv/bin/rlft}
PY=${PY:-.venv/bin/python}
STEPS=${STEPS:-20}
EVAL=${EVAL:-0}
HELD_OUT=${HELD_OUT:-50}
PROMPTS=${PROMPTS:-2}
TEMPERATURE=${TEMPERATURE:-0.7}
SAMPLER=${SAMPLER:-vllm}
ALGO=${ALGO:-grpo}
TOOL=${TOOL:-calculator}
for d in plain "$ALGO"; do
  if [ -e "$OUT/$d" ]; then echo "$OUT/$d exists: choose another OUT_DIR" >&2; exit 2; fi
done
mkdir -p "$OUT/plain"
OUT=$(cd "$OUT" && pwd) RLFT=$(realpath "$RLFT")
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
grep -m1 "model name" /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' > "$OUT/cpu.txt"
echo "gemm_before $(gemm)" > "$OUT/gemm.txt"
: > "$OUT/timings.txt"

"$PY" scripts/tool_task.py "$OUT/data" --train 400 --eval "$HELD_OUT" --tool "$TOOL"
(cd "$OUT/plain" && timed plain "$RLFT" eval model=smollm2_135m "reward.fns=[math_correct]" "sampler=$SAMPLER" \
   "data.num_eval=$HELD_OUT" --samples 0 --data "$OUT/data/plain.jsonl")
timed "$ALGO" "$RLFT" train "algo=$ALGO" model=smollm2_135m data=jsonl "data.path=$OUT/data/train.jsonl" \
  "data.eval_path=$OUT/data/eval.jsonl" "data.num_eval=$HELD_OUT" "tools=[$TOOL]" episode.max_turns=3 \
  "reward.fns=[math_correct]" "sampler=$SAMPLER" sampler.max_new_tokens=40 "sampler.temperature=$TEMPERATURE" \
  "trainer.num_prompts=$PROMPTS" "trainer.steps=$STEPS" \
  "trainer.eval_every=$EVAL" trainer.eval_at_start=true "hydra.run.dir=$OUT/$ALGO"
echo "gemm_after $(gemm)" >> "$OUT/gemm.txt"

"$PY" - "$OUT" "$ALGO" <<'EOF'
import json, sys
from pathlib import Path
out, algo = Path(sys.argv[1]), sys.argv[2]
plain = json.loads((out / "plain" / "eval.json").read_text())
print(f"base model, no tool: greedy held-out accuracy {plain['eval/accuracy']:.3f}")
recs = [json.loads(l) for l in (out / algo / "metrics.jsonl").read_text().splitlines() if l.strip()]
print("| step | greedy accuracy | tool calls / episode | turns / episode | policy token share |")
print("|---|---|---|---|---|")
for r in recs:
    if "eval/accuracy" in r:
        print(f"| {r['step']} | {r['eval/accuracy']:.3f} | {r['eval/episode/tool_calls']:.2f} | "
              f"{r['eval/episode/turns']:.2f} | {r['eval/episode/policy_token_frac']:.2f} |")
train = [r for r in recs if "episode/turns" in r]
for lo in range(0, len(train), 5):
    part = train[lo:lo + 5]
    mean = lambda k: sum(r.get(k, 0.0) for r in part) / len(part)
    print(f"steps {part[0]['step']}-{part[-1]['step']}: reward {mean('reward/mean'):.3f}, tool calls "
          f"{mean('episode/tool_calls'):.2f}, tool errors {mean('episode/tool_errors'):.2f}, turns "
          f"{mean('episode/turns'):.2f}, policy token share {mean('episode/policy_token_frac'):.2f}")
EOF
cat "$OUT/cpu.txt" "$OUT/gemm.txt" "$OUT/timings.txt"
