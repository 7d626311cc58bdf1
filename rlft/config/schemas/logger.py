"""``logger``: the console, the rollout log and wandb."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class WandbConfig:
    enabled: bool = False
    """Log to Weights & Biases."""
    project: str = "rlft"
    """wandb project."""
    mode: str = "offline"
    """online or offline (offline needs no network)."""
    entity: str | None = None
    """wandb entity (team)."""


@dataclass
class LoggerConfig:
    console: bool = True
    """Progress bar and one line per step on the console."""
    verbose: bool = False
    """Also show other libraries' log records, warnings and progress bars on the console (they always go to
    train.log; without it the console shows rlft's lines and the libraries' errors)."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases settings."""
    rollouts: bool = False
    """Also write every kept rollout row (step, group, prompt and completion token ids, score) to rollouts.jsonl."""
