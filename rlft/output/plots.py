"""PNG plots of a run's reward and eval accuracy (a reward model's loss and held-out pairwise accuracy),
and of a sweep's jobs side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlft.output.tracking import read_metrics

PANELS = (("reward/mean", "reward (train batch mean)"), ("eval/accuracy", "eval accuracy (greedy)"))
# With reward models or judges: their weighted score against the rule-based checker's, on one panel (over-optimisation
# shows as the two parting).
GOLD_PANEL = (("reward/model", "reward/gold"), "reward model vs gold checker (train batch mean)")
RM_PANELS = (("rm/loss", "reward-model loss (train batch mean)"), ("eval/rm_accuracy", "held-out pairwise accuracy"))
"""The panels of runs of ``rlft rm`` (they log rm/loss)."""


def wall_minutes(records: list[dict[str, Any]]) -> list[float]:
    """Cumulative training + evaluation time at the end of each record (setup excluded)."""
    total, out = 0.0, []
    for r in records:
        total += sum(v for k, v in r.items() if k in ("time/step_s", "time/eval_s") and isinstance(v, (int, float)))
        out.append(total / 60)
    return out


def _series(records: list[dict[str, Any]], key: str, x: str = "step") -> tuple[list[float], list[float]]:
    xs = wall_minutes(records) if x == "wall" else [r["step"] for r in records]
    pts = [(xv, r[key]) for xv, r in zip(xs, records) if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pts], [p[1] for p in pts]


def _figure(runs: dict[str, list[dict[str, Any]]], title: str, out: Path, x: str = "step") -> Path:
    import matplotlib  # seconds to import: only when a plot is drawn

    matplotlib.use("Agg")  # files only; no display here
    import matplotlib.pyplot as plt  # after use("Agg")

    if any("rm/loss" in r for records in runs.values() for r in records):
        panels = [((key,), label) for key, label in RM_PANELS]
    else:
        gold = any(k in r for records in runs.values() for r in records for k in GOLD_PANEL[0])
        panels = [((key,), label) for key, label in PANELS] + ([GOLD_PANEL] if gold else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6))
    for ax, (keys, label) in zip(axes, panels):
        for name, records in runs.items():
            for key in keys:
                xs, ys = _series(records, key, x)
                if xs:
                    ax.plot(xs, ys, marker="o" if len(xs) < 20 or key.startswith("eval/") else None, markersize=3,
                            linestyle="--" if key == "reward/gold" else "-",
                            label=name if len(keys) == 1 else f"{name} {key.split('/')[-1]}")
        if len(keys) > 1 and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        ax.set_xlabel("step" if x == "step" else "minutes (training + eval)")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    if len(runs) > 1 and axes[-1].get_legend_handles_labels()[0]:
        axes[-1].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_run(run_dir: Path) -> Path:
    """``run_dir/plots.png``: reward and eval accuracy against step, from metrics.jsonl (and reward/model
    against reward/gold when the run logged them)."""
    return _figure({run_dir.name: read_metrics(run_dir / "metrics.jsonl")}, str(run_dir), run_dir / "plots.png")


def plot_sweep(job_dirs: dict[str, Path], out: Path, x: str = "step", title: str | None = None) -> Path:
    """One line per job on each panel, against step or wall-clock (``x="wall"``)."""
    runs = {name: read_metrics(d / "metrics.jsonl") for name, d in job_dirs.items()}
    return _figure(runs, title or out.parent.name, out, x)
