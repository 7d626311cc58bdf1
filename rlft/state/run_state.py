"""What a run's checkpoint holds and how it goes back into the training components.

Saved: the trainable weights (policy adapter or full weights, critic), optimizer and
scheduler state, every random state (python, numpy, torch, the mini-batch shuffler), the
data position, the adapted algorithm coefficients, the reward's running statistics
(``reward.normalize``), the step and the resolved config. Under LoRA the adapter is also
written in peft's own format (``adapter/``) for use outside rlft.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from rlft.models.critic import CRITIC_ADAPTER
from rlft.parallel.fsdp import copy_full_, full_named, like
from rlft.rewards.normalize import RunningMoments
from rlft.state import checkpoint as ckpt

if TYPE_CHECKING:
    from rlft.training.components import Components

WEIGHTS = "trainable.safetensors"
OPTIMIZER = "optimizer.safetensors"
RNG = "rng.safetensors"
CUDA_RNG = "cuda"
CONFIG = "config.yaml"

@dataclass
class Snapshot:
    """A copy of :func:`collect` in host memory (under LoRA a few MB: the adapter and its Adam moments)."""

    tensors: dict[str, dict[str, Tensor]]
    state: dict[str, Any]


def trainable_tensors(c: Components) -> dict[str, Tensor]:
    """Every trained tensor, by a stable name: the policy's (incl. a critic adapter) and the critic's."""
    out = {f"policy/{n}": p for n, p in c.policy.model.named_parameters() if p.requires_grad}
    if c.critic is not None:
        out.update({f"critic_head/{n}": p for n, p in c.critic.head.named_parameters()})
        if c.critic.adapter is None:
            out.update({f"critic_model/{n}": p for n, p in c.critic.model.named_parameters() if p.requires_grad})
    return out


def collect(c: Components) -> tuple[dict[str, dict[str, Tensor]], dict[str, Any]]:
    """Everything a training step changes, as ``({file name: {tensor name: tensor}}, JSON state)``.

    The tensors are the live ones (weights, optimizer moments), not copies, except under FSDP2,
    where the shards are gathered into whole tensors (so the files are the same whatever the
    strategy). A checkpoint writes this to disk; :mod:`rlft.state.failure` keeps a copy in memory after
    each step. Under data parallelism the weights and optimizer are the same on every rank; the
    random states of every rank are gathered (a collective: every rank calls this), rank r's under
    ``rank{r}.`` names.
    """
    dp = c.dp
    opt = c.optimizer.state_dict()
    opt_tensors = full_named((f"{pid}.{k}", v) for pid, s in opt["state"].items() for k, v in s.items())
    ranks = dp.all_gather(_rank_rng(c.device))
    rng_json, rng = ranks[0][1], {"shuffle": c.shuffle.get_state(), **ranks[0][0]}
    for r, (tensors, _) in enumerate(ranks[1:], 1):
        rng.update({f"rank{r}.{k}": v for k, v in tensors.items()})
    state = {
        "cursor": c.cursor,
        "dropped_prompts": list(c.task.dropped),
        "compute_dtype": c.precision.dtype,
        "world_size": dp.world,
        "algo": {"penalty_beta": c.state.penalty_beta, "kl_coef": c.state.kl_coef,
                 "reward_moments": c.state.reward_moments.to_json()},
        "optimizer_param_groups": opt["param_groups"],
        "scheduler": c.scheduler.state_dict(),
        **rng_json,
        "rank_rngs": [j for _, j in ranks[1:]],
    }
    return {WEIGHTS: full_named(trainable_tensors(c).items()), OPTIMIZER: opt_tensors, RNG: rng}, state


def _rank_rng(device: torch.device) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """This process's random states: tensors, and the JSON part."""
    np_state = np.random.get_state()
    tensors = {"torch": torch.get_rng_state(), "numpy_keys": torch.from_numpy(np_state[1].astype(np.int64))}
    if device.type == "cuda":  # dropout on the GPU draws from the device's generator
        tensors[CUDA_RNG] = torch.cuda.get_rng_state(device)
    return tensors, {
        "python_rng": _py_state_to_json(random.getstate()),
        "numpy_rng": {"pos": int(np_state[2]), "has_gauss": int(np_state[3]), "cached": float(np_state[4])},
    }


def save(c: Components, run_dir: Path, step: int, config_yaml: str, keep_last: int,
         metrics: dict | None = None) -> Path:
    """Checkpoint the components after ``step`` completed steps; prune to ``keep_last``. Under data
    parallelism every rank calls this (the random states are gathered) and rank 0 writes."""
    tensors, state = collect(c)
    if not c.dp.main:
        return run_dir / "checkpoints" / ckpt.step_dir_name(step)
    return write(c, run_dir, step, tensors, state, config_yaml, keep_last, metrics)


def write(c: Components, run_dir: Path, step: int, tensors: dict[str, dict[str, Tensor]], state: dict[str, Any],
          config_yaml: str, keep_last: int, metrics: dict | None = None) -> Path:
    """Write collected (or snapshotted) state as the checkpoint of ``step``; no collectives."""
    state = {"step": step, **state, "metrics": metrics or {}}
    extra = _peft_writer(c.policy.model, tensors[WEIGHTS]) if c.policy.lora else None
    path = ckpt.write_checkpoint(run_dir / "checkpoints", step, tensors, {ckpt.STATE: state, CONFIG: config_yaml},
                                 extra)
    ckpt.prune(run_dir / "checkpoints", keep_last)
    return path


def _peft_writer(model: Any, weights: dict[str, Tensor]) -> Any:
    """Writes the adapter in peft's format, from the collected (whole) tensors, not the live (maybe sharded) ones."""
    state = {k.removeprefix("policy/"): v for k, v in weights.items() if k.startswith("policy/")}

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp / "adapter", selected_adapters=["default"], state_dict=state)

    return write


