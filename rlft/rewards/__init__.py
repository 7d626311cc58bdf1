"""Reward functions: built-ins by name and user functions by dotted path."""

from rlft.errors import RewardError
from rlft.rewards import builtins as _builtins  # noqa: F401  (registers the built-ins)
from rlft.rewards import countdown as _countdown  # noqa: F401  (registers countdown_correct)
from rlft.rewards import gsm8k as _gsm8k  # noqa: F401  (registers gsm8k_correct)
from rlft.rewards.functions import REWARDS, RewardFn, resolve_reward, score_samples

__all__ = ["REWARDS", "RewardError", "RewardFn", "resolve_reward", "score_samples"]
