"""Rollout batches as padded tensors."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor


@dataclass
class RolloutBatch:
    """One rollout, padded. Each row is prompt + completion, right-padded (positions start at 0).

    Attributes:
        input_ids: (B, L) prompt then completion tokens (padding after ``resp_start + resp_len``).
        resp_start: (B,) index in ``input_ids`` of each row's first completion token.
        resp_len: (B,) completion length in tokens.
        response_mask: (B, T) 1 on completion tokens that enter the loss.
        group_ids: (B,) prompt index; rows sharing it form a group.
        scores: (B,) sequence rewards.
        truncated: (B,) True where the completion hit the length cap without EOS.
        old_logp: (B, T) log-probs under the sampling policy (None: equal to the current ones).
        ref_logp: (B, T) log-probs under the reference (None: no KL term).
        advantages: (B, T).
        returns: (B, T).
        values: (B, T) critic values at rollout time (PPO).
        sampler_logp: (B, T) the sampler's own log-probs of the completion tokens (vLLM).
    """

    input_ids: Tensor
    resp_start: Tensor
    resp_len: Tensor
    response_mask: Tensor
    group_ids: Tensor
    scores: Tensor
    truncated: Tensor
    old_logp: Tensor | None = None
    ref_logp: Tensor | None = None
    advantages: Tensor | None = None
    returns: Tensor | None = None
    values: Tensor | None = None
    sampler_logp: Tensor | None = None

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: Tensor) -> RolloutBatch:
        """The given rows, with padding columns that no selected row uses trimmed off."""
        picked = {
            f.name: (v[rows] if isinstance(v := getattr(self, f.name), Tensor) else v) for f in fields(self)
        }
        sub = replace(self, **picked)
        t_len = max(1, int(sub.resp_len.max().item()))
        l_len = int((sub.resp_start + sub.resp_len).max().item())
        out = {}
        for f in fields(sub):
            v = getattr(sub, f.name)
            if f.name == "input_ids":
                out[f.name] = v[:, :l_len]
            elif isinstance(v, Tensor) and v.dim() == 2:
                out[f.name] = v[:, :t_len]
            else:
                out[f.name] = v
        return replace(sub, **out)


def pack(
    prompts: list[list[int]], completions: list[list[int]], pad_id: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Concatenate each prompt with its completion and right-pad.

    Args:
        prompts: Token ids per row.
        completions: Token ids per row (may be empty).
        pad_id: Padding token.

    Returns:
        ``input_ids`` (B, L), ``resp_start`` (B,), ``resp_len`` (B,), ``response_mask`` (B, T)
        with T the longest completion (at least 1).
    """
    b = len(prompts)
    seq_len = max(len(p) + len(c) for p, c in zip(prompts, completions))
    t_len = max(1, max(len(c) for c in completions))
    input_ids = torch.full((b, seq_len), pad_id, dtype=torch.long)
    response_mask = torch.zeros((b, t_len), dtype=torch.float32)
    resp_start = torch.zeros(b, dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        row = p + c
        input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        resp_start[i] = len(p)
        response_mask[i, : len(c)] = 1.0
    resp_len = torch.tensor([len(c) for c in completions], dtype=torch.long)
    return input_ids, resp_start, resp_len, response_mask
