"""The PPO critic: a scalar value head on the policy's base, through its own LoRA adapter."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from rlft.models.policy import Policy

if TYPE_CHECKING:
    from rlft.config.schemas.model import ModelConfig

CRITIC_ADAPTER = "critic"


@dataclass
class Critic:
    """V(s_t) for each response position.

    Attributes:
        model: Under LoRA, the policy's own peft model (the critic adapter is switched on for
            its forwards; no second copy of the base weights); otherwise a separate model.
        head: Linear(hidden, 1) in fp32.
        adapter: The peft adapter name, or None for a separate model.
    """

    model: Any
    head: nn.Linear
    adapter: str | None

    @contextlib.contextmanager
    def active(self) -> Iterator[Any]:
        """The model with the critic's weights in effect."""
        if self.adapter is None:
            yield self.model
            return
        self.model.set_adapter(self.adapter)
        try:
            yield self.model
        finally:
            self.model.set_adapter("default")
            _set_trainable(self.model, ("default", self.adapter))

    def parameters(self) -> list[Tensor]:
        own = [p for n, p in self.model.named_parameters() if self._owns(n)]
        return own + list(self.head.parameters())

    def _owns(self, name: str) -> bool:
        if self.adapter is None:
            return True
        return f".{self.adapter}." in name


def _set_trainable(model: Any, adapters: tuple[str, ...]) -> None:
    # peft's set_adapter freezes every adapter but the active one; both of ours keep training.
    for name, p in model.named_parameters():
        if any(f".{a}." in name for a in adapters):
            p.requires_grad_(True)


def build_critic(policy: Policy, cfg: ModelConfig, seed: int) -> Critic:
    """A critic for ``policy``: a second adapter under LoRA, else a copy of the base model."""
    hidden = policy.model.get_output_embeddings().weight.shape[1]
    with torch.random.fork_rng():
        torch.manual_seed(seed + 1)
        head = nn.Linear(hidden, 1)
        # V starts at 0: a random head gives values far from the returns, and whitened GAE
        # advantages would then be mostly critic noise in the first updates.
        nn.init.zeros_(head.weight)
        nn.init.zeros_(head.bias)
        head.to(policy.device)
        if policy.lora:
            from peft import LoraConfig  # peft imports transformers (seconds): only when a model is built

            lora = cfg.lora
            policy.model.add_adapter(
                CRITIC_ADAPTER,
                LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                           target_modules=list(lora.target_modules), task_type="CAUSAL_LM"),
            )
            policy.model.set_adapter("default")
            _set_trainable(policy.model, ("default", CRITIC_ADAPTER))
            policy.model.to(policy.device)  # the new adapter is created on the CPU
            return Critic(policy.model, head, CRITIC_ADAPTER)
    model = copy.deepcopy(policy.model)
    model.requires_grad_(True)
    return Critic(model, head, None)
