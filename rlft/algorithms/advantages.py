"""Advantage estimators: fn(inputs, cfg) -> (advantages, returns), both (B, T)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rlft.registry import Registry

ADV_ESTIMATORS = Registry("advantage estimator")


@dataclass
class AdvantageInputs:
    """What an estimator may use; each estimator reads the fields it needs.

    Attributes:
        scores: Sequence-level rewards, shape (B,).
        mask: Response mask, shape (B, T).
        group_ids: Prompt index of each sequence, shape (B,); equal ids form a group.
        token_rewards: Per-token rewards, shape (B, T) (PPO: KL penalty plus score).
        values: Critic values, shape (B, T) (PPO).
    """

    scores: Tensor
    mask: Tensor
    group_ids: Tensor
    token_rewards: Tensor | None = None
    values: Tensor | None = None


def group_normalized_scores(scores: Tensor, group_ids: Tensor, norm_by_std: bool, eps: float) -> Tensor:
    """(R_i - mean(R_group)) / (std(R_group) + eps), std unbiased as in torch.std.

    Args:
        scores: Shape (B,).
        group_ids: Shape (B,), integer group labels.
        norm_by_std: Divide by the group std (False: only centre, as Dr. GRPO).
        eps: Added to the std.

    Returns:
        Shape (B,).
    """
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    n_groups = counts.numel()
    sums = torch.zeros(n_groups, dtype=scores.dtype).index_add_(0, inverse, scores)
    means = sums / counts
    centred = scores - means[inverse]
    if not norm_by_std:
        return centred
    sq = torch.zeros(n_groups, dtype=scores.dtype).index_add_(0, inverse, centred**2)
    std = torch.sqrt(sq / (counts - 1).clamp(min=1))
    return centred / (std[inverse] + eps)


@ADV_ESTIMATORS.register("grpo")
def grpo(inputs: AdvantageInputs, cfg: Any) -> tuple[Tensor, Tensor]:
    """GRPO outcome advantages: the group-normalized score on every response token.

    Args:
        inputs: Uses ``scores`` (B,), ``group_ids`` (B,), ``mask`` (B, T).
        cfg: AlgoConfig; reads ``norm_adv_by_std`` and ``adv_eps``.

    Returns:
        ``(advantages, returns)``, each (B, T), zero outside the mask.
    """
    adv = group_normalized_scores(inputs.scores.float(), inputs.group_ids, cfg.norm_adv_by_std, cfg.adv_eps)
    adv = adv[:, None] * inputs.mask
    return adv, adv
