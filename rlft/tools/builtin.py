"""The built-in tools: ``calculator`` (arithmetic through :mod:`ast`, in the caller's process) and ``python``
(the policy's code in a process of its own, under time, memory, CPU and file-size limits).

Both are rlft's own code, bounded in time by themselves: the tool runner calls them in its own process
(threads), not in the worker processes that hold user tools, and they cut their own output.
"""

from __future__ import annotations

import ast
import contextlib
import math
import operator
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from rlft.errors import ToolTimeout, how_it_ended
from rlft.tools import sandbox

if TYPE_CHECKING:
    from rlft.config.schemas.episode import EpisodeConfig


def cut_output(text: str, limit: int) -> str:
    """``text``, or its first ``limit`` characters and a note saying it was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[output cut to its first {limit} characters]"


# ----------------------------------------------------------------------------------------- calculator

MAX_EXPRESSION_CHARS = 1000
"""Longer expressions are refused before parsing (deep nesting could exhaust the parser)."""
MAX_BITS = 4096
"""An integer result (or operand of **) past this many bits is an error, not minutes of bignum work."""

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: Numbers with + - * / // % ** and parentheses, for example "(12 + 3) * 4 ** 2".
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ValueError(f"cannot parse {expression[:80]!r} as arithmetic") from None
    value = _evaluate(tree.body)
    return repr(value) if isinstance(value, float) else str(value)


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        _check_size(node.op, left, right)
        value = _BINARY[type(node.op)](left, right)
        if isinstance(value, complex):  # (-8) ** 0.5
            raise ValueError("the result is not a real number")
        if isinstance(value, float) and not math.isfinite(value):
            raise OverflowError("the result is too large")
        return value
    raise ValueError(f"only numbers, + - * / // % ** and parentheses are allowed, not {type(node).__name__}")


def _check_size(op: ast.operator, left: int | float, right: int | float) -> None:
    """Refuse an operation whose integer result would pass MAX_BITS, before computing it."""
    if not (isinstance(left, int) and isinstance(right, int)):
        return  # floats overflow to an error or inf in constant time
    if isinstance(op, ast.Pow) and right > 0 and abs(left) > 1 and left.bit_length() * right > MAX_BITS:
        raise OverflowError(f"the result would have more than {MAX_BITS} bits")
    if isinstance(op, ast.Mult) and left.bit_length() + right.bit_length() > MAX_BITS + 1:
        raise OverflowError(f"the result would have more than {MAX_BITS} bits")


# --------------------------------------------------------------------------------------------- python

_MAX_FILES = 256
"""RLIMIT_NOFILE of the python tool's processes."""
_OUTPUT_FILE_BYTES = 4 * 2**20
"""RLIMIT_FSIZE of the python tool: any file it writes (its output included) stops growing here."""

# Runs first in the child (inside the sandbox): raises its OOM score (the kernel's OOM killer takes it before
# the trainer; children inherit it and cannot lower it), leaves root for uid ``drop`` (a root trainer's
# sandbox), sets the limits (-1: unchanged), then replaces itself with a fresh isolated interpreter that reads
# the policy's code from stdin, unbuffered (-u: prints and tracebacks reach the shared output file in order).
# No preexec_fn: that is unsafe in a process with threads (the trainer's).
_BOOTSTRAP = """import os, resource, sys
try:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
except OSError:
    pass
drop = int(sys.argv[1])
if drop and os.getuid() == 0:
    os.setgroups([])
    os.setresgid(drop, drop, drop)
    os.setresuid(drop, drop, drop)
for name, value in zip(("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_CORE", "RLIMIT_NPROC", "RLIMIT_NOFILE"),
                       map(int, sys.argv[2:])):
    if value >= 0:
        resource.setrlimit(getattr(resource, name), (value, value))
os.execv(sys.executable, [sys.executable, "-I", "-u", "-"])
"""


def python_tool(cfg: EpisodeConfig) -> Callable[[str], str]:
    """The ``python`` tool under ``cfg``'s limits (``tool_timeout_s``, ``python_memory_mb``, ``python_max_procs``,
    ``tool_output_chars``) in its sandbox (``python_sandbox``; checked here: ConfigError when it cannot start)."""
    sandboxed = cfg.python_sandbox == "bwrap"
    # RLIMIT_NPROC (-1 here) is set per call, only where no cgroup bounds it (_boots). RLIMIT_NOFILE: memfds and
    # files are memory a per-process limit misses.
    limits = [cfg.python_memory_mb * 2**20, math.ceil(cfg.tool_timeout_s) + 1, _OUTPUT_FILE_BYTES, 0, -1, _MAX_FILES]
    if sandboxed:
        bounded, unbounded = _boots(limits, cfg.python_max_procs)
        sandbox.check_sandbox(tuple(bounded), limits[0], cfg.python_max_procs, tuple(unbounded))
    sandbox.harden_trainer()

    def python(code: str) -> str:
        """Run a Python program in a fresh interpreter and return what it printed (stdout and stderr).

        Args:
            code: The program; print() the values you want to see.
        """
        return run_python(code, limits, cfg.tool_timeout_s, cfg.tool_output_chars, sandboxed, cfg.python_max_procs)

    return python


