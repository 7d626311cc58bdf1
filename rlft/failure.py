"""Stopping well: Ctrl-C / SIGTERM handling, and keeping the last consistent state when a step fails.

A step changes the weights, the optimizer and scheduler, the random states, the data
position and the adapted coefficients. A failure at any point of a step (a reward that
raises, an evaluation that crashes, an abort in the middle of the update) would leave a mix
of two steps. So each step starts from an in-memory :class:`Snapshot` of the state after the
last completed step, and a failure rolls back to it and saves that as a checkpoint: with the
default ``trainer.save_every=0`` nothing but the failed step is lost.
"""

from __future__ import annotations

import copy
import os
import random
import signal
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlft.run_state import trainable_tensors


@dataclass
class Snapshot:
    """Everything a step changes, copied (under LoRA a few MB: the adapter and its Adam moments)."""

    weights: dict[str, Tensor]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    rng: tuple[Any, ...]
    cursor: int
    algo: tuple[float, float]


def capture(c: Any) -> Snapshot:
    """Copy the components' training state (``c``: trainer Components)."""
    weights = {k: v.detach().clone() for k, v in trainable_tensors(c).items()}
    rng = (torch.get_rng_state(), c.shuffle.get_state(), np.random.get_state(), random.getstate())
    return Snapshot(weights, copy.deepcopy(c.optimizer.state_dict()), copy.deepcopy(c.scheduler.state_dict()), rng,
                    c.cursor, (c.state.penalty_beta, c.state.kl_coef))


def restore(c: Any, snap: Snapshot) -> None:
    """Put a snapshot back into the components."""
    own = trainable_tensors(c)
    if own.keys() != snap.weights.keys():  # e.g. an abort inside the critic's adapter switch
        raise RuntimeError("the trained parameters changed during the step; resume from the last checkpoint")
    with torch.no_grad():
        for name, p in own.items():
            p.copy_(snap.weights[name])
    c.optimizer.load_state_dict(snap.optimizer)
    c.scheduler.load_state_dict(snap.scheduler)
    torch.set_rng_state(snap.rng[0])
    c.shuffle.set_state(snap.rng[1])
    np.random.set_state(snap.rng[2])
    random.setstate(snap.rng[3])
    c.cursor = snap.cursor
    c.state.penalty_beta, c.state.kl_coef = snap.algo


class GracefulStop:
    """The first Ctrl-C (or SIGTERM) finishes the current step, checkpoints and stops; a second one aborts."""

    def __init__(self, tracker: Any):
        self.tracker = tracker
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        # A raw write: the interrupted main thread may be inside the console's or the log's own
        # write, and re-entering those raises (the loop logs the stop once the step is done).
        os.write(2, b"stopping after this step and saving a checkpoint (Ctrl-C again to abort now)\n")

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
