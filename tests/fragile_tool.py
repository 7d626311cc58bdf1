"""A tool module that imports only where its program set things up first (tests/test_worker_server.py): in a
fresh interpreter (the worker server) it raises, as a module that needs its trainer's state does."""

import builtins
import os

if not getattr(builtins, "rlft_test_ready", False):
    raise RuntimeError("imported outside the program that set it up")


def parent_pid(x: int) -> str:
    """The pid of the process that started this worker.

    Args:
        x: Any integer.
    """
    return str(os.getppid())
