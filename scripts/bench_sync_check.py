"""What the sync check (rlft/sync_check.py) costs next to a training step, and the honest mismatches it sees.

    python scripts/bench_sync_check.py [--steps N] [--checks K] [--cases a,b,...] [KEY=VALUE ...]

Each case runs in a process of its own (one vLLM engine per process): it builds a run's components,
takes a warm-up step, then N measured steps; after each step it also times K more checks on their own
(the step's check is one sample; the extra ones give a steadier median on a noisy machine). It prints,
per case, the median check time, the median step time (the check included), their ratio, and the
largest honest mismatch seen (mean and max |learner - sampler| log-prob over the probe), and the most synced
weights whose read-back differed from the learner's (0 on an honest sync) of those read. Speed on
this machine drifts by minutes, so the fp32 GEMM speed of the moment (1024x576x1536, GFLOP/s) is
measured before and after each case and printed beside its absolute times; only the ratio compares.

Cases: hf-fp32, hf-bf16, vllm-merged-fp32, vllm-adapter-fp32, vllm-merged-bf16 (the tiny random model),
smollm2-hf-bf16, smollm2-vllm-merged-bf16 (SmolLM2-135M: converted from its GGUF file on first use).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VLLM = ["sampler=vllm", "sampler.vllm.kv_cache_gb=0.5", "sampler.vllm.max_model_len=512"]
TINY = ["model=tiny", "reward.fns=[tests.helpers:char_count]", "optim.lr=1e-2"]
CASES = {
    "hf-fp32": TINY + ["sampler=hf", "model.dtype=fp32"],
    "hf-bf16": TINY + ["sampler=hf", "model.dtype=bf16"],
    "vllm-merged-fp32": TINY + VLLM + ["model.dtype=fp32"],
    "vllm-adapter-fp32": TINY + VLLM + ["model.dtype=fp32", "sampler.vllm.sync=adapter"],
    "vllm-merged-bf16": TINY + VLLM + ["model.dtype=bf16"],
    "smollm2-hf-bf16": ["model=smollm2_135m", "sampler=hf", "model.dtype=bf16"],
    "smollm2-vllm-merged-bf16": ["model=smollm2_135m", *VLLM, "model.dtype=bf16"],
    "smollm2-vllm-adapter-bf16": ["model=smollm2_135m", *VLLM, "model.dtype=bf16", "sampler.vllm.sync=adapter"],
}
DEFAULT_CASES = "hf-fp32,hf-bf16,vllm-merged-fp32,vllm-adapter-fp32,vllm-merged-bf16"
# The steps measured: the default batch (trainer.num_prompts=4 x sampler.n=8, 32 new tokens), no evaluation.
COMMON = ["data.num_eval=0", "trainer.eval_at_start=false", "logger.console=false", "trainer.steps=1000"]


def gemm() -> float:
    import torch

    from rlft.models.precision import gemm_gflops

    return gemm_gflops(torch.float32, 1024, 576, 1536)


def one_case(overrides: list[str], steps: int, checks: int) -> dict:
    """Run one case in this process; returns its timings and mismatches."""
    from rlft.components import build_components
    from rlft.config import compose
    from rlft.sync_check import measure
    from rlft.trainer import train_step

    cfg, _, _ = compose(overrides)
    c = build_components(cfg)
    train_step(1, c, cfg)  # warm-up: first calls pick kernels, the engine compiles nothing more
    step_s, check_s, diffs = [], [], []
    for step in range(2, steps + 2):
        m = train_step(step, c, cfg)
        step_s.append(m["time/step_s"])
        check_s.append(m["time/sync_check_s"])
        diffs.append((m["sync/logp_abs_diff_mean"], m["sync/logp_abs_diff_max"], m["sync/weights_differ"],
                      m["sync/weights_read"]))
        for _ in range(checks):
            check_s.append(measure(c.sync_check, c.sampler, c.policy)["time/sync_check_s"])
    return {"step_s": statistics.median(step_s), "check_s": statistics.median(check_s),
            "mean_diff": max(d[0] for d in diffs), "max_diff": max(d[1] for d in diffs),
            "differ": max(d[2] for d in diffs), "read": min(d[3] for d in diffs),
            "tol": c.sync_check.tol, "where": c.sync_check.where}


def run_case(name: str, extra: list[str], steps: int, checks: int) -> dict:
    """One case in a child process (a fresh vLLM engine each), with the GEMM speed before and after."""
    before = gemm()
    args = [sys.executable, __file__, "--child", json.dumps(CASES[name] + COMMON + extra),
            "--steps", str(steps), "--checks", str(checks)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env)
    after = gemm()
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1], "gemm": (before, after)}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "gemm": (before, after)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="measured steps per case (after one warm-up step)")
    parser.add_argument("--checks", type=int, default=5, help="extra checks timed after each step")
    parser.add_argument("--cases", default=DEFAULT_CASES, help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_case(json.loads(args.child), args.steps, args.checks)))
        return 0
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        print(f"bench_sync_check: error: unknown case {unknown[0]}; valid: {', '.join(CASES)}", file=sys.stderr)
        return 2
    print(f"{'case':<26} {'check s':>8} {'step s':>8} {'ratio':>7} {'mean diff':>10} {'max diff':>10} {'tol':>6} {'weights differ/read':>19}"
          "  GEMM fp32 GFLOP/s before/after")
    for name in args.cases.split(","):
        t0 = time.perf_counter()
        r = run_case(name, args.overrides, args.steps, args.checks)
        g = "{:.0f}/{:.0f}".format(*r["gemm"])
        if "error" in r:
            print(f"{name:<26} failed: {r['error']}  ({g})")
            continue
        print(f"{name:<26} {r['check_s']:8.4f} {r['step_s']:8.2f} {r['check_s'] / r['step_s']:7.2%} "
              f"{r['mean_diff']:10.2e} {r['max_diff']:10.2e} {r['tol']:6g} {int(r['differ']):>10}/{int(r['read']):<8}  {g}  ({time.perf_counter() - t0:.0f} s)",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
