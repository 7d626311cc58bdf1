"""Where worker processes kept for the run (tool calls, ``episode.env`` environments) are forked from: a small
server process (multiprocessing's forkserver: a fresh interpreter, started once), not the trainer.

A worker forked from the trainer shares the trainer's memory copy-on-write, and keeps every page the trainer
writes afterwards: the trainer's next update writes the memory its last update freed, and each written page is
copied, the worker keeping the old one. Measured (docs/results.md, the tool task on SmolLM2-135M at
``trainer.micro_batch_size=16``): 15 tool workers forked while the trainer held 13.4 GB took the 24 GB machine
out of memory during the next update. A worker forked from the server shares only the server's few modules.
It neither holds the trainer's memory (the data's answers included) nor inherits its open files.

The server imports :data:`_PRELOAD` and :data:`_MODULES` (the modules of the user's tools and environments) once
when it starts, so that the workers share those imports instead of each importing them. It runs the function of a
worker after unpickling it by reference: a function that does not pickle (a closure) is run by a worker forked from
the trainer instead (:func:`start_method`).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import multiprocessing
import multiprocessing.forkserver as forkserver
import multiprocessing.process as mp_process
import multiprocessing.util as mp_util
import os
import pickle
import signal
import sys
import types
import weakref
from typing import Any

from rlft.output.console import job_log
from rlft.workers.temp_dir import own_temp_dir

_PRELOAD = ("rlft.workers.in_server", "rlft.workers.in_worker")
"""multiprocessing's preload of the server: its first import, then what every worker runs."""
_MODULES: list[str] = []
"""The modules of the functions handed to :func:`start_method`, which the server's first import imports itself
(multiprocessing's preload skips a module that raises ImportError, and each worker would then die unpickling)."""
SERVER_ENV = "RLFT_WORKER_SERVER"
"""Set before the server starts to what its first import (rlft.workers.in_server) needs: the trainer's pid (it
acts only in a direct child of that process) and how the trainer's ``__main__`` is named to a worker."""


def start_method(fn: Any, start: str = "server") -> tuple[Any, str]:
    """The multiprocessing context to start a worker of ``fn`` with, and why, in words (for the start-up log).
    ``start`` server: the server's (forkserver, started when the first worker starts) when ``fn`` pickles by
    reference to modules a fresh interpreter imports as this process has them, else fork (a closure can only be
    inherited). ``start`` fork: always fork (the workers see what the program set at run time)."""
    fork = multiprocessing.get_context("fork")
    if start == "fork":
        return fork, "forked from the trainer (episode.worker_start=fork)"
    if _State.failed or "forkserver" not in multiprocessing.get_all_start_methods():
        return fork, "forked from the trainer (the worker server is not available here)"
    try:
        modules = _globals(fn)
    except Exception as e:  # noqa: BLE001  (pickling may raise anything)
        return fork, f"forked from the trainer (what they run does not pickle: {type(e).__name__})"
    if modules & {"__main__", "__mp_main__"}:  # the server's workers lack those
        return fork, "forked from the trainer (what they run is defined in the trainer's __main__)"
    if _started_by_another():
        return fork, "forked from the trainer (another part of the program started multiprocessing's forkserver)"
    for name in sorted(modules - {"builtins"}):
        why = not_fresh(name)
        if why:
            logging.getLogger(__name__).warning("module %s %s: its workers are forked from the trainer", name, why)
            return fork, f"forked from the trainer (module {name} {why})"
    # Imported by the server when it starts (those named after it started: by each worker that needs them).
    _MODULES.extend(m for m in sorted(modules - {"builtins"}) if m not in _MODULES)
    ctx = _arm()
    users = sorted(m for m in modules if m.split(".")[0] not in ("rlft", "builtins", "functools"))
    return ctx, (f"forked from the worker server (episode.worker_start=server), which imports "
                 f"{', '.join(users) or 'their modules'} afresh: what the program set in them after import is not "
                 "seen there (episode.worker_start=fork: forked from the trainer, each keeping a copy of the memory "
                 "the trainer writes; docs/guide/agents-and-tools.md#worker-processes)")


def _arm() -> Any:
    """Set up the server that the next worker start will start (when none runs): what it imports and what its
    first import needs (SERVER_ENV); the forkserver context."""
    ctx = multiprocessing.get_context("forkserver")
    if _running():
        return ctx
    own_temp_dir()
    ctx.set_forkserver_preload(list(_PRELOAD))
    report = os.path.join(mp_util.get_temp_dir(), f"rlft-server-{os.getpid()}.err")
    os.environ[SERVER_ENV] = json.dumps({"trainer": os.getpid(), "log": job_log(), **_main_names(),
                                         "modules": _MODULES, "report": report})
    _State.ours = True
    return ctx


