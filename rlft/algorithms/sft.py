"""The supervised loss: the negative log-likelihood of the assistant's tokens, fn(logp (B, T), mask (B, T),
step_tokens) -> scalar.

The mean is over every assistant token of the optimizer step, not of each micro-batch: a micro-batch's loss is its
tokens' summed NLL divided by the step's token count, so the gradients accumulated over micro-batches (and summed
over ranks) are the gradient of the step's token mean whatever the split. Averaging each micro-batch first weights a
token of a short micro-batch above one of a long one (the gradient-accumulation bug of 2024 in transformers).
"""

from __future__ import annotations

from torch import Tensor


def sft_loss(logp: Tensor, mask: Tensor, step_tokens: int) -> Tensor:
    """``-sum(logp * mask) / step_tokens``.

    Args:
        logp: (B, T) log-probs of each target token under the model.
        mask: (B, T) 1 where the token is the assistant's (trained), else 0.
        step_tokens: assistant tokens in the whole optimizer step (all micro-batches, all ranks), at least 1.
    """
    return -(logp * mask).sum() / max(int(step_tokens), 1)


def token_accuracy(argmax_hit: Tensor, mask: Tensor) -> tuple[int, int]:
    """``(hits, tokens)``: assistant tokens whose most likely token under the model was the target, and their
    count, for ``argmax_hit`` (B, T) bool and ``mask`` (B, T)."""
    m = mask.bool()
    return int((argmax_hit & m).sum()), int(m.sum())
