"""What the sync check (rlft/sync/verify.py) costs next to a training step, and the honest mismatches it sees.

    python scripts/bench_sync_check.py [--steps N] [--checks K] [--cases a,b,...] [KEY=VALUE ...]

Each case runs in a process of its own (one vLLM engine per process): it builds a run's components,
takes a warm-up step, then N measured steps; after each step it times K checks with the probe and, where
the read-back covers every trained weight, K without it (the read-back alone). It prints, per case, their
medians, sampler.sync_probe_every (1 where the probe runs at every check), a check's average cost over a
run ((probe + (every - 1) x read-back) / every), the median step time (its own check included), their
ratio, the largest honest mismatch seen (mean and max |learner - sampler| log-prob over the probe), and
the most synced weights whose read-back differed from the learner's (0 on an honest sync) of those read. Speed on
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
    """Run one case in this process; returns its timings and mismatches. After each step, ``checks`` checks
    with the probe and ``checks`` without it (the read-back alone) are timed; a run's check costs on average
    (probe + (N - 1) x read-back) / N, N = sampler.sync_probe_every where the read-back covers training."""
    import dataclasses

    from rlft.config import compose
    from rlft.sync.verify import measure
    from rlft.training.components import build_components
    from rlft.training.loop import train_step

    cfg, _, _ = compose(overrides)
    c = build_components(cfg)
    train_step(1, c, cfg)  # warm-up: first calls pick kernels, the engine compiles nothing more
    check = c.sync_check
    probed, alone = dataclasses.replace(check, probe_every=1), dataclasses.replace(check, probe_every=10**9)
    step_s, probe_s, read_s, diffs = [], [], [], []
    for step in range(2, steps + 2):
        m = train_step(step, c, cfg)
        step_s.append(m["time/step_s"])
        for _ in range(checks):
            p = measure(probed, c.sampler, c.policy)
            probe_s.append(p["time/sync_check_s"])
            diffs.append((p["sync/logp_abs_diff_mean"], p["sync/logp_abs_diff_max"], p["sync/weights_differ"],
                          p["sync/weights_read"]))
            if check.covered:
                read_s.append(measure(alone, c.sampler, c.policy)["time/sync_check_s"])
    every = check.probe_every if check.covered else 1
    probe, read = statistics.median(probe_s), statistics.median(read_s) if read_s else None
    return {"step_s": statistics.median(step_s), "probe_s": probe, "read_s": read, "every": every,
            "check_s": (probe + (every - 1) * read) / every if read is not None else probe,
            "mean_diff": max(d[0] for d in diffs), "max_diff": max(d[1] for d in diffs),
            "differ": max(d[2] for d in diffs), "read": min(d[3] for d in diffs),
            "tol": check.tol, "where": check.where}


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
    print(f"{'case':<26} {'probe+read s':>12} {'read s':>7} {'every':>5} {'check s':>8} {'step s':>7} {'ratio':>6} "
          f"{'mean diff':>9} {'max diff':>9} {'tol':>5} {'differ/read':>11}  GEMM fp32 GFLOP/s before/after")
    for name in args.cases.split(","):
        t0 = time.perf_counter()
        r = run_case(name, args.overrides, args.steps, args.checks)
        g = "{:.0f}/{:.0f}".format(*r["gemm"])
        if "error" in r:
            print(f"{name:<26} failed: {r['error']}  ({g})")
            continue
        read = f"{r['read_s']:7.4f}" if r["read_s"] is not None else f"{'-':>7}"
        print(f"{name:<26} {r['probe_s']:12.4f} {read} {r['every']:5d} {r['check_s']:8.4f} {r['step_s']:7.2f} "
              f"{r['check_s'] / r['step_s']:6.2%} {r['mean_diff']:9.2e} {r['max_diff']:9.2e} {r['tol']:5g} "
              f"{int(r['differ']):>5}/{int(r['read']):<5}  {g}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
