"""A pool of worker processes kept for the run (a tool's calls, step after step), taking calls as they come and
handing each back as it settles (rlft.tools.dispatch: episodes whose tools run while other episodes generate).
Its workers come from the worker server (rlft.workers.server) when their function pickles."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from rlft.workers.server import forks_here, start_method, usable
from rlft.workers.user_calls import CallPolicy, Worker, Workers


class Pool:
    """Worker processes for one function, kept between calls (a tool's calls, step after step): up to
    ``num_workers`` processes forked when first needed and reused after; a worker that hung (killed at
    ``timeout_s``) or died is replaced by a fresh one, and one found dead while idle is replaced before it is
    given a call. Each call is settled on its own, as rlft.workers.user_calls.settle_calls does. Calls go in with ``submit``
    and come out with ``poll`` as they settle (episodes whose tools run while other episodes generate)."""

    def __init__(self, fn: Callable[..., Any], num_workers: int, timeout_s: float,
                 may_fork: Callable[[], bool] = lambda: True, start: str = "server"):
        ctx, self.started_from = start_method(fn, start)
        """Where the workers are forked from, in words (rlft.workers.server.start_method; episode.worker_start)."""
        self._workers = Workers(fn, CallPolicy(max(1, num_workers), timeout_s), keep=True, ctx=ctx)
        self._may_fork = may_fork
        """Whether a worker may be forked now (not while the caller's threads may hold locks a child would copy)."""
        self._queue: deque[tuple[int, tuple[tuple, dict]]] = deque()

    def submit(self, key: int, call: tuple[tuple, dict]) -> None:
        """Queue a call (``key``: how ``poll`` names it); it starts at once when a worker is free or may be forked."""
        self._queue.append((key, call))
        self._dispatch()

    def poll(self, timeout: float | None) -> dict[int, tuple[Any, float]]:
        """The calls that settled within ``timeout`` seconds (None: wait for one), by key: (outcome, seconds it
        ran). Nothing when no call is running."""
        w = self._workers
        self._dispatch()
        if not w.busy:
            return {}
        results: dict[int, Any] = {}
        failures: dict[int, Exception] = {}
        w.seconds = {}
        w._collect(results, failures, None, limit=timeout)
        self._dispatch()  # the freed workers take the queued calls at once
        return {k: (v, w.seconds.get(k, 0.0)) for k, v in (results | failures).items()}

    @property
    def running(self) -> int:
        """Calls submitted and not yet settled."""
        return len(self._queue) + len(self._workers.busy)

    def abandon(self) -> None:
        """Drop the queued calls and stop the running ones' workers (the idle ones are kept)."""
        self._queue.clear()
        for worker in self._workers.busy:
            worker.stop()
        self._workers.busy = []

    @property
    def pids(self) -> list[int]:
        """The live workers' process ids (idle between batches)."""
        return [w.process.pid for w in self._workers.idle]

    def close(self) -> None:
        self._queue.clear()
        self._workers.close()

    def _dispatch(self) -> None:
        w = self._workers
        while self._queue and (w.idle or (len(w.busy) < w.policy.num_workers
                                          and (not forks_here(usable(w.ctx)) or self._may_fork()))):
            worker = w.idle.pop() if w.idle else Worker(w.ctx, w.fn)
            key, call = self._queue.popleft()
            if not w.send(worker, key, call):  # a fresh one takes the call (forked on the next turn of the loop)
                self._queue.appendleft((key, call))
