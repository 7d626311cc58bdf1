"""multiprocessing's temporary folder of an rlft trainer (the worker server's socket lies there), named after the
trainer so that a trainer killed with kill -9 can be told from a live one, and its folder removed at the next
start (rlft.workers.server sets it up before the server starts)."""

from __future__ import annotations

import fcntl
import multiprocessing
import multiprocessing.util as mp_util
import os
import shutil
import tempfile

TEMP_PREFIX = "rlft-mp-"
"""multiprocessing's temporary folder of an rlft trainer (it holds the server's socket): rlft-mp-PID-XXXXXXXX. The
trainer holds a lock on its ``lock`` file while it lives (a trainer of another PID namespace sharing /tmp too)."""
_SOCKET_ROOM = 107
"""The longest path the server's socket may have (an AF_UNIX path has 108 bytes, its NUL included)."""


def own_temp_dir() -> str | None:
    """Give this process's multiprocessing a temporary folder named after its pid (multiprocessing's own,
    pymp-XXXXXXXX, names no owner) and hold its lock, unless it has a folder already; first remove those of
    trainers that are gone (a trainer killed with kill -9 leaves its folder). Returns the folder (None:
    multiprocessing chooses its own, as where the name would make the server's socket path too long)."""
    config = getattr(multiprocessing.current_process(), "_config", None)  # where multiprocessing.util keeps it
    if not isinstance(config, dict) or config.get("tempdir") is not None:
        return None
    where = tempfile.gettempdir()
    if len(os.path.join(where, f"{TEMP_PREFIX}{os.getpid()}-xxxxxxxx", "listener-xxxxxxxx")) > _SOCKET_ROOM:
        return None
    remove_stale_temp_dirs(where)
    path = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-", dir=where)
    lock = os.open(os.path.join(path, "lock"), os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when this process (and what it forked) is gone
    # Removed at exit as multiprocessing removes its own (late: after the server's socket is closed).
    mp_util.Finalize(None, shutil.rmtree, args=(path, True), exitpriority=-100)
    config["tempdir"] = path
    return path


def remove_stale_temp_dirs(where: str) -> list[str]:
    """Remove the multiprocessing folders of rlft trainers that are gone from ``where``: the PID in the name is not
    a process here, and nobody holds the folder's lock. Returns them."""
    removed: list[str] = []
    if not os.path.isdir("/proc/self"):  # no way to tell a live owner here
        return removed
    try:
        names = [n for n in os.listdir(where) if n.startswith(TEMP_PREFIX)]
    except OSError:
        return removed
    for name in names:
        owner, path = name[len(TEMP_PREFIX):].split("-")[0], os.path.join(where, name)
        if not owner.isdigit() or os.path.exists(f"/proc/{owner}") or _locked(os.path.join(path, "lock")):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _locked(path: str) -> bool:
    """Whether another process holds ``path``'s lock (or it cannot be told: a folder not ours, no lock file yet)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)
