"""Run a command as uid/gid 65534 in a user namespace whose ``max_user_namespaces`` is 0: a machine where user
namespaces are off for unprivileged users (a container runtime's default, a distribution's restriction), built
without touching the host's sysctls (the limit is per user namespace). Needs root (it maps uids 0-65535).

    python tests/no_userns.py COMMAND [ARG ...]
"""

from __future__ import annotations

import ctypes
import os
import sys

CLONE_NEWUSER = 0x10000000


def main() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    go_r, go_w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        if libc.unshare(CLONE_NEWUSER) != 0:
            os._exit(90)
        os.write(ready_w, b"1")
        os.read(go_r, 1)  # the parent has written the uid and gid maps
        with open("/proc/sys/user/max_user_namespaces", "w") as f:
            f.write("0")
        os.setgroups([])
        os.setresgid(65534, 65534, 65534)
        os.setresuid(65534, 65534, 65534)
        os.execvp(sys.argv[1], sys.argv[1:])
    os.read(ready_r, 1)
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write("0 0 65536")
    os.write(go_w, b"1")
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


if __name__ == "__main__":
    sys.exit(main())
