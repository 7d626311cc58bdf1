"""Per-token estimators of KL(pi_theta || pi_ref) from sampled tokens: fn(logp, ref_logp) -> (B, T)."""

from __future__ import annotations

import torch
from torch import Tensor

from rlft.registry import Registry

KL_ESTIMATORS = Registry("KL estimator")


@KL_ESTIMATORS.register("k1")
def k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """logp - ref: unbiased, can be negative. Shapes (B, T)."""
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """0.5 (logp - ref)^2: biased, low variance. Shapes (B, T)."""
    return 0.5 * (logp - ref_logp) ** 2


@KL_ESTIMATORS.register("k3")
def k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """exp(ref - logp) - (ref - logp) - 1: unbiased and never negative (GRPO). Shapes (B, T)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1
