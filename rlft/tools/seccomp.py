"""The seccomp filter of the python tool's sandbox (bwrap ``--seccomp FD``): the system calls that reach past the
namespaces are refused with EPERM. A classic BPF program written here (no libseccomp binding is installed; the
program is 30-odd instructions).

What it refuses, and why:

- ``keyctl``, ``add_key``, ``request_key``: the kernel keyrings are not namespaced by the mount or PID namespace; the
  trainer's session keyring (a login's, Kerberos' ``KEYRING:`` caches, tokens) would be readable and writable, and
  a root trainer's sandboxes would share uid 65534's user keyring from one call to the next.
- ``unshare``, ``setns``, and ``clone`` with a namespace flag: a new user namespace would give the program every
  capability inside it (and with them the kernel's namespace-gated interfaces: mounts, nftables); ``clone3``
  answers ENOSYS (its flags sit in memory a filter cannot read), so the C library falls back to ``clone``.
- ``ptrace``, ``process_vm_readv``/``writev``, and calls that reach into another process after a ptrace access
  check of their own: ``pidfd_getfd`` (takes a copy of its open file), ``kcmp`` (compares two processes' files
  and memory), ``process_madvise`` (acts on its memory), ``get_robust_list`` (reads an address of its), and
  ``migrate_pages``/``move_pages`` (move or read where its pages lie). bwrap's init, in the sandbox beside the
  program, holds what it was started with.
- ``io_uring_*``, ``bpf``, ``perf_event_open``, ``userfaultfd``: large kernel interfaces a Python program does not
  need, and the usual way past a filter.

x86_64 and aarch64 (other architectures: no filter, :func:`program` returns None); on x86_64 the x32 ABI's
numbers are refused too.
"""

from __future__ import annotations

import functools
import os
import platform
import struct

_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_AND = 0x54  # BPF_ALU | BPF_AND | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_EPERM, _ENOSYS = 1, 38
_NS_FLAGS = 0x7E020080  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME

# machine -> (AUDIT_ARCH, {name: number})
_ARCHES = {
    "x86_64": (0xC000003E, {"ptrace": 101, "keyctl": 250, "add_key": 248, "request_key": 249, "unshare": 272,
                            "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311, "perf_event_open": 298,
                            "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
                            "io_uring_register": 427, "kcmp": 312, "pidfd_getfd": 438, "process_madvise": 440,
                            "get_robust_list": 274, "migrate_pages": 256, "move_pages": 279, "clone": 56,
                            "clone3": 435}),
    "aarch64": (0xC00000B7, {"ptrace": 117, "keyctl": 219, "add_key": 217, "request_key": 218, "unshare": 97,
                             "setns": 268, "process_vm_readv": 270, "process_vm_writev": 271, "perf_event_open": 241,
                             "bpf": 280, "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
                             "io_uring_register": 427, "kcmp": 272, "pidfd_getfd": 438, "process_madvise": 440,
                             "get_robust_list": 100, "migrate_pages": 238, "move_pages": 239, "clone": 220,
                             "clone3": 435}),
}
REFUSED = ("ptrace", "keyctl", "add_key", "request_key", "unshare", "setns", "process_vm_readv", "process_vm_writev",
           "kcmp", "pidfd_getfd", "process_madvise", "get_robust_list", "migrate_pages", "move_pages", "perf_event_open", "bpf", "userfaultfd", "io_uring_setup",
           "io_uring_enter", "io_uring_register")


@functools.cache  # the same bytes for every call of a run
def program(machine: str | None = None) -> bytes | None:
    """The filter as bwrap reads it (``struct sock_filter`` records), for ``machine`` (default: this one)."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit, numbers = arch
    # Another ABI's calls (int 0x80's i386 numbers on x86_64) are refused whole: Python makes none.
    ins: list[tuple[int, int, int, int]] = [(_LD_ABS, 0, 0, 4), (_JEQ, 1, 0, audit), (_RET, 0, 0, _ERRNO | _EPERM),
                                            (_LD_ABS, 0, 0, 0)]
    if audit == 0xC000003E:  # x32 numbers (bit 30) would reach the same calls by another number
        ins.append((_JGE, 0, 1, 0x40000000))
        ins.append((_RET, 0, 0, _ERRNO | _EPERM))
    for name in REFUSED:
        ins += [(_JEQ, 0, 1, numbers[name]), (_RET, 0, 0, _ERRNO | _EPERM)]
    ins += [(_JEQ, 0, 1, numbers["clone3"]), (_RET, 0, 0, _ERRNO | _ENOSYS),
            (_JEQ, 1, 0, numbers["clone"]), (_RET, 0, 0, _ALLOW),
            (_LD_ABS, 0, 0, 16),  # clone's flags: args[0], low 32 bits (little-endian)
            (_AND, 0, 0, _NS_FLAGS), (_JEQ, 0, 1, 0), (_RET, 0, 0, _ALLOW), (_RET, 0, 0, _ERRNO | _EPERM)]
    return b"".join(struct.pack("=HBBI", *i) for i in ins)


def memfd(code: bytes) -> int:
    """A file descriptor holding ``code`` from its start (bwrap reads the filter from it)."""
    fd = os.memfd_create("rlft-seccomp", 0)
    os.write(fd, code)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
