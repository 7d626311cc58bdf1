"""Imported first by the worker server (rlft.workers.server) when it starts, and acting only there (a direct
child of the process named in ``RLFT_WORKER_SERVER``). The server leaves the trainer's process group, as each
worker does (rlft.workers.user_calls), so that a stop signal sent to the whole group (Ctrl-C, torch's agent, coreutils
``timeout``, SLURM), meant for the trainer, does not end the server and with it the workers the trainer still
needs to finish its step; the kernel kills the server when the trainer dies (its workers then follow it, each
set to die with its parent). Its ``__main__`` takes the trainer's main module's names (see
rlft.workers.server._main_names), and its records go to the job's train.log as the trainer's do (its workers
inherit the handler)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import json
import os
import sys

from rlft.output.console import log_to_file
from rlft.workers.in_worker import leave_group
from rlft.workers.server import SERVER_ENV


def _start_server() -> None:
    try:
        told = json.loads(os.environ.get(SERVER_ENV, ""))
    except ValueError:
        return
    if told.get("trainer") != os.getppid():
        return
    del os.environ[SERVER_ENV]  # not for the workers' own children
    leave_group(told["trainer"])
    if told.get("log"):
        log_to_file(*told["log"])
    main = sys.modules["__main__"]
    if told.get("name"):
        main.__spec__ = importlib.machinery.ModuleSpec(told["name"], None)
    if told.get("path"):
        main.__file__ = told["path"]
    for name in told.get("modules", []):
        try:
            importlib.import_module(name)
        except BaseException as e:  # noqa: BLE001  (a module may raise anything, SystemExit too)
            with contextlib.suppress(OSError):
                with open(told["report"], "w") as f:
                    f.write(f"importing {name} there raised {type(e).__name__}: {e}")
            os._exit(1)  # the trainer's start of a worker fails, and it forks its workers itself


_start_server()
