"""Log-probs and values of sampled tokens, without the (B, T, V) logits.

Rows sharing a prompt share its forward pass (:func:`response_hidden`), logits exist only at
completion tokens and a chunk at a time (:func:`token_logprobs`), and whole batches run in
micro-batches of similar completion length (:func:`batch_logprobs`, :func:`batch_values`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rlft.models.critic import Critic
from rlft.models.policy import Policy
from rlft.parallel.distributed import SINGLE, DataParallel
from rlft.parallel.fsdp import is_sharded, lockstep_count
from rlft.training.batch import RolloutBatch


def response_hidden(model: Any, batch: RolloutBatch, whole_rows: bool = False) -> tuple[Tensor, Tensor]:
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
        whole_rows: Run each row whole (as under gradient checkpointing), not the shared prompt pass.

    Returns:
        ``hidden`` (B, T, H): row b's state before completion token t; and ``targets`` (B, T),
        the completion tokens (meaningful where the response mask is 1).
    """
    if whole_rows or (model.training and getattr(model, "is_gradient_checkpointing", False)):
        return _whole_rows_hidden(model, batch)
    from transformers import DynamicCache  # transformers: seconds to import, only with a model

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
    # Attend to every completion token, not only those in the loss: an episode's environment tokens
    # (0 in the response mask) are context the policy's later turns were sampled after.
    written = torch.arange(width, device=dev)[None, :] < batch.resp_len[:, None]
    mask = torch.cat([prompt_mask[slot], written.long()], dim=1)
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
    in forward; it carries a gradient only with ``entropy_grad`` (the entropy bonus), in the same
    chunked backward: with p = softmax(z / T) and H = -sum p log p,
    dH / dz_j = -p_j (log p_j + H) / T.
    """

    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float,
                chunk: int, entropy_grad: bool = False) -> tuple[Tensor, Tensor]:
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
        if entropy_grad:
            ctx.save_for_backward(hidden, weight, targets, lse, entropy)
        else:
            ctx.save_for_backward(hidden, weight, targets, lse)
            ctx.mark_non_differentiable(entropy)
        ctx.temperature, ctx.chunk, ctx.entropy_grad = temperature, chunk, entropy_grad
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, grad_logp: Tensor, grad_entropy: Tensor | None) -> tuple[Tensor | None, ...]:
        hidden, weight, targets, lse = ctx.saved_tensors[:4]
        entropy = ctx.saved_tensors[4] if ctx.entropy_grad and grad_entropy is not None else None
        t, chunk = ctx.temperature, ctx.chunk
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if ctx.needs_input_grad[1] else None
        rows = torch.arange(min(chunk, hidden.shape[0]), device=hidden.device)
        for s in range(0, hidden.shape[0], chunk):
            h, g = hidden[s : s + chunk], grad_logp[s : s + chunk].float()
            if entropy is None:
                probs = _logits(h, weight, t).sub_(lse[s : s + chunk, None]).exp_()
                grad_logits = probs.mul_(-g[:, None] / t)
            else:
                grad_logits = _entropy_grad_logits(_logits(h, weight, t).sub_(lse[s : s + chunk, None]), g,
                                                   grad_entropy[s : s + chunk].float(), entropy[s : s + chunk], t)
            grad_logits[rows[: len(g)], targets[s : s + chunk]] += g / t
            grad_logits = grad_logits.to(hidden.dtype)
            if grad_h is not None:
                grad_h[s : s + chunk] = grad_logits @ weight
            if grad_w is not None:
                grad_w += (grad_logits.t() @ h).float()
        return grad_h, grad_w.to(weight.dtype) if grad_w is not None else None, None, None, None, None


def _entropy_grad_logits(logq: Tensor, g: Tensor, g_ent: Tensor, entropy: Tensor, t: float) -> Tensor:
    """The gradient of one chunk over the logits, but the target's one-hot term: from the log-probs,
    -g p / T, and from the entropy, -g_H p (log p + H) / T. ``logq`` (chunk, V), the log-softmax, is
    consumed."""
    probs = logq.exp()
    logq.add_(entropy[:, None]).mul_(probs).mul_(-g_ent[:, None] / t)  # dH/dz, times the entropy's upstream
    return logq.sub_(probs.mul_(g[:, None] / t))


def _logits(hidden: Tensor, weight: Tensor, temperature: float) -> Tensor:
    logits = (hidden @ weight.t()).float()
    return logits.div_(temperature) if temperature != 1.0 else logits


def token_logprobs(
    model: Any, batch: RolloutBatch, temperature: float, chunk_tokens: int = 128, entropy_grad: bool = False,
    whole_rows: bool = False,
) -> tuple[Tensor, Tensor]:
    """Log-probs (and entropies) of each row's completion tokens under ``model``.

    Logits are computed only at the completion tokens (not at padding), ``chunk_tokens``
    positions at a time, and recomputed in backward, so the (B, T, V) logits never exist.

    Args:
        model: A causal LM exposing ``get_decoder`` and ``get_output_embeddings`` (no LM-head bias).
        batch: See :func:`response_hidden`.
        temperature: Sampling temperature; logits are divided by it.
        chunk_tokens: Positions per logits chunk.
        entropy_grad: Give the entropy a gradient too (the entropy bonus), in the same chunked backward.
        whole_rows: One forward over each whole row instead of the shared prompt pass (the same values:
            for a single row, as the sync check's probe, one decoder call is cheaper than two).

    Returns:
        ``logp`` (B, T), with gradient when enabled, and ``entropy`` (B, T) of the distribution at
        ``temperature``, detached unless ``entropy_grad``; both are 0 where the response mask is 0.
    """
    h, targets = response_hidden(model, batch, whole_rows)
    b, t_len, width = h.shape
    valid = batch.response_mask.reshape(-1).nonzero().squeeze(-1)
    h, targets = h.reshape(b * t_len, width)[valid], targets.reshape(b * t_len)[valid]
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise NotImplementedError("LM heads with a bias are not supported")
    kind = h.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else h.dtype
    logp, entropy = _TokenLogProbs.apply(h.to(dtype), head.weight.to(dtype), targets, temperature, chunk_tokens,
                                         entropy_grad)
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
