"""``build_task``: the task a DataConfig names, over the modules that implement each."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlft.data.countdown import countdown_task
from rlft.data.hf import hf_task
from rlft.data.tasks import Task, arithmetic_task, file_task
from rlft.errors import DataError

if TYPE_CHECKING:
    from rlft.config.schemas.data import DataConfig


def build_task(cfg: DataConfig, seed: int) -> Task:
    """The task named by ``cfg.name`` (DataConfig)."""
    if cfg.name == "arithmetic":
        return arithmetic_task(cfg, seed)
    if cfg.name == "jsonl":
        return file_task(cfg, seed)
    if cfg.name in ("hf", "gsm8k"):
        return hf_task(cfg, seed)
    if cfg.name == "countdown":
        return countdown_task(cfg, seed)
    raise DataError(f"data.name='{cfg.name}'; valid choices: arithmetic, countdown, jsonl, hf, gsm8k")
