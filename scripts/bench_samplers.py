"""Compare sampler=vllm with sampler=hf on the same rollout batch, in one run.

    python scripts/bench_samplers.py [--steps N] [KEY=VALUE ...]

Builds both samplers from the same config, then for each measured step samples the same
prompts with each (alternating, so machine noise hits both alike) and runs a full training
step with each sampler. Prints rollout tokens/s, full step time and weight-sync share.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="measured steps per sampler")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table

    from rlft.config import ConfigError, compose
    from rlft.trainer import build_components, train_step

    runs = {}
    for name in ("vllm", "hf"):
        try:
            cfg, _, _ = compose(args.overrides + [f"sampler={name}", f"trainer.steps={args.steps + 1}"])
        except ConfigError as e:
            print(f"bench_samplers: error: {e}", file=sys.stderr)
            return 2
        t0 = time.perf_counter()
        c = build_components(cfg)
        runs[name] = {"cfg": cfg, "c": c, "setup": time.perf_counter() - t0, "steps": []}
        train_step(1, c, cfg)  # warm-up
    for step in range(2, args.steps + 2):
        for r in runs.values():  # alternate: same prompts (same step index), same noise
            r["steps"].append(train_step(step, r["c"], r["cfg"]))

    def mean(name: str, key: str) -> float:
        return statistics.mean(m[key] for m in runs[name]["steps"])

    table = Table(title="sampler=vllm vs sampler=hf, same config and prompts")
    for col in ("sampler", "rollout tok/s", "generate s", "sync s", "step s", "sync share", "setup s"):
        table.add_column(col, justify="right")
    for name in runs:
        table.add_row(
            name, f"{mean(name, 'throughput/tokens_per_s'):.0f}", f"{mean(name, 'time/generate_s'):.2f}",
            f"{mean(name, 'time/sync_s'):.2f}", f"{mean(name, 'time/step_s'):.2f}",
            f"{100 * mean(name, 'time/sync_s') / mean(name, 'time/step_s'):.1f}%", f"{runs[name]['setup']:.1f}",
        )
    console = Console()
    console.print(table)
    speed = mean("vllm", "throughput/tokens_per_s") / mean("hf", "throughput/tokens_per_s")
    step = mean("hf", "time/step_s") / mean("vllm", "time/step_s")
    console.print(f"vllm/hf rollout tokens/s: {speed:.2f}x | hf/vllm step time: {step:.2f}x | "
                  f"mean over {args.steps} steps each after 1 warm-up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
