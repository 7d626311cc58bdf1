"""Off-policy corrections for the sampler/learner mismatch:
fn(old_logp, sampler_logp, mask, low, high) -> (weight (B, T), metrics).

The sampler (vLLM) and the learner compute the same policy's log-probs with other kernels and
precision, so the tokens were drawn from pi_sampler while the loss assumes pi_old. Each function
turns the ratio rho = pi_old / pi_sampler (per token, its product over a sequence, or its
geometric mean over a sequence) into a detached weight that multiplies the per-token policy loss;
``[low, high]`` is the band it is clamped to (``*_tis``) or outside of which it becomes 0
(``*_mask``), as TRL's ``vllm_importance_sampling_mode``. Weights are 0 outside the mask. A
weight of 0 leaves the token in the loss aggregation's denominator (TRL, OpenRLHF; verl's
rejection removes it): the functions return weights and never change the mask.

The product of T token ratios has a log-variance T times a token's, so the same band drops more
of the long sequences (per-token log-ratio noise N(0, 0.05^2), band [0, 2]: 0.03% of 16-token
sequences, 27% of 512-token ones); the geometric mean exp(mean_t log rho_t) does not grow with
length (``seq_geo_*``).

Every log-ratio is clamped to [-20, 20] before exp (verl's safety bound), so that a token the
sampler gave -inf, or a long sequence's product, yields a finite weight instead of inf/NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlft.algorithms.masked import masked_mean
from rlft.registry import Registry

ROLLOUT_CORRECTIONS = Registry("rollout correction")

SAFETY_BOUND = 20.0


def token_ratio(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor) -> Tensor:
    """rho_t = exp(clamp(old - sampler, -20, 20)) per token; 1 outside the mask. Shapes (B, T)."""
    diff = torch.where(mask > 0, old_logp - sampler_logp, torch.zeros_like(old_logp))
    return torch.exp(diff.clamp(-SAFETY_BOUND, SAFETY_BOUND))


def sequence_ratio(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor) -> Tensor:
    """rho_i = exp(clamp(sum_t m_t (old - sampler), -20, 20)): the product of the token ratios over the
    sequence's masked tokens (not their geometric mean), broadcast to (B, T)."""
    diff = torch.where(mask > 0, old_logp - sampler_logp, torch.zeros_like(old_logp))
    seq = torch.exp(diff.sum(1).clamp(-SAFETY_BOUND, SAFETY_BOUND))
    return seq[:, None].expand_as(old_logp)


def geometric_ratio(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor) -> Tensor:
    """rho_i = exp(clamp(mean_t over the mask of (old - sampler), -20, 20)): the geometric mean of the
    sequence's token ratios (1 for a row without mask tokens), broadcast to (B, T)."""
    diff = torch.where(mask > 0, old_logp - sampler_logp, torch.zeros_like(old_logp))
    seq = torch.exp(masked_mean(diff, mask, dim=1).clamp(-SAFETY_BOUND, SAFETY_BOUND))
    return seq[:, None].expand_as(old_logp)


def _truncate(ratio: Tensor, mask: Tensor, low: float, high: float) -> tuple[Tensor, dict[str, Tensor]]:
    weight = ratio.clamp(low, high) * mask
    clipped = ((ratio < low) | (ratio > high)).float()
    return weight, {"rollout/is_weight_mean": masked_mean(weight, mask),
                    "rollout/is_clipped_frac": masked_mean(clipped, mask)}


def _mask(ratio: Tensor, mask: Tensor, low: float, high: float) -> tuple[Tensor, dict[str, Tensor]]:
    outside = (ratio < low) | (ratio > high)
    weight = torch.where(outside, torch.zeros_like(ratio), ratio) * mask
    return weight, {"rollout/is_weight_mean": masked_mean(weight, mask),
                    "rollout/is_masked_frac": masked_mean(outside.float(), mask)}


@ROLLOUT_CORRECTIONS.register("token_tis")
def token_tis(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, low: float,
              high: float) -> tuple[Tensor, dict[str, Tensor]]:
    """Token-level truncated IS: w_t = clamp(rho_t, low, high) (TRL ``token_truncate``; verl
    ``rollout_is=token``, which clamps above only, as ``low=0`` does).

    Args:
        old_logp: The learner's log-probs of the sampled tokens under the rollout policy, (B, T).
        sampler_logp: The sampler's log-probs of the same tokens, (B, T).
        mask: Response mask, (B, T).
        low, high: The band the ratio is clamped to.

    Returns:
        Detached weights (B, T) and metrics: ``rollout/is_weight_mean`` (mean weight over loss tokens),
        ``rollout/is_clipped_frac`` (share of loss tokens whose ratio was clamped).
    """
    return _truncate(token_ratio(old_logp, sampler_logp, mask).detach(), mask, low, high)


