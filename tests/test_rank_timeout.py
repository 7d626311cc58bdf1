"""A rank that stops answering (gloo on the CPU, 2 real ranks through trainer.nproc): the other ends
on one line within trainer.dist_timeout_s, and rank 0 still saves the last completed step."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.support import DIST_ARGS, ROOT, dist_env

pytestmark = pytest.mark.slow  # 2 ranks that load torch and the model


def test_a_hung_rank_ends_the_run_within_the_collective_timeout(tmp_path):
    run, mark = tmp_path / "run", tmp_path / "hung"
    # rank 1 hangs while scoring step 3 (8 reward calls per step on each rank); rank 0 goes on to the
    # next collective and would wait there for gloo's default 30 minutes
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlft", "train", *DIST_ARGS, "trainer.nproc=2", "trainer.dist_timeout_s=5",
         "trainer.stop_grace_s=2", f"hydra.run.dir={run}"], cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
        env=dist_env(RLFT_TEST_KILL_RANK="1", RLFT_TEST_KILL_AFTER="20", RLFT_TEST_HANG_MARK=str(mark)),
    )
    try:
        deadline = time.time() + 300
        while not mark.exists():
            assert proc.poll() is None and time.time() < deadline, "rank 1 never hung"
            time.sleep(0.05)
        t0 = time.perf_counter()
        while not (run / "job.json").exists():
            assert time.perf_counter() - t0 < 30, "rank 0 still waits for the hung rank"
            time.sleep(0.05)
        reported = time.perf_counter() - t0
        _, err = proc.communicate(timeout=120)  # the agent then stops rank 1 (SIGTERM, its stop grace)
    finally:
        proc.kill()
    assert reported < 5 + 10, reported  # the bound plus the time rank 0 takes to reach the collective and save
    assert proc.returncode == 1 and "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("rlft: error:")]
    assert len(lines) == 1 and "rank 0: another rank did not answer within trainer.dist_timeout_s" in lines[0], err
    status = json.loads((run / "job.json").read_text())
    assert status["exit_code"] == 1 and "did not answer" in status["error"]
    saved = sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step_"))
    assert saved == ["step_000002"], saved  # the last completed step, written by rank 0 alone
