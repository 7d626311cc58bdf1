"""The learner's GPU memory by docs/guide/gpu.md's arithmetic ("Memory arithmetic on one 80 GB GPU"), for ``rlft check``
to print on CUDA beside the peak the allocator measured over its update.

The formulas are the page's, term by term, in bytes; tests/test_check_memory.py recomputes the page's table
(Qwen2.5 0.5B, 1.5B, 7B; LoRA and full fine-tuning; with and without checkpointing) from them. The page's
assumptions hold here too: a decoder of Qwen2/Llama shape (RMSNorm, SwiGLU MLP, sdpa attention), bf16 compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from rlft.config.schemas import Config
    from rlft.models import Policy

GIB = 2**30
CHUNK = 128
"""Rows of the log-prob head's logits chunk (rlft/training/logprobs.py)."""
OVERHEAD = 1 * GIB
"""CUDA context, cuBLAS workspace and allocator slack (outside what the allocator reports)."""


@dataclass(frozen=True)
class Shapes:
    """A decoder's shapes, as in its config.json."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    params: int
    """Every weight of the base model (a tied embedding once)."""


def shapes_of(config: Any, params: int) -> Shapes:
    """A transformers config's shapes (``head_dim`` and ``num_key_value_heads`` default as in transformers)."""
    heads = config.num_attention_heads
    return Shapes(config.num_hidden_layers, config.hidden_size, config.intermediate_size, heads,
                  getattr(config, "num_key_value_heads", None) or heads,
                  getattr(config, "head_dim", None) or config.hidden_size // heads, config.vocab_size, params)


def linear_params(s: Shapes) -> int:
    """The seven linear layers' weights (q, k, v, o; gate, up, down) over all layers."""
    h, ad, kvd = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
    return s.layers * (2 * h * ad + 2 * h * kvd + 3 * h * s.intermediate)


def lora_params(s: Shapes, r: int) -> int:
    """LoRA rank ``r`` on the seven linear layers: r x (fan-in + fan-out) each."""
    h, ad, kvd = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
    return s.layers * r * (2 * (h + ad) + 2 * (h + kvd) + 3 * (h + s.intermediate))


def learner_parts(s: Shapes, tokens: int, lora: int | None, checkpointing: bool, reference: bool) -> dict[str, int]:
    """The learner phase's peak, in bytes, by part (docs/guide/gpu.md#memory-arithmetic-on-one-80-gb-gpu), and their ``total``.

    Args:
        tokens: N, the tokens of one micro-batch (rows x padded length).
        lora: the adapter's parameter count; None under full fine-tuning.
        checkpointing: ``model.gradient_checkpointing``.
        reference: whether the run keeps a reference policy (``algo.beta > 0`` and the like): a bf16 copy under
            full fine-tuning, nothing under LoRA (the base with the adapter off).
    """
    h, i, n, p = s.hidden, s.intermediate, tokens, s.params
    per_token = 20 * h + 8 * i if lora is not None else 34 * h + 8 * i  # A, per token per layer
    if checkpointing:
        activations = s.layers * (2 if lora is not None else 4) * h * n + 2 * per_token * n
    else:
        activations = (s.layers + 1) * per_token * n
    parts = {
        "weights": 2 * p if lora is not None else 4 * p,
        "trainable state": 16 * lora if lora is not None else 12 * p,
        "reference": 2 * p if reference and lora is None else 0,
        "activations": activations,
        "log-prob head": 10 * CHUNK * s.vocab + 10 * h * n + (0 if lora is not None else 8 * s.vocab * h),
        "autocast casts": 0 if lora is not None else 2 * linear_params(s),
        "overhead": OVERHEAD,
    }
    parts["total"] = sum(parts.values())
    return parts


def micro_batch_tokens(rows: int, length: int, micro_batch_size: int) -> int:
    """N of the update's largest micro-batch: its rows times the batch's padded length."""
    return min(rows, micro_batch_size) * length


def gib(parts: dict[str, int]) -> dict[str, float]:
    return {k: v / GIB for k, v in parts.items()}


def peak_start(device: torch.device) -> int | None:
    """On CUDA, reset the allocator's peak and return the bytes allocated now; None elsewhere."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def learner_memory(policy: Policy, cfg: Config, rows: int, length: int, before: int | None) -> dict[str, Any] | None:
    """The arithmetic for this run's shapes and largest micro-batch beside the allocator's peak since
    :func:`peak_start` (None off CUDA)."""
    if before is None:
        return None
    torch.cuda.synchronize(policy.device)
    peak = torch.cuda.max_memory_allocated(policy.device)
    base = sum(p.numel() for n, p in policy.model.named_parameters() if "lora_" not in n)
    lora = sum(p.numel() for p in policy.trainable_parameters()) if policy.lora else None
    tokens = micro_batch_tokens(rows, length, cfg.trainer.micro_batch_size)
    parts = learner_parts(shapes_of(policy.model.config, base), tokens, lora, cfg.model.gradient_checkpointing,
                          cfg.algo.needs_reference)
    return {"estimate_gib": gib(parts), "tokens": tokens, "peak_gib": peak / GIB, "before_gib": before / GIB}
