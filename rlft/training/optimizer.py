"""The optimizer of a run: AdamW over the trainable parameters (the policy's, the critic's at its own rate), and
its learning-rate schedule (linear warm-up, then constant, linear or cosine)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from rlft.config.schemas import Config
    from rlft.config.schemas.trainer import OptimConfig
    from rlft.models.critic import Critic
    from rlft.models.policy import Policy


def build_optimizer(
    policy: Policy, cfg: Config, total_updates: int, critic: Critic | None = None
) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW (policy at ``optim.lr``, critic at ``algo.critic_lr``) with linear warm-up then a schedule."""
    groups = [{"params": policy.trainable_parameters(), "lr": cfg.optim.lr}]
    if critic is not None:
        groups.append({"params": critic.parameters(), "lr": cfg.algo.critic_lr})
    return adamw(groups, cfg.optim, total_updates)


def adamw(groups: list[dict[str, Any]], o: OptimConfig, total_updates: int) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW over parameter ``groups`` (each with its ``lr``) per OptimConfig ``o``, and its LR schedule:
    linear warm-up over ``o.warmup_steps``, then ``o.schedule`` over ``total_updates`` optimizer steps."""
    opt = torch.optim.AdamW(groups, betas=tuple(o.betas), weight_decay=o.weight_decay)

    def factor(step: int) -> float:
        if o.warmup_steps > 0 and step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        if o.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - o.warmup_steps) / max(1, total_updates - o.warmup_steps))
        if o.schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)
