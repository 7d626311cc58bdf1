"""Policy losses: fn(logp, old_logp, advantages, mask, cfg, state) -> (loss (B, T), metrics).

``cfg`` is the AlgoConfig; ``state`` holds the coefficients adapted during training (the trainer's
AlgoState: ``penalty_beta``). The returned loss is per token, to be minimised; aggregation to a
scalar is separate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from rlft.algorithms.masked import masked_mean
from rlft.registry import Registry

if TYPE_CHECKING:
    from rlft.config.schemas.algo import AlgoConfig

POLICY_LOSSES = Registry("policy loss")


@POLICY_LOSSES.register("clip")
def clipped_surrogate(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: AlgoConfig, state: Any
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-Clip: -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), r = exp(logp - old_logp).

    Args:
        logp: Current policy log-probs of the sampled tokens, (B, T).
        old_logp: Sampling policy log-probs, (B, T), no gradient.
        advantages: (B, T).
        mask: Response mask, (B, T).
        cfg: AlgoConfig; reads ``clip_eps_low`` and ``clip_eps_high``.
        state: The adapted coefficients (unused).

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
        metrics = _token_clip_metrics((ratio < lo) & (advantages < 0), (ratio > hi) & (advantages > 0), ratio, mask)
    return loss, metrics


def _token_clip_metrics(low: Tensor, high: Tensor, ratio: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """``clip_frac/low``, ``clip_frac/high`` (shares of masked tokens where ``low``/``high`` hold) and
    ``ratio/mean`` over the masked tokens. Shapes (B, T)."""
    return {
        "clip_frac/low": masked_mean(low.float(), mask),
        "clip_frac/high": masked_mean(high.float(), mask),
        "ratio/mean": masked_mean(ratio, mask),
    }


@POLICY_LOSSES.register("kl_penalty")
def kl_penalty_surrogate(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: AlgoConfig, state: Any
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-Penalty: -(r A) + penalty_beta * KL(pi_old || pi_theta), KL per token as (r - 1) - log r.

    Args:
        logp, old_logp, advantages, mask: (B, T) as for ``clip``.
        cfg: Unused (its ``penalty_beta`` is only the starting value).
        state: Reads ``penalty_beta``, the current coefficient (adapted after each update).

    Returns:
        Per-token loss (B, T) and detached metrics (``ratio/mean``, ``penalty_kl``).
    """
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    kl = ratio - 1 - log_ratio
    loss = -ratio * advantages + state.penalty_beta * kl
    with torch.no_grad():
        metrics = {"ratio/mean": masked_mean(ratio, mask), "penalty_kl": masked_mean(kl, mask)}
    return loss, metrics


@POLICY_LOSSES.register("gspo")
def gspo_surrogate(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: AlgoConfig, state: Any
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO: a sequence-level ratio s_i = exp(mean_t (logp - old_logp)), clipped per sequence.

    Every token of sequence i carries -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i),
    so a per-sequence mean over tokens (``seq-mean-token-mean``) gives GSPO's objective.

    Args:
        logp, old_logp, advantages, mask: (B, T); advantages are constant along each row.
        cfg: Reads ``clip_eps_low`` and ``clip_eps_high``.
        state: Unused.

    Returns:
        Per-token loss (B, T) and detached metrics (``clip_frac/low``, ``clip_frac/high``, ``ratio/mean``).
    """
    n = mask.sum(1).clamp(min=1)
    seq_ratio = torch.exp(((logp - old_logp) * mask).sum(1) / n)  # (B,)
    seq_adv = (advantages * mask).sum(1) / n
    lo, hi = 1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high
    seq_loss = -torch.minimum(seq_ratio * seq_adv, torch.clamp(seq_ratio, lo, hi) * seq_adv)
    loss = seq_loss[:, None].expand_as(logp)
    with torch.no_grad():
        rows = (mask.sum(1) > 0).float()
        denom = rows.sum().clamp(min=1)
        metrics = {
            "clip_frac/low": (((seq_ratio < lo) & (seq_adv < 0)).float() * rows).sum() / denom,
            "clip_frac/high": (((seq_ratio > hi) & (seq_adv > 0)).float() * rows).sum() / denom,
            "ratio/mean": (seq_ratio * rows).sum() / denom,
        }
    return loss, metrics


@POLICY_LOSSES.register("cispo")
def cispo_surrogate(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: AlgoConfig, state: Any
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1): -sg(clip(r, 1 - eps_low, 1 + eps_high)) A logp, no PPO min.

    The clipped ratio is a detached weight, so every token keeps its gradient A grad(logp) (scaled
    by the weight); clipping bounds the weight instead of dropping the token. ``clip_eps_low >= 1``
    leaves the weight unbounded below (the paper's and TRL's choice).

    Args:
        logp, old_logp, advantages, mask: (B, T) as for ``clip``.
        cfg: Reads ``clip_eps_low`` and ``clip_eps_high``.
        state: Unused.

    Returns:
        Per-token loss (B, T) and detached metrics: ``clip_frac/low`` and ``clip_frac/high`` (share
        of masked tokens whose weight was clamped at 1 - eps_low or 1 + eps_high; their gradient is
        kept), ``ratio/mean``.
    """
    ratio = torch.exp(logp - old_logp).detach()
    lo, hi = max(1.0 - cfg.clip_eps_low, 0.0), 1.0 + cfg.clip_eps_high
    weight = torch.clamp(ratio, lo, hi)
    loss = -weight * advantages * logp
    return loss, _token_clip_metrics(ratio < lo, ratio > hi, ratio, mask)


