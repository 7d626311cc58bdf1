"""Rollout batches as padded tensors."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch
from torch import Tensor


@dataclass(frozen=True)
class HostIndex:
    """What decides a batch's shapes, kept in host memory so that reading it never waits for the device.

    Attributes:
        resp_start: Per row, as ``RolloutBatch.resp_start``.
        resp_len: Per row, as ``RolloutBatch.resp_len``.
        prompt_of: Per row, its prompt's index in ``prompts``.
        prompts: The distinct prompts' token ids (shared by every selection of the batch).
    """

    resp_start: list[int]
    resp_len: list[int]
    prompt_of: list[int]
    prompts: list[tuple[int, ...]]

    @staticmethod
    def of(input_ids: Tensor, resp_start: Tensor, resp_len: Tensor) -> HostIndex:
        starts, ids = resp_start.tolist(), input_ids.tolist()
        index: dict[tuple[int, ...], int] = {}
        prompt_of = [index.setdefault(tuple(row[:s]), len(index)) for row, s in zip(ids, starts)]
        return HostIndex(starts, resp_len.tolist(), prompt_of, list(index))

    def select(self, rows: list[int]) -> HostIndex:
        return HostIndex([self.resp_start[i] for i in rows], [self.resp_len[i] for i in rows],
                         [self.prompt_of[i] for i in rows], self.prompts)


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
        host: The lengths and prompts in host memory (built from the tensors when not given).

    The tensors live on one device (the learner's, see :meth:`to`); row indices passed to
    :meth:`select` are host tensors, as the shuffler and :func:`rlft.training.logprobs.by_length` make them.
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
    host: HostIndex | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.host is None:
            self.host = HostIndex.of(self.input_ids, self.resp_start, self.resp_len)

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    def to(self, device: torch.device | str) -> RolloutBatch:
        """The batch with every tensor on ``device`` (the host index stays in host memory)."""
        # Host-to-device copies need not block; a device-to-host one must finish before it is read.
        moved = {f.name: v.to(device, non_blocking=v.device.type == "cpu")
                 for f in fields(self) if isinstance(v := getattr(self, f.name), Tensor)}
        return replace(self, **moved)

    def select(self, rows: Tensor) -> RolloutBatch:
        """The given rows (a host tensor of indices), with padding columns no selected row uses trimmed off."""
        if rows.dtype == torch.bool or rows.is_floating_point():
            raise TypeError("RolloutBatch.select takes integer row indices (a mask: mask.nonzero().squeeze(-1))")
        host = self.host.select(rows.tolist())
        t_len = max(1, max(host.resp_len, default=1))  # no rows: a rank that holds none of the groups
        l_len = max((s + n for s, n in zip(host.resp_start, host.resp_len)), default=1)
        on_device = rows.to(self.device, non_blocking=True)
        out: dict[str, object] = {"host": host}
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, Tensor):
                continue
            v = v[on_device]
            if f.name == "input_ids":
                v = v[:, :l_len]
            elif v.dim() == 2:
                v = v[:, :t_len]
            out[f.name] = v
        return replace(self, **out)

    def blank(self) -> RolloutBatch:
        """One row that enters no loss (response mask 0), with this batch's loss inputs set to 0 and
        the log-prob ones to None: a rank with fewer micro-batches than another runs it under FSDP2,
        so that every rank makes the same passes (its gradient is exactly 0)."""
        dev, out = self.device, {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor) and f.name not in ("old_logp", "ref_logp", "sampler_logp"):
                out[f.name] = torch.zeros((1, 1) if v.dim() == 2 else (1,), dtype=v.dtype, device=dev)
            elif isinstance(v, Tensor):
                out[f.name] = None
        out["input_ids"] = torch.zeros((1, 2), dtype=self.input_ids.dtype, device=dev)
        out["resp_start"] = torch.ones(1, dtype=self.resp_start.dtype, device=dev)
        out["resp_len"] = torch.ones(1, dtype=self.resp_len.dtype, device=dev)
        return replace(self, **out, host=HostIndex([1], [1], [0], [(0,)]))


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
