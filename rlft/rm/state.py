"""What a reward-model checkpoint holds and how it goes back: the trained tensors (adapter and score
head, or all weights), AdamW's moments and the scheduler, torch's random state (LoRA dropout), the
step and the pair position. Written with :mod:`rlft.state.checkpoint`'s atomic directories under the same
file names as ``rlft train``'s (:mod:`rlft.state.run_state`), plus a ``kind`` that ``rlft export`` reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlft.parallel.distributed import SINGLE, DataParallel
from rlft.rm.model import RewardModel
from rlft.state import checkpoint as ckpt
from rlft.state.run_state import CONFIG, CUDA_RNG, OPTIMIZER, RNG, WEIGHTS, restore_device_rng

KIND = "reward_model"
"""``trainer_state.json``'s ``kind`` in a checkpoint of ``rlft rm``."""


@dataclass
class RMState:
    """What the loop carries from step to step, besides the weights and the optimizer."""

    step: int = 0
    cursor: int = 0
    """Pairs drawn so far (the order is a seeded function of it: nothing else to save)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The last step's metrics."""


def is_reward_checkpoint(path: Path) -> bool:
    return ckpt.kind(path) == KIND


def _own_rng(device: torch.device) -> dict[str, Tensor]:
    rng = {"torch": torch.get_rng_state()}
    if device.type == "cuda":  # dropout on the GPU draws from the device's generator
        rng[CUDA_RNG] = torch.cuda.get_rng_state(device)
    return rng


def save(rm: RewardModel, optimizer: torch.optim.Optimizer, scheduler: Any, state: RMState, run_dir: Path,
         config_yaml: str, keep_last: int, compute_dtype: str, dp: DataParallel = SINGLE, kind: str = KIND) -> Path | None:
    """Checkpoint after ``state.step`` steps; prune to ``keep_last`` (0: keep all); ``kind`` names the command
    whose checkpoint it is (``rlft sft`` writes its own with this code). Under several ranks a
    collective: the weights and optimizer are the same on every rank, each rank's random state is
    gathered (rank r's under ``rank{r}.`` names) and rank 0 writes; the other ranks get None."""
    ranks = dp.all_gather(_own_rng(rm.device))
    if not dp.main:
        return None
    opt = optimizer.state_dict()
    rng = dict(ranks[0])
    for r, own in enumerate(ranks[1:], 1):
        rng.update({f"rank{r}.{k}": v for k, v in own.items()})
    tensors = {
        WEIGHTS: rm.trainable(),
        OPTIMIZER: {f"{pid}.{k}": v for pid, s in opt["state"].items() for k, v in s.items()},
        RNG: rng,
    }
    saved = {"kind": kind, "step": state.step, "cursor": state.cursor, "compute_dtype": compute_dtype,
             "optimizer_param_groups": opt["param_groups"], "scheduler": scheduler.state_dict(),
             "metrics": state.metrics, "world_size": dp.world}
    path = ckpt.write_checkpoint(run_dir / "checkpoints", state.step, tensors, {ckpt.STATE: saved, CONFIG: config_yaml})
    ckpt.prune(run_dir / "checkpoints", keep_last)
    return path


def load_weights(rm: RewardModel, path: Path) -> None:
    """Copy a checkpoint's trained tensors into a model built like the trained one.

    Raises:
        CheckpointError: the names or shapes do not fit.
    """
    saved, own = ckpt.read_tensors(path, WEIGHTS), rm.trainable()
    missing, unexpected = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
    if missing or unexpected:
        raise ckpt.CheckpointError(f"checkpoint {path} does not fit this model: missing {missing[:3]}, "
                                   f"unexpected {unexpected[:3]}")
    with torch.no_grad():
        for name, p in own.items():
            if saved[name].shape != p.shape:
                raise ckpt.CheckpointError(f"checkpoint {path}: {name} has shape {tuple(saved[name].shape)}, "
                                           f"model has {tuple(p.shape)}")
            p.copy_(saved[name])


def restore(rm: RewardModel, optimizer: torch.optim.Optimizer, scheduler: Any, path: Path, rank: int = 0) -> RMState:
    """Put a checkpoint's whole training state back (rank ``rank``'s random state, rank 0's when it was
    written by fewer ranks); returns the loop's state."""
    saved = ckpt.read_json(path, ckpt.STATE)
    load_weights(rm, path)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    moments: dict[int, dict[str, Tensor]] = {}
    for key, value in ckpt.read_tensors(path, OPTIMIZER).items():
        pid, name = key.split(".", 1)
        moments.setdefault(int(pid), {})[name] = value.to(params[int(pid)].device) if value.dim() else value
    optimizer.load_state_dict({"state": moments, "param_groups": saved["optimizer_param_groups"]})
    scheduler.load_state_dict(saved["scheduler"])
    rng = ckpt.read_tensors(path, RNG)
    prefix = f"rank{rank}."
    if rank > 0 and f"{prefix}torch" in rng:
        rng = {k.removeprefix(prefix): v for k, v in rng.items() if k.startswith(prefix)}
    torch.set_rng_state(rng["torch"])
    restore_device_rng(rng, rm.device)
    return RMState(int(saved["step"]), int(saved["cursor"]), saved.get("metrics", {}))
