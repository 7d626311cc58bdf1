"""Running the policy's tool calls: every outcome, a bad call or a failing tool included, is a message the
policy reads, never an exception.

User tools are user code that may raise, hang, call ``sys.exit`` or ``os._exit`` or kill their process:
they run in worker processes (rlft.workers.pool.Pool, kept for the run) with ``episode.tool_timeout_s`` as the
limit of each call. The built-ins are rlft's code and bound themselves (the python tool kills its own process group
at the limit): they run in this process, on threads, since a worker killed at the limit would leave the
python tool's process behind.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlft.tools.format import ToolCall
from rlft.tools.outcomes import ToolResult, call_user, error, outcome_result, refusal, text_or_not, too_many
from rlft.workers.pool import Pool
from rlft.workers.user_calls import CallFailed

if TYPE_CHECKING:
    from rlft.config.schemas.episode import EpisodeConfig
    from rlft.tools.spec import Tool

@dataclass
class _Reply:
    """A reply's calls in flight: their results so far (None: not back yet) and seconds, and the too_many_calls
    results that follow them."""

    calls: list[ToolCall]
    results: list[ToolResult | None]
    seconds: list[float]
    extra: list[ToolResult]
    user: list[int] = field(default_factory=list)
    builtin: list[int] = field(default_factory=list)


class ToolRunner:
    """Runs calls of ``tools`` under ``cfg``'s limits (``tool_timeout_s``, ``tool_output_chars``).

    User tools run in worker processes (``cfg.env_workers`` at most, sized for calls that wait, not for cores),
    started at the first call that needs them and kept for the run's later calls (rlft.workers.pool.Pool); a worker that
    hung or died is replaced. The built-ins run on ``num_workers`` threads (0: one per CPU core this process may
    use: the python tool's programs are CPU-bound).
    """

    def __init__(self, tools: Sequence[Tool], cfg: EpisodeConfig, num_workers: int = 0):
        self.tools = {t.name: t for t in tools}
        self.cfg = cfg
        self.num_workers = num_workers or len(os.sched_getaffinity(0))
        self._threads: ThreadPoolExecutor | None = None
        user = {name: tool.fn for name, tool in self.tools.items() if not tool.builtin}
        # Made here, so that where its workers will come from is settled (and said) at start-up; they start at the
        # first call that needs them.
        self._pool = Pool(functools.partial(call_user, user), cfg.env_workers, cfg.tool_timeout_s,
                          may_fork=lambda: not self._futures, start=cfg.worker_start) if user else None
        self._open_replies: dict[int, _Reply] = {}
        self._tickets: dict[int, tuple[int, int]] = {}
        """The user calls in the pool, by ticket: (reply key, call index)."""
        self._futures: dict[Future, tuple[int, int]] = {}
        """The built-in calls on threads: (reply key, call index)."""
        self._done: list[tuple[int, list[ToolResult], float]] = []
        self._next_ticket = 0
        self.steps: Any = None
        """The continuous episode loop's ToolSteps over this runner (rlft.episodes.tool_env), made when first used."""

    def run(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """One result per call, in order (no cap on their number)."""
        return self._settle([calls], cap=None)[0][0]

    def run_reply(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """One result per call of one reply (run_replies)."""
        return self.run_replies([calls])[0][0]

    def run_replies(self, replies: Sequence[Sequence[ToolCall]]) -> tuple[list[list[ToolResult]], list[float]]:
        """The results of several replies' calls, all run at once (episodes waiting on their tools together), and
        per reply the seconds its longest call ran. Of each reply the first ``episode.max_tool_calls`` are run,
        each call after them reads a too_many_calls error instead (a reply full of hanging calls would cost a
        timeout each)."""
        return self._settle(replies, self.cfg.max_tool_calls)

    def start_replies(self, replies: Sequence[tuple[int, Sequence[ToolCall]]]) -> None:
        """Start the calls of each ``(key, calls)`` reply, capped as in run_replies; ``poll`` hands each reply's
        results back, by key, once all its calls are done. Forking a worker while threads of this process are
        inside subprocess calls could copy a held lock into it, so user tools are sent first, then the built-ins
        start, and a worker (a new one up to ``env_workers``, or one replacing a worker that hung or died) is forked
        only while no built-in call is running: until then the user calls wait for an idle worker."""
        self._start(replies, self.cfg.max_tool_calls)

    def _start(self, replies: Sequence[tuple[int, Sequence[ToolCall]]], cap: int | None) -> None:
        started = [(key, self._open(key, calls, cap)) for key, calls in replies]
        for key, reply in started:
            for i in reply.user:
                assert self._pool is not None
                self._tickets[self._next_ticket] = (key, i)
                self._pool.submit(self._next_ticket, ((reply.calls[i].name, reply.calls[i].arguments), {}))
                self._next_ticket += 1
        for key, reply in started:
            for i in reply.builtin:
                if self._threads is None:
                    self._threads = ThreadPoolExecutor(self.num_workers, thread_name_prefix="rlft-tool")
                call = reply.calls[i]
                self._futures[self._threads.submit(self._timed_builtin, call.name, call.arguments)] = (key, i)
            self._finish_if_done(key)

    def poll(self, timeout: float | None) -> list[tuple[int, list[ToolResult], float]]:
        """The replies whose calls all came back within ``timeout`` seconds (None: wait for one): (key, results in
        call order, seconds its longest call ran). Nothing when no reply is running."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self._done and self._open_replies:
            left = None if end is None else max(0.0, end - time.monotonic())
            running_user = self._pool is not None and self._pool.running > 0
            if self._futures:  # threads and worker pipes cannot be waited on together: the threads in short slices
                slice_s = 0.005 if left is None else min(0.005, left)
                wait_futures(list(self._futures), slice_s if running_user else left, FIRST_COMPLETED)
                self._take_threads()
                if running_user:
                    self._take_user(0.0)
            elif running_user:
                self._take_user(left)
            else:  # open replies with nothing running: fail rather than wait forever
                raise RuntimeError(f"{len(self._open_replies)} tool replies wait on no call (an rlft bug)")
            if left == 0.0:
                break
        done, self._done = self._done, []
        return done

    @property
    def running(self) -> int:
        """Replies started and not yet handed back by poll."""
        return len(self._open_replies) + len(self._done)

    def _settle(self, replies: Sequence[Sequence[ToolCall]], cap: int | None) -> tuple[list[list[ToolResult]], list[float]]:
        keys = [-1 - k for k in range(len(replies))]  # below the keys streaming callers use (>= 0)
        try:
            self._start(list(zip(keys, replies)), cap)
            got: dict[int, tuple[list[ToolResult], float]] = {}
            others: list[tuple[int, list[ToolResult], float]] = []  # replies started by start_replies, kept for poll
            while len(got) < len(keys):
                for key, results, s in self.poll(None):
                    if key < 0:
                        got[key] = (results, s)
                    else:
                        others.append((key, results, s))
            self._done += others
        except BaseException:
            self.abandon()
            raise
        return [got[k][0] for k in keys], [got[k][1] for k in keys]

    def _open(self, key: int, calls: Sequence[ToolCall], cap: int | None) -> _Reply:
        ran = list(calls if cap is None else calls[:cap])
        extra = [] if cap is None else [error(c.name, "too_many_calls", too_many(i, cap), self.cfg.tool_output_chars)
                                        for i, c in enumerate(calls[cap:], cap + 1)]
        reply = _Reply(ran, [refusal(self.tools, c, self.cfg.tool_output_chars) for c in ran], [0.0] * len(ran), extra)
        pending = [i for i, r in enumerate(reply.results) if r is None]
        reply.user = [i for i in pending if not self.tools[ran[i].name].builtin]
        reply.builtin = [i for i in pending if self.tools[ran[i].name].builtin]
        self._open_replies[key] = reply
        return reply

    def _take_threads(self) -> None:
        for future in [f for f in self._futures if f.done()]:
            key, i = self._futures.pop(future)
            outcome, seconds = future.result()
            self._record(key, i, outcome, seconds)

    def _take_user(self, timeout: float | None) -> None:
        assert self._pool is not None
        for ticket, (outcome, seconds) in self._pool.poll(timeout).items():
            key, i = self._tickets.pop(ticket)
            self._record(key, i, outcome, seconds)

    def _record(self, key: int, i: int, outcome: Any, seconds: float) -> None:
        reply = self._open_replies[key]
        name = reply.calls[i].name
        reply.results[i] = outcome_result(self.tools[name], name, outcome, self.cfg)
        reply.seconds[i] = seconds
        self._finish_if_done(key)

    def _finish_if_done(self, key: int) -> None:
        reply = self._open_replies[key]
        if all(r is not None for r in reply.results):
            del self._open_replies[key]
            self._done.append((key, [r for r in reply.results if r is not None] + reply.extra,
                               max(reply.seconds, default=0.0)))

    def abandon(self) -> None:
        """Forget the replies in flight (an interrupted batch): their user calls' workers are stopped, their
        built-in calls not started yet are cancelled."""
        if self._pool is not None:
            self._pool.abandon()
        for future in self._futures:
            future.cancel()
        self._open_replies, self._tickets, self._futures, self._done = {}, {}, {}, []

    @property
    def started_from(self) -> str | None:
        """Where the user tools' workers are forked from, in words (None: no user tool)."""
        return self._pool.started_from if self._pool is not None else None

    @property
    def worker_pids(self) -> list[int]:
        """The user tools' idle worker processes (none before the first user call)."""
        return self._pool.pids if self._pool is not None else []

    def close(self) -> None:
        """Stop the threads and the worker processes."""
        if self._threads is not None:
            self._threads.shutdown()
            self._threads = None
        if self._pool is not None:
            self._pool.close()

    def __enter__(self) -> ToolRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _timed_builtin(self, name: str, arguments: dict[str, Any]) -> tuple[Any, float]:
        start = time.monotonic()
        try:
            return text_or_not(self.tools[name].fn(**arguments)), time.monotonic() - start
        except Exception as e:  # noqa: BLE001  (worded for the policy)
            return CallFailed(0, e), time.monotonic() - start
