"""Critic-free REINFORCE-family estimators: RLOO, REINFORCE++ and REINFORCE++-baseline.

Each reads the per-token rewards (the score on the last response token, plus the in-reward KL
penalty ``-kl_reward_coef (logp_old - logp_ref)`` on every token when that coefficient is > 0),
as verl's ``compute_rloo_outcome_advantage``, ``compute_reinforce_plus_plus_outcome_advantage``
and ``compute_reinforce_plus_plus_baseline_outcome_advantage`` read ``token_level_rewards``.
Groups never span ranks (their statistics are local); the batch whitening of the REINFORCE++
pair sums its statistics over every rank through ``inputs.reduce``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rlft.algorithms.advantages import ADV_ESTIMATORS, AdvantageInputs, ppo_token_rewards
from rlft.algorithms.masked import masked_sum, masked_whiten

if TYPE_CHECKING:
    from rlft.config.schemas.algo import AlgoConfig


def token_rewards_of(inputs: AdvantageInputs) -> Tensor:
    """The per-token rewards the trainer built (score and in-reward KL), or, called without them,
    the score alone on each row's last response token. Shape (B, T), zero outside the mask."""
    if inputs.token_rewards is not None:
        return inputs.token_rewards.float()
    return ppo_token_rewards(inputs.scores.nan_to_num(0.0), None, None, inputs.mask, 0.0)


def sequence_rewards(inputs: AdvantageInputs) -> Tensor:
    """R_i = sum_t reward_{i,t} over the response (score plus the summed in-reward KL); NaN where
    the sample is unscored, so that group statistics leave it out. Shape (B,)."""
    summed = masked_sum(token_rewards_of(inputs), inputs.mask, dim=1)
    return torch.where(torch.isfinite(inputs.scores), summed, torch.full_like(summed, float("nan")))


def _group_sums(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per sample: its reward (0 if unscored, float64), whether it is scored, and its group's
    (count of scored members, sum of their rewards)."""
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    scored = torch.isfinite(rewards)
    values = torch.where(scored, rewards, torch.zeros_like(rewards)).double()
    zeros = torch.zeros(uniq.numel(), dtype=torch.float64, device=rewards.device)
    counts = zeros.clone().index_add_(0, inverse, scored.double())[inverse]
    sums = zeros.clone().index_add_(0, inverse, values)[inverse]
    return values, scored, torch.stack([counts, sums])


def leave_one_out(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """RLOO: A_i = R_i - mean_{j != i} R_j over the scored members of i's group.

    Taken in float64 (a group of equal rewards gets exactly 0). Unscored samples (NaN) get 0,
    and so does every member of a group with fewer than 2 scored samples (no other member to
    average: verl keeps R_i there, a signal with no baseline; config validation refuses
    ``sampler.n < 2`` for rloo, so only unscored samples can leave a group that small).

    Args:
        rewards: (B,) sequence rewards, NaN where unscored.
        group_ids: (B,) integer group labels.

    Returns:
        (B,) advantages in ``rewards``' dtype.
    """
    values, scored, (counts, sums) = _group_sums(rewards, group_ids)
    adv = values - (sums - values) / (counts - 1).clamp(min=1)
    return torch.where(scored & (counts >= 2), adv, torch.zeros_like(adv)).to(rewards.dtype)


def group_centred(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """REINFORCE++-baseline's first step: R_i - mean(R_group) over the scored members, float64.
    A group with one scored member keeps R_i (its baseline is 0, as verl sets for a group of
    one); unscored samples get 0. Shapes (B,) -> (B,)."""
    values, scored, (counts, sums) = _group_sums(rewards, group_ids)
    mean = torch.where(counts >= 2, sums / counts.clamp(min=1), torch.zeros_like(sums))
    return torch.where(scored, values - mean, torch.zeros_like(values)).to(rewards.dtype)


def discounted_returns(token_rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """G_t = sum_{k >= t} gamma^(k-t) reward_k over each response's policy tokens (returns-to-go), zero
    outside the mask.

    k runs over the tokens inside the mask: tokens outside it between two of the policy's (a multi-turn
    episode's environment tokens) are skipped and carry the return over, as :func:`gae` does (verl's
    loop resets it there). On one-turn rows (a prefix mask) both are verl's returns.

    Args:
        token_rewards: (B, T) per-token rewards (read only inside the mask).
        mask: (B, T) 1 on the policy's tokens.
        gamma: Discount.

    Returns:
        (B, T) returns.
    """
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        inside = mask[:, t] > 0
        running = torch.where(inside, token_rewards[:, t] + gamma * running, running)
        returns[:, t] = running * mask[:, t]
    return returns


@ADV_ESTIMATORS.register("rloo")
def rloo(inputs: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, Tensor]:
    """RLOO (Ahmadian et al. 2024): the leave-one-out advantage of the sequence reward on every
    response token (not whitened).

    Args:
        inputs: Uses ``scores``, ``group_ids``, ``mask`` and ``token_rewards`` (when given).
        cfg: Unused.

    Returns:
        ``(advantages, returns)``, each (B, T), zero outside the mask.
    """
    adv = leave_one_out(sequence_rewards(inputs), inputs.group_ids)[:, None] * inputs.mask
    return adv, adv


@ADV_ESTIMATORS.register("reinforce_pp")
def reinforce_pp(inputs: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu et al. 2025): discounted returns-to-go of the per-token rewards (the KL
    penalty is in them), whitened over every valid token of the batch (all ranks).

    Args:
        inputs: Uses ``mask``, ``token_rewards`` (or ``scores``) and ``reduce``.
        cfg: Reads ``gamma``.

    Returns:
        ``(advantages, returns)``, each (B, T); returns are not whitened.
    """
    returns = discounted_returns(token_rewards_of(inputs), inputs.mask, cfg.gamma)
    return masked_whiten(returns, inputs.mask, reduce=inputs.reduce), returns


@ADV_ESTIMATORS.register("reinforce_pp_baseline")
def reinforce_pp_baseline(inputs: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, Tensor]:
    """REINFORCE++-baseline (Hu et al. 2025): the sequence reward minus its group's mean, on every
    response token, then whitened over every valid token of the batch (all ranks).

    Args:
        inputs: Uses ``scores``, ``group_ids``, ``mask``, ``token_rewards`` (when given) and ``reduce``.
        cfg: Unused.

    Returns:
        ``(advantages, returns)``, each (B, T), zero outside the mask.
    """
    centred = group_centred(sequence_rewards(inputs), inputs.group_ids)[:, None] * inputs.mask
    adv = masked_whiten(centred, inputs.mask, reduce=inputs.reduce)
    return adv, adv
