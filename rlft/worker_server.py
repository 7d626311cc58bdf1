"""Where worker processes kept for the run (tool calls, ``episode.env`` environments) are forked from: a small
server process (multiprocessing's forkserver: a fresh interpreter, started once), not the trainer.

A worker forked from the trainer shares the trainer's memory copy-on-write, and keeps every page the trainer
writes afterwards: the trainer's next update writes the memory its last update freed, and each written page is
copied, the worker keeping the old one. Measured (docs/results.md, the tool task on SmolLM2-135M at
``trainer.micro_batch_size=16``): 15 tool workers forked while the trainer held 13.4 GB took the 24 GB machine
out of memory during the next update. A worker forked from the server shares only the server's few modules.
It neither holds the trainer's memory (the data's answers included) nor inherits its open files.

The server imports :data:`_PRELOAD` once when it starts (the worker's loop, the modules of the user's tools
and environments), so that the workers share those imports instead of each importing them. It runs the
function of a worker after unpickling it by reference: a function that does not pickle (a closure) is run by
a worker forked from the trainer instead (``context``).
"""

from __future__ import annotations

import io
import json
import logging
import multiprocessing
import multiprocessing.forkserver as forkserver
import multiprocessing.process as mp_process
import os
import pickle
import sys
import types
from typing import Any

from rlft.console import job_log

_PRELOAD: list[str] = ["rlft.worker_server_init", "rlft.worker_loop"]
SERVER_ENV = "RLFT_WORKER_SERVER"
"""Set before the server starts to what its first import (rlft.worker_server_init) needs: the trainer's pid (it
acts only in a direct child of that process) and how the trainer's ``__main__`` is named to a worker."""


def preload(*modules: str) -> None:
    """Have the server import ``modules`` when it starts (those named after it started are imported by each
    worker that needs them)."""
    _PRELOAD.extend(m for m in modules if m not in _PRELOAD)


def context(fn: Any) -> Any:
    """The multiprocessing context to start a worker of ``fn`` with: the server's (forkserver, started here if it is
    not running) when ``fn`` pickles without naming ``__main__``, else fork (a closure can only be inherited)."""
    fork = multiprocessing.get_context("fork")
    if _State.failed or "forkserver" not in multiprocessing.get_all_start_methods():
        return fork
    try:
        modules = _globals(fn)
    except Exception:  # noqa: BLE001  (pickling may raise anything)
        return fork
    if modules & {"__main__", "__mp_main__"} or _started_by_another():  # the server's workers lack those
        return fork
    preload(*sorted(modules - {"builtins"}))
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(_PRELOAD))  # no effect once the server runs
    os.environ[SERVER_ENV] = json.dumps({"trainer": os.getpid(), "log": job_log(), **_main_names()})
    _State.ours = True
    return ctx


def usable(ctx: Any) -> Any:
    """``ctx``, or fork once the server has failed to start."""
    return multiprocessing.get_context("fork") if _State.failed and not forks_here(ctx) else ctx


def failed(error: BaseException) -> Any:
    """The server did not start (a module it imports raised there, where the trainer imported it fine): the
    workers are forked from the trainer from now on, said once (a warning). Returns the fork context."""
    if not _State.failed:
        logging.getLogger(__name__).warning(
            "the worker server did not start (%s: %s); tool and environment workers are forked from the trainer",
            type(error).__name__, error)
    _State.failed = True
    return multiprocessing.get_context("fork")


class _State:
    ours = False
    """rlft set this process's forkserver up."""
    failed = False
    """It did not start."""


def _started_by_another() -> bool:
    """Another part of this program started the process's forkserver (a library, or Python 3.14's default start
    method): its server preloads nothing of this module's and stays in the trainer's process group."""
    return not _State.ours and getattr(forkserver._forkserver, "_forkserver_pid", None) is not None


def forks_here(ctx: Any) -> bool:
    """Whether ``ctx`` forks its workers from this process (its threads' held locks would be copied)."""
    return ctx.get_start_method() == "fork"


def _main_names() -> dict[str, str | None]:
    """How a worker's start (multiprocessing.spawn.prepare) names the trainer's ``__main__``: the server's own
    ``__main__`` is given these names, so that its workers find their main module already there and do not run
    the trainer's script (which would import its modules in every worker, and start it again where it lacks an
    ``if __name__ == "__main__"`` guard)."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    path = getattr(main, "__file__", None)
    if name or path is None:
        return {"name": name, "path": None}
    # The path exactly as spawn.get_preparation_data words it (made absolute from where the program started): a
    # worker skips running it only when the server's __main__ has that very path. A __main__ without a real file
    # (a script read from stdin: "<stdin>") is thereby never run either.
    if not os.path.isabs(path) and mp_process.ORIGINAL_DIR is not None:
        path = os.path.join(mp_process.ORIGINAL_DIR, path)
    return {"name": None, "path": os.path.normpath(path)}


def _globals(obj: Any) -> set[str]:
    """The modules of the functions and classes pickling ``obj`` names (raises when it does not pickle)."""
    found: set[str] = set()

    class _Names(pickle.Pickler):
        def reducer_override(self, o: Any) -> Any:
            if isinstance(o, (types.FunctionType, type, types.BuiltinFunctionType)):
                found.add(getattr(o, "__module__", None) or "__main__")
            return NotImplemented

    _Names(io.BytesIO()).dump(obj)
    return found
