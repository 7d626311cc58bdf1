"""Rollouts with transformers' ``generate`` on the sampler's own copy of the weights."""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import Tensor

from rlft.rollout.base import Generations, SamplingParams


class HFSampler:
    """Batched group sampling with ``model.generate``.

    The sampler owns a plain (non-peft) model in the compute dtype; after each policy update
    the trainer pushes merged weights in with :meth:`load_weights`, as it would into vLLM.
    """

    def __init__(self, model: Any, tokenizer: Any, seed: int, max_batch: int = 128):
        self.model = model.eval().requires_grad_(False)
        self.tok = tokenizer
        self.eos = tokenizer.eos_token_id
        self.pad = tokenizer.pad_token_id
        self.max_batch = max_batch
        self.generator_seed = seed

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Generations:
        index: list[int] = []
        completions: list[list[int]] = []
        truncated: list[bool] = []
        per_call = max(1, self.max_batch // params.n)
        for start in range(0, len(prompts), per_call):
            chunk = prompts[start : start + per_call]
            out = self._generate_chunk(chunk, params)
            for j, row in enumerate(out):
                ids, cut = self._trim(row, params.max_new_tokens)
                index.append(start + j // params.n)
                completions.append(ids)
                truncated.append(cut)
        return Generations(index, completions, truncated)

    def _generate_chunk(self, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding: generation continues from the right edge
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        kwargs: dict[str, Any] = dict(
            max_new_tokens=params.max_new_tokens, num_return_sequences=params.n,
            pad_token_id=self.pad, eos_token_id=self.eos,
        )
        if params.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(
                do_sample=True, temperature=params.temperature, top_p=params.top_p,
                top_k=params.top_k if params.top_k > 0 else None,
            )
        seqs = self.model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        return seqs[:, width:].tolist()

    def _trim(self, row: list[int], max_new: int) -> tuple[list[int], bool]:
        if self.eos in row:
            return row[: row.index(self.eos) + 1], False
        return row[:max_new], True

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        for name, value in weights:
            self.model.get_parameter(name).copy_(value)
