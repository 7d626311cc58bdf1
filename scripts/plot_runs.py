"""Reward and held-out accuracy of one or more runs, against step and against wall-clock; for runs with
reward models, also reward/model against reward/gold (the rule-based checker) on a third panel.

    python scripts/plot_runs.py OUT_PREFIX NAME=RUN_DIR [NAME=RUN_DIR ...]

Writes OUT_PREFIX_step.png and OUT_PREFIX_wall.png and prints, per run, the accuracy at
each evaluation with the minutes of training + evaluation spent so far.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rlft.output.plots import plot_sweep, wall_minutes
from rlft.output.tracking import read_metrics


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    prefix = Path(sys.argv[1])
    runs = dict(a.split("=", 1) for a in sys.argv[2:])
    dirs = {name: Path(d) for name, d in runs.items()}
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for x in ("step", "wall"):
        plot_sweep(dirs, prefix.parent / f"{prefix.name}_{x}.png", x=x, title=prefix.name)
    for name, d in dirs.items():
        records = read_metrics(d / "metrics.jsonl")
        print(f"{name}: step  minutes  greedy_acc  reward  model  gold")
        for r, minutes in zip(records, wall_minutes(records)):
            if "eval/accuracy" in r:
                extra = "".join(f"  {r.get(k, float('nan')):.3f}" for k in ("reward/model", "reward/gold"))
                print(f"  {r['step']:>4}  {minutes:7.1f}  {r['eval/accuracy']:.3f}  {r.get('reward/mean', float('nan')):.3f}"
                      + extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