@POLICY_LOSSES.register("gmpo")
def gmpo_surrogate(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: AlgoConfig, state: Any
) -> tuple[Tensor, dict[str, Tensor]]:
    """GMPO (Zhao et al. 2025): the geometric mean of the token ratios, clipped per token in log space.

    With A_i the row's advantage and d_t = logp - old_logp, each token's log-ratio is clipped
    pessimistically for the sign of A_i: c_t = sgn(A_i) min(sgn(A_i) d_t, sgn(A_i) clip(d_t, -eps_low,
    eps_high)); the sequence ratio is g_i = exp(mean_t c_t) and every token of row i carries -g_i A_i,
    so the per-sequence mean (``seq-mean-token-mean``) gives GMPO's (1/G) sum_i g_i A_i. Here
    ``clip_eps_low``/``clip_eps_high`` bound the log-ratio (the paper's 0.4: ratios in (e^-0.4, e^0.4)).

    Args:
        logp, old_logp, advantages, mask: (B, T); advantages are constant along each row.
        cfg: Reads ``clip_eps_low`` and ``clip_eps_high``.
        state: Unused.

    Returns:
        Per-token loss (B, T) and detached metrics: ``clip_frac/low`` (share of masked tokens whose
        gradient the clip removed: d < -eps_low with A < 0), ``clip_frac/high`` (d > eps_high with
        A > 0), ``ratio/mean`` (mean sequence ratio g_i over rows with tokens).
    """
    n = mask.sum(1).clamp(min=1)
    seq_adv = (advantages * mask).sum(1) / n
    sign = torch.sign(seq_adv)[:, None]
    log_ratio = logp - old_logp
    clipped = torch.clamp(log_ratio, -cfg.clip_eps_low, cfg.clip_eps_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped)
    seq_ratio = torch.exp((pessimistic * mask).sum(1) / n)
    loss = (-seq_ratio * seq_adv)[:, None].expand_as(logp)
    with torch.no_grad():
        rows = (mask.sum(1) > 0).float()
        metrics = {
            "clip_frac/low": masked_mean(((log_ratio < -cfg.clip_eps_low) & (sign < 0)).float(), mask),
            "clip_frac/high": masked_mean(((log_ratio > cfg.clip_eps_high) & (sign > 0)).float(), mask),
            "ratio/mean": (seq_ratio * rows).sum() / rows.sum().clamp(min=1),
        }
    return loss, metrics


def clipped_value_loss(values: Tensor, old_values: Tensor, returns: Tensor, clip_eps: float) -> Tensor:
    """PPO value loss per token: 0.5 max((V - R)^2, (clip(V, V_old - eps, V_old + eps) - R)^2).

    Args:
        values: (B, T) current critic values.
        old_values: (B, T) values at rollout time.
        returns: (B, T) GAE returns.
        clip_eps: Value clip range (0 or less: no clipping).

    Returns:
        (B, T) per-token loss.
    """
    unclipped = (values - returns) ** 2
    if clip_eps <= 0:
        return 0.5 * unclipped
    clipped = (old_values + torch.clamp(values - old_values, -clip_eps, clip_eps) - returns) ** 2
    return 0.5 * torch.maximum(unclipped, clipped)
