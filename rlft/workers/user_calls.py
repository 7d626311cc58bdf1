"""Running calls of user code (reward functions, tools): in this process, or in worker processes that can
be stopped when a call hangs.

A thread cannot be stopped, so a time limit needs processes: with a time limit (or a number of
workers) the calls go to forked worker processes, one call at a time each, so that the parent
always knows which call a worker is running. A call that does not return in time gets its worker
killed (and replaced); a worker that dies on its own (the function called ``os._exit``, a segfault,
the OOM killer) is seen at once through its process sentinel. :func:`run_calls` raises at the first
failing call (a reward run ends with one line naming the function, the sample and what happened, or,
with ``reward.on_timeout``, that call scores the configured value and the other calls go on);
:func:`settle_calls` returns each call's result or failure (a tool call's failure is a message to the
policy, and the other calls go on).

``multiprocessing.Pool`` is not used: it silently replaces a dead worker, and the result of the
call that worker held never arrives (the run would wait forever).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from rlft.errors import CallDied, CallFailed, CallTimeout, Described, how_it_ended  # noqa: F401  (re-exported)
from rlft.workers.in_worker import PARENT_ENDS, serve
from rlft.workers.server import failed, forks_here, started, usable


@dataclass(frozen=True)
class CallPolicy:
    """How calls run: worker processes (0 with no time limit: in this process), the time limit of one call
    (0: none) and, for rewards, the score of a call that timed out or died (``reward.on_timeout``)."""

    num_workers: int = 0
    timeout_s: float = 0.0
    on_timeout: float | None = None

    @property
    def in_process(self) -> bool:
        return self.num_workers == 0 and self.timeout_s <= 0


IN_PROCESS = CallPolicy()


def run_calls(fn: Callable[..., Any], calls: Sequence[tuple[tuple, dict]], policy: CallPolicy,
              timed_out: Any = None) -> list[Any]:
    """``[fn(*args, **kwargs) for args, kwargs in calls]`` under ``policy``; with ``policy.on_timeout``
    set, a call that ran past the limit or whose worker died returns ``timed_out`` (what that score
    means for this call).

    Raises:
        CallFailed: a call raised (``SystemExit`` included: ``sys.exit()`` in a reward is its failure,
            not the run's end).
        CallTimeout: a call ran past ``policy.timeout_s`` and ``policy.on_timeout`` is None.
        CallDied: a worker process ended during a call and ``policy.on_timeout`` is None.
    """
    if policy.in_process:
        out = []
        for i, (args, kwargs) in enumerate(calls):
            try:
                out.append(fn(*args, **kwargs))
            except (Exception, SystemExit) as e:  # noqa: BLE001  (the caller words it)
                raise CallFailed(i, e) from None
        return out
    return Workers(fn, policy).run(calls, timed_out)


def settle_calls(fn: Callable[..., Any], calls: Sequence[tuple[tuple, dict]], policy: CallPolicy) -> list[Any]:
    """Every call of ``fn`` under ``policy`` (``on_timeout`` is not used), each settled on its own: its result,
    or the :class:`CallFailed`, :class:`CallTimeout` or :class:`CallDied` that ended it (returned, not
    raised). One failing call does not stop the others."""
    if policy.in_process:
        out: list[Any] = []
        for i, (args, kwargs) in enumerate(calls):
            try:
                out.append(fn(*args, **kwargs))
            except (Exception, SystemExit) as e:  # noqa: BLE001  (the caller words it)
                out.append(CallFailed(i, e))
        return out
    return Workers(fn, CallPolicy(policy.num_workers, policy.timeout_s), settle=True).run(calls, None)


def describe(error: BaseException) -> str:
    """``Type: message``; ``SystemExit(code)`` for a function that called ``sys.exit`` (its message is only the code)."""
    if isinstance(error, SystemExit):
        return f"SystemExit({error.code!r})"
    return f"{type(error).__name__}: {error}"


class Worker:
    """A process that runs ``fn`` on the calls sent down its pipe, one at a time (rlft.workers.pool.Pool's, rlft.episodes.env_pool's
    and run_calls' workers)."""

    def __init__(self, ctx: Any, fn: Callable[..., Any]):
        self.conn, child = ctx.Pipe()
        PARENT_ENDS.add(self.conn)
        try:
            self.process = _start(usable(ctx), fn, child)
        except BaseException:
            self._close()
            raise
        finally:
            child.close()
        self.index = -1
        self.started = 0.0
        self.deadline = float("inf")

    def start(self, index: int, call: tuple[tuple, dict], timeout_s: float) -> None:
        self.index = index
        self.started = time.monotonic()
        self.deadline = self.started + timeout_s if timeout_s > 0 else float("inf")
        self.conn.send(call)

    def receive(self) -> tuple[bool, Any] | None:
        """The worker's reply; None when the pipe closed or a reply was cut short (the worker died)."""
        try:
            return self.conn.recv()
        except (EOFError, OSError):  # OSError: "got end of file during message" from a worker that died mid-send
            return None
        except Exception as e:  # noqa: BLE001  (unpickling runs arbitrary code)
            return False, RuntimeError(f"its result could not be read back from the worker ({type(e).__name__}: {e})")

    def stop(self, died: bool = False) -> None:
        if died:  # the pipe said so: give the exit a moment, so that its code (not our SIGKILL) is reported
            self.process.join(1.0)
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self._close()

    def _close(self) -> None:
        PARENT_ENDS.discard(self.conn)
        self.conn.close()


def _start(ctx: Any, fn: Callable[..., Any], child: Connection) -> Any:
    """A started worker process serving ``fn`` on ``child``; forked from here when the worker server fails."""
    parent = os.getpid() if forks_here(ctx) else None  # a server's worker learns its parent's pid itself
    process = ctx.Process(target=serve, args=(fn, child, parent), daemon=True)
    try:
        process.start()
    except (OSError, EOFError) as e:  # the server died as it started: a module it imports raised there
        if forks_here(ctx):
            raise
        return _start(failed(e), fn, child)
    if not forks_here(ctx):
        started(process)
    return process


class Workers:
    """``policy.num_workers`` (at least 1) workers for one function; a hung or dead one is replaced. With
    ``settle``, a failure neither stops the calls after it nor is raised: it is that call's result. With
    ``keep`` (rlft.workers.pool.Pool's workers, which never go through run()), a hung or dead worker's replacement is started when a
    call needs it, not at once."""

    def __init__(self, fn: Callable[..., Any], policy: CallPolicy, settle: bool = False, keep: bool = False,
                 ctx: Any = None):
        self.fn, self.policy, self.settle, self.keep = fn, policy, settle, keep
        # A kept pool's workers come from where its ``ctx`` says (rlft.workers.server.start_method: the worker server,
        # since a worker forked from the trainer keeps the pages the trainer writes later); run()'s live for one
        # batch of calls and are forked from the trainer, inheriting the user modules as the trainer has them.
        self.ctx = ctx or multiprocessing.get_context("fork")
        self.idle: list[Worker] = []
        self.busy: list[Worker] = []
        self.seconds: dict[int, float] = {}

    def close(self) -> None:
        for worker in self.idle + self.busy:
            worker.stop()
        self.idle, self.busy = [], []

    def run(self, calls: Sequence[tuple[tuple, dict]], timed_out: Any) -> list[Any]:
        """Every call's result; a failure is raised once the calls before it are settled, so the
        error names the first failing sample, as in one process."""
        results: dict[int, Any] = {}
        failures: dict[int, Exception] = {}
        queue = deque(range(len(calls)))
        self.seconds = {}
        try:
            for _ in range(min(max(1, self.policy.num_workers), len(calls)) - len(self.idle)):
                self.idle.append(Worker(self.ctx, self.fn))  # one by one: the finally stops those started
            while _unsettled(results, failures, self._bound(len(calls), failures)):
                while queue and self.idle and queue[0] < self._bound(len(calls), failures):
                    worker, i = self.idle.pop(), queue.popleft()
                    if not self.send(worker, i, calls[i]):  # a fresh one takes the call
                        self.idle.append(Worker(self.ctx, self.fn))
                        queue.appendleft(i)
                self._collect(results, failures, timed_out)
        finally:
            for worker in self.idle + self.busy:
                worker.stop()
            self.idle, self.busy = [], []
        if self.settle:
            return [results[i] if i in results else failures[i] for i in range(len(calls))]
        if failures:
            raise failures[min(failures)]
        return [results[i] for i in range(len(calls))]

    def send(self, worker: Worker, index: int, call: tuple[tuple, dict]) -> bool:
        """Start ``call`` on idle ``worker``, which is then busy; False (the worker stopped) when it died while
        idle (the OOM killer's pick, a kill) or between two calls."""
        try:
            if not worker.process.is_alive():
                raise OSError
            worker.start(index, call, self.policy.timeout_s)
        except OSError:
            worker.stop()
            return False
        self.busy.append(worker)
        return True

    def _bound(self, n: int, failures: dict[int, Exception]) -> int:
        """Calls before this index are run: all of them when settling, else those before the first failure."""
        return n if self.settle else min([n, *failures])

    def _collect(self, results: dict[int, Any], failures: dict[int, Exception], timed_out: Any,
                 limit: float | None = None) -> None:
        """Wait for the first busy worker to answer, die or pass its deadline (or ``limit`` seconds to pass),
        and settle its call."""
        deadline = min(w.deadline for w in self.busy)
        timeout = None if deadline == float("inf") else max(0.0, deadline - time.monotonic())
        if limit is not None:
            timeout = limit if timeout is None else min(timeout, limit)
        ready = set(wait([w.conn for w in self.busy] + [w.process.sentinel for w in self.busy], timeout))
        for worker in list(self.busy):
            if worker.conn in ready:  # checked first: a worker may answer and then be gone
                reply = worker.receive()
                if reply is None:
                    self._lost(worker, True, results, failures, timed_out)
                    continue
                ok, value = reply
                self.seconds[worker.index] = time.monotonic() - worker.started
                if ok:
                    results[worker.index] = value
                else:
                    failures[worker.index] = CallFailed(worker.index, value.rebuilt() if isinstance(value, Described)
                                                        else value)
                self.busy.remove(worker)
                self.idle.append(worker)
            elif worker.process.sentinel in ready or time.monotonic() >= worker.deadline:
                self._lost(worker, worker.process.sentinel in ready, results, failures, timed_out)

    def _lost(self, worker: Worker, died: bool, results: dict[int, Any], failures: dict[int, Exception],
              timed_out: Any) -> None:
        """A worker died, or hung past its deadline (it is killed): its call scores ``timed_out`` under
        ``on_timeout``, else fails; a fresh worker takes its place."""
        self.seconds[worker.index] = time.monotonic() - worker.started
        worker.stop(died)
        if self.policy.on_timeout is not None:
            results[worker.index] = timed_out
        else:
            failures[worker.index] = CallDied(worker.index, worker.process.exitcode) if died \
                else CallTimeout(worker.index)
        self.busy.remove(worker)
        if not self.keep:  # a kept pool (rlft.workers.pool.Pool) starts its replacement when a call needs it
            self.idle.append(Worker(self.ctx, self.fn))


def _unsettled(results: dict[int, Any], failures: dict[int, Exception], bound: int) -> bool:
    """Whether a call before ``bound`` (the first known failure, unless settling) has neither a result nor a
    failure yet: a later failure is reported only once every earlier call has settled, so the error names
    the first in call order."""
    return any(i not in results and i not in failures for i in range(bound))
