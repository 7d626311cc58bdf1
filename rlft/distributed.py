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

    def sum_gradients(self, params: list[Tensor]) -> None:
        """Replace each parameter's gradient by its sum over ranks (a rank without one counts 0)."""
        if not self.active:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n


SINGLE = DataParallel()


def from_environment(device: torch.device) -> DataParallel:
    """Join the process group torchrun describes in the environment (RANK, WORLD_SIZE, MASTER_ADDR,
    ...): gloo on the CPU, NCCL on CUDA. Without torchrun, one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return SINGLE
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return DataParallel(dist.get_rank(), dist.get_world_size())