@ROLLOUT_CORRECTIONS.register("seq_tis")
def seq_tis(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, low: float,
            high: float) -> tuple[Tensor, dict[str, Tensor]]:
    """Sequence-level truncated IS: w_i = clamp(prod_t rho_t, low, high) on every token of sequence i
    (TRL ``sequence_truncate``; verl ``rollout_is=sequence``).

    Args: as :func:`token_tis`.

    Returns:
        Detached weights (B, T) and metrics: ``rollout/is_weight_mean``, ``rollout/is_clipped_frac``
        (share of loss tokens in sequences whose ratio was clamped: sequences weighted by length).
    """
    return _truncate(sequence_ratio(old_logp, sampler_logp, mask).detach(), mask, low, high)


@ROLLOUT_CORRECTIONS.register("token_mask")
def token_mask(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, low: float,
               high: float) -> tuple[Tensor, dict[str, Tensor]]:
    """IcePop's token masking: w_t = rho_t if low <= rho_t <= high, else 0 (Ring-1T's M(k; alpha, beta),
    alpha 0.5, beta 5; TRL ``token_mask``; verl's rejection ``token_k1`` with the ratio kept as weight).

    Args: as :func:`token_tis`.

    Returns:
        Detached weights (B, T) and metrics: ``rollout/is_weight_mean``, ``rollout/is_masked_frac``
        (share of loss tokens whose weight is 0).
    """
    return _mask(token_ratio(old_logp, sampler_logp, mask).detach(), mask, low, high)


@ROLLOUT_CORRECTIONS.register("seq_mask")
def seq_mask(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, low: float,
             high: float) -> tuple[Tensor, dict[str, Tensor]]:
    """Sequence masking (TRL's default ``sequence_mask``): w_i = rho_i if low <= rho_i <= high, else 0,
    with rho_i the product of the token ratios (exp of the summed log-ratio, as TRL; the geometric mean,
    verl's ``seq_mean_k1``, is :func:`seq_geo_mask`), on every token of sequence i.

    Args: as :func:`token_tis`.

    Returns:
        Detached weights (B, T) and metrics: ``rollout/is_weight_mean``, ``rollout/is_masked_frac``
        (share of loss tokens in dropped sequences: sequences weighted by length).
    """
    return _mask(sequence_ratio(old_logp, sampler_logp, mask).detach(), mask, low, high)


@ROLLOUT_CORRECTIONS.register("seq_geo_tis")
def seq_geo_tis(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, low: float,
                high: float) -> tuple[Tensor, dict[str, Tensor]]:
    """Sequence-level truncated IS on the geometric mean: w_i = clamp(exp(mean_t log rho_t), low, high) on
    every token of sequence i, the mean over the sequence's mask tokens (the length-independent form of
    :func:`seq_tis`; GSPO's sequence ratio, here between learner and sampler).

    Args: as :func:`token_tis`.

    Returns:
        Detached weights (B, T) and metrics: ``rollout/is_weight_mean``, ``rollout/is_clipped_frac``
        (share of loss tokens in sequences whose geometric-mean ratio was clamped).
    """
    return _truncate(geometric_ratio(old_logp, sampler_logp, mask).detach(), mask, low, high)


@ROLLOUT_CORRECTIONS.register("seq_geo_mask")
def seq_geo_mask(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, low: float,
                 high: float) -> tuple[Tensor, dict[str, Tensor]]:
    """Geometric-mean sequence masking with token-level TIS inside: sequence i is dropped (weight 0) when
    its geometric-mean ratio exp(mean_t log rho_t) leaves [low, high]; the tokens of a kept sequence get
    :func:`token_tis`'s weight clamp(rho_t, low, high). OpenRLHF's ``seq-mask-tis`` (which keeps rho_t
    unclamped) and verl's ``rollout_rs: seq_mean_k1`` with ``rollout_is: token`` (which weights the kept
    tokens as ``token_tis`` with ``low=0`` does, but also takes the dropped ones out of the denominator).

    Args: as :func:`token_tis`.

    Returns:
        Detached weights (B, T) and metrics: ``rollout/is_weight_mean``, ``rollout/is_masked_frac``
        (share of loss tokens in dropped sequences), ``rollout/is_clipped_frac`` (share of loss tokens in
        kept sequences whose token ratio was clamped).
    """
    geo = geometric_ratio(old_logp, sampler_logp, mask).detach()
    tok = token_ratio(old_logp, sampler_logp, mask).detach()
    dropped = (geo < low) | (geo > high)
    clipped = ~dropped & ((tok < low) | (tok > high))
    weight = torch.where(dropped, torch.zeros_like(tok), tok.clamp(low, high)) * mask
    return weight, {"rollout/is_weight_mean": masked_mean(weight, mask),
                    "rollout/is_masked_frac": masked_mean(dropped.float(), mask),
                    "rollout/is_clipped_frac": masked_mean(clipped.float(), mask)}
