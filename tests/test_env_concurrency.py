"""Every waiting episode's environment at once (issue 36): the tool calls of all episodes in one batch on worker
processes kept for the run, the environments of episode.env in worker processes of their own; real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from rlft.config.schemas.episode import EpisodeConfig
from rlft.episodes.tool_env import ToolEnv
from rlft.tools.dispatch import ToolRunner
from rlft.tools.spec import load_tools

H = "tests.tool_helpers"


def _reply(name: str, **arguments) -> str:
    import json

    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def _runner(*names: str, **cfg) -> tuple[ToolRunner, EpisodeConfig]:
    c = EpisodeConfig(**{"tool_timeout_s": 5.0, **cfg})
    return ToolRunner(load_tools([f"{H}:{n}" for n in names], c), c), c


def test_the_calls_of_32_waiting_episodes_run_at_once():
    runner, _ = _runner("slow_lookup")
    with runner:
        envs = [ToolEnv(runner) for _ in range(32)]
        ToolEnv.step_batch(envs[:1], [_reply("slow_lookup", x=0)])  # forks the first worker
        start = time.monotonic()
        out = ToolEnv.step_batch(envs, [_reply("slow_lookup", x=i) for i in range(32)])
        took = time.monotonic() - start
    # One episode after another (rlft before issue 36): 32 x 0.5 s = 16 s.
    assert took < 4.0, took
    assert [s.messages[0]["content"] for s, _ in out] == [f"looked up {i}" for i in range(32)]
    assert all(0.45 < seconds < 3.0 for _, seconds in out)  # each episode's own time: its call's
    assert all(s.events["tool_calls"] == 1 and s.events["tool_errors"] == 0 and not s.done for s, _ in out)


def test_a_reply_without_a_call_ends_its_episode_beside_the_others():
    runner, _ = _runner("multiply")
    with runner:
        envs = [ToolEnv(runner) for _ in range(3)]
        out = ToolEnv.step_batch(envs, [_reply("multiply", a=2, b=3.0), "The answer is 6.", _reply("nope")])
    assert out[0][0].messages[0]["content"] == "6.0"
    assert out[1] == (out[1][0], 0.0) and out[1][0].done and out[1][0].events == {"tool_calls": 0}
    assert out[2][0].events["tool_errors/unknown_tool"] == 1


def test_tool_workers_are_kept_across_steps_and_replaced_when_one_dies():
    runner, _ = _runner("worker_pid", "exits_hard", env_workers=3)
    with runner:
        envs = [ToolEnv(runner) for _ in range(3)]
        first = {s.messages[0]["content"] for s, _ in ToolEnv.step_batch(envs, [_reply("worker_pid", x=1)] * 3)}
        again = {s.messages[0]["content"] for s, _ in ToolEnv.step_batch(envs, [_reply("worker_pid", x=2)] * 3)}
        assert len(first) == 3 and again == first  # the same three processes: not forked per episode or step
        assert str(os.getpid()) not in first
        died = ToolEnv.step_batch(envs[:1], [_reply("exits_hard", x=1)])[0][0]
        assert died.messages[0]["content"] == "Error: exits_hard ended its process (exited with code 3) without returning"
        after = {s.messages[0]["content"] for s, _ in ToolEnv.step_batch(envs, [_reply("worker_pid", x=3)] * 3)}
        assert len(after) == 3 and len(after & first) == 2  # one fresh worker in place of the dead one
        # one killed while idle between steps is replaced before it is given a call
        victim = int(sorted(after)[0])
        os.kill(victim, 9)
        time.sleep(0.2)
        last = {s.messages[0]["content"] for s, _ in ToolEnv.step_batch(envs, [_reply("worker_pid", x=4)] * 3)}
        assert len(last) == 3 and str(victim) not in last
        pids = runner.worker_pids
    for pid in pids:  # close() stops them
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_a_hanging_call_costs_its_timeout_not_the_others_time():
    runner, _ = _runner("hangs", "slow_lookup", tool_timeout_s=1.5)
    with runner:
        envs = [ToolEnv(runner) for _ in range(8)]
        start = time.monotonic()
        out = ToolEnv.step_batch(envs, [_reply("hangs", x=0)] + [_reply("slow_lookup", x=i) for i in range(1, 8)])
        took = time.monotonic() - start
    assert took < 4.0, took
    assert out[0][0].events["tool_errors/timeout"] == 1
    assert [s.messages[0]["content"] for s, _ in out[1:]] == [f"looked up {i}" for i in range(1, 8)]


def test_the_progress_line_shows_the_episodes(tmp_path):
    import io

    from rich.console import Console

    from rlft.config import compose
    from rlft.output.tracking import Tracker

    cfg, _, _ = compose(["logger.console=true"])
    tracker = Tracker(tmp_path, cfg, 10, console=False)
    try:
        tracker.episodes(20, 8, 4)
        shown = io.StringIO()
        Console(file=shown, width=200).print(tracker.progress.get_renderable())
        assert "episodes 20 done | 8 running | 4 waiting on env" in shown.getvalue()
        tracker.log_step(1, {"time/step_s": 1.0})  # a logged step clears it until the next rollout
        shown = io.StringIO()
        Console(file=shown, width=200).print(tracker.progress.get_renderable())
        assert "episodes" not in shown.getvalue() and "1/10" in shown.getvalue()
    finally:
        tracker.close()


# ---------------------------------------------------------------------------------- episode.env in workers


def test_environments_step_at_once_in_workers_that_keep_their_state():
    import gc

    from rlft.episodes.env_pool import EnvPool
    from tests import envs

    pool = EnvPool(envs.SlowEnv, "episode.env=x", 32, 5.0)
    try:
        held = [pool.make(None) for _ in range(32)]
        for turn in (1, 2):
            start = time.monotonic()
            out = pool.step(held, ["a reply"] * 32)
            assert time.monotonic() - start < 4.0  # one after another: 16 s
            texts = [s.messages[0]["content"] for s, _ in out]
            assert all(t.endswith(f"step {turn}") for t in texts)  # each environment's own count, kept
            assert all(0.45 < seconds < 4.0 for _, seconds in out)
        pids = {t.split()[1] for t in texts}
        assert len(pids) == 32 and str(os.getpid()) not in pids and len(pool.workers) == 32
        # finished episodes' environments are dropped from their workers; new ones go to the emptiest worker
        del held, out
        gc.collect()
        assert pool.live == [0] * 32 and all(pool.drops)
        again = [pool.make(None) for _ in range(3)]
        assert len({e.slot for e in again}) == 3 and len(pool.workers) == 32
        assert [s.messages[0]["content"].endswith("step 1") for s, _ in pool.step(again, ["r"] * 3)] == [True] * 3
        assert not any(pool.drops[e.slot] for e in again)  # sent with those calls
    finally:
        pool.close()


def test_more_live_episodes_than_workers_share_them():
    from rlft.episodes.env_pool import EnvPool
    from tests import envs

    pool = EnvPool(envs.SlowEnv, "episode.env=x", 4, 5.0)
    try:
        held = [pool.make(None) for _ in range(8)]
        start = time.monotonic()
        out = pool.step(held, ["r"] * 8)
        assert 0.9 < time.monotonic() - start < 3.5  # two environments a worker: two steps of 0.5 s
        assert len(pool.workers) == 4 and len({s.messages[0]["content"].split()[1] for s, _ in out}) == 4
    finally:
        pool.close()


@pytest.mark.parametrize(("env", "words"), [
    ("StuckInCEnv", r"^episode.env=x: step\(\) on the reply 'r' ran past episode.env_timeout_s=1s \(its worker process "
                    r"was killed\)$"),
    ("HardExitEnv", r"^episode.env=x: step\(\) on the reply 'r' ended its worker process \(exited with code 7\)$"),
    ("SelfKillingEnv", r"^episode.env=x: step\(\) on the reply 'r' ended its worker process \(killed by SIGKILL\)$"),
    ("UnbuildableEnv", r"^episode.env=x: building it raised RuntimeError: built$"),
    ("JunkEnv", r"^episode.env=x: step\(\) returned dict, not rlft.episodes.env.Step$"),
])
def test_an_environment_that_hangs_in_c_or_ends_its_process_is_one_error(env, words):
    from rlft.episodes.env_pool import EnvPool
    from rlft.errors import EnvError
    from tests import envs

    pool = EnvPool(getattr(envs, env), "episode.env=x", 4, 1.0)
    healthy = EnvPool(envs.SlowEnv, "episode.env=y", 1, 5.0)
    start = time.monotonic()
    with pytest.raises(EnvError, match=words):
        pool.step([pool.make(None) for _ in range(3)], ["r"] * 3)
    assert time.monotonic() - start < 10
    assert pool.workers == []  # stopped: the run ends
    # the trainer (this process) lives on, and another pool still works
    assert healthy.step([healthy.make(None)], ["r"])[0][0].messages[0]["content"].endswith("step 1")
    healthy.close()


def _collect_and_measure(x: int) -> float:
    """In a worker: a full garbage collection, then the worker's own (private, dirtied) memory in MiB."""
    import gc

    gc.collect()
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Private_Dirty"):
            return int(line.split()[1]) / 1024
    return 0.0


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="Linux's smaps_rollup")
def test_workers_forked_from_the_trainer_do_not_copy_its_python_heap():
    """A function that does not pickle (a closure) runs in workers forked from the trainer (rlft.workers.server)."""
    from rlft.workers.pool import Pool

    heap = [{"k": i, "v": [i]} for i in range(1_000_000)]  # ~130 MiB of Python objects, as a trainer holds
    pool = Pool(lambda x: _collect_and_measure(x), 2, 60.0)
    try:
        for i in range(2):
            pool.submit(i, ((i,), {}))
        got: dict = {}
        while len(got) < 2:
            got.update(pool.poll(None))
        private = [got[i][0] for i in range(2)]
    finally:
        pool.close()
    # Without gc.freeze() in the worker, a collection writes to every inherited object: ~125 MiB copied per worker.
    assert all(mb < 40 for mb in private), private
    assert len(heap) == 1_000_000


