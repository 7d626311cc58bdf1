"""A cgroup per python tool call, where this process may make one: the memory and the processes of the whole
sandbox are then bounded together (rlimits bound each process alone).

Two cases, tried in order (:func:`kind`):

- cgroup v2, delegated: this process's own cgroup is writable and already hands the ``memory`` and ``pids``
  controllers to its children (``cgroup.subtree_control``), as a delegated systemd unit or a container with
  a private cgroup namespace does.
- cgroup v1 (hybrid hosts), writable ``memory`` and ``pids`` hierarchies: typically a root trainer.

Elsewhere (an unprivileged user on a host without delegation) there is no cgroup: the sandbox's process
count is still bounded (RLIMIT_NPROC) and its memory to that count times ``episode.python_memory_mb``.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from pathlib import Path

_COUNTER = itertools.count()


@functools.cache  # not thread-safe: rlft.tools.sandbox.check_sandbox settles it at start-up, in one thread
def parents() -> tuple[str, tuple[Path, ...]] | None:
    """``("v2", (dir,))`` or ``("v1", (memory dir, pids dir))``: where this process makes its sandboxes'
    cgroups; None when it cannot. The cgroups a killed trainer left there are removed (:func:`remove_stale`)."""
    found = _parents()
    if found is not None:
        remove_stale(found[1])
    return found


def remove_stale(dirs: tuple[Path, ...]) -> list[Path]:
    """Remove the sandbox cgroups in ``dirs`` whose trainer is gone (its pid is in their name: a trainer killed
    with kill -9 leaves its calls' cgroups behind, empty once the sandbox's processes died with it); returns them.
    One that still holds a process stays."""
    removed = []
    for d in dirs:
        try:
            children = [c for c in d.iterdir() if c.name.startswith("rlft-sandbox-")]
        except OSError:
            continue
        for child in children:
            owner = child.name.split("-")[2]
            if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
                try:
                    child.rmdir()
                    removed.append(child)
                except OSError:
                    pass
    return removed


def _parents() -> tuple[str, tuple[Path, ...]] | None:
    own = _own_cgroups()
    mounts = _mounts()
    v2 = mounts.get("cgroup2")
    if v2 is not None and "" in own:
        parent = v2 / own[""].lstrip("/")
        wanted = {"memory", "pids"}
        try:
            delegated = wanted <= set((parent / "cgroup.subtree_control").read_text().split())
        except OSError:
            delegated = False
        if delegated and _can_make(parent):
            return "v2", (parent,)
    dirs = tuple(mounts[c] / own[c].lstrip("/") for c in ("memory", "pids") if c in mounts and c in own)
    if len(dirs) == 2 and all(_can_make(d) for d in dirs):
        return "v1", dirs
    return None


def kind() -> str | None:
    """``v2``, ``v1``, or None (no cgroup: see the module docstring)."""
    found = parents()
    return found[0] if found else None


def make(memory_bytes: int, max_procs: int) -> list[Path] | None:
    """New cgroups for one sandbox with these limits (swap included in the memory where the host has it);
    None when this process cannot make one."""
    found = parents()
    if found is None:
        return None
    version, dirs = found
    name = f"rlft-sandbox-{os.getpid()}-{next(_COUNTER)}-{os.urandom(4).hex()}"  # never a leftover's name
    made = []
    try:
        for d in dirs:
            (d / name).mkdir()
            made.append(d / name)
        if version == "v2":
            _write(made[0], {"memory.max": memory_bytes, "memory.swap.max": 0, "pids.max": max_procs})
        else:
            _write(made[0], {"memory.limit_in_bytes": memory_bytes, "memory.memsw.limit_in_bytes": memory_bytes})
            _write(made[1], {"pids.max": max_procs})
    except OSError:
        remove(made)
        return None
    return made


def enter(cgroups: list[Path], pid: int) -> None:
    """Move process ``pid`` (the sandbox's first process, before it starts the program) into ``cgroups``."""
    for c in cgroups:
        (c / "cgroup.procs").write_text(str(pid))


def remove(cgroups: list[Path], wait_s: float = 2.0) -> None:
    """Remove the cgroups once their processes are gone (killed ones leave within milliseconds)."""
    deadline = time.monotonic() + wait_s
    for c in cgroups:
        while True:
            try:
                c.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)


def _write(cgroup: Path, values: dict[str, int]) -> None:
    for key, value in values.items():
        if (cgroup / key).exists():  # memsw / swap.max only where the host accounts swap
            (cgroup / key).write_text(str(value))


def _can_make(parent: Path) -> bool:
    probe = parent / f"rlft-probe-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup path per controller ('' for v2's unified hierarchy)."""
    out: dict[str, str] = {}
    for line in _lines("/proc/self/cgroup"):
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


def _mounts() -> dict[str, Path]:
    """Mount points: 'cgroup2' for the unified hierarchy, the controller's name for a v1 one."""
    out: dict[str, Path] = {}
    for line in _lines("/proc/self/mounts"):
        _, where, fstype, options = line.split()[:4]
        if fstype == "cgroup2":
            out.setdefault("cgroup2", Path(where))
        elif fstype == "cgroup":
            for opt in options.split(","):
                if opt in ("memory", "pids"):
                    out.setdefault(opt, Path(where))
    return out


def _lines(path: str) -> list[str]:
    """The file's lines; none where it cannot be read (not Linux, no /proc)."""
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []
