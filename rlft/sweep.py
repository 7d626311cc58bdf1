"""`rlft train -m`: every combination of comma-separated overrides, each job in its own process."""

from __future__ import annotations

import csv
import itertools
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlft.paths import user_path
from rlft.tracking import read_metrics

SUMMARY_KEYS = ("reward/mean", "eval/accuracy")


@dataclass
class Job:
    name: str
    """Directory name: the job's own overrides, e.g. ``algo=dapo,seed=1``."""
    overrides: list[str]
    run_dir: Path
    status: str = "pending"
    seconds: float = 0.0


def expand(overrides: list[str]) -> tuple[list[str], list[list[str]]]:
    """Split shell overrides into the fixed ones and the cartesian product of the swept ones.

    Returns:
        ``(fixed, combos)``: each combo lists one ``key=value`` per swept key, in the order given.
    """
    from rlft.config import check_overrides

    fixed, swept = [], []
    for text, ov in zip(overrides, check_overrides(overrides)):
        if ov.is_sweep_override():
            swept.append([f"{ov.get_key_element()}={v}" for v in ov.sweep_string_iterator()])
        else:
            fixed.append(text)
    return fixed, [list(c) for c in itertools.product(*swept)] if swept else [[]]


def _sweep_dir(fixed: list[str]) -> tuple[Path, list[str]]:
    from rlft.config import check_overrides

    dirs = [(text, ov.value()) for text, ov in zip(fixed, check_overrides(fixed))
            if ov.key_or_group in ("hydra.sweep.dir", "hydra.run.dir")]  # the parsed value: quotes removed
    rest = [o for o in fixed if o not in {text for text, _ in dirs}]
    if dirs:
        return user_path(dirs[0][1]), rest
    return Path("multirun") / time.strftime("%Y-%m-%d") / time.strftime("%H-%M-%S"), rest


def run_sweep(overrides: list[str], console: Any) -> int:
    """Run each job in turn; one failing does not stop the others. Returns 0 when all succeeded."""
    fixed, combos = expand(overrides)
    root, fixed = _sweep_dir(fixed)
    jobs = [Job(",".join(c) or "job", c, root / (",".join(c).replace("/", "_") or "job")) for c in combos]
    root.mkdir(parents=True, exist_ok=True)
    console.print(f"sweep of {len(jobs)} jobs in {root}")
    for i, job in enumerate(jobs, 1):
        console.rule(f"job {i}/{len(jobs)}: {job.name}")
        t0 = time.perf_counter()
        args = [sys.executable, "-m", "rlft.cli", "train", *fixed, *job.overrides, f"hydra.run.dir='{job.run_dir}'"]
        code = subprocess.call(args)
        job.seconds = time.perf_counter() - t0
        job.status = "ok" if code == 0 else f"failed (exit {code})"
    rows = summarize(jobs, root)
    _print_table(rows, console)
    console.print(f"summary: {root / 'summary.csv'}  plot: {root / 'summary.png'}")
    return 0 if all(j.status == "ok" for j in jobs) else 1


def summarize(jobs: list[Job], root: Path) -> list[dict[str, Any]]:
    """``summary.csv`` and ``summary.png`` in ``root``: each job's final reward and accuracy and its status."""
    from rlft.plots import plot_sweep

    rows = []
    for job in jobs:
        records = read_metrics(job.run_dir / "metrics.jsonl")
        row: dict[str, Any] = {"job": job.name, "status": job.status,
                               "steps": max((r["step"] for r in records), default=0), "seconds": round(job.seconds, 1)}
        for key in SUMMARY_KEYS:
            values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
            row[key] = values[-1] if values else None
        row["run_dir"] = str(job.run_dir)
        rows.append(row)
    with (root / "summary.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot_sweep({j.name: j.run_dir for j in jobs}, root / "summary.png")
    return rows


def _print_table(rows: list[dict[str, Any]], console: Any) -> None:
    from rich.table import Table

    table = Table(title="sweep summary")
    for col in ("job", "status", "steps", "reward/mean", "eval/accuracy", "seconds"):
        table.add_column(col)
    for r in rows:
        reward, acc = (f"{r[k]:.3f}" if r[k] is not None else "-" for k in SUMMARY_KEYS)
        table.add_row(r["job"], r["status"], str(r["steps"]), reward, acc, f"{r['seconds']:.0f}s")
    console.print(table)
