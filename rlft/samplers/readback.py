"""Reading back the weights a sampler serves, for the sync check's weight comparison (rlft/sync/served_weights.py).

A log-prob probe sees a sync's error only as far as it moves the probe's log-probs, which at a default
learning rate is less than bf16 rounding (issue 35). The served weights themselves show any missed update
at once. Each linear layer is read through its own kernel: a batch of one-hot rows ``x`` gives
``x @ W.T``, i.e. columns of ``W`` exactly (one product with 1.0, the rest with 0.0, in any kernel and any
dtype); vLLM's CPU layers keep their weights only inside a packed oneDNN handle, so there is no tensor to
read. Under ``sync=adapter`` the engine's stacked LoRA buffers of the served adapter are read as they are.

Names are the base model's (Hugging Face) module names, e.g. ``model.layers.0.self_attn.q_proj``; vLLM's
fused layers (``qkv_proj``, ``gate_up_proj``) are split by the model's ``packed_modules_mapping``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

COLUMNS = 4
"""Columns of each weight read per check: 4 x N elements of an N x K weight (8 doubled the comparison's time)."""


@functools.cache
def columns(k: int) -> tuple[int, ...]:
    """The input columns read of a weight with ``k`` inputs: a fixed random choice (seeded by ``k``), so the
    learner and any sampler pick the same ones."""
    g = torch.Generator().manual_seed(k)
    return tuple(sorted(torch.randperm(k, generator=g)[: min(COLUMNS, k)].tolist()))


@functools.cache
def column_index(k: int, device: torch.device | str = "cpu") -> Tensor:
    """:func:`columns` as an index tensor on ``device`` (made once: a check indexes hundreds of weights)."""
    return torch.tensor(columns(k), device=device)


@functools.cache
def one_hot_rows(k: int, dtype: torch.dtype, device: Any) -> Tensor:
    """(COLUMNS, k): row i is the unit vector of input column ``columns(k)[i]``."""
    cols = columns(k)
    x = torch.zeros(len(cols), k, dtype=dtype, device=device)
    x[torch.arange(len(cols)), torch.tensor(cols)] = 1
    return x


def _parts(model: Any, name: str) -> list[str]:
    """The Hugging Face module names one vLLM module holds (``qkv_proj`` -> ``q_proj, k_proj, v_proj``)."""
    prefix, _, leaf = name.rpartition(".")
    packed = getattr(model, "packed_modules_mapping", {}) or {}
    return [f"{prefix}.{p}" if prefix else p for p in packed.get(leaf, [leaf])]


def vllm_linear_columns(worker: Any, wanted: list[str]) -> dict[str, Tensor]:
    """Runs inside vLLM's worker (``LLM.collective_rpc``): for each wanted module, the columns
    :func:`columns` of the weight its kernel applies, as (N, COLUMNS) on the CPU in the engine's dtype.
    Modules that hold no wanted name, or that are not linear layers, are not read."""
    model = worker.model_runner.model
    want = set(wanted)
    out: dict[str, Tensor] = {}
    with torch.no_grad():
        for name, module in model.named_modules():
            parts = _parts(model, name)
            layer = getattr(module, "base_layer", module)  # under sync=adapter vLLM wraps each linear layer
            method = getattr(layer, "quant_method", None)
            if not want.intersection(parts) or method is None or not hasattr(layer, "input_size_per_partition"):
                continue
            sizes = list(getattr(layer, "output_partition_sizes", [layer.output_size_per_partition]))
            if len(sizes) != len(parts):
                continue
            x = one_hot_rows(layer.input_size_per_partition, layer.params_dtype, _device(layer))
            y = method.apply(layer, x, None)  # (COLUMNS, N): x @ W.T through the layer's own kernel
            for part, block in zip(parts, y.t().split(sizes)):
                if part in want:
                    out[part] = block.contiguous().cpu()
    return out


def vllm_adapter_weights(worker: Any, wanted: list[str], lora_id: int) -> dict[str, tuple[Tensor, Tensor]]:
    """Runs inside vLLM's worker: for each wanted module, the served adapter's (A, B) as the engine holds
    them (A: (r, K), B: (N, r) with the scaling folded in, vLLM's ``optimize``), from the slot of adapter
    ``lora_id``; empty when that adapter is not active in the engine."""
    manager = worker.model_runner.lora_manager._adapter_manager  # vLLM 0.3x internals: pinned by the tests
    if lora_id not in manager.lora_index_to_id:
        return {}
    slot = manager.lora_index_to_id.index(lora_id)
    want = set(wanted)
    out: dict[str, tuple[Tensor, Tensor]] = {}
    for name, module in manager.modules.items():
        parts = _parts(manager.model, name)
        a_stack, b_stack = getattr(module, "lora_a_stacked", None), getattr(module, "lora_b_stacked", None)
        if not want.intersection(parts) or a_stack is None or len(a_stack) != len(parts):
            continue
        for part, a, b in zip(parts, a_stack, b_stack):
            if part in want:
                out[part] = (a[slot, 0].detach().cpu().clone(), b[slot, 0].detach().cpu().clone())
    return out


def _device(layer: Any) -> torch.device:
    for t in layer.parameters(recurse=False):
        return t.device
    return torch.device("cpu")
