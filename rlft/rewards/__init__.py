"""Reward functions: built-ins by name and user functions by dotted path."""

from rlft.rewards import builtins as _builtins  # noqa: F401  (registers the built-ins)
from rlft.rewards.registry import REWARDS, RewardError, RewardFn, resolve_reward, score_samples

__all__ = ["REWARDS", "RewardError", "RewardFn", "resolve_reward", "score_samples"]
