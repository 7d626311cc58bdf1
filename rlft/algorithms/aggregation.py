"""Loss aggregation: fn(loss (B, T), mask (B, T), norm) -> scalar.

``norm`` carries the mini-batch totals, so that gradient accumulation over micro-batches
gives the same gradient as one pass over the whole mini-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rlft.algorithms.masked import masked_sum
from rlft.registry import Registry

LOSS_AGGREGATIONS = Registry("loss aggregation")


@dataclass
class LossNorm:
    """Totals over the whole mini-batch that a micro-batch's loss is divided by.

    Attributes:
        num_seqs: Sequences in the mini-batch.
        num_tokens: Response tokens (mask sum) in the mini-batch.
        max_tokens: The generation budget (sampler.max_new_tokens; x episode.max_turns in episodes), for Dr. GRPO.
    """

    num_seqs: float
    num_tokens: float
    max_tokens: float


@LOSS_AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(loss: Tensor, mask: Tensor, norm: LossNorm) -> Tensor:
    """GRPO: (1/G) sum_i (1/|o_i|) sum_t loss_{i,t}. Shapes (B, T) -> scalar."""
    per_seq = masked_sum(loss, mask, dim=1) / mask.sum(1).clamp(min=1)
    return per_seq.sum() / norm.num_seqs


@LOSS_AGGREGATIONS.register("token-mean")
def token_mean(loss: Tensor, mask: Tensor, norm: LossNorm) -> Tensor:
    """DAPO: (1 / sum_i |o_i|) sum_i sum_t loss_{i,t}. Shapes (B, T) -> scalar."""
    return masked_sum(loss, mask) / max(norm.num_tokens, 1.0)


@LOSS_AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(loss: Tensor, mask: Tensor, norm: LossNorm) -> Tensor:
    """Dr. GRPO: sum_i sum_t loss_{i,t} / (G * L_max), a constant normaliser. Shapes (B, T) -> scalar."""
    return masked_sum(loss, mask) / (norm.num_seqs * norm.max_tokens)
