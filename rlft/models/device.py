"""The learner's device: ``trainer.device`` resolved, and the autocast that goes with it."""

from __future__ import annotations

from typing import Any

import torch


def resolve_device(requested: str, local_rank: int | None = None) -> torch.device:
    """``auto`` is CUDA when torch sees a GPU, else the CPU; other names are taken as given
    (config validation has already refused a CUDA device that does not exist). Under torchrun
    (``local_rank`` given) ``cuda``/``auto`` mean this process's own GPU, ``cuda:LOCAL_RANK``."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and local_rank is not None:
        requested = f"cuda:{local_rank}"
    device = torch.device(requested)
    if device.type == "cuda" and device.index is not None:
        # Calls without a device (empty_cache, mem_get_info, vLLM's engine) act on the current one.
        torch.cuda.set_device(device)
    return device


def autocast(device: torch.device, compute_dtype: torch.dtype) -> Any:
    """bf16 autocast on ``device`` when the compute dtype is bf16 (fp32: a no-op context)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=compute_dtype == torch.bfloat16)