def _running() -> bool:
    return getattr(forkserver._forkserver, "_forkserver_pid", None) is not None


def not_fresh(name: str) -> str | None:
    """Why a fresh interpreter (the worker server) importing module ``name`` would not get the module this process
    has: it is not found by that name, or found in another file (a module loaded with
    ``importlib.util.spec_from_file_location`` and put in ``sys.modules``; one made at run time); None when it would.
    Each package above it is checked too (a fresh import goes through them)."""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        module = sys.modules.get(prefix)
        parent = sys.modules.get(prefix.rpartition(".")[0]) if i > 1 else None
        if module is None or prefix in sys.builtin_module_names or (i > 1 and not hasattr(parent, "__path__")):
            continue  # a submodule of a module that is no package: its C code made it (pyexpat.errors, torch._C._nn)
        spec = _fresh_spec(prefix)
        if spec is None:
            return "is not found by a fresh import of that name"
        have = getattr(module, "__file__", None)
        if not spec.has_location or have is None:  # built-in, frozen, a namespace package, a finder's own loader
            continue
        if os.path.realpath(have) != os.path.realpath(spec.origin):
            return f"was loaded from {have}, where a fresh import finds {spec.origin}"
    return None


def _fresh_spec(name: str) -> Any:
    """The spec a fresh import of ``name`` would find (sys.modules not consulted): the meta path's finders over the
    parent package's ``__path__`` (sys.path for a top-level module, which the server shares)."""
    parent = name.rpartition(".")[0]
    path = getattr(sys.modules.get(parent), "__path__", None) if parent else None
    if parent and path is None:
        return None
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(name, path)
        except Exception:  # noqa: BLE001  (a finder of some library)
            continue
        if spec is not None:
            return spec
    return None


def stop() -> None:
    """At the end of a job (a sweep runs several in one process), once the job's workers are gone: stop the server
    rlft started, so that the next job's server starts with that job's environment, log and modules. A server with
    a live worker (of a pool still open elsewhere in the program) is left running (its workers would die with it). A
    pool that starts a worker after the stop starts a server set up anew (:func:`usable`)."""
    server = forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    halt = getattr(server, "_stop", None)  # CPython's own (its tests stop servers with it): closes, reaps, unlinks
    try:
        if any(p.is_alive() for p in list(_LIVE)):
            return
        if _State.ours and pid is not None and halt is not None:
            # Killed first: the server ends by itself only once every holder of its "alive" pipe has closed it, and
            # a process forked from the trainer meanwhile (a reward worker, a user's) holds a copy.
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):  # reaped elsewhere (SIGCHLD ignored), its socket gone
                halt()
            server._forkserver_pid = None  # whatever halt() managed: the next start starts afresh
        _State.ours = False
        os.environ.pop(SERVER_ENV, None)
    finally:
        _State.failed = False
        _MODULES.clear()


def usable(ctx: Any) -> Any:
    """``ctx``, or fork once the server has failed to start; a server stopped at the end of a job is set up again
    (for this job) before a worker of an older pool starts it."""
    if forks_here(ctx):
        return ctx
    if _State.failed:
        return multiprocessing.get_context("fork")
    return ctx if _started_by_another() else _arm()


def started(process: Any) -> None:
    """A worker of the server started (:func:`stop` leaves the server running while one lives)."""
    _LIVE.add(process)


def failed(error: BaseException) -> Any:
    """The server did not start (a module it imports raised there, where the trainer imported it fine): the
    workers are forked from the trainer from now on, said once (a warning naming the module, where the server
    reported it). Returns the fork context."""
    if not _State.failed:
        why = f"{type(error).__name__}: {error}"
        with contextlib.suppress(OSError, ValueError, KeyError):
            report = json.loads(os.environ.get(SERVER_ENV, "{}"))["report"]
            with open(report) as f:
                why = f.read().strip() or why
            os.unlink(report)
        logging.getLogger(__name__).warning(
            "the worker server did not start (%s); tool and environment workers are forked from the trainer", why)
    _State.failed = True
    return multiprocessing.get_context("fork")


_LIVE: weakref.WeakSet = weakref.WeakSet()
"""The server's workers started (processes) that may still live."""


class _State:
    ours = False
    """rlft set this process's forkserver up."""
    failed = False
    """It did not start."""


def _started_by_another() -> bool:
    """Another part of this program started the process's forkserver (a library, or Python 3.14's default start
    method): its server preloads nothing of this module's and stays in the trainer's process group."""
    return not _State.ours and _running()


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
