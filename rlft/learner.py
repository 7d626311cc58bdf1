"""Log-probs of sampled tokens and one policy update over a rollout batch."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from rlft.algorithms import KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES, LossNorm, masked_mean
from rlft.batch import RolloutBatch
from rlft.models.policy import Policy


def _chunk_logprobs(lm_head: Any, hidden: Tensor, targets: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    logits = lm_head(hidden).float() / temperature
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    with torch.no_grad():
        entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, entropy


def token_logprobs(
    model: Any, batch: RolloutBatch, temperature: float, chunk_tokens: int = 2048
) -> tuple[Tensor, Tensor]:
    """Log-probs (and entropies) of each row's completion tokens under ``model``.

    Logits are computed only at completion positions, ``chunk_tokens`` positions at a
    time, and recomputed in backward, so the (B, T, V) logits never all exist at once.

    Args:
        model: A causal LM (plain or peft) exposing ``get_decoder`` and ``get_output_embeddings``.
        batch: Uses ``input_ids`` (B, L), ``attention_mask``, ``resp_start``, ``response_mask`` (B, T).
        temperature: Sampling temperature; logits are divided by it.
        chunk_tokens: Positions per logits chunk.

    Returns:
        ``logp`` (B, T), with gradient when enabled, and detached ``entropy`` (B, T); both are
        meaningful only where the response mask is 1.
    """
    hidden = model.get_decoder()(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
    ).last_hidden_state
    b, seq_len, width = hidden.shape
    t_len = batch.response_mask.shape[1]
    # The token at position p is predicted from the hidden state at p - 1.
    pos = (batch.resp_start[:, None] - 1 + torch.arange(t_len)[None, :]).clamp(0, seq_len - 2)
    h = hidden.gather(1, pos.unsqueeze(-1).expand(b, t_len, width)).reshape(b * t_len, width)
    targets = batch.input_ids.gather(1, pos + 1).reshape(b * t_len)
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


@torch.no_grad()
def batch_logprobs(policy: Policy, model: Any, batch: RolloutBatch, temperature: float, micro: int) -> Tensor:
    """``token_logprobs`` of every row, without gradient, ``micro`` rows at a time. Returns (B, T)."""
    out = torch.zeros_like(batch.response_mask)
    for rows in torch.arange(batch.size).split(micro):
        sub = batch.select(rows)
        with policy.autocast():
            lp, _ = token_logprobs(model, sub, temperature)
        out[rows, : lp.shape[1]] = lp
    return out


def _micro_loss(
    policy: Policy, sub: RolloutBatch, cfg: Any, temperature: float, norm: LossNorm
) -> tuple[Tensor, dict[str, Tensor]]:
    algo = cfg.algo
    with policy.autocast():
        logp, entropy = token_logprobs(policy.model, sub, temperature)
    mask = sub.response_mask
    old = sub.old_logp if sub.old_logp is not None else logp.detach()
    pg, metrics = POLICY_LOSSES.get(algo.policy_loss)(logp, old, sub.advantages, mask, algo)
    per_token = pg
    if algo.beta > 0 and sub.ref_logp is not None:
        kl = KL_ESTIMATORS.get(algo.kl_estimator)(logp, sub.ref_logp)
        per_token = pg + algo.beta * kl
        metrics["kl"] = masked_mean(kl.detach(), mask)
    loss = LOSS_AGGREGATIONS.get(algo.loss_agg)(per_token, mask, norm)
    with torch.no_grad():
        # Approximate KL(old || new) with k3 on the sampled tokens, for monitoring/early stop.
        metrics["approx_kl"] = masked_mean(KL_ESTIMATORS.get("k3")(old, logp.detach()), mask)
        metrics["entropy"] = masked_mean(entropy, mask)
        metrics["pg_loss"] = masked_mean(pg.detach(), mask)
    return loss, metrics


def update_policy(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    scheduler: Any | None,
    batch: RolloutBatch,
    cfg: Any,
    generator: torch.Generator,
) -> dict[str, float]:
    """``ppo_epochs`` passes over the batch, ``num_mini_batches`` optimizer steps each.

    Args:
        policy: The policy to update in place.
        optimizer: Over ``policy.trainable_parameters()``.
        scheduler: Stepped after each optimizer step (or None).
        batch: A rollout with ``advantages`` set (and ``old_logp``/``ref_logp`` when needed).
        cfg: The full Config.
        generator: Shuffles rows into mini-batches.

    Returns:
        Metrics averaged over micro-batches (weighted by their response tokens), plus
        ``loss`` (mean over optimizer steps), ``grad_norm`` and ``lr``.
    """
    algo, temperature = cfg.algo, cfg.sampler.temperature
    sums: dict[str, float] = defaultdict(float)
    weight = 0.0
    losses, norms = [], []
    params = policy.trainable_parameters()
    for _ in range(algo.ppo_epochs):
        order = torch.randperm(batch.size, generator=generator)
        for mini in order.chunk(algo.num_mini_batches):
            mb_mask = batch.response_mask[mini]
            norm = LossNorm(float(len(mini)), float(mb_mask.sum()), float(cfg.sampler.max_new_tokens))
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for rows in mini.split(cfg.trainer.micro_batch_size):
                sub = batch.select(rows)
                loss, metrics = _micro_loss(policy, sub, cfg, temperature, norm)
                loss.backward()
                total += loss.item()
                tokens = float(sub.response_mask.sum())
                for k, v in metrics.items():
                    sums[k] += float(v) * tokens
                weight += tokens
            grad_norm = _clip(params, cfg.optim.max_grad_norm)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            losses.append(total)
            norms.append(grad_norm)
    out = {k: v / max(weight, 1.0) for k, v in sums.items()}
    out["loss"] = sum(losses) / len(losses)
    out["grad_norm"] = sum(norms) / len(norms)
    out["lr"] = optimizer.param_groups[0]["lr"]
    return out


def _clip(params: list[Tensor], max_norm: float) -> float:
    if max_norm > 0:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    grads = [p.grad.norm() for p in params if p.grad is not None]
    return float(torch.norm(torch.stack(grads))) if grads else 0.0


def build_optimizer(policy: Policy, cfg: Any, total_updates: int) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW over the trainable parameters with linear warm-up then constant/linear/cosine."""
    o = cfg.optim
    opt = torch.optim.AdamW(
        policy.trainable_parameters(), lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay
    )

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
