"""Masked reductions over (batch, tokens) tensors."""

from __future__ import annotations

import torch
from torch import Tensor


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` where ``mask`` is 1.

    Args:
        x: Values, shape (B, T).
        mask: 0/1 mask, shape (B, T).
        dim: Reduce over this dim only (None: all).
    """
    prod = x * mask
    return prod.sum() if dim is None else prod.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over the positions where ``mask`` is 1 (0 where the mask is empty)."""
    return masked_sum(x, mask, dim) / mask.sum(dim).clamp(min=1)


def masked_var(x: Tensor, mask: Tensor) -> Tensor:
    """Unbiased variance of the masked entries of ``x`` (scalar)."""
    n = mask.sum()
    mean = masked_mean(x, mask)
    return masked_sum((x - mean) ** 2, mask) / (n - 1).clamp(min=1)


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """Normalize the masked entries of ``x`` to mean 0, std 1; masked-out entries become 0."""
    mean = masked_mean(x, mask)
    return (x - mean) * torch.rsqrt(masked_var(x, mask) + eps) * mask
