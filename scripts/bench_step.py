"""Time one training step, split by phase, for a config given as overrides.

    python scripts/bench_step.py [--steps N] [--warmup N] [KEY=VALUE ...]

Runs ``warmup`` steps, then ``steps`` measured steps of the real training loop, and prints
the mean time of each phase (generate, reward, log-prob/reference, update, weight sync),
its share of the step, and the rollout throughput.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

PHASES = [
    ("generate", "time/generate_s"),
    ("reward", "time/reward_s"),
    ("log-prob/reference", "time/logprob_s"),
    ("update", "time/update_s"),
    ("weight sync", "time/sync_s"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="measured steps")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured steps first")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table

    from rlft.config import ConfigError, compose
    from rlft.training.loop import build_components, train_step

    try:
        cfg, _, _ = compose(args.overrides + [f"trainer.steps={args.steps + args.warmup}"])
    except ConfigError as e:
        print(f"bench_step: error: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    c = build_components(cfg)
    setup_s = time.perf_counter() - t0
    runs = [train_step(i + 1, c, cfg) for i in range(args.warmup + args.steps)][args.warmup :]

    def mean(key: str) -> float:
        return statistics.mean(r[key] for r in runs)

    step_s = mean("time/step_s")
    table = Table(title=f"one step: {cfg.algo.name}, {cfg.model.name}, {cfg.sampler.name} sampler, "
                  f"{cfg.trainer.num_prompts}x{cfg.sampler.n} samples, max {cfg.sampler.max_new_tokens} new tokens")
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for label, key in PHASES:
        table.add_row(label, f"{mean(key):.2f}", f"{100 * mean(key) / step_s:.0f}%")
    other = step_s - sum(mean(k) for _, k in PHASES)
    table.add_row("other", f"{other:.2f}", f"{100 * other / step_s:.0f}%")
    table.add_row("[bold]step", f"[bold]{step_s:.2f}", "100%")
    console = Console()
    console.print(table)
    tokens = mean("tokens/generated")
    console.print(
        f"generated tokens/step {tokens:.0f} | rollout {mean('throughput/tokens_per_s'):.0f} tok/s | "
        f"step {tokens / step_s:.0f} generated tok/s | setup {setup_s:.1f}s | "
        f"mean over {args.steps} steps after {args.warmup} warm-up"
    )
    import torch

    where = f"learner on {c.device} ({c.precision.dtype})"
    if c.device.type == "cuda":
        where += (f", {torch.cuda.get_device_name(c.device)}, peak allocated "
                  f"{torch.cuda.max_memory_allocated(c.device) / 2**30:.2f} GiB")
    console.print(where)
    return 0


if __name__ == "__main__":
    sys.exit(main())
