"""Where a run's output goes: the console, metrics.jsonl, the run log, plots and checkpoints.

Under data parallelism every rank runs the training loop and takes part in its collectives,
but only rank 0 writes: the other ranks' :class:`Outputs` say and write nothing. The trainer
decides nothing by rank itself; besides this module, only ``run_state.save`` (every rank gathers
its random state, rank 0 writes) and the app's ``job.json`` (rank 0) do.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from rlft.output.plots import plot_run
from rlft.output.tracking import Tracker, keep_metrics_through
from rlft.parallel.distributed import DataParallel
from rlft.state import run_state

if TYPE_CHECKING:
    from rlft.config.schemas import Config
    from rlft.state.run_state import Snapshot
    from rlft.training.components import Components

# Tests kill the process inside a torn write: a step's rows but the last line's end are written, then
# this many seconds pass.
FAULT_ROLLOUT_DELAY_ENV = "RLFT_FAULT_ROLLOUT_DELAY"


@dataclass
class Outputs:
    """A run's writer (``tracker`` None: a rank that writes nothing)."""

    run_dir: Path
    cfg: Config
    resolved_yaml: str
    tracker: Tracker | None

    @staticmethod
    def open(dp: DataParallel, run_dir: Path, cfg: Config, resolved_yaml: str, start: int,
             resume: Path | None) -> Outputs:
        """Start (or, resuming at ``start``, continue) the run's files; on ranks other than 0, a silent writer."""
        if not dp.main:
            return Outputs(run_dir, cfg, resolved_yaml, None)
        run_dir.mkdir(parents=True, exist_ok=True)
        source = resume.parent.parent if resume is not None else None  # the checkpoint's run: maybe another
        keep_metrics_through(run_dir / "metrics.jsonl", start if resume is not None else -1,
                             source / "metrics.jsonl" if source else None)
        _keep_rollouts_through(run_dir / "rollouts.jsonl", start if resume is not None else 0,
                               source / "rollouts.jsonl" if source else None)
        (run_dir / "config.yaml").write_text(resolved_yaml)
        tracker = Tracker(run_dir, cfg, cfg.trainer.steps, cfg.logger.console, _as_dict(resolved_yaml), start)
        return Outputs(run_dir, cfg, resolved_yaml, tracker)

    def info(self, message: str) -> None:
        if self.tracker is not None:
            self.tracker.info(message)

    def episodes(self, done: int, generating: int, waiting: int) -> None:
        """A rollout's episode counts (rlft.episodes.lockstep.Progress), shown on the progress line."""
        if self.tracker is not None:
            self.tracker.episodes(done, generating, waiting)

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        if self.tracker is not None:
            self.tracker.log_step(step, metrics)

    def log_rollout(self, step: int, rows: list[dict[str, Any]]) -> None:
        """With ``logger.rollouts``: the step's kept rows (every rank's) to rollouts.jsonl."""
        if self.tracker is None or not self.cfg.logger.rollouts:
            return
        text = "".join(json.dumps({"step": step, **row}) + "\n" for row in rows)
        with (self.run_dir / "rollouts.jsonl").open("a") as f:
            cut = len(text) - 2 if os.environ.get(FAULT_ROLLOUT_DELAY_ENV) and text else 0
            if cut:
                f.write(text[:cut])
                f.flush()
                time.sleep(float(os.environ[FAULT_ROLLOUT_DELAY_ENV]))
            # The step's rows in one write: a kill leaves at most a cut last line, which a resume drops.
            f.write(text[cut:])

    def save(self, c: Components, step: int, metrics: dict[str, float]) -> Path:
        """Checkpoint after ``step`` (a collective: every rank calls it; rank 0 writes)."""
        return run_state.save(c, self.run_dir, step, self.resolved_yaml, self.cfg.trainer.keep_last, metrics)

    def write_snapshot(self, c: Components, step: int, snap: Snapshot) -> Path | None:
        """Write a :class:`rlft.state.run_state.Snapshot` as the checkpoint of ``step``, without collectives."""
        if self.tracker is None:
            return None
        return run_state.write(c, self.run_dir, step, snap.tensors, snap.state, self.resolved_yaml,
                               self.cfg.trainer.keep_last)

    def close(self, finished: bool = False) -> None:
        if self.tracker is None:
            return
        self.tracker.close()
        if finished:
            plot_run(self.run_dir)


def _keep_rollouts_through(path: Path, step: int, source: Path | None = None) -> None:
    """Resuming at ``step`` (0: a fresh start): keep the rows up to it (from ``source`` when the checkpoint came
    from another run, as metrics.jsonl) and drop those logged after it, so no step appears twice, and a line cut
    short by a killed process (as ``read_metrics`` skips one in metrics.jsonl)."""
    read = source if source is not None and source.exists() else path
    if not read.exists():
        return
    kept = [line for line in read.read_text().splitlines() if _row_step(line) <= step]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(path)


def _row_step(line: str) -> float:
    """A rollouts.jsonl line's step; infinity for a line that is not a whole row."""
    try:
        return json.loads(line)["step"]
    except (ValueError, TypeError, KeyError):
        return math.inf


def _as_dict(resolved_yaml: str | None) -> dict:
    if not resolved_yaml:
        return {}
    return json.loads(json.dumps(yaml.safe_load(resolved_yaml)))
