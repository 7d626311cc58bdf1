"""Run outputs: metrics.jsonl, the run log, the console (rich) and wandb."""

from __future__ import annotations

import json
import logging
import math
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

if TYPE_CHECKING:
    from rlft.config.schemas import Config

# Shown on the per-step console line, in this order, when present.
_CONSOLE_KEYS = [
    ("reward/mean", "reward", "{:.3f}"),
    ("eval/accuracy", "acc", "{:.3f}"),
    ("loss", "loss", "{:.4f}"),
    ("kl", "kl", "{:.4f}"),
    ("rm/loss", "loss", "{:.4f}"),  # rlft rm
    ("rm/accuracy", "acc", "{:.3f}"),
    ("eval/rm_accuracy", "eval acc", "{:.3f}"),
    ("sft/loss", "loss", "{:.4f}"),  # rlft sft
    ("eval/sft_loss", "eval loss", "{:.4f}"),
    ("sft/tokens_per_s", "tok/s", "{:.0f}"),
    ("time/step_s", "step", "{:.1f}s"),
    ("throughput/tokens_per_s", "tok/s", "{:.0f}"),
]


class Tracker:
    """Writes each step's metrics everywhere they go."""

    def __init__(self, run_dir: Path, cfg: Config, total_steps: int, console: bool, resolved: dict | None = None,
                 start_step: int = 0):
        self.run_dir = run_dir
        self.metrics_path = run_dir / "metrics.jsonl"
        self.log = logging.getLogger("rlft")
        self.log.setLevel(logging.INFO)
        self.log.propagate = False  # train.log and our console are the run's log, whatever Hydra set up
        self._file_handler = logging.FileHandler(run_dir / "train.log")
        self._file_handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        self.log.addHandler(self._file_handler)
        self.console = Console(stderr=False, quiet=not console)
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[episodes]}"), console=self.console,
            transient=False,
        )
        self.task = self.progress.add_task("train", total=total_steps, completed=start_step, episodes="")
        self.progress.start()
        self.wandb = None
        if cfg.logger.wandb.enabled:
            import wandb  # optional, only with logger.wandb.enabled

            w = cfg.logger.wandb
            self.wandb = wandb.init(
                project=w.project, entity=w.entity, mode=w.mode, dir=str(run_dir), config=resolved or {},
                id=_wandb_id(run_dir), resume="allow",  # a resumed run continues the same wandb run
            )

    def info(self, message: str) -> None:
        self.log.info(message)
        self.progress.console.print(message, highlight=False, markup=False)  # '[...]' in a message is text

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        numbers = _finite(metrics)
        with self.metrics_path.open("a") as f:
            f.write(json.dumps({"step": step, **numbers}) + "\n")
        if self.wandb is not None:
            self.wandb.log(numbers, step=step)
        parts = [f"step {step:>4}"] + [
            f"{label} {fmt.format(metrics[k])}" for k, label, fmt in _CONSOLE_KEYS if k in metrics
        ]
        self.info("  ".join(parts))
        self.progress.update(self.task, completed=step, episodes="")

    def episodes(self, done: int, generating: int, waiting: int) -> None:
        """The rollout's episodes, on the progress line: done, generating (the sampler's), waiting on the environment."""
        self.progress.update(self.task, episodes=episodes_text(done, generating, waiting))

    def close(self) -> None:
        self.progress.stop()
        if self.wandb is not None:
            self.wandb.finish()
        self.log.removeHandler(self._file_handler)
        self._file_handler.close()


def episodes_text(done: int, generating: int, waiting: int) -> str:
    return f"episodes {done} done | {generating} running | {waiting} waiting on env"


def _finite(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics that have a value: a NaN or infinity (a mean over nothing, an overflowed norm)
    is left out, so metrics.jsonl and wandb hold numbers only."""
    return {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}


def _wandb_id(run_dir: Path) -> str:
    path = run_dir / "wandb_id.txt"
    if not path.exists():
        path.write_text(uuid.uuid4().hex[:12])
    return path.read_text().strip()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl; a line cut short by a killed process is skipped."""
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def keep_metrics_through(path: Path, step: int, source: Path | None = None) -> None:
    """Before resuming at ``step``: keep the records up to it (from ``source`` when the checkpoint
    came from another run) and drop the ones logged after it, so no step appears twice."""
    records = read_metrics(source if source is not None and source.exists() else path)
    kept = [r for r in records if r.get("step", 0) <= step]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    tmp.replace(path)
