"""Reward calls that end their process: ``sys.exit`` in the trainer's process, ``os._exit`` or a
signal in a worker; and a stop signal while a reward hangs. Each ends the run with one line and a
job.json, within seconds, or (worker deaths, with ``reward.on_timeout``) scores the configured value."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from rlft.rewards import RewardError, score_samples
from rlft.rewards.functions import Sample
from rlft.workers.user_calls import CallPolicy
from tests.support import ROOT, TINY

SAMPLES = [Sample(f"p{i}", "c", str(i), 1, False) for i in range(4)]
RUN = [*TINY, "data.num_eval=0", "trainer.eval_at_start=false"]


@contextmanager
def _within(seconds: int):
    """Fail instead of hanging (the bug was a wait that never ends)."""
    def _late(signum, frame):
        raise AssertionError(f"still waiting after {seconds} s")

    previous = signal.signal(signal.SIGALRM, _late)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_sys_exit_in_process_is_the_rewards_error_naming_the_sample():
    with pytest.raises(RewardError, match=r"'tests.helpers:exits_on_first' raised SystemExit\(3\) on sample 0 "
                                          r"\(prompt='p0'"):
        score_samples(["tests.helpers:exits_on_first"], [1.0], SAMPLES, 8)


@pytest.mark.parametrize("sigkill", [False, True])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_worker_that_dies_without_a_timeout_is_one_error_at_once(monkeypatch, workers, sigkill):
    if sigkill:
        monkeypatch.setenv("RLFT_TEST_SIGKILL", "1")
    how = "killed by SIGKILL" if sigkill else "exited with code 7"
    t0 = time.perf_counter()
    with _within(20), pytest.raises(RewardError, match=rf"'tests.helpers:kills_worker_on_first' ended its worker "
                                                       rf"process \({how}\) on sample 0 \(prompt='p0'"):
        score_samples(["tests.helpers:kills_worker_on_first"], [1.0], SAMPLES, 8, CallPolicy(workers))
    assert time.perf_counter() - t0 < 5


def test_sys_exit_in_a_worker_is_the_same_error_as_in_process():
    with _within(20), pytest.raises(RewardError, match=r"raised SystemExit\(3\) on sample 0"):
        score_samples(["tests.helpers:exits_on_first"], [1.0], SAMPLES, 8, CallPolicy(2))


def test_on_timeout_scores_a_dead_worker_and_the_rest_are_scored():
    """A call whose worker died produced no score, as a hung one: with reward.on_timeout it gets that score
    at once (not after the time limit), and a fresh worker takes the remaining calls."""
    t0 = time.perf_counter()
    with _within(20):
        totals, _ = score_samples(["tests.helpers:kills_worker_on_first"], [1.0], SAMPLES * 2, 8,
                                  CallPolicy(2, 30.0, -0.5))
    assert totals == [-0.5, 1.0, 1.0, 1.0] * 2 and time.perf_counter() - t0 < 5


def _train(args: list[str], run_dir, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlft.cli", "train", *args, f"hydra.run.dir={run_dir}"], cwd=ROOT,
                          env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})), capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("fn, extra, what", [
    ("exits_on_first", [], r"raised SystemExit\(3\)"),
    ("kills_worker_on_first", ["reward.num_workers=2"], r"ended its worker process \(exited with code 7\)"),
])
def test_cli_a_reward_that_exits_ends_the_run_in_one_line_with_a_job_status(tmp_path, fn, extra, what):
    import re

    r = _train([*RUN, f"reward.fns=[tests.helpers:{fn}]", "reward.weights=[1]", *extra], tmp_path,
               env={"RLFT_TEST_DIE_ALWAYS": "1"})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr[-3000:]
    assert re.search(rf"rlft: error: reward function 'tests.helpers:{fn}' {what} on sample 0 \(prompt=", lines[0])
    status = json.loads((tmp_path / "job.json").read_text())
    assert status["status"] == "failed" and status["exit_code"] == 1 and re.search(what, status["error"])


def _start_hung_run(run_dir, extra: list[str]) -> tuple[subprocess.Popen, float]:
    mark = run_dir.parent / f"{run_dir.name}.mark"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlft.cli", "train", *RUN, "reward.fns=[tests.helpers:hangs_marked]",
         "reward.weights=[1]", *extra, f"hydra.run.dir={run_dir}"], cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, env=dict(os.environ, RLFT_TEST_MARK=str(mark)),
    )
    deadline = time.time() + 120
    while not mark.exists():
        assert proc.poll() is None and time.time() < deadline, "the reward never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    return proc, time.perf_counter()


@pytest.mark.slow  # CLI runs (~10 s each); the group-SIGTERM test stays in make test
@pytest.mark.parametrize("workers", [0, 1])
def test_sigterm_while_a_reward_hangs_ends_the_run_after_the_grace(tmp_path, workers):
    proc, t0 = _start_hung_run(tmp_path / "run", ["trainer.stop_grace_s=2", f"reward.num_workers={workers}"])
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and time.perf_counter() - t0 < 15, err[-3000:]
    assert "Traceback" not in err and "stopping after this step" in err
    assert err.strip().splitlines()[-1].startswith(
        "rlft: error: interrupted (the step did not finish within trainer.stop_grace_s=2 s of the signal")
    status = json.loads((tmp_path / "run" / "job.json").read_text())
    assert status["status"] == "interrupted" and status["exit_code"] == 130


@pytest.mark.slow  # CLI runs (~10 s each); the group-SIGTERM test stays in make test
def test_a_second_sigterm_while_a_reward_hangs_ends_the_run_at_once(tmp_path):
    proc, t0 = _start_hung_run(tmp_path / "run", [])
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and time.perf_counter() - t0 < 15 and "Traceback" not in err, err[-3000:]


@pytest.mark.parametrize("override", ["trainer.stop_grace_s=-1", "trainer.dist_timeout_s=0"])
def test_stop_grace_and_collective_timeout_refuse_bad_values(override):
    from rlft.config import ConfigError, compose

    with pytest.raises(ConfigError, match=override.replace(".", r"\.")):
        compose([override])


def test_sigterm_to_the_whole_process_group_finishes_the_step_with_the_workers(tmp_path):
    """torch's agent under trainer.nproc, coreutils timeout and SLURM signal the whole process group: the
    reward workers are not the signal's target, they finish the step's calls and the run stops as
    interrupted (it was "reward function ... ended its worker process (killed by SIGTERM)", exit 1)."""
    from rlft.state import checkpoint as ckpt

    run, pids = tmp_path / "run", tmp_path / "pids"
    pids.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlft.cli", "train", *RUN, "trainer.steps=20",
         "reward.fns=[tests.helpers:records_pid_then_sleeps]", "reward.weights=[1]", "reward.num_workers=2",
         f"hydra.run.dir={run}"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, RLFT_TEST_PIDS=str(pids), RLFT_TEST_SLEEP="2"), start_new_session=True,
    )
    try:
        deadline = time.time() + 120
        while not any(pids.iterdir()):
            assert proc.poll() is None and time.time() < deadline, "the reward never started"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "ended its worker process" not in err and "Traceback" not in err, err[-3000:]
    status = json.loads((run / "job.json").read_text())
    assert status["status"] == "interrupted" and status["exit_code"] == 130
    assert [p.name for p in ckpt.list_checkpoints(run / "checkpoints")] == [ckpt.step_dir_name(1)]


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(sys.platform != "linux", reason="the kernel's parent-death signal is Linux's")
def test_workers_end_when_the_trainer_is_killed(tmp_path):
    """kill -9 of the trainer (the OOM killer, the agent's last resort) while rewards run: its workers end
    with it (they were orphaned forever, holding the trainer's memory and sockets)."""
    script = ("from rlft.workers.user_calls import CallPolicy, run_calls\nfrom tests.helpers import records_pid_then_sleeps"
              "\nrun_calls(records_pid_then_sleeps, [(('p', 'c', str(i)), {}) for i in range(4)], CallPolicy(2))\n")
    trainer = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=dict(os.environ, RLFT_TEST_PIDS=str(tmp_path)))
    try:
        deadline = time.time() + 20
        while len(list(tmp_path.iterdir())) < 2:
            assert trainer.poll() is None and time.time() < deadline, "the workers never started"
            time.sleep(0.05)
    finally:
        trainer.kill()
        trainer.wait()
    workers = [int(p.name) for p in tmp_path.iterdir()]
    deadline = time.time() + 5
    while any(_alive(pid) for pid in workers) and time.time() < deadline:
        time.sleep(0.05)
    left = [pid for pid in workers if _alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"workers {left} outlived the trainer"


def test_the_error_names_the_first_failing_sample_in_call_order():
    """Sample 1 fails at once while sample 0 is still running and fails later: sample 0 is the error, as in
    one process."""
    samples = [Sample(f"p{i}", "c", str(i), 1, False) for i in range(6)]
    with _within(20), pytest.raises(RewardError, match=r"raised ValueError: sample 0 fails, slowly on sample 0 "):
        score_samples(["tests.helpers:fails_first_two"], [1.0], samples, 8, CallPolicy(3))


def test_an_exception_that_cannot_be_rebuilt_is_one_line_naming_its_type():
    """GradeError pickles but its __init__ cannot rebuild it from the pickle: it was a TypeError traceback
    out of the trainer."""
    with _within(20), pytest.raises(RewardError, match=r"'tests.helpers:raises_grade_error' raised GradeError: "
                                                       r"p0: no answer found on sample 0 \(prompt='p0'"):
        score_samples(["tests.helpers:raises_grade_error"], [1.0], SAMPLES, 8, CallPolicy(2))


def test_a_worker_dying_mid_reply_is_a_died_worker():
    """A reply cut short ("got end of file during message") was an OSError traceback out of the trainer."""
    with _within(20), pytest.raises(RewardError, match=r"'tests.helpers:cuts_its_reply' ended its worker process "
                                                       r"\(exited with code 5\) on sample 0 \(prompt='p0'"):
        score_samples(["tests.helpers:cuts_its_reply"], [1.0], SAMPLES, 8, CallPolicy(1))