def _boot(limits: list[int], sandboxed: bool) -> list[str]:
    return [sys.executable, "-I", "-S", "-c", _BOOTSTRAP, str(sandbox.NOBODY if sandboxed else 0), *map(str, limits)]


def _boots(limits: list[int], max_procs: int) -> tuple[list[str], list[str]]:
    """The sandbox's bootstrap where a cgroup bounds the call's processes, and where none could be made for it
    (RLIMIT_NPROC bounds them then: it counts per user, as root uid 65534's processes machine-wide, so concurrent
    calls share it)."""
    return _boot(limits, True), _boot([*limits[:4], max_procs, *limits[5:]], True)


def run_python(code: str, limits: list[int], timeout_s: float, output_chars: int, sandboxed: bool,
               max_procs: int) -> str:
    """Run ``code`` with this venv's python in isolated mode, in a bwrap sandbox (``sandboxed``,
    rlft.tools.sandbox) or in a session and temporary directory of its own with a scrubbed environment,
    under ``limits`` (RLIMIT_AS, _CPU, _FSIZE, _CORE, _NPROC, _NOFILE; -1: unchanged); kill everything it started
    when it ends or at ``timeout_s``; ``max_procs``: the sandbox cgroup's process bound.

    Raises:
        ToolTimeout: it ran past ``timeout_s`` (the message holds its output so far).
    """
    workdir = None if sandboxed else tempfile.mkdtemp(prefix="rlft-python-")
    try:
        with tempfile.TemporaryFile() as source, tempfile.TemporaryFile() as output:
            source.write(code.encode("utf-8", "surrogatepass"))
            source.seek(0)
            with _started(limits, sandboxed, max_procs, source, output, workdir) as proc:
                finished = _wait_exit(proc.pid, timeout_s)
            text = _read(output, output_chars)
    finally:
        if workdir is not None:
            _remove(workdir)
    if not finished:
        so_far = f"; its output so far:\n{text}" if text else " (no output)"
        raise ToolTimeout(f"python did not finish within {timeout_s:g} s and was killed{so_far}")
    if proc.returncode:
        text += f"\n[{how_it_ended(proc.returncode)}]"
    return text or "[no output: print() the values you want to see]"


@contextlib.contextmanager
def _started(limits: list[int], sandboxed: bool, max_procs: int, source: Any, output: Any, workdir: str | None
             ) -> Iterator[subprocess.Popen]:
    """The program's process (bwrap's, when ``sandboxed``: rlft.tools.sandbox.started), started; on leaving,
    everything it started is killed and it is reaped."""
    io: dict[str, Any] = {"stdin": source, "stdout": output, "stderr": subprocess.STDOUT}
    if sandboxed:
        bounded, unbounded = _boots(limits, max_procs)
        with sandbox.started(bounded, limits[0], max_procs, unbounded, **io) as proc:
            yield proc
        return
    assert workdir is not None
    proc = subprocess.Popen(_boot(limits, False), cwd=workdir, env=sandbox.sandbox_env(workdir), start_new_session=True, **io)
    try:
        yield proc
    finally:
        sandbox.reap(proc)


def _wait_exit(pid: int, timeout_s: float) -> bool:
    """Whether child ``pid`` exited within ``timeout_s``, without reaping it: while the group's leader is an
    unreaped zombie, its process group id cannot be taken by another process, so killing the group after
    this never hits a stranger."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd (old kernel): poll
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
            time.sleep(0.01)
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)


def _read(output: Any, output_chars: int) -> str:
    """The child's output, decoded, cut to ``output_chars``; only a bounded prefix is read."""
    output.seek(0)
    data = output.read(4 * output_chars + 4)  # a UTF-8 character is at most 4 bytes: enough to see a cut
    return cut_output(data.decode("utf-8", "replace"), output_chars)


def _remove(path: str) -> None:
    """Remove the workdir, even where the code took away its own permissions (chmod 000 on a folder)."""
    def retry(func: Callable[[str], Any], failed: str, _exc: Any) -> None:
        for p in (os.path.dirname(failed), failed):
            try:
                os.chmod(p, 0o700)
            except OSError:
                pass
        func(failed)

    try:
        shutil.rmtree(path, onerror=retry)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
