"""The loop of ``rlft rm`` and ``rlft sft`` (rlft train's is rlft.training): its start (the ranks, the checkpoint
to resume from and whether the config allows it, the device, the dtype (rank 0 decides, the ranks follow), the
seeds), its outputs (only rank 0 writes), the seeded order of its examples, and its steps with their evaluations,
checkpoints and stop on a signal."""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlft.errors import ConfigError
from rlft.models.device import resolve_device
from rlft.models.loading import quiet_libraries
from rlft.models.precision import Precision
from rlft.models.precision import resolve as resolve_precision
from rlft.output.tracking import Tracker, keep_metrics_through
from rlft.parallel.distributed import DataParallel, from_environment, local_rank
from rlft.state import checkpoint as ckpt
from rlft.state import resume_rules
from rlft.state.failure import GracefulStop


@dataclass
class JobStart:
    dp: DataParallel
    resume: Path | None
    """The checkpoint to continue from (None: a fresh run)."""
    harmless: list[str]
    """The config changes since that checkpoint that the resume allows, worded for the log."""
    device: torch.device
    precision: Precision


def start_job(cfg: Any, run_dir: Path, resolved_yaml: str, key_classes: dict[str, tuple[str, str]]) -> JobStart:
    """Set up a job of ``cfg`` (with ``trainer``, ``model`` and ``seed``): ``cfg.model.dtype`` becomes the dtype
    resolved (the checkpoint's when resuming), and python's, numpy's and torch's generators are seeded.

    Raises:
        ConfigError: trainer.batch_size does not split over the ranks, or the config changed since the checkpoint in
            a way that changes the run.
        CheckpointError: a fresh run over another run's checkpoints, or no checkpoint to resume.
    """
    t = cfg.trainer
    dp = from_environment()
    dp.set_timeout(t.dist_timeout_s)
    if t.batch_size % dp.world:
        raise ConfigError(f"trainer.batch_size={t.batch_size} must be a multiple of the {dp.world} ranks")
    resume = ckpt.resolve(t.resume, run_dir)
    harmless = resume_rules.check_compatible(resume, resolved_yaml, dp.world, key_classes) if resume else []
    if resume is None:
        ckpt.check_fresh(run_dir, t.resume)
    if t.threads > 0:
        torch.set_num_threads(t.threads)
    device = resolve_device(t.device, local_rank() if dp.active else None)
    dtype = resume_rules.trained_dtype(resume) if resume else None
    # Rank 0 decides and the ranks follow (as in rlft.training.components): each rank probing or reading the
    # cache on its own could train in another dtype.
    precision = dp.broadcast((Precision(dtype, f"model.dtype={dtype}, as in the checkpoint") if dtype
                              else resolve_precision(cfg.model, device.type)) if dp.main else None)
    cfg.model.dtype = precision.dtype
    quiet_libraries(keep_warnings=True)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    return JobStart(dp, resume, harmless, device, precision)


class Silent:
    """The writer of a rank other than 0: it says and writes nothing."""

    def info(self, message: str) -> None:
        pass

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


def open_outputs(dp: DataParallel, run_dir: Path, cfg: Any, resolved_yaml: str, start: int,
                 resume: Path | None) -> Tracker | Silent:
    """Rank 0: the run's files (continued at ``start`` when resuming) and its console; another rank: silence."""
    if not dp.main:
        return Silent()
    run_dir.mkdir(parents=True, exist_ok=True)
    keep_metrics_through(run_dir / "metrics.jsonl", start if resume else -1,
                         resume.parent.parent / "metrics.jsonl" if resume else None)
    (run_dir / "config.yaml").write_text(resolved_yaml)
    return Tracker(run_dir, cfg, cfg.trainer.steps, cfg.logger.console, None, start)


@functools.lru_cache(maxsize=4)
def _epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).tolist()


def batch_indices(cursor: int, size: int, n: int, seed: int) -> list[int]:
    """The items drawn at positions ``cursor .. cursor + size - 1`` of the seeded order: every item once
    per epoch, a new permutation each epoch (a batch may straddle two epochs)."""
    return [_epoch_order(n, seed, i // n)[i % n] for i in range(cursor, cursor + size)]


def run_steps(cfg: Any, st: Any, items: Sequence[Any], step: Callable[[list[Any]], dict[str, float]],
              evaluate: Callable[[], dict[str, float]] | None, save: Callable[[], Any], out: Tracker | Silent,
              dp: DataParallel) -> None:
    """Steps ``st.step + 1 .. cfg.trainer.steps``, each on the next ``trainer.batch_size`` of ``items`` in the seeded
    order (``st.cursor`` counts those drawn; ``st.step``, ``st.metrics`` follow each step); ``evaluate`` (None: no
    held-out data) at the start, every ``trainer.eval_every`` steps and at the end; ``save`` every
    ``trainer.save_every`` steps and when a signal stops the run after a step (the final checkpoint is the
    caller's)."""
    t = cfg.trainer
    if t.eval_at_start and st.step == 0 and evaluate is not None:
        out.log_step(0, evaluate())
    with GracefulStop(hold_on_error=dp.active, grace_s=t.stop_grace_s) as stop:
        for n in range(st.step + 1, t.steps + 1):
            batch = [items[i] for i in batch_indices(st.cursor, t.batch_size, len(items), cfg.seed)]
            t0 = time.perf_counter()
            metrics = step(batch)
            metrics["time/step_s"] = time.perf_counter() - t0
            if evaluate is not None and (n == t.steps or (t.eval_every > 0 and n % t.eval_every == 0)):
                metrics.update(evaluate())
            st.step, st.cursor, st.metrics = n, st.cursor + len(batch), metrics
            out.log_step(n, metrics)
            stopping = dp.any(stop.requested) and n < t.steps
            if stopping:
                stop.step_done()
            if n < t.steps and (stopping or (t.save_every > 0 and n % t.save_every == 0)):
                save()
            if stopping:
                out.info(f"stopped by a signal after step {n}; saved it")
                raise KeyboardInterrupt
