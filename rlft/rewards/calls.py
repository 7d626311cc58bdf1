"""Running reward calls: in this process, or in worker processes that can be stopped when a call hangs.

A thread cannot be stopped, so a time limit needs processes: with ``reward.timeout_s`` (or
``reward.num_workers``) the calls go to a ``multiprocessing`` pool, and a call that does not
return in time gets the pool terminated (the hung worker with it). The run then ends with one
line naming the function and the sample, or, with ``reward.on_timeout``, that call scores the
configured value and the calls not yet collected run again in a fresh pool.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CallPolicy:
    """How reward calls run (RewardConfig's ``num_workers``, ``timeout_s``, ``on_timeout``)."""

    num_workers: int = 0
    timeout_s: float = 0.0
    on_timeout: float | None = None

    @property
    def in_process(self) -> bool:
        return self.num_workers == 0 and self.timeout_s <= 0


IN_PROCESS = CallPolicy()


def call_policy(reward_cfg: Any) -> CallPolicy:
    """The CallPolicy of a RewardConfig."""
    return CallPolicy(reward_cfg.num_workers, reward_cfg.timeout_s, reward_cfg.on_timeout)


class CallTimeout(Exception):
    """Call ``index`` did not return within the time limit."""

    def __init__(self, index: int):
        super().__init__(index)
        self.index = index


class CallFailed(Exception):
    """Call ``index`` raised ``error`` (in this process or a worker)."""

    def __init__(self, index: int, error: BaseException):
        super().__init__(index, error)
        self.index, self.error = index, error


def run_calls(fn: Callable[..., Any], calls: Sequence[tuple[tuple, dict]], policy: CallPolicy,
              timed_out: Any = None) -> list[Any]:
    """``[fn(*args, **kwargs) for args, kwargs in calls]`` under ``policy``; a call that ran past the
    limit with ``policy.on_timeout`` set returns ``timed_out`` (what that score means for this call).

    Raises:
        CallFailed: a call raised.
        CallTimeout: a call ran past ``policy.timeout_s`` and ``policy.on_timeout`` is None.
    """
    if policy.in_process:
        out = []
        for i, (args, kwargs) in enumerate(calls):
            try:
                out.append(fn(*args, **kwargs))
            except Exception as e:  # noqa: BLE001  (the caller words it)
                raise CallFailed(i, e) from None
        return out
    results: dict[int, Any] = {}
    while len(results) < len(calls):
        _run_in_pool(fn, calls, policy, results, timed_out)
    return [results[i] for i in range(len(calls))]


def _worker_signals() -> None:
    """Forked workers inherit the trainer's Ctrl-C/SIGTERM handler: put the defaults back, so that
    terminating the pool stops them and only the training process answers Ctrl-C."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_in_pool(fn: Callable[..., Any], calls: Sequence[tuple[tuple, dict]], policy: CallPolicy,
                 results: dict[int, Any], timed_out: Any) -> None:
    """Collect, in order, every call not in ``results`` yet; on a scored timeout, return early
    (the pool, hung worker included, is gone; the caller starts a fresh one for the rest)."""
    ctx = multiprocessing.get_context("fork")  # workers inherit the imported reward modules
    pool = ctx.Pool(max(1, policy.num_workers), initializer=_worker_signals)
    try:
        pending = {i: pool.apply_async(fn, args, kwargs) for i, (args, kwargs) in enumerate(calls) if i not in results}
        for i, handle in pending.items():
            try:
                results[i] = handle.get(timeout=policy.timeout_s if policy.timeout_s > 0 else None)
            except multiprocessing.TimeoutError:
                if policy.on_timeout is None:
                    raise CallTimeout(i) from None
                results[i] = timed_out
                return
            except Exception as e:  # noqa: BLE001  (raised by the user's function in the worker)
                raise CallFailed(i, e) from None
    finally:
        pool.terminate()
        pool.join()
