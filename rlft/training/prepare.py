"""Between a rollout and its update: the mask, old/reference log-probs, values and advantages;
and after the update, the coefficients that adapt to it (PPO-Penalty's beta, the adaptive KL).

Under data parallelism each rank prepares its own rows (groups never span ranks, so group
statistics are local), while every batch-wide statistic (PPO's whitening, the KL that adapts a
coefficient, the logged means) is reduced over all ranks, so every rank takes the same decision.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from torch import Tensor

from rlft.algorithms import ADV_ESTIMATORS, KL_ESTIMATORS, AdvantageInputs
from rlft.algorithms.advantages import ppo_token_rewards
from rlft.algorithms.kl_control import adaptive_kl_coef, penalty_beta_update
from rlft.algorithms.masked import masked_moments, masked_sum
from rlft.parallel.distributed import SINGLE, DataParallel
from rlft.training.batch import RolloutBatch
from rlft.training.logprobs import batch_logprobs, batch_values

if TYPE_CHECKING:
    from rlft.config.schemas import Config
    from rlft.training.components import Components


def prepare_batch(c: Components, batch: RolloutBatch, cfg: Config) -> dict[str, float]:
    """Mask, old/reference log-probs and values (only what the algorithm needs), and advantages.

    ``c`` is the trainer's Components (policy, critic, adapted coefficients, ``dp``).
    """
    a, temp, micro = cfg.algo, cfg.sampler.temperature, cfg.trainer.micro_batch_size
    policy, dp = c.policy, c.dp
    t0 = time.perf_counter()
    if a.overlong_filter:
        batch.response_mask = batch.response_mask * (~batch.truncated).float()[:, None]
    unscored = ~batch.scores.isfinite()  # no reward function scored it (None): no loss, no group statistics
    if bool(unscored.any()):
        batch.response_mask = batch.response_mask * (~unscored).float()[:, None]
    if a.needs_old_logprobs:
        batch.old_logp = batch_logprobs(policy, policy.model, batch, temp, micro, dp)
    if a.needs_reference:
        with policy.reference() as ref:
            batch.ref_logp = batch_logprobs(policy, ref, batch, temp, micro, dp)
    token_rewards = None
    if c.critic is not None:
        batch.values = batch_values(policy, c.critic, batch, micro, dp)
    if a.uses_token_rewards:  # PPO, RLOO, REINFORCE++: the score on the last token, the KL penalty on each
        token_rewards = ppo_token_rewards(batch.scores.nan_to_num(0.0), batch.old_logp, batch.ref_logp, batch.response_mask,
                                          c.state.kl_coef)
    t1 = time.perf_counter()
    inputs = AdvantageInputs(batch.scores, batch.response_mask, batch.group_ids, token_rewards, batch.values,
                             reduce=dp.sum_)
    batch.advantages, batch.returns = ADV_ESTIMATORS.get(a.adv_estimator)(inputs, a)
    mean, var, count = masked_moments(batch.advantages, batch.response_mask, dp.sum_)
    out = {
        "time/logprob_s": t1 - t0,
        "adv/mean": float(mean),
        "adv/std": float(var.sqrt()) if count > 1 else 0.0,
        "response/loss_tokens": float(count),
    }
    if batch.ref_logp is not None and batch.old_logp is not None:
        seq_kl = ((batch.old_logp - batch.ref_logp) * batch.response_mask).sum(1)
        total, rows = dp.sum_floats([float(seq_kl.sum()), float(batch.size)])
        out["kl/seq_ref"] = total / max(rows, 1.0)
    if batch.values is not None:
        out["value/explained_var"] = explained_variance(batch.values, batch.returns, batch.response_mask, dp)
    return out


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor, dp: DataParallel = SINGLE) -> float:
    """1 - Var(R - V) / Var(R) over the masked tokens of every rank (1: perfect critic, <= 0: no
    better than a constant)."""
    _, var_r, n = masked_moments(returns, mask, dp.sum_)
    if n < 2 or var_r == 0:
        return 0.0
    return float(1.0 - masked_moments(returns - values, mask, dp.sum_)[1] / var_r)


def adapt_coefficients(c: Components, batch: RolloutBatch, cfg: Config, metrics: dict[str, float]) -> None:
    """After an update: PPO-Penalty's beta from the new KL(old || new), and the adaptive in-reward KL coef."""
    a, dp = cfg.algo, c.dp
    if a.uses_ppo_penalty:
        new_logp = batch_logprobs(c.policy, c.policy.model, batch, cfg.sampler.temperature,
                                  cfg.trainer.micro_batch_size, dp)
        per_token = KL_ESTIMATORS.get("k3")(batch.old_logp, new_logp)
        total, tokens = dp.sum_floats([float(masked_sum(per_token, batch.response_mask)),
                                       float(batch.response_mask.sum())])
        kl = total / max(tokens, 1.0)
        metrics["penalty_kl_after"] = kl
        c.state.penalty_beta = penalty_beta_update(c.state.penalty_beta, kl, a.penalty_target_kl)
    if a.adapts_kl_coef and "kl/seq_ref" in metrics:
        rows = dp.sum_floats([float(batch.size)])[0]
        c.state.kl_coef = adaptive_kl_coef(c.state.kl_coef, metrics["kl/seq_ref"], a.kl_target, int(rows),
                                           a.kl_horizon)
