"""Stopping well: Ctrl-C / SIGTERM handling, and keeping the last consistent state when a step fails.

A step changes the weights, the optimizer and scheduler, the random states, the data
position and the adapted coefficients. A failure at any point of a step (a reward that
raises, an evaluation that crashes, an abort in the middle of the update) would leave a mix
of two steps. So after each completed step the trainer keeps an in-memory :class:`rlft.state.run_state.Snapshot`
of its state, and a failure saves that as a checkpoint: with the default
``trainer.save_every=0`` nothing but the failed step is lost.

Under data parallelism the snapshot holds every rank's random states (gathered when it is
taken), so rank 0 can write it alone, without a collective: after a failure, another rank may
be gone (an error of its own, ``kill -9``), and its collectives would never complete.
"""

from __future__ import annotations

import copy
import os
import signal
import threading
from typing import TYPE_CHECKING, Any

from rlft.state import run_state
from rlft.state.run_state import Snapshot

if TYPE_CHECKING:
    from rlft.output.writer import Outputs
    from rlft.training.components import Components


def capture(c: Components) -> Snapshot:
    """Copy the components' training state into host memory (on a GPU,
    device memory is the scarce one; the copy costs one transfer per step)."""
    tensors, state = run_state.collect(c)
    copied = {f: {k: v.detach().to("cpu", copy=True) for k, v in group.items()} for f, group in tensors.items()}
    return Snapshot(copied, copy.deepcopy(state))


def restore(c: Components, snap: Snapshot) -> None:
    """Put a snapshot back into the components.

    Raises:
        CheckpointError: the trained parameters changed during the step (e.g. an abort inside the
            critic's adapter switch); the last checkpoint is then the place to resume from.
    """
    run_state.apply(c, snap.tensors, snap.state, "the step's starting state")


def save_on_failure(c: Components, out: Outputs, done: int, saved_step: int, snap: Snapshot) -> None:
    """Keep the work done so far when a run stops on an error or an abort: ``snap`` (the state after
    ``done`` steps) goes back into the components and, on the writing rank, into a checkpoint.
    ``out`` is the run's :class:`rlft.output.writer.Outputs`."""
    if done <= saved_step or done == 0:
        return
    try:
        restore(c, snap)
        path = out.write_snapshot(c, done, snap)
    except Exception as e:  # noqa: BLE001  (the original error is the one to report)
        out.info(f"stopped after step {done} but could not save it ({type(e).__name__}: {e}); "
                 f"resume from step {saved_step}")
        return
    if path is not None:
        out.info(f"stopped after step {done}; saved {path} (resume with trainer.resume=auto)")


class GracefulStop:
    """The first Ctrl-C (or SIGTERM) finishes the current step, checkpoints and stops; a second one aborts.

    ``grace_s`` (``trainer.stop_grace_s``): a step that has not finished that long after the first
    signal is aborted as by a second one (a reward that hangs without a time limit would otherwise
    keep the run alive forever). The abort raises ``KeyboardInterrupt`` from the signal handler,
    which runs in the main thread between bytecodes and ends the blocking waits Python can interrupt
    (sleep, a pipe, a lock); code that holds the main thread in C without returning stays deaf.

    ``hold_on_error``: leaving on an exception, ignore these signals instead of restoring the previous
    handlers (for a rank under a launcher, which ends once it reported the error). When one rank
    fails, torch's agent SIGTERMs the others at once; a rank already past this block, writing its
    error line and the job's status, would otherwise die mid-write with the default action.
    """

    def __init__(self, hold_on_error: bool = False, grace_s: float = 0.0) -> None:
        self.requested = False
        self.hold_on_error = hold_on_error
        self.grace_s = grace_s
        self._previous: dict[int, Any] = {}
        self._timer: threading.Timer | None = None
        # _expired (the deadline passed and its signal is sent) and _done (the step finished: the deadline
        # no longer applies) change together under the lock, so that the timer cannot fire once the step
        # is done, and a signal it sent just before is recognised by the handler and dropped.
        self._lock = threading.RLock()  # the handler takes it too, in the main thread, maybe inside step_done
        self._expired = False
        self._done = False

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        with self._lock:
            late = self._expired and self._done
            if late:
                self._expired = False
        if late:  # the timer's signal, sent as the step finished: the checkpoint write goes on
            return
        if self._expired:
            raise KeyboardInterrupt(f"the step did not finish within trainer.stop_grace_s={self.grace_s:g} s "
                                    "of the signal and was aborted")
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if self.grace_s > 0:
            self._timer = threading.Timer(self.grace_s, self._expire, (threading.main_thread().ident,))
            self._timer.daemon = True
            self._timer.start()
        # A raw write: the interrupted main thread may be inside the console's or the log's own
        # write, and re-entering those raises (the loop logs the stop once the step is done).
        os.write(2, b"stopping after this step and saving a checkpoint (Ctrl-C again to abort now)\n")

    def _expire(self, main: int) -> None:
        with self._lock:
            if self._done:
                return
            self._expired = True
            signal.pthread_kill(main, signal.SIGTERM)  # to the main thread: it interrupts its blocking call

    def step_done(self) -> None:
        """The step has finished: the deadline no longer applies (the checkpoint write is not cut short).
        Once this returns the timer has ended, so it cannot signal after ``__exit__`` restored the handlers."""
        with self._lock:
            self._done = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join()

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.step_done()
        hold = exc_type is not None and self.hold_on_error
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_IGN if hold else handler)
