"""Policy losses: fn(logp, old_logp, advantages, mask, cfg) -> (loss (B, T), metrics).

The returned loss is per token, to be minimised; aggregation to a scalar is separate.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rlft.algorithms.masked import masked_mean
from rlft.registry import Registry

POLICY_LOSSES = Registry("policy loss")


@POLICY_LOSSES.register("clip")
def clipped_surrogate(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: Any
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-Clip: -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), r = exp(logp - old_logp).

    Args:
        logp: Current policy log-probs of the sampled tokens, (B, T).
        old_logp: Sampling policy log-probs, (B, T), no gradient.
        advantages: (B, T).
        mask: Response mask, (B, T).
        cfg: AlgoConfig; reads ``clip_eps_low`` and ``clip_eps_high``.

    Returns:
        Per-token loss (B, T) and detached metrics: ``clip_frac/low`` (share of masked tokens
        whose gradient is cut because r < 1 - eps_low with A < 0), ``clip_frac/high``
        (r > 1 + eps_high with A > 0), ``ratio/mean``.
    """
    ratio = torch.exp(logp - old_logp)
    lo, hi = 1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, lo, hi) * advantages
    loss = -torch.minimum(unclipped, clipped)
    with torch.no_grad():
        low = ((ratio < lo) & (advantages < 0)).float()
        high = ((ratio > hi) & (advantages > 0)).float()
        metrics = {
            "clip_frac/low": masked_mean(low, mask),
            "clip_frac/high": masked_mean(high, mask),
            "ratio/mean": masked_mean(ratio, mask),
        }
    return loss, metrics