# ------------------------------------------------------------ steps handed back as each finishes (continuous)


def _arrivals(stepper, count: int) -> list[tuple[int, float]]:
    """(key, seconds since the call) of the next ``count`` answers, in the order they came back."""
    start, out = time.monotonic(), []
    while len(out) < count:
        out += [(key, time.monotonic() - start) for key, *_ in stepper.poll(None)]
    return out


def test_tool_replies_come_back_as_each_finishes_not_together():
    from rlft.episodes.tool_env import ToolSteps

    c = EpisodeConfig(tool_timeout_s=5.0)
    with ToolRunner(load_tools([f"{H}:naps", "calculator"], c), c) as runner:
        steps = ToolSteps(runner)
        env = ToolEnv(runner)
        assert env.stepper() is env.stepper() and env.stepper().runner is runner  # one per runner
        steps.submit(0, env, _reply("naps", seconds=1.5))
        steps.submit(1, env, _reply("naps", seconds=0.2))
        steps.submit(2, env, "no call: the episode ends")
        steps.submit(3, env, _reply("calculator", expression="6*7"))  # a built-in, on a thread
        assert steps.running == 4
        order = _arrivals(steps, 4)
        assert [k for k, _ in order][-1] == 0 and {k for k, _ in order[:3]} == {1, 2, 3}
        took = dict(order)
        assert took[1] < 1.0 < 1.4 < took[0] < 3.0, order  # the short nap did not wait for the long one
        assert steps.running == 0 and steps.poll(0.0) == []
        # the answers are the episodes' steps: results, events, and a reply without a call ends its episode
        steps.submit(5, env, _reply("calculator", expression="6*7"))
        steps.submit(6, env, "nothing to call")
        got = {}
        while len(got) < 2:
            got.update((k, (s, sec)) for k, s, sec in steps.poll(None))
        assert got[5][0].messages[0]["content"] == "42" and got[5][0].events["tool_calls"] == 1
        assert got[6] == (got[6][0], 0.0) and got[6][0].done and got[6][0].events == {"tool_calls": 0}


