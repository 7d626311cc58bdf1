"""The environments of ``episode.env`` in worker processes: a call that hangs (in C code too) is stopped at
``episode.env_timeout_s``, one that ends its process (``os._exit``, a signal, the OOM killer) is seen at once,
and the trainer waits on all the episodes' environments together, never on one.

Each environment lives in one worker for its whole episode (its state stays there: nothing is pickled but the
problem once, each reply and each Step). A worker holds several environments when there are more live
episodes than ``episode.env_workers``; the steps of one worker's environments run one after another, those of
different workers at once. Workers are forked when first needed (at most ``env_workers``) and kept for the run;
an environment is placed on the worker holding the fewest live ones. A finished episode's environment is
dropped from its worker with the next call sent there.

What fails (the environment raises, ``sys.exit`` included; returns something else than a Step; runs past the
limit; ends its worker) ends the run with one EnvError, as an environment that raises in the trainer did: an
environment's failure is a bug in the user's code, not a move of the policy, and scoring it as configured would
train on a reward that the bug, not the policy, decided. The pool is then stopped; a later call starts afresh.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import wait
from typing import Any

from rlft.episodes.env import Step
from rlft.episodes.env_in_worker import env_call
from rlft.episodes.episode import check_step
from rlft.errors import Described, EnvError, how_it_ended
from rlft.workers.server import start_method
from rlft.workers.user_calls import Worker as _Worker

_Job = tuple[Any, "WorkerEnv", str, Any, str]
"""A call for a worker: (the step's key or None for a build, environment, op, argument, what it does in words)."""


class WorkerEnv:
    """One episode's environment, held by a worker of ``pool`` (built there at its first step)."""

    def __init__(self, pool: EnvPool, eid: int, slot: int, problem: Any):
        self.pool, self.eid, self.slot, self.problem, self.built = pool, eid, slot, problem, False

    def step(self, reply: str) -> Step:
        return self.step_batch([self], [reply])[0][0]

    def stepper(self) -> EnvPool:
        """What steps this episode in the continuous loop (rlft.episodes.continuous): its pool."""
        return self.pool

    @staticmethod
    def step_batch(envs: Sequence[WorkerEnv], replies: Sequence[str]) -> list[tuple[Step, float]]:
        """Each environment's Step for its reply and the seconds it took in its worker, all at once."""
        out: list[tuple[Step, float] | None] = [None] * len(envs)
        for pool in {id(e.pool): e.pool for e in envs}.values():
            mine = [i for i, e in enumerate(envs) if e.pool is pool]
            for i, answer in zip(mine, pool.step([envs[i] for i in mine], [replies[i] for i in mine])):
                out[i] = answer
        return out  # type: ignore[return-value]


class EnvPool:
    """Up to ``num_workers`` worker processes holding ``env_class`` environments (see the module docstring);
    ``timeout_s`` bounds each build and step (0: no limit); ``name`` names the environment in errors."""

    def __init__(self, env_class: Any, name: str, num_workers: int, timeout_s: float, start: str = "server"):
        self.env_class, self.name, self.num_workers, self.timeout_s = env_class, name, max(1, num_workers), timeout_s
        self._fn = functools.partial(env_call, env_class)
        # From the worker server, which imports the environment's module (episode.worker_start=server), or the trainer.
        self.ctx, self.started_from = start_method(self._fn, start)
        self.workers: list[_Worker] = []
        self.live: list[int] = []
        """Per worker, the environments it holds that an episode still uses."""
        self.drops: list[list[int]] = []
        """Per worker, finished environments to drop with its next call."""
        self._next = 0
        self._queues: dict[int, deque[_Job]] = {}
        """Per worker, the calls waiting for it to be free."""
        self._busy: dict[int, _Job] = {}
        """Per worker, the call it runs."""

    def make(self, problem: Any) -> WorkerEnv:
        """An environment for ``problem`` (built in its worker at the first step)."""
        if len(self.workers) < self.num_workers and all(self.live):
            self.workers.append(_Worker(self.ctx, self._fn))
            self.live.append(0)
            self.drops.append([])
        slot = min(range(len(self.workers)), key=self.live.__getitem__)
        self._next += 1
        env = WorkerEnv(self, self._next, slot, problem)
        self.live[slot] += 1
        weakref.finalize(env, self._finished, self.workers[slot], slot, env.eid)
        return env

    def step(self, envs: Sequence[WorkerEnv], replies: Sequence[str]) -> list[tuple[Step, float]]:
        """Each environment's Step for its reply (built first if it is not yet) and the seconds the step took in
        its worker; all workers at once.

        Raises:
            EnvError: one of them failed (the pool is stopped).
        """
        done: dict[int, tuple[Step, float]] = {}
        try:
            for k, (env, reply) in enumerate(zip(envs, replies)):
                self.submit(k, env, reply)
            while len(done) < len(envs):
                done.update((k, (step, s)) for k, step, s in self.poll(None))
        except BaseException:
            self.close()
            raise
        return [done[k] for k in range(len(envs))]

    def submit(self, key: int, env: WorkerEnv, reply: str) -> None:
        """Queue ``env``'s step on ``reply`` (``key``: how ``poll`` names it), after its build if it has none yet;
        its worker starts it once the calls queued there before it are done."""
        queue = self._queues.setdefault(env.slot, deque())
        if not env.built:
            queue.append((None, env, "build", env.problem, "building it"))
            env.built, env.problem = True, None
        queue.append((key, env, "step", reply, f"step() on the reply {reply[:60]!r}"))
        try:
            self._dispatch()
        except BaseException:
            self.close()
            raise

    def poll(self, timeout: float | None) -> list[tuple[int, Step, float]]:
        """The steps that came back within ``timeout`` seconds (None: wait for one): (key, Step, seconds in its
        worker). Nothing when no call is running.

        Raises:
            EnvError: a call failed (the pool is stopped).
        """
        if not self._busy:
            return []
        try:
            out = self._collect(timeout)
            self._dispatch()
        except BaseException:
            self.close()
            raise
        return out

    def abandon(self) -> None:
        """Drop the calls in flight (a rollout that failed elsewhere): the workers and their environments go."""
        self.close()

    @property
    def running(self) -> int:
        """Steps and builds queued or running."""
        return sum(len(q) for q in self._queues.values()) + len(self._busy)

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self.workers]

    def close(self) -> None:
        """Stop the workers (their environments are lost)."""
        for w in self.workers:
            w.stop()
        self.workers, self.live, self.drops = [], [], []
        self._queues.clear()
        self._busy.clear()

    def _finished(self, worker: _Worker, slot: int, eid: int) -> None:
        """An episode's environment proxy is gone: its worker drops it with its next call."""
        if slot < len(self.workers) and self.workers[slot] is worker:
            self.live[slot] -= 1
            self.drops[slot].append(eid)

    def _dispatch(self) -> None:
        """Send each idle worker the next call queued for it."""
        for slot in [s for s in self._queues if s not in self._busy]:
            job = self._queues[slot].popleft()
            if not self._queues[slot]:
                del self._queues[slot]
            key, env, op, arg, _ = job
            drops, self.drops[slot] = self.drops[slot], []
            try:
                self.workers[slot].start(0, ((op, env.eid, arg, drops), {}), self.timeout_s)
            except OSError:  # it died between two calls
                self._busy[slot] = job
                raise self._lost(job, self.workers[slot], True) from None
            self._busy[slot] = job

    def _collect(self, timeout: float | None) -> list[tuple[int, Step, float]]:
        """Wait (up to ``timeout`` seconds) for busy workers to answer, die or pass their deadline."""
        workers = {slot: self.workers[slot] for slot in self._busy}
        deadline = min(w.deadline for w in workers.values())
        wait_s = None if deadline == float("inf") else max(0.0, deadline - time.monotonic())
        if timeout is not None:
            wait_s = timeout if wait_s is None else min(wait_s, timeout)
        ready = set(wait([w.conn for w in workers.values()] + [w.process.sentinel for w in workers.values()], wait_s))
        out = []
        for slot, w in workers.items():
            job = self._busy[slot]
            if w.conn in ready:
                reply = w.receive()
                if reply is None:
                    raise self._lost(job, w, True)
                ok, value = reply
                if not ok:
                    error = value.rebuilt() if isinstance(value, Described) else value
                    raise EnvError(f"{self.name}: {job[4]} raised {type(error).__name__}: {error}")
                del self._busy[slot]
                if job[2] == "step":
                    check_step(value, self.name)
                    out.append((job[0], value, time.monotonic() - w.started))
            elif w.process.sentinel in ready or time.monotonic() >= w.deadline:
                raise self._lost(job, w, w.process.sentinel in ready)
        return out

    def _lost(self, job: _Job, worker: _Worker, died: bool) -> EnvError:
        what = job[4]
        if died:  # its pipe closed or its sentinel fired: give its exit a moment (a loaded machine), so its code shows
            worker.process.join(5.0)
            worker.stop(died=True)
            return EnvError(f"{self.name}: {what} ended its worker process ({how_it_ended(worker.process.exitcode)})")
        return EnvError(f"{self.name}: {what} ran past episode.env_timeout_s={self.timeout_s:g}s (its worker process "
                        "was killed)")

