"""Reward calls run through rlft.calls (worker processes, time limits); this module maps the reward config
onto that machinery and keeps the old import path of its names."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlft.calls import IN_PROCESS, CallDied, CallFailed, CallPolicy, CallTimeout, run_calls  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    from rlft.config.schemas import RewardConfig


def call_policy(reward_cfg: RewardConfig) -> CallPolicy:
    """The CallPolicy of a RewardConfig (``num_workers``, ``timeout_s``, ``on_timeout``)."""
    return CallPolicy(reward_cfg.num_workers, reward_cfg.timeout_s, reward_cfg.on_timeout)
