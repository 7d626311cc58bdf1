"""The Sampler interface that every rollout backend implements."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from rlft.errors import ConfigError

if TYPE_CHECKING:
    from rlft.models import Policy


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
    seed: int | None = None
    """Seeds this call's sampling (None: continue the sampler's own random stream). The trainer
    derives it from the run seed and the data position, so a resumed run samples the same tokens."""
    prompt_seeds: tuple[int, ...] | None = None
    """One seed per prompt (overrides ``seed``): a prompt's completions then depend only on its seed
    and the weights, not on which other prompts share the call, so the rollout of a step is the same
    whether one process samples all prompts or each of N ranks samples its share. Completion j of
    a prompt seeded s is seeded s + j (:func:`completion_seeds`)."""


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


@runtime_checkable
class Sampler(Protocol):
    """What the trainer, evaluation and weight sync call on a rollout backend (hf.py, vllm.py)."""

    serves_adapter: bool
    """True: the sampler serves the policy's LoRA adapter on its own base weights, and a sync calls
    :meth:`load_adapter`; False: a sync pushes weights with :meth:`load_weights`."""

    dtype: torch.dtype
    """The dtype its weights are held and computed in (the sync check's tolerance depends on it)."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Generations:
        """Sample ``params.n`` completions for each tokenized prompt."""
        ...

    def score(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """Teacher-forced log-probs, at temperature 1, of each completion token given the prompt and the
        completion tokens before it, under the sampler's current weights (rlft.sync.verify compares
        them with the learner's)."""
        ...

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        """Replace the named weights (base-model names) with the policy's current values."""
        ...

    def read_served(self, names: list[str]) -> dict[str, tuple[Tensor, ...]]:
        """What the sampler serves of the named modules (base-model names), for the sync check's weight
        comparison (rlft/sync/served_weights.py): ``(columns,)`` of a merged weight, or ``(A, B)`` of a served
        adapter. Modules it cannot read are left out."""
        ...

    def load_adapter(self, model: Any) -> None:
        """Serve peft ``model``'s "default" adapter from now on (called only when :attr:`serves_adapter`)."""
        ...

    def sleep(self) -> None:
        """Give accelerator memory to the learner until the next call that samples or loads weights.
        The trainer calls it after each rollout."""
        ...


def completion_seeds(params: SamplingParams) -> list[int]:
    """Each completion's seed, prompt-major: s + j for completion j of a prompt seeded s, the seeds
    vLLM gives the n children of a seeded request (``vllm/v1/engine/parallel_sampling.py``), so
    prompt seeds must be at least n apart."""
    return [s + j for s in params.prompt_seeds or () for j in range(params.n)]


def stop_token_ids(generation_config: Any, tokenizer: Any) -> list[int]:
    """The tokens that end a completion, the same for every sampler and for evaluation: the
    tokenizer's EOS and every EOS of the model's generation config (chat models often list
    several, e.g. an end-of-turn token beside the end-of-text one)."""
    eos = getattr(generation_config, "eos_token_id", None)
    ids = {tokenizer.eos_token_id, *(eos if isinstance(eos, (list, tuple)) else [eos])}
    return sorted(i for i in ids if i is not None)


def sync_sampler(sampler: Sampler, policy: Policy) -> None:
    """Make ``sampler`` sample from ``policy``'s current weights: its adapter, when the sampler
    serves adapters, else only the weights that change (under LoRA: the adapted layers, merged)."""
    if sampler.serves_adapter:
        sampler.load_adapter(policy.model)
    else:
        sampler.load_weights(policy.sampler_weights())


def check_mergeable(policy: Policy, sampler: Sampler) -> None:
    """Refuse at start-up what a merged sync cannot serve: LoRA on an embedding the model ties to its LM head
    (the sampler's copy shares that tensor, so merging the adapter into its embedding moves its LM head too,
    which the learner's adapter leaves alone; the sync check stopped such runs at the first sync).

    Raises:
        ConfigError: that case, in one line with what to do.
    """
    if sampler.serves_adapter or not policy.lora:
        return
    head = policy.model.get_output_embeddings()
    tied = [n.rsplit(".", 1)[-1] for n, m in policy.model.named_modules() if getattr(m, "lora_embedding_A", None)
            and head is not None and m.get_base_layer().weight is head.weight]
    if tied:
        raise ConfigError(f"model.lora.target_modules has {tied[0]}, which this model ties to its LM head: a merged "
                          "sync would change the sampler's LM head as well; drop it from the targets")


def scratch_dir(prefix: str, in_ram: bool = False) -> str:
    """A temporary directory removed at exit; with ``in_ram``, in /dev/shm when there is one."""
    shm = "/dev/shm"
    where = shm if in_ram and os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    path = tempfile.mkdtemp(prefix=prefix, dir=where)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path
