"""Data parallelism on this machine: the same job on 1 rank and on N ranks (trainer.nproc), step
times side by side, and the world-size invariance check (same rollouts, same final weights).

    python scripts/bench_ranks.py [--ranks 2] [--repeats 2] [--strategies ddp,fsdp2] [KEY=VALUE ...]

Speed: runs alternate (1, N ddp, N fsdp2, 1, ...) so that drift of the machine's speed hits both alike,
all cores in use either way (1 rank x C threads against N ranks x C/N threads); each run is a
fresh `rlft train` (steps 2.. are timed: step 1 includes warm-up). The fp32 GEMM speed of the
moment is printed before and after, beside the absolute times.

Invariance: one more run per side with 1 thread per rank (CPU kernels that split work
by thread round differently, and a real model's rollouts then drift apart once a token flips),
compared step by step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ["model=smollm2_135m", "sampler=hf", "model.dtype=fp32", "algo=grpo", "trainer.steps=4",
           "trainer.num_prompts=4", "sampler.n=4", "sampler.max_new_tokens=32", "data.num_eval=0",
           "trainer.eval_at_start=false", "logger.rollouts=true", "logger.console=false"]


def gemm() -> float:
    import torch

    from rlft.models.precision import gemm_gflops

    return gemm_gflops(torch.float32, 1024, 576, 1536)


def run(ranks: int, overrides: list[str], run_dir: Path, threads: int = 0, strategy: str = "ddp") -> dict:
    threads = threads or max(1, (os.cpu_count() or 1) // ranks)  # the same cores in total, split over the ranks
    args = [*overrides, f"trainer.nproc={ranks}", f"trainer.threads={threads}", f"trainer.strategy={strategy}",
            f"hydra.run.dir={run_dir}"]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    r = subprocess.run([sys.executable, "-m", "rlft", "train", *args], cwd=ROOT, env=env, capture_output=True,
                       text=True)
    if r.returncode != 0:
        sys.exit(f"bench_ranks: {ranks}-rank run failed:\n{r.stderr[-2000:]}")
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if s["step"] >= 2]
    return {"step_s": statistics.mean(s["time/step_s"] for s in steps),
            "generate_s": statistics.mean(s["time/generate_s"] for s in steps),
            "update_s": statistics.mean(s["time/update_s"] for s in steps), "threads": threads}


def compare(a: Path, b: Path) -> tuple[str, float]:
    """The first step whose rollouts differ (or "none"), and the final weights' max relative difference."""
    from safetensors.torch import load_file

    ckpt = sorted((a / "checkpoints").glob("step_*"))[-1].name
    x, y = (load_file(str(p / "checkpoints" / ckpt / "trainable.safetensors")) for p in (a, b))
    worst = max(float((x[k] - y[k]).norm() / x[k].norm().clamp(min=1e-12)) for k in x)
    rows = [[json.loads(line) for line in (p / "rollouts.jsonl").read_text().splitlines()] for p in (a, b)]
    differ = sorted({r["step"] for r, q in zip(*rows) if r != q} | ({-1} if len(rows[0]) != len(rows[1]) else set()))
    return (str(differ[0]) if differ else "none"), worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--strategies", default="ddp,fsdp2", help="trainer.strategy of the N-rank runs")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    overrides = DEFAULT + args.overrides
    import platform

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    before = gemm()
    sides = [(1, "ddp")] + [(args.ranks, s) for s in args.strategies.split(",")]
    results: dict[tuple[int, str], list[dict]] = {side: [] for side in sides}
    checks = {}
    with tempfile.TemporaryDirectory(prefix="rlft-bench-ranks-") as tmp:
        for i in range(args.repeats):
            for n, strategy in sides:
                results[n, strategy].append(run(n, overrides, Path(tmp) / f"r{n}-{strategy}-{i}", strategy=strategy))
        for n, strategy in sides:
            run(n, overrides, Path(tmp) / f"inv{n}-{strategy}", threads=1, strategy=strategy)
        for n, strategy in sides[1:]:
            checks[strategy] = compare(Path(tmp) / "inv1-ddp", Path(tmp) / f"inv{n}-{strategy}")
    after = gemm()
    print(f"CPU {cpu}, {os.cpu_count()} cores; fp32 GEMM 1024x576x1536 before / after: {before:.0f} / {after:.0f} GFLOP/s")
    print(f"job: {' '.join(overrides)}")
    for (n, strategy), rs in results.items():
        times = " / ".join(f"{r['step_s']:.2f}" for r in rs)
        print(f"{n} rank(s) x {rs[0]['threads']} thread(s) {strategy}: step {times} s "
              f"(generate {statistics.mean(r['generate_s'] for r in rs):.2f} s, "
              f"update {statistics.mean(r['update_s'] for r in rs):.2f} s)")
    one = statistics.mean(r["step_s"] for r in results[1, "ddp"])
    for (n, strategy), rs in list(results.items())[1:]:
        first, worst = checks[strategy]
        print(f"{n} ranks {strategy} / 1 rank step time: {statistics.mean(r['step_s'] for r in rs) / one:.2f}x; "
              f"invariance (1 thread per rank on both sides): first step whose rollouts differ: {first}; "
              f"final weights max |a-b|/|a| over tensors: {worst:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
