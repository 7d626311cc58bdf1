"""Data parallelism on torch.distributed: the process group torchrun sets up, and the few
collectives the learner needs so that every rank takes the same step as one process would.

Each rank holds a slice of the rollout (whole groups). The loss of a rank is its share of the
*global* loss (normalised by global token / sequence counts), so the sum over ranks of the
ranks' gradients is the one-process gradient: one all-reduce (sum) of the flattened trainable
gradients per optimizer step. DDP's reducer would do the same reduction, but it only engages
when the wrapped module's ``forward`` runs, and the learner calls the decoder directly (to share
each prompt's pass across its group); for adapters of a few MB a single flat all-reduce per
step is also what DDP's bucketing amounts to.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass(frozen=True)
class DataParallel:
    """This process's place among the ranks (``world == 1``: one process, every collective a no-op)."""

    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def share(self, items: list[Any]) -> list[Any]:
        """This rank's contiguous share of ``items`` (all of them in one process): equal shares, the last one
        shorter when ``items`` does not split evenly."""
        per = -(-len(items) // self.world)
        return items[self.rank * per: (self.rank + 1) * per]

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def sum_(self, t: Tensor) -> Tensor:
        """In-place sum over ranks (returns ``t``)."""
        if self.active:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def max_(self, t: Tensor) -> Tensor:
        if self.active:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on one (a stop request, a spent time budget)."""
        return bool(self.max_(torch.tensor([float(flag)])).item())

    def sum_floats(self, values: list[float]) -> list[float]:
        """Elementwise sums over ranks of a few host numbers (float64, so counts stay exact)."""
        if not self.active:
            return list(values)
        return self.sum_(torch.tensor(values, dtype=torch.float64)).tolist()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.active:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def set_timeout(self, seconds: float) -> None:
        """Bound every later collective's wait for the other ranks (``trainer.dist_timeout_s``): past
        it, gloo raises "Timed out waiting ...", NCCL (blocking wait, see :func:`from_environment`)
        aborts the communicator and raises; the rank then reports on one line (rlft.commands.train)."""
        if self.active:
            from torch.distributed.distributed_c10d import _set_pg_timeout  # private to torch: only when used

            _set_pg_timeout(timedelta(seconds=seconds))

    def sum_gradients(self, params: list[Tensor]) -> None:
        """Replace each parameter's gradient by its sum over ranks (a rank without one counts 0). A
        parameter that has a gradient on no rank keeps none, as in one process (AdamW skips it)."""
        if not self.active or not params:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        present = torch.tensor([float(p.grad is not None) for p in params], device=params[0].device,
                               dtype=grads[0].dtype)
        flat = torch.cat([g.reshape(-1) for g in grads] + [present])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset, anywhere = 0, flat[-len(params):].tolist()
        for p, has in zip(params, anywhere):
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone() if has else None
            offset += n


SINGLE = DataParallel()


def launched() -> bool:
    """Started by torchrun (or another launcher that sets WORLD_SIZE) with more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def local_rank() -> int:
    """This process's index on its node (its GPU under torchrun)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def from_environment(device: torch.device | None = None) -> DataParallel:
    """Join the process group torchrun describes in the environment (RANK, WORLD_SIZE, MASTER_ADDR,
    ...). Gloo carries the host-side collectives (objects, flags, counts); NCCL joins it for CUDA
    tensors when torch sees a GPU. Without torchrun, one process.

    NCCL's collectives run on the GPU's stream, and by default a peer that is gone is noticed only by
    its watchdog thread, which tears the process down (no error line, no snapshot). With
    ``TORCH_NCCL_BLOCKING_WAIT=1`` (set here unless the environment sets it) the calling thread
    waits for each collective and, past the process group's timeout, aborts the communicator and
    raises, as gloo does."""
    if not launched():
        return SINGLE
    if not dist.is_initialized():
        os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
        cuda = torch.cuda.is_available() and (device is None or device.type == "cuda")
        dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo")
    return DataParallel(dist.get_rank(), dist.get_world_size())
