"""Built-in reward functions (see rlft.rewards.functions for the signature)."""

from __future__ import annotations

import re
from typing import Any

from rlft.rewards.functions import REWARDS

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> float | None:
    """The last number written in ``text`` (thousands separators allowed), or None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


@REWARDS.register("math_correct")
def math_correct(prompt: str, completion: str, answer: str, **info: Any) -> float:
    """1.0 when the last number in the completion equals the answer, else 0.0."""
    got, want = last_number(completion), last_number(answer)
    return float(got is not None and want is not None and abs(got - want) < 1e-6)


@REWARDS.register("format_number")
def format_number(prompt: str, completion: str, answer: str, **info: Any) -> float:
    """1.0 when the completion is just a number (and ended with EOS), else 0.0."""
    return float(not info.get("truncated", False) and re.fullmatch(r"\s*-?\d[\d,]*(\.\d+)?\s*", completion) is not None)


@REWARDS.register("length_penalty")
def length_penalty(prompt: str, completion: str, answer: str, **info: Any) -> float:
    """-(completion tokens / max_new_tokens): in [-1, 0], favours short replies."""
    return -float(info["num_tokens"]) / float(info["max_new_tokens"])


@REWARDS.register("env_reward")
def env_reward(prompt: str, completion: str, answer: str, **info: Any) -> float | None:
    """The episode's environment rewards, summed (``episode.env``'s Step rewards); None (unscored) when
    its environment gave none."""
    value = info.get("env_reward")
    return None if value is None else float(value)
