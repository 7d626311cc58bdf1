"""The console shows rlft's own lines; other libraries' chatter goes to the run's train.log.

While a job runs (:func:`run_log`), what libraries would print goes to train.log instead:

- log records: every logger's console handlers are detached and its records propagate to the
  root logger, whose file handler writes them (Hydra's own records keep Hydra's console handler:
  they are the sweep's lines);
- Python warnings, as records of ``py.warnings``;
- what a library writes to file descriptors 1 and 2 while it starts (vLLM's C++ warnings),
  through :func:`quiet`; progress bars are turned off where the library allows it.

A third-party record at ERROR or above still shows, as one line naming its logger: a library
reporting a failure is something the user must see. So does a warning from the user's own reward
modules (logged or warned from their files, or on a logger of their package): it is theirs to act on. ``logger.verbose=true`` shows every record
and leaves the progress bars on.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class _State:
    log_file: Path | None = None  # train.log of the job this process runs (None: no job)
    verbose: bool = False
    prefix: str = ""  # "[rank N] " on a rank of several
    user_paths: tuple[str, ...] = ()  # files and folders of the user's reward modules
    user_names: tuple[str, ...] = ()  # their top-level package names


# Loggers whose records never show on the console: the launcher of trainer.nproc's ranks reports
# a rank's failure, which that rank already printed as rlft's one line.
_FILE_ONLY = ("torch.distributed.elastic",)


def job_log() -> tuple[str, str] | None:
    """The running job's train.log and this rank's record prefix (None: no job): where the worker server's
    workers log (rlft.workers.server)."""
    return None if _State.log_file is None else (str(_State.log_file), _State.prefix)


def log_to_file(path: str, prefix: str) -> None:
    """This process's records (INFO and above) and warnings go to ``path`` as the job's do: a worker server's
    (forked from a fresh interpreter, it has none of the trainer's handlers)."""
    handler = logging.FileHandler(path, delay=True)
    handler.setFormatter(logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)


def verbose() -> bool:
    """Third-party output on the console too (``logger.verbose=true``)."""
    return _State.verbose


def note(message: str) -> None:
    """An rlft line printed before the run's console exists (on the first rank only)."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(message, flush=True)


class _ConsoleFilter(logging.Filter):
    """On a console handler: Hydra's records, and third-party failures (all records when verbose)."""

    def __init__(self, hydra_handler: bool):
        super().__init__()
        self.hydra_handler = hydra_handler

    def filter(self, record: logging.LogRecord) -> bool:
        hydra = record.name == "hydra" or record.name.startswith("hydra.")
        if self.hydra_handler:
            return hydra
        if hydra or any(record.name == n or record.name.startswith(n + ".") for n in _FILE_ONLY):
            return False
        return _State.verbose or record.levelno >= logging.ERROR or (
            record.levelno >= logging.WARNING and _from_user_code(record))


def _from_user_code(record: logging.LogRecord) -> bool:
    """A record of the user's reward modules: a warning raised in their files, or a log record
    made there or on a logger of their package."""
    if record.name.split(".")[0] in _State.user_names:
        return True
    # A captured warning's message starts with the file it was raised in ("PATH:LINE: Category: ...").
    where = record.getMessage().split(":", 1)[0] if record.name == "py.warnings" else record.pathname
    where = os.path.realpath(where)
    return any(where == p or where.startswith(p) for p in _State.user_paths)


def user_code(fns: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(paths, names)`` of the top-level modules that ``reward.fns``' dotted paths name (built-ins:
    none). Found without importing them: a folder (with a separator at the end) or a file each."""
    paths: list[str] = []
    names = sorted({str(fn).partition(":")[0].split(".")[0] for fn in fns if ":" in str(fn)})
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.submodule_search_locations:
            paths += [os.path.realpath(p) + os.sep for p in spec.submodule_search_locations]
        elif spec is not None and spec.origin:
            paths.append(os.path.realpath(spec.origin))
    return tuple(paths), tuple(names)


def _is_console(handler: logging.Handler) -> bool:
    """A handler that writes to a stream rather than a file: the console, whatever object stands for
    it (a handler made while another stream stood in for sys.stderr still writes to a terminal or
    pipe, not to train.log)."""
    return isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)


@contextmanager
def run_log(log_file: Path, verbose: bool = False, rank: int | None = None,
            reward_fns: list[str] | None = None) -> Iterator[None]:
    """Route third-party output to ``log_file`` (train.log) while a job runs; ``rank``: prefix of
    this rank's records when the job has several; ``reward_fns``: whose modules' warnings still show."""
    # Set before vLLM is imported: its records then propagate here instead of to its own stdout handler.
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    root = logging.getLogger()
    detached = _detach_console_handlers()
    file_handler = logging.FileHandler(log_file, delay=True)  # no train.log until there is something to write
    prefix = f"[rank {rank}] " if rank is not None else ""
    file_handler.setFormatter(logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s"))
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter(f"{prefix}%(levelname)s %(name)s: %(message)s"))
    console.addFilter(_ConsoleFilter(hydra_handler=False))
    hydra_filters = [(h, _ConsoleFilter(hydra_handler=True)) for h in root.handlers if _is_console(h)]
    for h, f in hydra_filters:
        h.addFilter(f)
    level, captured = root.level, logging._warnings_showwarning is not None  # type: ignore[attr-defined]
    root.addHandler(file_handler)
    root.addHandler(console)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    saved = _State.log_file, _State.verbose, _State.prefix, _State.user_paths, _State.user_names
    _State.log_file, _State.verbose, _State.prefix = log_file, verbose, prefix
    _State.user_paths, _State.user_names = user_code(reward_fns or [])
    try:
        yield
    finally:
        _State.log_file, _State.verbose, _State.prefix, _State.user_paths, _State.user_names = saved
        logging.captureWarnings(captured)
        root.setLevel(level)
        for h in (file_handler, console):
            root.removeHandler(h)
        file_handler.close()
        for h, f in hydra_filters:
            h.removeFilter(f)
        for logger, handlers, propagate in detached:
            for h in handlers:
                logger.addHandler(h)
            logger.propagate = propagate


def _detach_console_handlers() -> list[tuple[logging.Logger, list[logging.Handler], bool]]:
    """Take the console handlers off every named logger (torch's, transformers', ...) and let its
    records propagate to the root; returns what to put back."""
    detached = []
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if not isinstance(logger, logging.Logger) or logger.name == "rlft" or logger.name.startswith("rlft."):
            continue
        handlers = [h for h in logger.handlers if _is_console(h)]
        if not handlers:  # a logger that keeps its records to itself (torch's trace) stays so
            continue
        detached.append((logger, handlers, logger.propagate))
        for h in handlers:
            logger.removeHandler(h)
        logger.propagate = True
    return detached


@contextmanager
def quiet(what: str) -> Iterator[None]:
    """What a library writes straight to file descriptors 1 and 2 while it starts (C++ warnings,
    stray prints) goes to train.log, with a line naming ``what``, instead of the console."""
    if _State.verbose or _State.log_file is None:
        yield
        return
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = os.dup(1), os.dup(2)
    sink = os.open(_State.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(sink, f"{_State.prefix}--- output of {what} ---\n".encode())
    # A crash inside (a segfault, an abort) would leave its report in train.log only: Python's
    # fault handler writes to the console's stderr instead.
    console_err = os.fdopen(os.dup(saved[1]), "w")
    was_enabled = faulthandler.is_enabled()
    faulthandler.enable(file=console_err)
    try:
        os.dup2(sink, 1)
        os.dup2(sink, 2)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, sink):
            os.close(fd)
        faulthandler.disable()
        if was_enabled:
            faulthandler.enable()
        console_err.close()
