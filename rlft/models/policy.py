"""The trainable policy: base model plus LoRA adapter (or full weights) and its reference."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from rlft.models.device import autocast
from rlft.models.loading import DTYPES, load_base
from rlft.parallel.fsdp import sharded_layers

if TYPE_CHECKING:
    from rlft.config.schemas.model import LoraConfig, ModelConfig


@dataclass
class Policy:
    """What the learner trains.

    Attributes:
        model: The trainable module (a peft model under LoRA).
        tokenizer: Its tokenizer.
        compute_dtype: Autocast dtype for forward passes.
        lora: Whether ``model`` is a LoRA-wrapped base.
        ref_model: Frozen copy for full fine-tuning with a KL term (None under LoRA,
            where the reference is the base with the adapter disabled).
        device: Where the model (and everything the learner builds) lives.
    """

    model: Any
    tokenizer: Any
    compute_dtype: torch.dtype
    lora: bool
    ref_model: Any | None = None
    device: torch.device = torch.device("cpu")

    def autocast(self) -> Any:
        return autocast(self.device, self.compute_dtype)

    @contextlib.contextmanager
    def reference(self) -> Iterator[Any]:
        """Yields the reference model: the base with the adapter off, or the frozen copy."""
        if self.lora:
            with self.model.disable_adapter():
                yield self.model
        else:
            assert self.ref_model is not None, "full fine-tuning keeps a reference copy only when algo.beta > 0"
            yield self.ref_model

    def trainable_parameters(self) -> list[Tensor]:
        """The policy's own trainable weights (under LoRA: the default adapter, not a critic's)."""
        if self.lora:
            # ".default." inside linear layers' names (lora_A.default.weight), ".default" at the end of an
            # embedding's (lora_embedding_A.default): its adapter was left out of the optimizer before.
            return [p for n, p in self.model.named_parameters()
                    if "lora_" in n and (".default." in n or n.endswith(".default"))]
        return [p for p in self.model.parameters() if p.requires_grad]

    def sampler_weights(self) -> Iterator[tuple[str, Tensor]]:
        """Weights a sampler must load to match the policy, named as in the base model.

        Under LoRA only the adapted layers change: each yields base + (B A) * scale, merged
        here in fp32 so the base weights are never modified.
        """
        if not self.lora:
            for name, p in self.model.named_parameters():
                yield name, p.detach()
            return
        from peft.tuners.lora import LoraLayer  # peft imports transformers (seconds): only with a model

        # Under FSDP2 each decoder layer is gathered whole while its weights are read (every rank
        # reads them, in the same order), then freed again.
        units = set(sharded_layers(self.model))
        gathered = None
        for name, module in self.model.named_modules():
            if module in units:
                if gathered is not None:
                    gathered.reshard()
                module.unshard()
                gathered = module
            if isinstance(module, LoraLayer):
                base = module.get_base_layer().weight
                delta = module.get_delta_weight("default")
                yield base_name(name) + ".weight", base.detach().float() + delta.detach().float()
        if gathered is not None:
            gathered.reshard()


def base_name(peft_name: str) -> str:
    return peft_name.removeprefix("base_model.model.")


def wrap_lora(base: Any, cfg: LoraConfig) -> Any:
    """``base`` with a fresh LoRA adapter named "default" per LoraConfig ``cfg``."""
    from peft import LoraConfig, get_peft_model  # peft imports transformers (seconds): only with a model

    return get_peft_model(
        base,
        LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(cfg.target_modules),
                   task_type="CAUSAL_LM"),
    )


def _keep_activation_dtype(model: Any) -> None:
    """peft casts each LoRA layer's input to the adapter's fp32 dtype, and autocast casts it straight
    back to bf16: two activation copies per layer for nothing. Autocast alone handles the dtypes."""
    from peft.tuners.lora import LoraLayer  # peft imports transformers (seconds): only with a model

    for module in model.modules():
        if isinstance(module, LoraLayer):
            module.cast_input_dtype_enabled = False


def build_policy(cfg: ModelConfig, seed: int, need_reference: bool,
                 device: torch.device | str = "cpu") -> tuple[Policy, Any]:
    """Load the base model and wrap it for training on ``device``.

    Args:
        cfg: ModelConfig.
        seed: Seeds the random init of adapters (and of the tiny model).
        need_reference: Keep a frozen reference (only matters for full fine-tuning).
        device: Where the policy (and its reference) lives.

    Returns:
        The policy, and a plain copy of the base model, on the CPU, for a sampler to own
        (the hf sampler moves it to its device; vLLM loads its own).
    """
    compute = DTYPES[cfg.dtype]
    lora = cfg.lora.enabled
    device = torch.device(device)
    # Under LoRA the frozen base can live in the compute dtype; full fine-tuning keeps fp32 masters.
    base, tok = load_base(cfg, compute if lora else torch.float32, seed, device)
    sampler_copy = copy.deepcopy(base).to(compute)
    if cfg.gradient_checkpointing:
        # Non-reentrant: works with frozen inputs (LoRA) and keyword arguments.
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    base.to(device)
    ref_model = None
    if lora:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = wrap_lora(base, cfg.lora)
        if compute != torch.float32:
            _keep_activation_dtype(model)
    else:
        model = base
        if need_reference:
            ref_model = copy.deepcopy(base).to(compute).requires_grad_(False)
    model.to(device).train()  # the adapter is created on the CPU
    return Policy(model, tok, compute, lora, ref_model, device), sampler_copy
