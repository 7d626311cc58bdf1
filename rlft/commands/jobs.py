"""A job's status: the ``job.json`` each job writes when it ends, and what the last ``hydra.main``
call left for its caller. Shared by the app (writes), the launcher of ranks and the sweep
summary (read), so that none of them imports another for it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rlft.errors import RlftError

JOB_STATUS = "job.json"
"""Written in each job's directory when it ends: status, exit code, error line, overrides, seconds."""


class JobState:
    """What the last ``hydra.main`` call left for the caller (the launching process only)."""

    failed_jobs: int = 0
    flags: list[str] = []  # noqa: RUF012  (Hydra's flags of this command, which trainer.nproc's ranks get too)


def failed(e: RlftError) -> dict[str, Any]:
    """job.json's fields for a job that ``e`` ended: its one line and its class's exit code."""
    return {"status": "failed", "exit_code": e.exit_code, "error": str(e)}


def write_status(run_dir: Path, status: dict[str, Any], t0: float) -> None:
    """``status`` as ``run_dir``'s job.json, with the seconds since ``t0`` (``time.perf_counter``) and the end time."""
    status["seconds"] = round(time.perf_counter() - t0, 1)
    status["ended"] = time.time()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / JOB_STATUS).write_text(json.dumps(status, indent=1) + "\n")


def read_status(run_dir: Path) -> dict[str, Any]:
    """The job.json in ``run_dir`` (empty when there is none or it cannot be read)."""
    try:
        return json.loads((run_dir / JOB_STATUS).read_text())
    except (OSError, ValueError):
        return {}