def load_policy_weights(model: Any, path: Path) -> None:
    """Copy a checkpoint's policy weights (not its critic's) into a model built like the trained one."""
    saved = {k.removeprefix("policy/"): v for k, v in ckpt.read_tensors(path, WEIGHTS).items()
             if k.startswith("policy/") and f".{CRITIC_ADAPTER}." not in k}
    own = dict(model.named_parameters())
    missing = sorted(set(saved) - set(own))
    if missing:
        raise ckpt.CheckpointError(f"checkpoint {path} does not fit this model: no parameter {missing[0]}")
    _copy_into({name: own[name] for name in saved}, saved, f"checkpoint {path}")


def _copy_into(own: dict[str, Tensor], saved: dict[str, Tensor], source: str) -> None:
    """``own[name] <- saved[name]`` for every name in ``own``, refusing a shape mismatch."""
    with torch.no_grad():
        for name, p in own.items():
            if saved[name].shape != p.shape:
                raise ckpt.CheckpointError(f"{source}: {name} has shape {tuple(saved[name].shape)}, "
                                           f"model has {tuple(p.shape)}")
            copy_full_(p, saved[name])


def restore(c: Components, path: Path) -> dict[str, Any]:
    """Put the whole training state back; returns the trainer state JSON (``step``, ``metrics``, ...)."""
    state = ckpt.read_json(path, ckpt.STATE)
    _check_same_problems(state, c.task, path)
    apply(c, {name: ckpt.read_tensors(path, name) for name in (WEIGHTS, OPTIMIZER, RNG)}, state, f"checkpoint {path}")
    return state


def _check_same_problems(state: dict[str, Any], task: Any, path: Path) -> None:
    """The prompts dropped as too long are those the checkpoint's run dropped. Keys that only change numerics
    (sampler.name, sampler.vllm.max_model_len) also move vLLM's prompt limit, hence the training rows and
    their order. Dropping is by a length threshold, so equal counts mean the same problems."""
    saved = state.get("dropped_prompts")  # absent from checkpoints older than this check
    if saved is None or list(saved) == list(task.dropped):
        return
    raise ckpt.CheckpointError(
        f"checkpoint {path} dropped {saved[0]} training and {saved[1]} held-out prompts as too long; this run drops "
        f"{task.dropped[0]} and {task.dropped[1]} ({task.dropped_by or 'no limit'}), which changes the training "
        "problems: keep the checkpoint's sampler.name and sampler.vllm.max_model_len"
    )


def apply(c: Components, tensors: dict[str, dict[str, Tensor]], state: dict[str, Any], source: str) -> None:
    """Put what :func:`collect` returned (from a checkpoint or a snapshot) back into the components.

    Raises:
        CheckpointError: the trained tensors' names or shapes do not fit the components.
    """
    saved, own = tensors[WEIGHTS], trainable_tensors(c)
    missing, unexpected = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
    if missing or unexpected:
        raise ckpt.CheckpointError(f"{source} does not fit this model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    _copy_into(own, saved, source)
    opt_state: dict[int, dict[str, Tensor]] = {}
    params = [p for group in c.optimizer.param_groups for p in group["params"]]
    for key, value in tensors[OPTIMIZER].items():
        pid, name = key.split(".", 1)
        param = params[int(pid)]  # a moment of a sharded parameter is sharded as it is
        opt_state.setdefault(int(pid), {})[name] = like(param, value) if value.shape == param.shape else value
    c.optimizer.load_state_dict({"state": opt_state, "param_groups": state["optimizer_param_groups"]})
    c.scheduler.load_state_dict(state["scheduler"])
    c.cursor = int(state["cursor"])
    c.state.penalty_beta = float(state["algo"]["penalty_beta"])
    c.state.kl_coef = float(state["algo"]["kl_coef"])
    c.state.reward_moments = RunningMoments.from_json(state["algo"].get("reward_moments", []))  # absent: older
    rng, rng_json = _own_rng(tensors[RNG], state, c.dp.rank)
    torch.set_rng_state(rng["torch"])
    restore_device_rng(rng, c.device)
    c.shuffle.set_state(tensors[RNG]["shuffle"])
    n = rng_json["numpy_rng"]
    np.random.set_state(("MT19937", rng["numpy_keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached"]))
    random.setstate(_py_state_from_json(rng_json["python_rng"]))


def _own_rng(rng: dict[str, Tensor], state: dict[str, Any], rank: int) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Rank ``rank``'s random states; rank 0's when the checkpoint has none for it (it was written at
    a smaller world size, a change :func:`rlft.state.resume_rules.check_compatible` reports)."""
    prefix = f"rank{rank}."
    if rank > 0 and f"{prefix}torch" in rng and len(state.get("rank_rngs", [])) >= rank:
        return {k.removeprefix(prefix): v for k, v in rng.items() if k.startswith(prefix)}, state["rank_rngs"][rank - 1]
    return {k: v for k, v in rng.items() if not k.startswith("rank")}, state


def restore_device_rng(rng: dict[str, Tensor], device: torch.device) -> None:
    """The CUDA generator's state, when the checkpoint has one and this run is on CUDA. A CUDA
    checkpoint resumed on the CPU (or the other way round) has no device generator to carry over:
    the CPU-side states (torch, numpy, python, shuffler) are restored either way."""
    if CUDA_RNG in rng and device.type == "cuda":
        torch.cuda.set_rng_state(rng[CUDA_RNG], device)


def _py_state_to_json(s: tuple) -> list:
    return [s[0], list(s[1]), s[2]]


def _py_state_from_json(s: list) -> tuple:
    return (s[0], tuple(s[1]), s[2])
