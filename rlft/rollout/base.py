"""The Sampler interface that every rollout backend implements."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    """Completions per prompt."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 32
    greedy: bool = False
    """Argmax decoding (ignores temperature/top_p/top_k)."""


@dataclass
class Generations:
    """Completions for a list of prompts, ``n`` per prompt, prompt-major order.

    Attributes:
        prompt_index: For each completion, the index of its prompt.
        completion_ids: Token ids of each completion, EOS included when generated.
        truncated: True when the completion hit max_new_tokens without EOS.
        logprobs: The sampler's own log-prob of each completion token, when it reports them.
    """

    prompt_index: list[int]
    completion_ids: list[list[int]]
    truncated: list[bool]
    logprobs: list[list[float]] | None = None

    @property
    def num_tokens(self) -> int:
        return sum(len(c) for c in self.completion_ids)


class Sampler(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Generations:
        """Sample ``params.n`` completions for each tokenized prompt."""
        ...

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        """Replace the named weights (base-model names) with the policy's current values."""
        ...


def build_sampler(cfg: Any, model: Any, tokenizer: Any, seed: int) -> Sampler:
    """The backend named by ``cfg.name`` (SamplerConfig), owning ``model`` for generation."""
    if cfg.name == "hf":
        from rlft.rollout.hf import HFSampler

        return HFSampler(model, tokenizer, seed)
    raise ValueError(f"sampler.name='{cfg.name}'; valid choices: hf")
