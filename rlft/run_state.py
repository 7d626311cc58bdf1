"""What a run's checkpoint holds and how it goes back into the training components.

Saved: the trainable weights (policy adapter or full weights, critic), optimizer and
scheduler state, every random state (python, numpy, torch, the mini-batch shuffler), the
data position, the adapted algorithm coefficients, the step and the resolved config. Under
LoRA the adapter is also written in peft's own format (``adapter/``) for use outside rlft.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlft import checkpoint as ckpt
from rlft.config import ConfigError

WEIGHTS = "trainable.safetensors"
OPTIMIZER = "optimizer.safetensors"
RNG = "rng.safetensors"
CONFIG = "config.yaml"

# Changing these between a checkpoint and its resumption does not change what is being trained.
HARMLESS = (
    "logger.", "trainer.steps", "trainer.eval_every", "trainer.eval_at_start", "trainer.save_every",
    "trainer.keep_last", "trainer.resume", "trainer.threads", "trainer.micro_batch_size", "sampler.vllm.",
    "sampler.name", "data.num_eval", "data.eval_path",
)


def trainable_tensors(c: Any) -> dict[str, Tensor]:
    """Every trained tensor, by a stable name: the policy's (incl. a critic adapter) and the critic's."""
    out = {f"policy/{n}": p for n, p in c.policy.model.named_parameters() if p.requires_grad}
    if c.critic is not None:
        out.update({f"critic_head/{n}": p for n, p in c.critic.head.named_parameters()})
        if c.critic.adapter is None:
            out.update({f"critic_model/{n}": p for n, p in c.critic.model.named_parameters() if p.requires_grad})
    return out


def save(c: Any, run_dir: Path, step: int, config_yaml: str, keep_last: int, metrics: dict | None = None) -> Path:
    """Checkpoint the components after ``step`` completed steps; prune to ``keep_last``."""
    opt = c.optimizer.state_dict()
    opt_tensors = {f"{pid}.{k}": v for pid, s in opt["state"].items() for k, v in s.items()}
    np_state = np.random.get_state()
    state = {
        "step": step,
        "cursor": c.cursor,
        "algo": {"penalty_beta": c.state.penalty_beta, "kl_coef": c.state.kl_coef},
        "optimizer_param_groups": opt["param_groups"],
        "scheduler": c.scheduler.state_dict(),
        "python_rng": _py_state_to_json(random.getstate()),
        "numpy_rng": {"pos": int(np_state[2]), "has_gauss": int(np_state[3]), "cached": float(np_state[4])},
        "metrics": metrics or {},
    }
    rng = {
        "torch": torch.get_rng_state(),
        "shuffle": c.shuffle.get_state(),
        "numpy_keys": torch.from_numpy(np_state[1].astype(np.int64)),
    }
    tensors = {WEIGHTS: trainable_tensors(c), OPTIMIZER: opt_tensors, RNG: rng}
    extra = _peft_writer(c.policy.model) if c.policy.lora else None
    path = ckpt.write_checkpoint(run_dir / "checkpoints", step, tensors, {ckpt.STATE: state, CONFIG: config_yaml},
                                 extra)
    ckpt.prune(run_dir / "checkpoints", keep_last)
    return path


def _peft_writer(model: Any) -> Any:
    def write(tmp: Path) -> None:
        model.save_pretrained(tmp / "adapter", selected_adapters=["default"])

    return write


def load_weights(c: Any, path: Path) -> None:
    """Copy a checkpoint's trained tensors into the components (names must match exactly)."""
    saved = ckpt.read_tensors(path, WEIGHTS)
    own = trainable_tensors(c)
    missing, unexpected = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
    if missing or unexpected:
        raise ckpt.CheckpointError(
            f"checkpoint {path} does not fit this model: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    _copy_into(own, saved, path)


def load_policy_weights(model: Any, path: Path) -> None:
    """Copy a checkpoint's policy weights (not its critic's) into a model built like the trained one."""
    from rlft.models.critic import CRITIC_ADAPTER

    saved = {k.removeprefix("policy/"): v for k, v in ckpt.read_tensors(path, WEIGHTS).items()
             if k.startswith("policy/") and f".{CRITIC_ADAPTER}." not in k}
    own = dict(model.named_parameters())
    missing = sorted(set(saved) - set(own))
    if missing:
        raise ckpt.CheckpointError(f"checkpoint {path} does not fit this model: no parameter {missing[0]}")
    _copy_into({name: own[name] for name in saved}, saved, path)


def _copy_into(own: dict[str, Tensor], saved: dict[str, Tensor], path: Path) -> None:
    """``own[name] <- saved[name]`` for every name in ``own``, refusing a shape mismatch."""
    with torch.no_grad():
        for name, p in own.items():
            if saved[name].shape != p.shape:
                raise ckpt.CheckpointError(f"checkpoint {path}: {name} has shape {tuple(saved[name].shape)}, "
                                           f"model has {tuple(p.shape)}")
            p.copy_(saved[name])


def restore(c: Any, path: Path) -> dict[str, Any]:
    """Put the whole training state back; returns the trainer state JSON (``step``, ``metrics``, ...)."""
    load_weights(c, path)
    state = ckpt.read_json(path, ckpt.STATE)
    opt_tensors = ckpt.read_tensors(path, OPTIMIZER)
    opt_state: dict[int, dict[str, Tensor]] = {}
    for key, value in opt_tensors.items():
        pid, name = key.split(".", 1)
        opt_state.setdefault(int(pid), {})[name] = value
    c.optimizer.load_state_dict({"state": opt_state, "param_groups": state["optimizer_param_groups"]})
    c.scheduler.load_state_dict(state["scheduler"])
    c.cursor = int(state["cursor"])
    c.state.penalty_beta = float(state["algo"]["penalty_beta"])
    c.state.kl_coef = float(state["algo"]["kl_coef"])
    rng = ckpt.read_tensors(path, RNG)
    torch.set_rng_state(rng["torch"])
    c.shuffle.set_state(rng["shuffle"])
    n = state["numpy_rng"]
    np.random.set_state(("MT19937", rng["numpy_keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached"]))
    random.setstate(_py_state_from_json(state["python_rng"]))
    return state


def _py_state_to_json(s: tuple) -> list:
    return [s[0], list(s[1]), s[2]]


def _py_state_from_json(s: list) -> tuple:
    return (s[0], tuple(s[1]), s[2])


def config_changes(saved_yaml: str, current_yaml: str) -> tuple[list[str], list[str]]:
    """Keys whose values differ between two resolved configs, split into (harmful, harmless)."""
    import yaml

    old, new = _flatten(yaml.safe_load(saved_yaml) or {}), _flatten(yaml.safe_load(current_yaml) or {})
    diffs = [f"{k}: {old.get(k, '<unset>')} -> {new.get(k, '<unset>')}"
             for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    harmless = [d for d in diffs if d.startswith(HARMLESS)]
    return [d for d in diffs if d not in harmless], harmless


def check_compatible(path: Path, current_yaml: str) -> list[str]:
    """Fail when the config changed in a way that matters; return the harmless changes."""
    harmful, harmless = config_changes((path / CONFIG).read_text(), current_yaml)
    if harmful:
        shown = "; ".join(harmful[:4]) + (f"; and {len(harmful) - 4} more" if len(harmful) > 4 else "")
        raise ConfigError(
            f"cannot resume from {path}: the config changed in ways that change the run ({shown}); "
            "revert them or start a new run directory"
        )
    return harmless


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix.rstrip("."): d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}."))
    return out
