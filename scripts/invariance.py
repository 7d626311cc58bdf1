"""World-size invariance by dtype and micro-batch size: the same job on 1 rank and on 2 ranks
(trainer.nproc=2, 1 thread per rank on both sides), compared step by step: how many of the step's
completions are token-identical, and the largest relative difference of the checkpoint's tensors.

    python scripts/invariance.py                       # the table in docs/results.md
    python scripts/invariance.py --variants "bf16 mb=1:model.dtype=bf16 trainer.micro_batch_size=1"

A variant is NAME:OVERRIDES (space-separated), added to the base job below.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ranks import gemm, run  # noqa: E402

BASE = ["model=tiny", "sampler=hf", "trainer.num_prompts=4", "sampler.n=8", "sampler.max_new_tokens=16",
        "data.num_eval=0", "trainer.eval_at_start=false", "logger.rollouts=true", "logger.console=false",
        "reward.fns=[tests.helpers:char_count]", "trainer.save_every=1", "trainer.steps=3"]
VARIANTS = [
    "fp32 grpo mb=16:model.dtype=fp32 algo=grpo",
    "bf16 grpo mb=16:model.dtype=bf16 algo=grpo",
    "bf16 grpo mb=4:model.dtype=bf16 algo=grpo trainer.micro_batch_size=4",
    "bf16 grpo mb=1:model.dtype=bf16 algo=grpo trainer.micro_batch_size=1",
    "bf16 dapo mb=1:model.dtype=bf16 algo=dapo algo.overlong_filter=false trainer.micro_batch_size=1",
    "bf16 ppo mb=1:model.dtype=bf16 algo=ppo trainer.micro_batch_size=1",
]


def step_rows(run_dir: Path) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for line in (run_dir / "rollouts.jsonl").read_text().splitlines():
        row = json.loads(line)
        out.setdefault(row["step"], []).append(row)
    return out


def weight_diff(a: Path, b: Path, step: int) -> float:
    from safetensors.torch import load_file

    name = f"checkpoints/step_{step:06d}/trainable.safetensors"
    x, y = load_file(str(a / name)), load_file(str(b / name))
    return max(float((x[k] - y[k]).norm() / x[k].norm().clamp(min=1e-12)) for k in x)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="*", default=VARIANTS)
    args = parser.parse_args()
    print(f"fp32 GEMM 1024x576x1536: {gemm():.0f} GFLOP/s; base job: {' '.join(BASE)}")
    print("| variant | step | identical completions | weights max rel. diff |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="rlft-invariance-") as tmp:
        for i, variant in enumerate(args.variants):
            name, _, extra = variant.partition(":")
            overrides = BASE + extra.split()
            one, two = Path(tmp) / f"{i}-one", Path(tmp) / f"{i}-two"
            run(1, overrides, one, threads=1)
            run(2, overrides, two, threads=1)
            rows_one, rows_two = step_rows(one), step_rows(two)
            for step, rows in sorted(rows_one.items()):
                same = sum(p == q for p, q in zip(rows, rows_two.get(step, [])))
                print(f"| {name} | {step} | {same}/{len(rows)} | {weight_diff(one, two, step):.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
