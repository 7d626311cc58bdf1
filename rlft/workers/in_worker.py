"""What runs in a worker process of rlft.workers.user_calls (reward calls, tool calls, episode.env environments): its loop over the
calls sent down its pipe, and how it dies with its parent. Kept apart from rlft.workers.user_calls, which the trainer side
uses: the worker server (rlft.workers.server) imports this module for every worker."""

from __future__ import annotations

import ctypes
import gc
import os
import pickle
import signal
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from rlft.errors import Described

# The trainer's ends of the open workers' pipes. A forked worker inherits them all and closes them
# first: while a copy of its own pipe's far end stays open in the worker, it never sees EOF when the
# trainer is gone.
PARENT_ENDS: set[Connection] = set()


def serve(fn: Callable[..., Any], conn: Connection, parent: int | None) -> None:
    """A worker's loop. It leaves the trainer's process group: a stop signal sent to the whole group
    (torch's agent, coreutils ``timeout``, SLURM) is meant for the trainer, which finishes its step
    with the worker's help and then kills it. Forked workers inherit the trainer's Ctrl-C/SIGTERM
    handler: the defaults go back, so that killing a worker stops it. The objects inherited from the
    trainer are frozen out of the garbage collector: a collection would write to every one of them and
    copy the trainer's Python heap into each worker (a worker is kept for the run). ``parent``: the trainer's
    pid (None: the worker server's, read at once)."""
    parent = os.getppid() if parent is None else parent
    gc.freeze()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    leave_group(parent)
    for other in PARENT_ENDS:
        other.close()
    PARENT_ENDS.clear()
    while True:
        try:
            args, kwargs = conn.recv()
        except EOFError:  # the trainer is gone
            os._exit(0)
        try:
            reply: tuple[bool, Any] = (True, fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001  (SystemExit too: the parent words it)
            reply = (False, e)
        conn.send(_picklable(reply))


def leave_group(parent: int) -> None:
    """Leave the trainer's process group (a group stop signal is the trainer's, not this process's) and die with
    ``parent`` (:func:`die_with`). SIGTERM is ignored while still in the group, then back to its default."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.setpgid(0, 0)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with(parent)


def die_with(parent: int) -> None:
    """Have the kernel SIGKILL this process when ``parent`` (the trainer, or the worker server) dies (kill -9,
    the OOM killer): out of its process group, no group signal reaches it. Linux only; elsewhere a worker ends
    on its pipe's EOF."""
    if sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(0)


def _picklable(reply: tuple[bool, Any]) -> tuple[bool, Any]:
    """``reply``, or a failure saying what could not cross to the trainer: a score that does not pickle,
    or an exception that does not survive the round trip (an ``__init__`` with other arguments than its
    message cannot be rebuilt), which crosses as its type's name and message."""
    ok, value = reply
    try:
        pickle.loads(pickle.dumps(value))
    except Exception:  # noqa: BLE001  (pickling may raise anything)
        if ok:
            return False, TypeError(f"returned a {type(value).__name__}, which cannot be sent back from the worker")
        return False, Described(type(value).__name__, str(value))
    return reply
