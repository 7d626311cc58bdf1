"""Masked reductions over (batch, tokens) tensors."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

Reduce = Callable[[Tensor], Tensor]
"""Sums a tensor over the data-parallel ranks (in place, returning it); identity in one process."""


def local(t: Tensor) -> Tensor:
    """The reduction of one process: nothing to add."""
    return t


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


def masked_moments(x: Tensor, mask: Tensor, reduce: Reduce = local) -> tuple[Tensor, Tensor, Tensor]:
    """``(mean, unbiased variance, count)`` of the masked entries of ``x`` (float64 scalars), over every
    rank's entries when ``reduce`` sums over ranks (two passes, as one process computes them).

    Summed in float64, so that entries that are all equal have their value as their exact mean
    and a variance of exactly 0 (a float32 sum is off by rounding steps, which whitening
    would then blow up by 1/sqrt(eps))."""
    x, mask = x.double(), mask.double()
    sums = reduce(torch.stack([masked_sum(x, mask), mask.sum()]))
    mean = sums[0] / sums[1].clamp(min=1)
    sq = reduce(masked_sum((x - mean) ** 2, mask).reshape(1))[0]
    return mean, sq / (sums[1] - 1).clamp(min=1), sums[1]


def masked_var(x: Tensor, mask: Tensor, reduce: Reduce = local) -> Tensor:
    """Unbiased variance of the masked entries of ``x`` (scalar)."""
    return masked_moments(x, mask, reduce)[1]


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8, reduce: Reduce = local) -> Tensor:
    """Normalize the masked entries of ``x`` to mean 0, std 1 (over every rank's entries with
    ``reduce``); masked-out entries become 0."""
    mean, var, _ = masked_moments(x, mask, reduce)
    return ((x.double() - mean) * torch.rsqrt(var + eps) * mask).to(x.dtype)
