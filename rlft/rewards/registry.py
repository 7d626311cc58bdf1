"""Reward registry and scoring.

A reward function scores one completion::

    def score(prompt: str, completion: str, answer: str, **info) -> float

``info`` holds ``num_tokens`` (completion length), ``truncated`` (no EOS within the
budget) and ``max_new_tokens``. Several functions combine as a weighted sum.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlft.registry import Registry

RewardFn = Callable[..., float]
REWARDS = Registry("reward function")


class RewardError(RuntimeError):
    """A reward function failed; the message names the function and the sample."""


def resolve_reward(name: str) -> RewardFn:
    """A built-in by name, or a user function 'pkg.module:function' (or 'pkg.module.function')."""
    if name in REWARDS:
        return REWARDS.get(name)
    if ":" in name:
        module, _, attr = name.partition(":")
    elif "." in name:
        module, _, attr = name.rpartition(".")
    else:
        raise RewardError(
            f"unknown reward '{name}'; built-ins: {', '.join(REWARDS.names())}, or a dotted path 'pkg.module:function'"
        )
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise RewardError(f"cannot load reward function '{name}': {e}") from None
    if not callable(fn):
        raise RewardError(f"reward '{name}' is not callable")
    return fn


@dataclass
class Sample:
    prompt: str
    completion: str
    answer: str
    num_tokens: int
    truncated: bool


def score_samples(
    names: Sequence[str], weights: Sequence[float], samples: Sequence[Sample], max_new_tokens: int
) -> tuple[list[float], dict[str, list[float]]]:
    """Weighted sum of reward functions over samples.

    Returns:
        The total reward per sample, and each function's raw scores by name.

    Raises:
        RewardError: a function raised, or returned something that is not a finite number.
    """
    fns = [resolve_reward(n) for n in names]
    per_fn: dict[str, list[float]] = {}
    for name, fn in zip(names, fns):
        per_fn[name] = [_call(name, fn, i, s, max_new_tokens) for i, s in enumerate(samples)]
    totals = [sum(w * per_fn[n][i] for n, w in zip(names, weights)) for i in range(len(samples))]
    return totals, per_fn


def _call(name: str, fn: RewardFn, index: int, s: Sample, max_new_tokens: int) -> float:
    where = f"sample {index} (prompt={_short(s.prompt)}, completion={_short(s.completion)})"
    try:
        value: Any = fn(
            s.prompt, s.completion, s.answer,
            num_tokens=s.num_tokens, truncated=s.truncated, max_new_tokens=max_new_tokens,
        )
    except Exception as e:  # noqa: BLE001  (any user error becomes one clear line)
        raise RewardError(f"reward function '{name}' raised {type(e).__name__}: {e} on {where}") from None
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise RewardError(f"reward function '{name}' returned {value!r}, not a number, on {where}") from None
    if not math.isfinite(value):
        raise RewardError(f"reward function '{name}' returned {value} on {where}")
    return value


def _short(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