def test_env_pool_steps_come_back_as_each_finishes_and_a_worker_runs_its_own_in_order():
    from rlft.episodes.env_pool import EnvPool
    from tests import envs

    pool = EnvPool(envs.NappingEnv, "episode.env=x", 2, 10.0)
    try:
        slow, fast = pool.make(None), pool.make(None)
        assert slow.stepper() is pool and slow.slot != fast.slot
        pool.submit(0, slow, "1.5")
        pool.submit(1, fast, "0.2")
        pool.submit(2, fast, "0.1")  # queued behind key 1 on the same worker (its environment's steps in order)
        assert pool.running == 5  # two builds and three steps
        order = _arrivals(pool, 3)
        assert [k for k, _ in order] == [1, 2, 0], order
        assert order[1][1] < 1.0 < 1.4 < order[2][1] < 3.0, order
        assert pool.running == 0 and pool.poll(0.0) == []
    finally:
        pool.close()


def test_a_pool_hands_calls_back_by_key_as_they_settle_and_reuses_its_workers():
    from rlft.workers.pool import Pool
    from rlft.workers.user_calls import CallFailed, CallTimeout
    from tests.tool_helpers import naps

    def call(kind: str, seconds: float) -> str:
        if kind == "raise":
            raise ValueError("no")
        return naps(seconds) + f" in {os.getpid()}"

    pool = Pool(call, 3, 1.0)
    try:
        for key, args in ((10, ("nap", 0.6)), (11, ("nap", 0.05)), (12, ("raise", 0)), (13, ("nap", 5.0)),
                          (14, ("nap", 0.05))):
            pool.submit(key, (args, {}))
        assert pool.running == 5
        got: dict = {}
        while len(got) < 5:
            got.update(pool.poll(None))
        assert isinstance(got[12][0], CallFailed) and isinstance(got[13][0], CallTimeout)
        assert 0.9 < got[13][1] < 2.5  # killed at the limit
        pids = {got[k][0].split()[-1] for k in (10, 11, 14)}
        assert len(pids) <= 3 and str(os.getpid()) not in pids
        assert got[10][0].startswith("slept 0.6") and pool.running == 0
    finally:
        pool.close()


