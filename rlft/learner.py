"""Log-probs and values of sampled tokens, and one update over a rollout batch."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from rlft.algorithms import KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES, LossNorm, masked_mean
from rlft.algorithms.losses import clipped_value_loss
from rlft.batch import RolloutBatch
from rlft.distributed import SINGLE, DataParallel
from rlft.models.critic import Critic
from rlft.models.policy import Policy
from rlft.sharding import grad_norm_and_clip, is_sharded, lockstep_count


def response_hidden(model: Any, batch: RolloutBatch) -> tuple[Tensor, Tensor]:
    """Final hidden states at the positions that predict each completion token.

    Rows that share a prompt (the n samples of a group) share its computation: the distinct
    prompts run once, left-aligned to a common end, and their key/value cache is indexed out
    to every row before the completions run on top of it. Gradients flow through the shared
    cache back into the prompt pass, so the result equals a full forward of each row. Under
    gradient checkpointing (which cannot keep a cache) each row runs whole instead. Under FSDP2
    the completion pass runs even for one-token completions (its output then unused), so that
    every rank makes the same decoder calls.

    Args:
        model: A causal LM (plain or peft) exposing ``get_decoder``.
        batch: Uses ``input_ids`` (B, L), ``resp_start``, ``resp_len``, ``response_mask`` (B, T), ``host``.

    Returns:
        ``hidden`` (B, T, H): row b's state before completion token t; and ``targets`` (B, T),
        the completion tokens (meaningful where the response mask is 1).
    """
    if model.training and getattr(model, "is_gradient_checkpointing", False):
        return _whole_rows_hidden(model, batch)
    from transformers import DynamicCache

    decoder, dev = model.get_decoder(), batch.device
    prompt_ids, prompt_mask, slot = _distinct_prompts(batch)
    cache = DynamicCache()
    prompt_pos = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    last = decoder(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=prompt_pos,
                   past_key_values=cache, use_cache=True).last_hidden_state[:, -1]
    t_len = batch.response_mask.shape[1]
    targets = _targets(batch)
    first = last[slot].unsqueeze(1)
    width = max(t_len - 1, 1) if is_sharded(model) else t_len - 1
    if width == 0:
        return first, targets
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys[slot], layer.values[slot]
    mask = torch.cat([prompt_mask[slot], batch.response_mask[:, :width].long()], dim=1)
    pos = prompt_pos[slot, -1:] + 1 + torch.arange(width, device=dev)[None, :]
    rest = decoder(input_ids=targets[:, :width], attention_mask=mask, position_ids=pos, past_key_values=cache,
                   use_cache=True).last_hidden_state
    # [:, : t_len - 1] keeps an unused pass in the graph (zero gradient), so its backward runs too.
    return torch.cat([first, rest[:, : t_len - 1]], dim=1), targets


def _response_columns(batch: RolloutBatch) -> Tensor:
    """(B, T) column in ``input_ids`` of each completion token (clamped to the row width)."""
    t_len = batch.response_mask.shape[1]
    cols = batch.resp_start[:, None] + torch.arange(t_len, device=batch.device)[None, :]
    return cols.clamp(max=batch.input_ids.shape[1] - 1)


def _targets(batch: RolloutBatch) -> Tensor:
    return batch.input_ids.gather(1, _response_columns(batch))


def _whole_rows_hidden(model: Any, batch: RolloutBatch) -> tuple[Tensor, Tensor]:
    """``response_hidden`` by one forward over each whole row (prompt + completion, right-padded)."""
    ids, dev = batch.input_ids, batch.device
    ends = batch.resp_start + batch.resp_len
    attn = (torch.arange(ids.shape[1], device=dev)[None, :] < ends[:, None]).long()
    hidden = model.get_decoder()(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
    before = (_response_columns(batch) - 1).clamp(min=0)
    h = hidden.gather(1, before[..., None].expand(-1, -1, hidden.shape[-1]))
    return h, _targets(batch)


def _distinct_prompts(batch: RolloutBatch) -> tuple[Tensor, Tensor, Tensor]:
    """The distinct prompts, left-padded (P, Lp), their mask, and each row's prompt index (B,).

    Built from the host index (no wait for the device) and copied over without blocking.
    """
    index: dict[int, int] = {}
    slot = [index.setdefault(p, len(index)) for p in batch.host.prompt_of]
    prompts = [batch.host.prompts[p] for p in index]
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=batch.input_ids.dtype, device="cpu")
    mask = torch.zeros((len(prompts), width), dtype=torch.long, device="cpu")
    for k, p in enumerate(prompts):
        ids[k, width - len(p) :] = torch.tensor(p, device="cpu")
        mask[k, width - len(p) :] = 1
    dev = batch.device
    return (ids.to(dev, non_blocking=True), mask.to(dev, non_blocking=True),
            torch.tensor(slot, device="cpu").to(dev, non_blocking=True))


class _TokenLogProbs(torch.autograd.Function):
    """log_softmax(h W^T / temperature)[target] and the entropy at N positions, ``chunk`` rows at a time.

    Only the (N, H) hidden states and the (N,) log-normalizers are kept for backward, which
    recomputes one chunk of logits at a time and forms the gradient by hand:
    d logp / d logits = (onehot(target) - softmax) / temperature. The entropy is computed once,
    in forward (it carries no gradient).
    """

    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float,
                chunk: int) -> tuple[Tensor, Tensor]:
        n, dev = hidden.shape[0], hidden.device
        logp = torch.empty(n, dtype=torch.float32, device=dev)
        entropy = torch.empty(n, dtype=torch.float32, device=dev)
        lse = torch.empty(n, dtype=torch.float32, device=dev)
        for s in range(0, n, chunk):
            # One exp pass serves the normalizer, the target's log-prob and the entropy:
            # with z = logits - max, e = exp(z), S = sum(e): logp = z[target] - log S and
            # entropy = log S - sum(e z) / S. Each pass over (chunk, V) costs memory bandwidth.
            z = _logits(hidden[s : s + chunk], weight, temperature)
            top = z.amax(-1, keepdim=True)
            z.sub_(top)
            e = z.exp()
            total = e.sum(-1)
            log_total = total.log()
            lse[s : s + chunk] = top.squeeze(-1) + log_total
            logp[s : s + chunk] = z.gather(-1, targets[s : s + chunk, None]).squeeze(-1) - log_total
            entropy[s : s + chunk] = log_total - torch.bmm(e[:, None, :], z[:, :, None]).view(-1) / total
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, grad_logp: Tensor, grad_entropy: Tensor) -> tuple[Tensor | None, ...]:
        hidden, weight, targets, lse = ctx.saved_tensors
        t, chunk = ctx.temperature, ctx.chunk
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if ctx.needs_input_grad[1] else None
        rows = torch.arange(min(chunk, hidden.shape[0]), device=hidden.device)
        for s in range(0, hidden.shape[0], chunk):
            h, g = hidden[s : s + chunk], grad_logp[s : s + chunk].float()
            probs = _logits(h, weight, t).sub_(lse[s : s + chunk, None]).exp_()
            grad_logits = probs.mul_(-g[:, None] / t)
            grad_logits[rows[: len(g)], targets[s : s + chunk]] += g / t
            grad_logits = grad_logits.to(hidden.dtype)
            if grad_h is not None:
                grad_h[s : s + chunk] = grad_logits @ weight
            if grad_w is not None:
                grad_w += (grad_logits.t() @ h).float()
        return grad_h, grad_w.to(weight.dtype) if grad_w is not None else None, None, None, None


def _logits(hidden: Tensor, weight: Tensor, temperature: float) -> Tensor:
    logits = (hidden @ weight.t()).float()
    return logits.div_(temperature) if temperature != 1.0 else logits


def token_logprobs(
    model: Any, batch: RolloutBatch, temperature: float, chunk_tokens: int = 128
) -> tuple[Tensor, Tensor]:
    """Log-probs (and entropies) of each row's completion tokens under ``model``.

    Logits are computed only at the completion tokens (not at padding), ``chunk_tokens``
    positions at a time, and recomputed in backward, so the (B, T, V) logits never exist.

    Args:
        model: A causal LM exposing ``get_decoder`` and ``get_output_embeddings`` (no LM-head bias).
        batch: See :func:`response_hidden`.
        temperature: Sampling temperature; logits are divided by it.
        chunk_tokens: Positions per logits chunk.

    Returns:
        ``logp`` (B, T), with gradient when enabled, and detached ``entropy`` (B, T); both are
        0 where the response mask is 0.
    """
    h, targets = response_hidden(model, batch)
    b, t_len, width = h.shape
    valid = batch.response_mask.reshape(-1).nonzero().squeeze(-1)
    h, targets = h.reshape(b * t_len, width)[valid], targets.reshape(b * t_len)[valid]
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise NotImplementedError("LM heads with a bias are not supported")
    kind = h.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else h.dtype
    logp, entropy = _TokenLogProbs.apply(h.to(dtype), head.weight.to(dtype), targets, temperature, chunk_tokens)
    out_logp = torch.zeros(b * t_len, dtype=torch.float32, device=h.device).index_put((valid,), logp)
    out_ent = torch.zeros(b * t_len, dtype=torch.float32, device=h.device).index_put((valid,), entropy)
    return out_logp.view(b, t_len), out_ent.view(b, t_len)


def critic_values(critic: Critic, batch: RolloutBatch) -> Tensor:
    """V at each response position (the state before each completion token). Returns (B, T)."""
    with critic.active() as model:
        h, _ = response_hidden(model, batch)
    return critic.head(h.float()).squeeze(-1)


def by_length(batch: RolloutBatch, rows: Tensor, micro: int) -> tuple[Tensor, ...]:
    """``rows`` (host indices) in micro-batches of similar completion length, so each pads to little
    more than its own rows (prompts are short and shared within a micro-batch, so their padding matters less)."""
    lengths = torch.tensor(batch.host.resp_len, device="cpu")
    if rows.numel() == 0:  # a rank that holds none of the groups (torch's split would give one empty chunk)
        return ()
    return rows[torch.argsort(lengths[rows], stable=True)].split(micro)


def micro_batches(policy: Policy, batch: RolloutBatch, rows: Tensor, micro: int,
                  dp: DataParallel) -> list[Tensor | None]:
    """:func:`by_length`'s micro-batches, and under FSDP2 as many ``None`` after them as this rank
    runs fewer than another (each stands for :meth:`RolloutBatch.blank`: every rank makes the same passes)."""
    chunks: list[Tensor | None] = list(by_length(batch, rows, micro))
    if is_sharded(policy.model):
        chunks += [None] * (lockstep_count(len(chunks), dp) - len(chunks))
    return chunks


def _per_row(policy: Policy, batch: RolloutBatch, micro: int, fn: Any, dp: DataParallel) -> Tensor:
    out = torch.zeros_like(batch.response_mask)
    with torch.no_grad():
        for rows in micro_batches(policy, batch, torch.arange(batch.size, device="cpu"), micro, dp):
            with policy.autocast():
                values = fn(batch.select(rows) if rows is not None else batch.blank())
            if rows is not None:
                out[rows.to(out.device, non_blocking=True), : values.shape[1]] = values.float()
    return out


def batch_logprobs(policy: Policy, model: Any, batch: RolloutBatch, temperature: float, micro: int,
                   dp: DataParallel = SINGLE) -> Tensor:
    """``token_logprobs`` of every row, without gradient, ``micro`` rows at a time. Returns (B, T)."""
    return _per_row(policy, batch, micro, lambda sub: token_logprobs(model, sub, temperature)[0], dp)


def batch_values(policy: Policy, critic: Critic, batch: RolloutBatch, micro: int, dp: DataParallel = SINGLE) -> Tensor:
    """``critic_values`` of every row, without gradient. Returns (B, T)."""
    return _per_row(policy, batch, micro, lambda sub: critic_values(critic, sub), dp)


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
    dp: DataParallel = SINGLE,
) -> dict[str, float]:
    """``ppo_epochs`` passes over the batch, ``num_mini_batches`` optimizer steps each.

    Under data parallelism (``dp``) ``batch`` is this rank's slice of the global rollout (ranks
    in order); mini-batches are drawn from the global row order, each rank computes its rows'
    share of the globally normalised loss, and gradients, losses and metrics are summed over
    ranks, so every rank takes the step one process would take on the whole rollout.

    A mini-batch with nothing to learn from (see :meth:`_RowFacts.nothing_to_learn`) takes no optimizer step.
    With ``early_stop_kl``, the mean approx KL(old || new) of each mini-batch is checked after
    its forward pass and before its optimizer step, as in Spinning Up's PPO: past the threshold
    that step and all later ones of this rollout are dropped. The first step is never dropped
    (before it the policy is the old one, so its KL is 0 up to rounding).

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
        dp: The ranks (default: one process).

    Returns:
        Metrics averaged over micro-batches (weighted by their response tokens), plus
        ``loss`` (mean over optimizer steps), ``grad_norm``, ``lr``, ``epochs_run`` (fewer than
        ``ppo_epochs`` after early stopping), ``update/optimizer_steps`` and ``update/skipped``
        (1 when no mini-batch had anything to learn from, so nothing moved).
    """
    algo = cfg.algo
    if penalty_beta is not None:
        algo = dataclasses.replace(algo, penalty_beta=penalty_beta)
    # The update's one read of batch values (the rest stays on the device), gathered over ranks.
    rows, offset = _RowFacts.gather(_RowFacts.of(batch), dp)
    acc = _MetricSums()
    losses, norms = [], []
    params = [p for group in optimizer.param_groups for p in group["params"]]
    plain = [p for p in params if not isinstance(p, DTensor)]
    epochs_run = 0
    for _ in range(algo.ppo_epochs):
        epochs_run += 1
        order = torch.randperm(len(rows.signal), generator=generator, device="cpu")  # global host row indices
        stop = False
        for mini in (m.tolist() for m in order.chunk(algo.num_mini_batches)):
            if rows.nothing_to_learn(mini, algo, critic):
                continue
            norm = LossNorm(float(len(mini)), rows.tokens(mini), float(cfg.sampler.max_new_tokens))
            mine = [i - offset for i in mini if offset <= i < offset + batch.size]
            totals = _accumulate_gradients(policy, optimizer, batch, torch.tensor(mine, dtype=torch.long, device="cpu"),
                                           norm, cfg, algo, critic, acc, dp)
            dp.sum_gradients(plain)  # FSDP2 has already summed the sharded ones in backward
            loss, kl_sum, kl_tokens = dp.sum_(totals)
            kl = kl_sum / kl_tokens.clamp(min=1.0)
            # The one decision that needs a value back from the device before the next step.
            if algo.early_stop_kl > 0 and losses and float(kl) > algo.early_stop_kl:
                stop = True
                break
            norms.append(_clip(params, cfg.optim.max_grad_norm, dp))
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            losses.append(loss)
        if stop:
            break
    optimizer.zero_grad(set_to_none=True)  # gradients would otherwise hold device memory through the rollout
    out = acc.means(params[0].device, dp)
    out["loss"] = float(torch.stack(losses).mean()) if losses else 0.0
    out["grad_norm"] = float(torch.stack(norms).mean()) if norms else 0.0
    out["lr"] = optimizer.param_groups[0]["lr"]
    out["epochs_run"] = float(epochs_run)
    out["update/optimizer_steps"] = float(len(losses))
    out["update/skipped"] = 0.0 if losses else 1.0
    return out


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

    def nothing_to_learn(self, rows: list[int], algo: Any, critic: Critic | None) -> bool:
        """No loss token (all masked), or zero advantages on every one with no other term (KL to the
        reference, PPO-Penalty, a critic): the gradient is exactly 0, and an AdamW step would still
        move the weights (moments, decay)."""
        if self.tokens(rows) == 0:
            return True
        if critic is not None or algo.beta > 0 or algo.policy_loss == "kl_penalty":
            return False  # a KL term, PPO-Penalty's pull back to the old policy, or the value loss
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
    policy: Policy, optimizer: torch.optim.Optimizer, batch: RolloutBatch, mini: Tensor, norm: LossNorm, cfg: Any,
    algo: Any, critic: Critic | None, acc: _MetricSums, dp: DataParallel,
) -> Tensor:
    """Forward and backward over this rank's rows of one mini-batch (possibly none), micro-batch by
    micro-batch, into fresh gradients.

    Nothing is read back from the device here: metrics accumulate as device tensors.

    Returns:
        (3,): the rows' share of the mini-batch loss, their approx KL(old || new) summed over
        response tokens, and their response tokens.
    """
    optimizer.zero_grad(set_to_none=True)
    total = kl_sum = kl_tokens = torch.zeros((), device=policy.device)
    for rows in micro_batches(policy, batch, mini, cfg.trainer.micro_batch_size, dp):
        sub = batch.select(rows) if rows is not None else batch.blank()
        loss, metrics = _policy_loss(policy, sub, algo, cfg.sampler.temperature, norm)
        loss.backward()
        if critic is not None:
            v_loss, v_metrics = _value_loss(policy, critic, sub, algo, norm)
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
