"""A run that fails keeps its last consistent state; a run without held-out problems skips evaluation."""

from __future__ import annotations

import json
import os

import pytest

from rlft.output.tracking import read_metrics
from rlft.state import checkpoint as ckpt
from tests.support import ROOT, TINY, comparable_metrics, run_cli, saved_weights

# 2 prompts x 4 samples: 8 reward calls per step; evaluation at step 2 scores 8 more.
RUN = [
    *[a for a in TINY if not a.startswith(("trainer.steps", "trainer.eval_every"))],
    "trainer.steps=4", "trainer.eval_every=2", "trainer.eval_at_start=false",
    "reward.fns=[tests.helpers:char_count_failing]", "reward.weights=[1]", "optim.lr=1e-2",
]


@pytest.mark.slow  # a whole run each (~40 s): make test stays under 10 minutes
def test_evaluation_failing_after_an_update_saves_the_last_logged_step(tmp_path, monkeypatch):
    ref, run = tmp_path / "ref", tmp_path / "run"
    r = run_cli(["train", *RUN, f"hydra.run.dir={ref}"], ROOT)
    assert r.returncode == 0, r.stderr[-2000:]

    monkeypatch.setenv("RLFT_TEST_FAIL_AFTER", "16")  # the first evaluation call, after step 2's update
    r = run_cli(["train", *RUN, f"hydra.run.dir={run}"], ROOT)
    assert r.returncode == 1 and "injected failure" in r.stderr and "Traceback" not in r.stderr
    assert [p.name for p in ckpt.list_checkpoints(run / "checkpoints")] == ["step_000001"]
    assert [m["step"] for m in read_metrics(run / "metrics.jsonl")] == [1]
    state = json.loads((run / "checkpoints" / "step_000001" / ckpt.STATE).read_text())
    assert state["cursor"] == 1  # step 2's data is drawn again on resume

    monkeypatch.delenv("RLFT_TEST_FAIL_AFTER")
    r = run_cli(["train", *RUN, f"hydra.run.dir={run}", "trainer.resume=auto"], ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [m["step"] for m in read_metrics(run / "metrics.jsonl")] == [1, 2, 3, 4]
    assert comparable_metrics(run) == comparable_metrics(ref)  # the rolled-back step 2 ran again exactly as in one go
    wa, wb = saved_weights(ref, 4), saved_weights(run, 4)
    assert all(bool((wa[k] == wb[k]).all()) for k in wa)


@pytest.mark.slow  # a whole run each (~40 s): make test stays under 10 minutes
def test_no_held_out_problems_skips_evaluation_with_a_reason(tmp_path):
    run = tmp_path / "run"
    r = run_cli(["train", *TINY, "data.num_eval=0", "trainer.eval_every=1", f"hydra.run.dir={run}"], ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "evaluation skipped: no held-out problems (data.num_eval=0)" in (run / "train.log").read_text()
    assert not any("eval/accuracy" in m for m in read_metrics(run / "metrics.jsonl"))

    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"prompt": "What is 1 + 1?", "answer": "2"}) + "\n")
    run = tmp_path / "run1"
    r = run_cli(["train", *TINY, "data=jsonl", f"data.path={one}", f"hydra.run.dir={run}"], ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "set data.eval_path" in (run / "train.log").read_text()

    r = run_cli(["eval", "model=tiny", "sampler=hf", "data.num_eval=0", "--samples", "0",
                 "--out", str(tmp_path / "e.json")], ROOT)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "no held-out problems" in r.stderr
    assert not os.path.exists(tmp_path / "e.json")


def test_first_ctrl_c_finishes_the_step_saves_and_exits_130(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    args = [a for a in RUN if not a.startswith(("trainer.steps", "reward.fns"))]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlft.cli", "train", *args, "trainer.steps=50", "reward.fns=[tests.helpers:char_count]",
         f"hydra.run.dir={run}"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.time() + 180
    while not (run / "metrics.jsonl").exists() or not read_metrics(run / "metrics.jsonl"):
        assert proc.poll() is None and time.time() < deadline, "training never logged a step"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 130 and "Traceback" not in err
    assert "stopping after this step" in err and "trainer.resume=auto" in err
    steps = [m["step"] for m in read_metrics(run / "metrics.jsonl")]
    assert steps[-1] < 50, "the signal did not stop the run"
    assert [p.name for p in ckpt.list_checkpoints(run / "checkpoints")] == [ckpt.step_dir_name(steps[-1])]
    assert f"stopped by a signal after step {steps[-1]}" in (run / "train.log").read_text()


def test_a_rank_leaving_on_an_error_ignores_the_launchers_sigterm_but_a_clean_exit_restores_it():
    import signal

    from rlft.state.failure import GracefulStop

    before, before_int = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        with GracefulStop(hold_on_error=True):
            pass
        assert signal.getsignal(signal.SIGTERM) is before
        try:
            with GracefulStop(hold_on_error=True):
                raise RuntimeError("Connection reset by peer")
        except RuntimeError:
            pass
        # the agent's SIGTERM, sent when another rank died, must not kill this one while it reports
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.raise_signal(signal.SIGTERM)  # ignored: the test process survives
        try:
            with GracefulStop():
                raise RuntimeError("one process")
        except RuntimeError:
            pass
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # restored to what it was on entry
    finally:
        signal.signal(signal.SIGTERM, before)
        signal.signal(signal.SIGINT, before_int)


def test_a_grace_deadline_that_fires_as_the_step_finishes_does_not_abort_the_checkpoint_write():
    """The timer fires just before step_done (its SIGTERM still pending, held here by a signal mask so that
    the race is exact): the handler must drop that signal once the step is done, not abort the save that
    follows with "did not finish within trainer.stop_grace_s". Once step_done returns the timer has
    ended: it cannot signal after __exit__ restored the previous handlers."""
    import signal
    import threading

    from rlft.state.failure import GracefulStop

    before = signal.getsignal(signal.SIGTERM)
    try:
        with GracefulStop(grace_s=60) as stop:
            signal.raise_signal(signal.SIGTERM)  # the first signal: finish the step
            assert stop.requested
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            try:
                timer = threading.Thread(target=stop._expire, args=(threading.main_thread().ident,))
                timer.start()
                timer.join()
                stop.step_done()
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # the timer's SIGTERM arrives now
            assert not stop._timer.is_alive()
            saved = True  # the checkpoint write, reached without a KeyboardInterrupt
        assert saved and signal.getsignal(signal.SIGTERM) is before
    finally:
        signal.signal(signal.SIGTERM, before)