@pytest.mark.parametrize(("overrides", "words"), [
    (["episode.schedule=sometimes", "tools=[calculator]"],
     "episode.schedule='sometimes'; valid choices: auto, continuous, lockstep"),
    (["episode.schedule=continuous", "tools=[calculator]", "sampler=hf"], "episode.schedule=continuous needs sampler=vllm"),
    (["episode.schedule=lockstep"], "episode.schedule=lockstep does nothing without tools or episode.env"),
    (["episode.worker_start=fork", "tools=[calculator,python]"],
     "episode.worker_start=fork does nothing without a user tool or episode.env"),
    (["episode.worker_start=spawn", "tools=[tests.tool_helpers:multiply]"],
     "episode.worker_start='spawn'; valid choices: server, fork"),
])
def test_episode_schedule_refusals(compose_cfg, overrides, words):
    from rlft.errors import ConfigError

    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        compose_cfg(*overrides)


def test_episode_schedule_auto_is_continuous_under_vllm_only(compose_cfg):
    from rlft.episodes.setup import episode_setup

    assert episode_setup(compose_cfg("tools=[calculator]", "sampler=vllm")).continuous
    assert not episode_setup(compose_cfg("tools=[calculator]", "sampler=hf")).continuous
    assert not episode_setup(compose_cfg("tools=[calculator]", "sampler=vllm", "episode.schedule=lockstep")).continuous


def test_no_tool_worker_is_forked_here_while_a_built_in_call_runs():
    """A fork copies the locks that other threads hold: a user tool whose worker would be forked from this process
    (a closure: rlft.workers.server) waits for the python tool's program (on a thread) to finish; once forked,
    workers are reused without waiting. The worker server's workers are forked there, and start at once."""
    import dataclasses

    from rlft.episodes.tool_env import ToolSteps
    from tests.tool_helpers import worker_pid

    c = EpisodeConfig(tool_timeout_s=5.0, python_sandbox="process")
    served = load_tools([f"{H}:worker_pid", "python"], c)
    closure = [dataclasses.replace(served[0], fn=lambda x: worker_pid(x)), served[1]]
    sleep = _reply("python", code="import time; time.sleep(1.0); print('done')")
    with ToolRunner(served, c) as runner:
        steps, env = ToolSteps(runner), ToolEnv(runner)
        steps.submit(0, env, sleep)
        steps.submit(1, env, _reply("worker_pid", x=1))
        order = _arrivals(steps, 2)
        assert [k for k, _ in order] == [1, 0] and order[0][1] < 0.5, order
    with ToolRunner(closure, c) as runner:
        steps, env = ToolSteps(runner), ToolEnv(runner)
        steps.submit(0, env, sleep)
        steps.submit(1, env, _reply("worker_pid", x=1))
        order = _arrivals(steps, 2)
        assert [k for k, _ in order] == [0, 1] and order[1][1] >= 0.9, order
        steps.submit(2, env, sleep)
        steps.submit(3, env, _reply("worker_pid", x=2))  # the kept worker takes it at once
        order = _arrivals(steps, 2)
        assert [k for k, _ in order] == [3, 2] and order[0][1] < 0.5, order


def test_each_job_of_a_sweep_ends_with_its_workers_and_gives_the_next_its_own_log_and_environment(tmp_path):
    """A sweep runs its jobs in one process: job 1's environment workers are gone when job 2 builds its environments
    (they used to stay until the sweep ended), and job 2's workers read job 2's environment variables and log to
    job 2's train.log (the worker server used to keep job 1's)."""
    from tests.support import ROOT, TINY, write_eos_model

    write_eos_model(tmp_path / "model", eos_logit=14.0)  # replies that end: the environments are stepped
    record = tmp_path / "workers.txt"
    tiny = [a for a in TINY if not a.startswith("model=")]
    args = ["train", "-m", *tiny, "model=local", f"model.path={tmp_path / 'model'}", "trainer.steps=1", "data.num_eval=0", "episode.env=tests.envs:JobEnv",
            "episode.env_workers=2", "seed=1,2", "+hydra.job.env_set.RLFT_TEST_JOB=job${hydra:job.num}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    env = dict(os.environ, RLFT_TEST_WORKERS=str(record), PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-m", "rlft.cli", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in record.read_text().splitlines()]
    assert {r[0] for r in rows} == {"job0", "job1"}, rows
    assert all(r[2] == "-" for r in rows if r[0] == "job1"), rows  # no worker of the first job left alive
    for job, other in (("0", "job1"), ("1", "job0")):
        log = (tmp_path / "sweep" / job / "train.log").read_text()
        mine = "job" + job
        assert f"job-env-warning {mine}" in log and f"job-env-warning {other}" not in log, log[-3000:]
        assert "environment workers: forked from the worker server" in log
