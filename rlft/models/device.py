"""The learner's device: ``trainer.device`` resolved, and the autocast that goes with it."""

from __future__ import annotations

from typing import Any

import torch


def resolve_device(requested: str) -> torch.device:
    """``auto`` is CUDA when torch sees a GPU, else the CPU; other names are taken as given
    (config validation has already refused a CUDA device that does not exist)."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def autocast(device: torch.device, compute_dtype: torch.dtype) -> Any:
    """bf16 autocast on ``device`` when the compute dtype is bf16 (fp32: a no-op context)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=compute_dtype == torch.bfloat16)

