"""Sweeps: expanding a plain sweep's combinations (for checking them up front) and the summary
that a Hydra callback writes at the end of every multirun."""

from __future__ import annotations

import csv
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra.core.override_parser.types import ValueType
from hydra.experimental.callback import Callback
from rich.console import Console
from rich.table import Table
from rich.text import Text

from rlft.commands.jobs import JOB_STATUS, JobState
from rlft.config.loading import TRAIN, check_overrides
from rlft.output.plots import plot_sweep
from rlft.output.tracking import read_metrics
from rlft.paths import user_path

SUMMARY_KEYS = ("reward/mean", "eval/accuracy")
RM_SUMMARY_KEYS = ("rm/loss", "eval/rm_accuracy")
"""The summary's two metric columns for a sweep of ``rlft rm`` (its jobs log no ``reward/mean``)."""


@dataclass
class Job:
    name: str
    """The job's own overrides (those not shared by every job), e.g. ``algo=dapo,seed=1``."""
    overrides: list[str]
    run_dir: Path
    status: str = "pending"
    seconds: float = 0.0


def expand(overrides: list[str], schema: Any = None) -> tuple[list[str], list[list[str]]]:
    """Split shell overrides into the fixed ones and the cartesian product of the swept ones
    (``interval(a,b)``, which only a sweeper such as Optuna can draw from, contributes ``a``).

    ``schema``: the command's :class:`rlft.config.loading.Schema` (None: ``rlft train``'s).

    Returns:
        ``(fixed, combos)``: each combo lists one ``key=value`` per swept key, in the order given.
    """
    fixed, swept = [], []
    for text, ov in zip(overrides, check_overrides(overrides, schema or TRAIN)):
        if ov.value_type == ValueType.INTERVAL_SWEEP:  # a sweeper draws from it: its lower end stands for it
            swept.append([f"{ov.get_key_element()}={ov.value().start}"])
        elif ov.is_sweep_override():
            swept.append([f"{ov.get_key_element()}={v}" for v in ov.sweep_string_iterator()])
        else:
            fixed.append(text)
    return fixed, [list(c) for c in itertools.product(*swept)] if swept else [[]]


class SweepSummary(Callback):
    """Hydra callback (conf/config.yaml, ``hydra.callbacks``): at the end of a multirun, whatever
    launcher or sweeper ran the jobs, print the summary table and write ``summary.csv`` and
    ``summary.png`` in the sweep directory."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        root = user_path(str(config.hydra.sweep.dir))
        jobs = find_jobs(root)
        if not jobs:
            return
        console = Console()
        _print_table(summarize(jobs, root), console)
        console.print(f"summary: {root / 'summary.csv'}  plot: {root / 'summary.png'}", markup=False)
        JobState.failed_jobs = sum(j.status != "ok" for j in jobs)


def find_jobs(root: Path) -> list[Job]:
    """The jobs of a finished sweep: each subdirectory Hydra set up (``.hydra/``), in job order,
    named by the overrides that differ between jobs, with the status its ``job.json`` records
    (a job that died without writing one is "failed (no status)")."""
    dirs = [d for d in root.iterdir() if (d / ".hydra" / "overrides.yaml").is_file()] if root.is_dir() else []
    dirs.sort(key=lambda d: (not d.name.isdigit(), int(d.name) if d.name.isdigit() else 0, d.name))
    overrides = [yaml.safe_load((d / ".hydra" / "overrides.yaml").read_text()) or [] for d in dirs]
    common = set.intersection(*(set(o) for o in overrides)) if overrides else set()
    jobs = []
    for d, ovs in zip(dirs, overrides):
        status_file = d / JOB_STATUS
        state = json.loads(status_file.read_text()) if status_file.is_file() else {}
        status = state.get("status", "failed (no status)")
        if status not in ("ok", "failed (no status)"):
            status = f"{status} (exit {state.get('exit_code')})"
        own = [o for o in ovs if o not in common]
        jobs.append(Job(",".join(own) or d.name, own, d, status, float(state.get("seconds", 0.0))))
    return jobs


def summarize(jobs: list[Job], root: Path) -> list[dict[str, Any]]:
    """``summary.csv`` and ``summary.png`` in ``root``: each job's final reward and accuracy (a sweep of ``rlft rm``:
    its final loss and held-out pairwise accuracy) and its status."""
    rows = []
    runs = [read_metrics(job.run_dir / "metrics.jsonl") for job in jobs]
    rm = any("rm/loss" in r for records in runs for r in records)
    for job, records in zip(jobs, runs):
        row: dict[str, Any] = {"job": job.name, "status": job.status,
                               "steps": max((r["step"] for r in records), default=0), "seconds": round(job.seconds, 1)}
        for key in RM_SUMMARY_KEYS if rm else SUMMARY_KEYS:
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
    table = Table(title="sweep summary")
    keys = RM_SUMMARY_KEYS if RM_SUMMARY_KEYS[0] in rows[0] else SUMMARY_KEYS
    for col in ("job", "status", "steps", *keys, "seconds"):
        table.add_column(col)
    for r in rows:
        values = (f"{r[k]:.3f}" if r[k] is not None else "-" for k in keys)
        # Text, not str: rich would read a list override's '[...]' as markup and drop it.
        table.add_row(Text(r["job"]), Text(r["status"]), str(r["steps"]), *values, f"{r['seconds']:.0f}s")
    console.print(table)
