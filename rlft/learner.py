"""Log-probs and values of sampled tokens, and one update over a rollout batch."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from rlft.algorithms import KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES, LossNorm, masked_mean
from rlft.algorithms.losses import clipped_value_loss
from rlft.batch import RolloutBatch
from rlft.models.critic import Critic
from rlft.models.policy import Policy


def response_hidden(model: Any, batch: RolloutBatch) -> tuple[Tensor, Tensor]:
    """Final hidden states at the positions that predict each completion token.

    Args:
        model: A causal LM (plain or peft) exposing ``get_decoder``.
        batch: Uses ``input_ids`` (B, L), ``attention_mask``, ``resp_start`` and ``response_mask`` (B, T).

    Returns:
        ``hidden`` (B, T, H), taken at position resp_start - 1 + t, and ``targets`` (B, T), the
        completion tokens they predict (meaningful where the response mask is 1).
    """
    hidden = model.get_decoder()(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
    ).last_hidden_state
    b, seq_len, width = hidden.shape
    t_len = batch.response_mask.shape[1]
    pos = (batch.resp_start[:, None] - 1 + torch.arange(t_len)[None, :]).clamp(0, seq_len - 2)
    h = hidden.gather(1, pos.unsqueeze(-1).expand(b, t_len, width))
    return h, batch.input_ids.gather(1, pos + 1)


def _chunk_logprobs(lm_head: Any, hidden: Tensor, targets: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    logits = lm_head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    with torch.no_grad():
        entropy = lse - (torch.exp(logits - lse.unsqueeze(-1)) * logits).sum(-1)
    return logp, entropy


def token_logprobs(
    model: Any, batch: RolloutBatch, temperature: float, chunk_tokens: int = 2048
) -> tuple[Tensor, Tensor]:
    """Log-probs (and entropies) of each row's completion tokens under ``model``.

    Logits are computed only at completion positions, ``chunk_tokens`` positions at a
    time, and recomputed in backward, so the (B, T, V) logits never all exist at once.

    Args:
        model: A causal LM exposing ``get_decoder`` and ``get_output_embeddings``.
        batch: See :func:`response_hidden`.
        temperature: Sampling temperature; logits are divided by it.
        chunk_tokens: Positions per logits chunk.

    Returns:
        ``logp`` (B, T), with gradient when enabled, and detached ``entropy`` (B, T); both are
        meaningful only where the response mask is 1.
    """
    h, targets = response_hidden(model, batch)
    b, t_len, width = h.shape
    h, targets = h.reshape(b * t_len, width), targets.reshape(b * t_len)
    lm_head = model.get_output_embeddings()
    logps, ents = [], []
    for s in range(0, b * t_len, chunk_tokens):
        args = (lm_head, h[s : s + chunk_tokens], targets[s : s + chunk_tokens], temperature)
        if torch.is_grad_enabled():
            lp, ent = checkpoint(_chunk_logprobs, *args, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(*args)
        logps.append(lp)
        ents.append(ent)
    return torch.cat(logps).view(b, t_len), torch.cat(ents).view(b, t_len)


def critic_values(critic: Critic, batch: RolloutBatch) -> Tensor:
    """V at each response position (the state before each completion token). Returns (B, T)."""
    with critic.active() as model:
        h, _ = response_hidden(model, batch)
    return critic.head(h.float()).squeeze(-1)


def _per_row(policy: Policy, batch: RolloutBatch, micro: int, fn: Any) -> Tensor:
    out = torch.zeros_like(batch.response_mask)
    with torch.no_grad():
        for rows in torch.arange(batch.size).split(micro):
            sub = batch.select(rows)
            with policy.autocast():
                values = fn(sub)
            out[rows, : values.shape[1]] = values.float()
    return out


def batch_logprobs(policy: Policy, model: Any, batch: RolloutBatch, temperature: float, micro: int) -> Tensor:
    """``token_logprobs`` of every row, without gradient, ``micro`` rows at a time. Returns (B, T)."""
    return _per_row(policy, batch, micro, lambda sub: token_logprobs(model, sub, temperature)[0])


def batch_values(policy: Policy, critic: Critic, batch: RolloutBatch, micro: int) -> Tensor:
    """``critic_values`` of every row, without gradient. Returns (B, T)."""
    return _per_row(policy, batch, micro, lambda sub: critic_values(critic, sub))


def _policy_loss(
    policy: Policy, sub: RolloutBatch, algo: Any, temperature: float, norm: LossNorm
) -> tuple[Tensor, dict[str, Tensor]]:
    with policy.autocast():
        logp, entropy = token_logprobs(policy.model, sub, temperature)
    mask = sub.response_mask
    old = sub.old_logp if sub.old_logp is not None else logp.detach()
    pg, metrics = POLICY_LOSSES.get(algo.policy_loss)(logp, old, sub.advantages, mask, algo)
    if sub.sampler_logp is not None:
        # old is the learner's view of the rollout policy; the sampler computed the same tokens
        # with other kernels and precision.
        diff = (old - sub.sampler_logp).abs() * mask
        metrics["rollout/logp_abs_diff_mean"] = masked_mean(diff, mask)
        metrics["rollout/logp_abs_diff_max"] = diff.max()
        if algo.tis_cap > 0:
            weight = torch.exp(old - sub.sampler_logp).clamp(max=algo.tis_cap).detach()
            pg = pg * weight
            metrics["rollout/tis_weight_mean"] = masked_mean(weight, mask)
    per_token = pg
    if algo.beta > 0 and sub.ref_logp is not None:
        kl = KL_ESTIMATORS.get(algo.kl_estimator)(logp, sub.ref_logp)
        per_token = pg + algo.beta * kl
        metrics["kl"] = masked_mean(kl.detach(), mask)
    loss = LOSS_AGGREGATIONS.get(algo.loss_agg)(per_token, mask, norm)
    with torch.no_grad():
        # k3 estimate of KL(old || new) on the sampled tokens, for monitoring and early stopping.
        metrics["approx_kl"] = masked_mean(KL_ESTIMATORS.get("k3")(old, logp.detach()), mask)
        metrics["entropy"] = masked_mean(entropy, mask)
        metrics["pg_loss"] = masked_mean(pg.detach(), mask)
    return loss, metrics


def _value_loss(
    policy: Policy, critic: Critic, sub: RolloutBatch, algo: Any, norm: LossNorm
) -> tuple[Tensor, dict[str, Tensor]]:
    with policy.autocast():
        values = critic_values(critic, sub)
    mask = sub.response_mask
    per_token = clipped_value_loss(values, sub.values, sub.returns, algo.value_clip)
    loss = algo.vf_coef * LOSS_AGGREGATIONS.get(algo.loss_agg)(per_token, mask, norm)
    with torch.no_grad():
        metrics = {"value_loss": masked_mean(per_token.detach(), mask), "value/mean": masked_mean(values, mask)}
    return loss, metrics


def update_policy(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    batch: RolloutBatch,
    cfg: Any,
    generator: torch.Generator,
    critic: Critic | None = None,
    penalty_beta: float | None = None,
) -> dict[str, float]:
    """``ppo_epochs`` passes over the batch, ``num_mini_batches`` optimizer steps each.

    Args:
        policy: The policy to update in place.
        optimizer: Over the policy's (and the critic's) trainable parameters.
        scheduler: Stepped after each optimizer step (or None).
        batch: A rollout with ``advantages`` set (``old_logp``/``ref_logp``/``values``/``returns``
            when the algorithm needs them).
        cfg: The full Config.
        generator: Shuffles rows into mini-batches.
        critic: Trained on the clipped value loss alongside the policy (PPO).
        penalty_beta: Current PPO-Penalty coefficient (for ``policy_loss=kl_penalty``).

    Returns:
        Metrics averaged over micro-batches (weighted by their response tokens), plus
        ``loss`` (mean over optimizer steps), ``grad_norm``, ``lr`` and ``epochs_run``
        (fewer than ``ppo_epochs`` when early stopping cut the update short).
    """
    algo = cfg.algo
    if penalty_beta is not None:
        algo = dataclasses.replace(algo, penalty_beta=penalty_beta)
    sums: dict[str, float] = defaultdict(float)
    maxes: dict[str, float] = {}
    weight = 0.0
    losses, norms = [], []
    params = [p for group in optimizer.param_groups for p in group["params"]]
    epochs_run = 0
    for _ in range(algo.ppo_epochs):
        epochs_run += 1
        epoch_kl, epoch_tokens = 0.0, 0.0
        order = torch.randperm(batch.size, generator=generator)
        for mini in order.chunk(algo.num_mini_batches):
            mb_mask = batch.response_mask[mini]
            norm = LossNorm(float(len(mini)), float(mb_mask.sum()), float(cfg.sampler.max_new_tokens))
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for rows in mini.split(cfg.trainer.micro_batch_size):
                sub = batch.select(rows)
                loss, metrics = _policy_loss(policy, sub, algo, cfg.sampler.temperature, norm)
                loss.backward()
                if critic is not None:
                    v_loss, v_metrics = _value_loss(policy, critic, sub, algo, norm)
                    v_loss.backward()
                    loss = loss + v_loss
                    metrics.update(v_metrics)
                total += loss.item()
                tokens = float(sub.response_mask.sum())
                for k, v in metrics.items():
                    if k.endswith("_max"):
                        maxes[k] = max(maxes.get(k, 0.0), float(v))
                    else:
                        sums[k] += float(v) * tokens
                weight += tokens
                epoch_kl += float(metrics["approx_kl"]) * tokens
                epoch_tokens += tokens
            norms.append(_clip(params, cfg.optim.max_grad_norm))
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            losses.append(total)
        if algo.early_stop_kl > 0 and epoch_kl / max(epoch_tokens, 1.0) > algo.early_stop_kl:
            break
    out = {k: v / max(weight, 1.0) for k, v in sums.items() if not k.endswith("_max")}
    out.update({k: v for k, v in maxes.items()})
    out["loss"] = sum(losses) / len(losses)
    out["grad_norm"] = sum(norms) / len(norms)
    out["lr"] = optimizer.param_groups[0]["lr"]
    out["epochs_run"] = float(epochs_run)
    return out


def _clip(params: list[Tensor], max_norm: float) -> float:
    if max_norm > 0:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    grads = [p.grad.norm() for p in params if p.grad is not None]
    return float(torch.norm(torch.stack(grads))) if grads else 0.0


def build_optimizer(
    policy: Policy, cfg: Any, total_updates: int, critic: Critic | None = None
) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW (policy at ``optim.lr``, critic at ``algo.critic_lr``) with linear warm-up then a schedule."""
    o = cfg.optim
    groups = [{"params": policy.trainable_parameters(), "lr": o.lr}]
    if critic is not None:
        groups.append({"params": critic.parameters(), "lr": cfg.algo.critic_lr})
    opt = torch.optim.AdamW(groups, betas=tuple(o.betas), weight_decay=o.weight_decay)

    def factor(step: int) -> float:
        if o.warmup_steps > 0 and step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        if o.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - o.warmup_steps) / max(1, total_updates - o.warmup_steps))
        if o.schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)
