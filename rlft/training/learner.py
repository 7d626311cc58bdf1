"""One update over a rollout batch: the policy and value losses, mini-batches, gradient
accumulation over micro-batches and ranks, and the optimizer step (the optimizer itself:
:mod:`rlft.training.optimizer`).

The log-probs and values the losses differentiate come from :mod:`rlft.training.logprobs`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from rlft.algorithms import KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES, ROLLOUT_CORRECTIONS, LossNorm, masked_mean
from rlft.algorithms.losses import clipped_value_loss
from rlft.config.validation import policy_budget
from rlft.models.critic import Critic
from rlft.models.policy import Policy
from rlft.parallel.distributed import SINGLE, DataParallel
from rlft.parallel.fsdp import grad_norm_and_clip
from rlft.training.batch import RolloutBatch
from rlft.training.logprobs import critic_values, micro_batches, token_logprobs
from rlft.training.prepare import adapt_coefficients, prepare_batch

if TYPE_CHECKING:
    from rlft.config.schemas import Config
    from rlft.config.schemas.algo import AlgoConfig
    from rlft.training.components import AlgoState, Components


def _policy_loss(
    policy: Policy, sub: RolloutBatch, algo: AlgoConfig, state: AlgoState, temperature: float, norm: LossNorm
) -> tuple[Tensor, dict[str, Tensor]]:
    bonus = algo.entropy_coef > 0
    with policy.autocast():
        logp, entropy = token_logprobs(policy.model, sub, temperature, entropy_grad=bonus)
    mask = sub.response_mask
    old = sub.old_logp if sub.old_logp is not None else logp.detach()
    pg, metrics = POLICY_LOSSES.get(algo.policy_loss)(logp, old, sub.advantages, mask, algo, state)
    if sub.sampler_logp is not None:
        # old is the learner's view of the rollout policy; the sampler computed the same tokens
        # with other kernels and precision.
        diff = (old - sub.sampler_logp).abs() * mask
        metrics["rollout/logp_abs_diff_mean"] = masked_mean(diff, mask)
        metrics["rollout/logp_abs_diff_max"] = diff.max()
        mode, low, high = algo.correction
        if mode != "none":
            weight, is_metrics = ROLLOUT_CORRECTIONS.get(mode)(old.detach(), sub.sampler_logp, mask, low, high)
            pg = pg * weight
            metrics.update(is_metrics)
    per_token = pg
    if algo.beta > 0 and sub.ref_logp is not None:
        kl = KL_ESTIMATORS.get(algo.kl_estimator)(logp, sub.ref_logp)
        per_token = pg + algo.beta * kl
        metrics["kl"] = masked_mean(kl.detach(), mask)
    if bonus:  # aggregation is linear: the same as subtracting coef x the aggregated entropy
        per_token = per_token - algo.entropy_coef * entropy
    loss = LOSS_AGGREGATIONS.get(algo.loss_agg)(per_token, mask, norm)
    with torch.no_grad():
        # k3 estimate of KL(old || new) on the sampled tokens, for monitoring and early stopping.
        metrics["approx_kl"] = masked_mean(KL_ESTIMATORS.get("k3")(old, logp.detach()), mask)
        metrics["entropy"] = masked_mean(entropy.detach(), mask)
        metrics["pg_loss"] = masked_mean(pg.detach(), mask)
    return loss, metrics


def _value_loss(
    policy: Policy, critic: Critic, sub: RolloutBatch, algo: AlgoConfig, norm: LossNorm
) -> tuple[Tensor, dict[str, Tensor]]:
    with policy.autocast():
        values = critic_values(critic, sub)
    mask = sub.response_mask
    per_token = clipped_value_loss(values, sub.values, sub.returns, algo.value_clip)
    loss = algo.vf_coef * LOSS_AGGREGATIONS.get(algo.loss_agg)(per_token, mask, norm)
    with torch.no_grad():
        metrics = {"value_loss": masked_mean(per_token.detach(), mask), "value/mean": masked_mean(values, mask)}
    return loss, metrics


def update_policy(c: Components, batch: RolloutBatch, cfg: Config) -> dict[str, float]:
    """``ppo_epochs`` passes over the batch, ``num_mini_batches`` optimizer steps each.

    Under data parallelism (``c.dp``) ``batch`` is this rank's slice of the global rollout (ranks
    in order); mini-batches are drawn from the global row order, each rank computes its rows'
    share of the globally normalised loss, and gradients, losses and metrics are summed over
    ranks, so every rank takes the step one process would take on the whole rollout.

    A mini-batch with nothing to learn from (see :meth:`_RowFacts.nothing_to_learn`) takes no optimizer step.
    With ``early_stop_kl``, the mean approx KL(old || new) of each mini-batch is checked after
    its forward pass and before its optimizer step, as in Spinning Up's PPO: past the threshold
    that step and all later ones of this rollout are dropped. The first step is never dropped
    (before it the policy is the old one, so its KL is 0 up to rounding).

    Args:
        c: The trainer's components. Updates ``c.policy`` (and ``c.critic``, trained on the clipped
            value loss alongside it, for PPO) in place with ``c.optimizer``, stepping ``c.scheduler``
            (if any) after each optimizer step; ``c.shuffle`` shuffles rows into mini-batches; the
            loss reads the adapted coefficients (PPO-Penalty's beta) from ``c.state``.
        batch: A rollout with ``advantages`` set (``old_logp``/``ref_logp``/``values``/``returns``
            when the algorithm needs them).
        cfg: The full Config.

    Returns:
        Metrics averaged over micro-batches (weighted by their response tokens), plus
        ``loss`` (mean over optimizer steps), ``grad_norm``, ``lr``, ``epochs_run`` (fewer than
        ``ppo_epochs`` after early stopping), ``update/optimizer_steps`` and ``update/skipped``
        (1 when no mini-batch had anything to learn from, so nothing moved).
    """
    algo, dp = cfg.algo, c.dp
    # The update's one read of batch values (the rest stays on the device), gathered over ranks.
    rows, offset = _RowFacts.gather(_RowFacts.of(batch), dp)
    acc = _MetricSums()
    losses: list[Tensor] = []
    norms: list[Tensor] = []
    params = [p for group in c.optimizer.param_groups for p in group["params"]]
    plain = [p for p in params if not isinstance(p, DTensor)]
    epochs_run = 0
    for epoch, mini in _shuffled_mini_batches(len(rows.signal), algo, c.shuffle):
        epochs_run = epoch
        if rows.nothing_to_learn(mini, algo):
            continue
        norm = LossNorm(float(len(mini)), rows.tokens(mini), float(policy_budget(cfg)))
        mine = torch.tensor([i - offset for i in mini if offset <= i < offset + batch.size], dtype=torch.long,
                            device="cpu")
        totals = _accumulate_gradients(c, batch, mine, norm, cfg, acc)
        dp.sum_gradients(plain)  # FSDP2 has already summed the sharded ones in backward
        loss, kl_sum, kl_tokens = dp.sum_(totals)
        kl = kl_sum / kl_tokens.clamp(min=1.0)
        # The one decision that needs a value back from the device before the next step.
        if algo.early_stop_kl > 0 and losses and float(kl) > algo.early_stop_kl:
            break
        norms.append(_clip(params, cfg.optim.max_grad_norm, dp))
        c.optimizer.step()
        if c.scheduler is not None:
            c.scheduler.step()
        losses.append(loss)
    c.optimizer.zero_grad(set_to_none=True)  # gradients would otherwise hold device memory through the rollout
    out = acc.means(params[0].device, dp)
    out.update(_step_metrics(c.optimizer, losses, norms, epochs_run))
    return out


def _shuffled_mini_batches(n_rows: int, algo: AlgoConfig, shuffle: torch.Generator) -> Iterator[tuple[int, list[int]]]:
    """``(epoch, global host row indices)`` of each mini-batch, epochs counted from 1. Each epoch's
    order is drawn when its first mini-batch is asked for, so an early stop draws no more."""
    for epoch in range(1, algo.ppo_epochs + 1):
        order = torch.randperm(n_rows, generator=shuffle, device="cpu")
        for mini in order.chunk(algo.num_mini_batches):
            yield epoch, mini.tolist()


def _step_metrics(optimizer: torch.optim.Optimizer, losses: list[Tensor], norms: list[Tensor],
                  epochs_run: int) -> dict[str, float]:
    return {
        "loss": float(torch.stack(losses).mean()) if losses else 0.0,
        "grad_norm": float(torch.stack(norms).mean()) if norms else 0.0,
        "lr": optimizer.param_groups[0]["lr"],
        "epochs_run": float(epochs_run),
        "update/optimizer_steps": float(len(losses)),
        "update/skipped": 0.0 if losses else 1.0,
    }


@dataclass
class _RowFacts:
    """Per-row loss tokens and whether the row carries a learning signal, read once per update."""

    tokens_per_row: list[float]
    signal: list[bool]

    @staticmethod
    def of(batch: RolloutBatch) -> _RowFacts:
        mask = batch.response_mask
        signal = (batch.advantages * mask).ne(0).any(1)
        both = torch.stack([mask.sum(1), signal.float()]).tolist()
        return _RowFacts(both[0], [bool(v) for v in both[1]])

    @staticmethod
    def gather(own: _RowFacts, dp: DataParallel) -> tuple[_RowFacts, int]:
        """Every rank's rows, in rank order, and where this rank's rows start among them."""
        parts = dp.all_gather(own)
        offset = sum(len(p.signal) for p in parts[: dp.rank])
        return _RowFacts([t for p in parts for t in p.tokens_per_row], [v for p in parts for v in p.signal]), offset

    def tokens(self, rows: list[int]) -> float:
        return float(sum(self.tokens_per_row[i] for i in rows))

    def nothing_to_learn(self, rows: list[int], algo: AlgoConfig) -> bool:
        """No loss token (all masked), or zero advantages on every one with no other term (KL to the
        reference, PPO-Penalty, a critic): the gradient is exactly 0, and an AdamW step would still
        move the weights (moments, decay)."""
        if self.tokens(rows) == 0:
            return True
        if algo.learns_from_zero_advantages:
            return False
        return not any(self.signal[i] for i in rows)


class _MetricSums:
    """Per-micro-batch metrics, summed on the device weighted by response tokens (``*_max`` keys:
    maximum), and read back once by :meth:`means`."""

    def __init__(self) -> None:
        self.sums: dict[str, Tensor] = {}
        self.maxes: dict[str, Tensor] = {}
        self.weight: Tensor | None = None

    def add(self, metrics: dict[str, Tensor], tokens: Tensor) -> None:
        for k, v in metrics.items():
            v = v.detach().float()
            if k.endswith("_max"):
                self.maxes[k] = torch.maximum(self.maxes[k], v) if k in self.maxes else v
            else:
                self.sums[k] = self.sums[k] + v * tokens if k in self.sums else v * tokens
        self.weight = tokens if self.weight is None else self.weight + tokens

    def means(self, device: torch.device, dp: DataParallel = SINGLE) -> dict[str, float]:
        """Token-weighted means over every rank's micro-batches (a rank that had none adds nothing).

        ``device``: where the reduced tensors live (the parameters'), also on a rank without rows, so
        that every rank's collective runs on the same backend.
        """
        keys, max_keys = sorted(self.sums), sorted(self.maxes)
        if dp.active:  # a metric may exist on some ranks only (a rank without rows, or without such rows)
            parts = dp.all_gather((keys, max_keys))
            keys = sorted({k for ks, _ in parts for k in ks})
            max_keys = sorted({k for _, ks in parts for k in ks})
        out: dict[str, float] = {}
        if keys:
            zero = torch.zeros((), device=device)
            weight = self.weight if self.weight is not None else zero
            sums = dp.sum_(torch.stack([self.sums.get(k, zero) for k in keys] + [weight]))
            out.update(zip(keys, (sums[:-1] / sums[-1].clamp(min=1.0)).tolist()))
        if max_keys:
            low = torch.full((), float("-inf"), device=device)
            maxes = dp.max_(torch.stack([self.maxes.get(k, low) for k in max_keys]))
            out.update(zip(max_keys, maxes.tolist()))
        return out


def _accumulate_gradients(
    c: Components, batch: RolloutBatch, mine: Tensor, norm: LossNorm, cfg: Config, acc: _MetricSums
) -> Tensor:
    """Forward and backward over this rank's rows ``mine`` of one mini-batch (possibly none),
    micro-batch by micro-batch, into fresh gradients.

    Nothing is read back from the device here: metrics accumulate as device tensors.

    Returns:
        (3,): the rows' share of the mini-batch loss, their approx KL(old || new) summed over
        response tokens, and their response tokens.
    """
    policy, algo = c.policy, cfg.algo
    c.optimizer.zero_grad(set_to_none=True)
    total = kl_sum = kl_tokens = torch.zeros((), device=policy.device)
    for rows in micro_batches(policy, batch, mine, cfg.trainer.micro_batch_size, c.dp):
        sub = batch.select(rows) if rows is not None else batch.blank()
        loss, metrics = _policy_loss(policy, sub, algo, c.state, cfg.sampler.temperature, norm)
        loss.backward()
        if c.critic is not None:
            v_loss, v_metrics = _value_loss(policy, c.critic, sub, algo, norm)
            v_loss.backward()
            loss = loss + v_loss
            metrics.update(v_metrics)
        if rows is None:
            continue  # a blank micro-batch: the same passes as another rank's, and nothing to count
        tokens = sub.response_mask.sum()
        acc.add(metrics, tokens)
        total = total + loss.detach()
        kl_sum = kl_sum + metrics["approx_kl"] * tokens
        kl_tokens = kl_tokens + tokens
    return torch.stack([total, kl_sum, kl_tokens])


def _clip(params: list[Tensor], max_norm: float, dp: DataParallel) -> Tensor:
    """The gradient norm (before clipping to ``max_norm``, when > 0), as a device tensor."""
    if any(isinstance(p, DTensor) for p in params):
        return grad_norm_and_clip(params, max_norm, dp)
    if max_norm > 0:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    grads = [p.grad for p in params if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else torch.zeros((), device=params[0].device)


def learn(c: Components, batch: RolloutBatch, cfg: Config) -> dict[str, float]:
    """A step's learning on its rollout batch: the old/reference log-probs, values and advantages, the update, the
    adapted coefficients; its metrics, ``time/update_s`` the update's (train_step's, and the one rlft check times)."""
    metrics = prepare_batch(c, batch, cfg)
    c.policy.model.train()
    t0 = time.perf_counter()
    metrics.update(update_policy(c, batch, cfg))
    if metrics["update/skipped"] == 0.0:
        adapt_coefficients(c, batch, cfg, metrics)
    metrics["time/update_s"] = time.perf_counter() - t0
    return metrics
