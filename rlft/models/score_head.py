"""A reward model's score head computed in fp32 (issue 35 item 6).

A reward is one number read off the last hidden state by one linear layer (``score``, transformers'
``*ForSequenceClassification`` decoders). In bf16 that number keeps 8 significant bits: near 1.0 its
steps are 0.0039 and 0.0078, so two close replies tie, and a bf16 copy of the head's weight moves
each score by as much again. The backbone may run in bf16; the head is kept in fp32 and applied to
the hidden state cast to fp32, outside autocast, when training (:mod:`rlft.rm.model`) and when
scoring (:mod:`rlft.rewards.models`). Its parameter keeps its name (``score.weight``), so a saved
model is a plain transformers directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

HEAD = "score"
"""The classification head of transformers' ``*ForSequenceClassification`` decoders."""


class FP32Head(nn.Linear):
    """``nn.Linear`` computed in fp32 whatever its input's dtype and any autocast around it."""

    def forward(self, x: Tensor) -> Tensor:
        with torch.autocast(x.device.type, enabled=False):
            bias = None if self.bias is None else self.bias.float()
            return nn.functional.linear(x.float(), self.weight.float(), bias)


def fp32_head(model: Any, stored: dict[str, Tensor] | None = None) -> bool:
    """Replace ``model.score`` (a linear layer) by an :class:`FP32Head` holding its values in fp32, or
    ``stored``'s (the head's tensors by parameter name, as its files hold them) when they fit; returns
    False, changing nothing, for a model without such a head (its scores stay in its own dtype)."""
    old = getattr(model, HEAD, None)
    if not isinstance(old, nn.Linear):
        return False
    if isinstance(old, FP32Head) and old.weight.dtype == torch.float32:
        return True
    bias = old.bias is not None
    head = nn.utils.skip_init(FP32Head, old.in_features, old.out_features, bias=bias,  # no random init drawn
                              device=old.weight.device, dtype=torch.float32)
    with torch.no_grad():
        for name, p in head.named_parameters():
            value = (stored or {}).get(name)
            p.copy_(value if value is not None and value.shape == p.shape else getattr(old, name))
    head.requires_grad_(old.weight.requires_grad)
    head.train(old.training)
    setattr(model, HEAD, head)
    return True


def stored_head(src: Path) -> dict[str, Tensor]:
    """The head's tensors as the safetensors files of the directory ``src`` hold them (fp32 where saved
    so; a loader in bf16 would have rounded them), by parameter name; empty when none are found."""
    from safetensors import safe_open

    prefix = f"{HEAD}."
    index = src / "model.safetensors.index.json"
    try:
        if index.is_file():
            files = sorted({f for k, f in json.loads(index.read_text())["weight_map"].items() if k.startswith(prefix)})
        else:
            files = ["model.safetensors"] if (src / "model.safetensors").is_file() else []
        found = {}
        for name in files:
            with safe_open(str(src / name), "pt") as f:
                for key in f.keys():  # noqa: SIM118  (safe_open has keys(), not iteration)
                    if key.startswith(prefix):
                        found[key.removeprefix(prefix)] = f.get_tensor(key)
        return found
    except Exception:  # noqa: BLE001  (unreadable here: the loaded values are upcast instead)
        return {}
