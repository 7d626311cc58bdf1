"""Advantage estimators: fn(inputs, cfg) -> (advantages, returns), both (B, T)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rlft.algorithms.masked import Reduce, local, masked_whiten
from rlft.registry import Registry

if TYPE_CHECKING:
    from rlft.config.schemas.algo import AlgoConfig

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
        reduce: Sums a tensor over the data-parallel ranks (batch-wide statistics such as PPO's
            whitening must cover every rank's rows); identity in one process. Groups never span ranks.
    """

    scores: Tensor
    mask: Tensor
    group_ids: Tensor
    token_rewards: Tensor | None = None
    values: Tensor | None = None
    reduce: Reduce = local


def group_normalized_scores(scores: Tensor, group_ids: Tensor, norm_by_std: bool, eps: float) -> Tensor:
    """(R_i - mean(R_group)) / (std(R_group) + eps), std unbiased as in torch.std.

    Unscored samples (NaN scores) are left out of their group's mean and std and get 0; so does
    every member of a group with fewer than 2 scored samples.

    The statistics are taken in float64: a group of equal float32 scores then has its score as its
    exact mean, so every member gets exactly 0, as GRPO means. In float32 (or torch.mean) the mean
    of eight 1.2s is one rounding step off, and dividing that by (std + eps) ~ eps gave every
    member an advantage of +0.1.

    Args:
        scores: Shape (B,); NaN marks an unscored sample.
        group_ids: Shape (B,), integer group labels.
        norm_by_std: Divide by the group std (False: only centre, as Dr. GRPO).
        eps: Added to the std.

    Returns:
        Shape (B,), finite.
    """
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    scored = torch.isfinite(scores)
    values = torch.where(scored, scores, torch.zeros_like(scores)).double()
    zeros = torch.zeros(uniq.numel(), dtype=torch.float64, device=scores.device)
    counts = zeros.clone().index_add_(0, inverse, scored.double())
    means = zeros.clone().index_add_(0, inverse, values) / counts.clamp(min=1)
    centred = torch.where(scored, values - means[inverse], torch.zeros_like(values))
    if norm_by_std:
        sq = zeros.clone().index_add_(0, inverse, centred**2)
        std = torch.sqrt(sq / (counts - 1).clamp(min=1))
        centred = centred / (std[inverse] + eps)
    return torch.where(counts[inverse] >= 2, centred, torch.zeros_like(centred)).to(scores.dtype)


@ADV_ESTIMATORS.register("grpo")
def grpo(inputs: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, Tensor]:
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


def gae(token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation over each response's policy tokens.

    delta_t = r_t + gamma V_{t+1} - V_t and A_t = delta_t + gamma lam A_{t+1}, where t + 1 is the
    row's next token inside the mask (a multi-turn episode's environment tokens, outside it, are
    skipped: the policy takes no action there), and V and A past the last one are 0.

    Args:
        token_rewards: (B, T) per-token rewards.
        values: (B, T) critic values V_t.
        mask: (B, T) 1 on the policy's tokens (a prefix per row in one-turn rollouts).
        gamma: Discount.
        lam: GAE lambda.

    Returns:
        ``(advantages, returns)``, each (B, T), returns = advantages + values, zero outside the mask.
    """
    b, t_len = token_rewards.shape
    adv = torch.zeros_like(token_rewards)
    next_value = torch.zeros(b, dtype=token_rewards.dtype, device=token_rewards.device)
    next_adv = torch.zeros(b, dtype=token_rewards.dtype, device=token_rewards.device)
    for t in reversed(range(t_len)):
        m = mask[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam * next_adv
        adv[:, t] = a * m
        next_value = torch.where(m > 0, values[:, t], next_value)  # outside the mask: carried over
        next_adv = torch.where(m > 0, a, next_adv)
    returns = (adv + values) * mask
    return adv, returns


@ADV_ESTIMATORS.register("gae")
def gae_estimator(inputs: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, Tensor]:
    """PPO: GAE on per-token rewards and critic values, advantages whitened over the batch.

    Args:
        inputs: Uses ``token_rewards`` (B, T), ``values`` (B, T) and ``mask`` (B, T).
        cfg: AlgoConfig; reads ``gamma``, ``lam`` and ``whiten_advantages``.

    Returns:
        ``(advantages, returns)``, each (B, T); returns are not whitened.
    """
    if inputs.token_rewards is None or inputs.values is None:
        raise ValueError("the gae estimator needs token_rewards and values (a critic)")
    adv, returns = gae(inputs.token_rewards, inputs.values, inputs.mask, cfg.gamma, cfg.lam)
    if cfg.whiten_advantages:
        adv = masked_whiten(adv, inputs.mask, reduce=inputs.reduce)
    return adv, returns


def ppo_token_rewards(scores: Tensor, logp_old: Tensor, logp_ref: Tensor | None, mask: Tensor, kl_coef: float) -> Tensor:
    """InstructGPT per-token reward: -kl_coef (logp_old - logp_ref) on every token, score added on the last.

    Args:
        scores: (B,) sequence rewards.
        logp_old: (B, T) sampling-policy log-probs.
        logp_ref: (B, T) reference log-probs (None: no KL term).
        mask: (B, T) 1 on the policy's tokens (a prefix per row in one-turn rollouts).
        kl_coef: The KL penalty coefficient.

    Returns:
        (B, T) rewards, zero outside the mask; the score sits on each row's last token in the mask.
    """
    rewards = torch.zeros_like(mask, dtype=torch.float32)
    if logp_ref is not None and kl_coef != 0:
        rewards = -kl_coef * (logp_old - logp_ref) * mask
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, -1).amax(1).clamp(min=0)
    has_tokens = mask.sum(1) > 0
    rows = torch.arange(mask.shape[0], device=mask.device)
    rewards[rows[has_tokens], last[has_tokens]] += scores[has_tokens].to(rewards.dtype)
    return rewards


def soft_overlong_penalty(lengths: Tensor, max_len: int, cache_len: int) -> Tensor:
    """DAPO's soft overlong punishment R_len(y), added to the reward.

    0 if |y| <= L_max - L_cache; ((L_max - L_cache) - |y|) / L_cache up to L_max; -1 beyond.

    Args:
        lengths: (B,) completion lengths |y|.
        max_len: L_max.
        cache_len: L_cache (> 0).

    Returns:
        (B,) penalties in [-1, 0].
    """
    lengths = lengths.float()
    free = max_len - cache_len
    ramp = (free - lengths) / cache_len
    out = torch.where(lengths <= free, torch.zeros_like(lengths), ramp)
    return torch.where(lengths > max_len, torch.full_like(lengths, -1.0), out)


def informative_groups(scores: Tensor, group_ids: Tensor) -> Tensor:
    """DAPO dynamic sampling: which groups have rewards that are not all equal.

    Args:
        scores: (B,) rewards; NaN (unscored) members are ignored.
        group_ids: (B,) group labels.

    Returns:
        The sorted group labels whose scored members' rewards differ (0 < #correct < G).
    """
    keep = []
    for g in torch.unique(group_ids):
        s = scores[group_ids == g]
        s = s[torch.isfinite(s)]
        if s.numel() > 1 and bool((s != s[0]).any()):
            keep.append(int(g))
    return torch.tensor(keep, dtype=torch.long)
