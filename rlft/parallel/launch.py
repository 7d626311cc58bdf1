"""``trainer.nproc=N``: start N ranks of a job on this machine through torch's own launcher
(the elastic agent behind ``torchrun --standalone``), each running ``python -m rlft train`` (or
``rlft rm``) with the job's overrides and its run directory. The job waits for them and takes their outcome.
"""

from __future__ import annotations

import math
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from rlft.commands.jobs import JOB_STATUS, read_status
from rlft.errors import how_it_ended
from rlft.output.tracking import read_metrics

# Flags that name the config to compose; each rank needs them too.
CONFIG_FLAGS = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd"}


def rank_args(overrides: list[str], flags: list[str], run_dir: Path, command: str = "train") -> list[str]:
    """``rlft COMMAND`` arguments for each rank: the config flags, the job's overrides, its directory."""
    keep: list[str] = []
    for i, f in enumerate(flags):
        if f in CONFIG_FLAGS and i + 1 < len(flags):
            keep += [f, flags[i + 1]]
    return ["-m", "rlft", command, *keep, *without(overrides, "hydra.run.dir"), f"hydra.run.dir={run_dir}"]


def without(overrides: list[str], *keys: str) -> list[str]:
    """``overrides`` less those that set one of ``keys`` (with or without a ``+``/``~`` prefix)."""
    return [o for o in overrides if o.lstrip("+~").partition("=")[0] not in keys]


def launch(nproc: int, args: list[str], run_dir: Path, result: str = "eval/accuracy") -> tuple[int, float]:
    """Run ``python ARGS`` as ``nproc`` ranks (gloo/NCCL rendezvous on localhost).

    Returns:
        The exit code (0, or the code of the rank that failed first) and the last value of the metric
        ``result`` in the run's metrics.jsonl (NaN if none).
    """
    # torch (seconds) only here: rlft.commands.train imports this module before it checks the overrides.
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # The agent passes a signal on and kills the ranks shutdown_timeout s later (30 by default): long
    # enough for a rank to finish its step and for rank 0 to write a checkpoint.
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, shutdown_timeout=600)
    # As torchrun does, but with this machine's cores split over the ranks rather than 1 thread each.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    (run_dir / JOB_STATUS).unlink(missing_ok=True)  # an earlier attempt's status is not this one's
    try:
        elastic_launch(config, sys.executable)(*args)
        code = 0
    except ChildFailedError as e:  # each rank printed its own one-line error; the first to fail is the cause
        _, first = e.get_first_failure()
        code = first.exitcode
        if code < 0:  # killed by a signal: the rank printed nothing, and torch's report is in train.log
            print(f"rlft: error: rank {first.local_rank} was {how_it_ended(code)}", file=sys.stderr)
        code = code if code > 0 else 128 - code  # killed by signal -s: the shell's 128 + s
    except SignalException as e:  # Ctrl-C / SIGTERM: the agent passed it to the ranks, which saved
        code = 128 + int(e.sigval)
    return code, _last_value(run_dir, result)


def _last_value(run_dir: Path, key: str) -> float:
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if key in r]
    return final_accuracy(records[-1] if records else {}, key)


def final_accuracy(metrics: dict[str, Any], key: str = "eval/accuracy") -> float:
    """A job's result for sweepers: its last ``key`` (``eval/accuracy``; NaN when it has none)."""
    value = metrics.get(key)
    return float(value) if isinstance(value, (int, float)) else math.nan


def rank_status(run_dir: Path) -> dict[str, Any]:
    """The job.json rank 0 wrote (empty when it wrote none)."""
    return read_status(run_dir)
