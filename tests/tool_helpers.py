"""Tools used by the tests (importable as tests.tool_helpers:NAME). Tool worker processes import this module:
it imports nothing at its top (no pytest)."""


def multiply(a: int, b: float = 1.0) -> str:
    """Multiply two numbers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return str(a * b)


def fails(x: int) -> str:
    """Raises ValueError.

    Args:
        x: Any integer.
    """
    raise ValueError(f"no luck with {x}")


def hangs(x: int) -> str:
    """Sleeps a minute.

    Args:
        x: Any integer.
    """
    import time

    time.sleep(60)
    return "late"


def exits_hard(x: int) -> str:
    """Ends its process with os._exit(3).

    Args:
        x: Any integer.
    """
    import os

    os._exit(3)


def calls_sys_exit(x: int) -> str:
    """Calls sys.exit(2).

    Args:
        x: Any integer.
    """
    import sys

    sys.exit(2)


def returns_dict(x: int) -> str:
    """Returns a dict instead of text.

    Args:
        x: Any integer.
    """
    return {"value": x}  # type: ignore[return-value]


def returns_int(x: int) -> str:
    """Returns a number instead of text.

    Args:
        x: Any integer.
    """
    return x * 2  # type: ignore[return-value]


def no_docstring(x: int) -> str:
    return str(x)


def no_type_hints(x):
    """Lacks type hints.

    Args:
        x: Anything.
    """
    return str(x)


NOT_CALLABLE = 42


def slow_lookup(x: int) -> str:
    """Waits half a second (an API's latency), then answers.

    Args:
        x: Any integer.
    """
    import time

    time.sleep(0.5)
    return f"looked up {x}"


def worker_pid(x: int) -> str:
    """The process id of the worker that runs the call.

    Args:
        x: Any integer.
    """
    import os

    return str(os.getpid())


def naps(seconds: float) -> str:
    """Sleeps, then says how long.

    Args:
        seconds: How long to sleep.
    """
    import time

    time.sleep(seconds)
    return f"slept {seconds}"


def own_memory(x: int) -> str:
    """This process's parent's pid and resident memory in MiB, as "PPID RSS".

    Args:
        x: Any integer.
    """
    import os

    rss = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS"))
    return f"{os.getppid()} {rss / 1024:.0f}"


def logs(text: str) -> str:
    """Logs ``text`` at INFO and warns with it, then returns "logged".

    Args:
        text: What to log.
    """
    import logging
    import warnings

    logging.getLogger("a_tool").info("info %s", text)
    warnings.warn(f"warned {text}", stacklevel=1)
    return "logged"


STATE: dict[str, str] = {"db": "set at import"}
"""What a trainer's program may set after importing this module (a client, a path): a worker that imported the module
afresh sees the import-time value."""


def reads_state(x: int) -> str:
    """The module's STATE["db"] as this worker sees it.

    Args:
        x: Any integer.
    """
    return STATE["db"]


def parent_pid(x: int) -> str:
    """The pid of the process that started this worker (the worker server's, or the trainer's).

    Args:
        x: Any integer.
    """
    import os

    return str(os.getppid())


def answer(pool, *args, **kwargs):
    """Not a tool: for the tests' trainer scripts, one call through ``pool`` (an rlft.workers.pool.Pool), waited for; its
    outcome."""
    pool.submit(0, (args, kwargs))
    got = {}
    while not got:
        got.update(pool.poll(None))
    return got[0][0]
