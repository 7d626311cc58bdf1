"""Reward functions: their two signatures, the built-ins by name and user functions by path, and scoring.

A reward function scores one completion::

    def score(prompt: str, completion: str, answer: str, **info) -> float

``info`` holds ``num_tokens`` (completion length), ``truncated`` (no EOS within the
budget), ``max_new_tokens`` and the data row's other columns. Or, TRL's batched signature, all
completions of a rollout at once::

    def score(prompts: list[str], completions: list[str], **columns) -> list[float]

with ``columns`` holding ``answer``, ``num_tokens``, ``truncated`` and each data column as lists
(one entry per completion) and ``max_new_tokens``. A function is batched exactly when its signature
has a parameter named ``completions`` (the keyword TRL passes); nothing is inferred from arity or
return values. Several functions combine as a weighted sum.

A score of None means "no score from this function for this sample" (TRL's convention): as in TRL,
the total is the weighted sum over the functions that did score the sample; a sample no function
scored is unscored (total NaN), which the trainer leaves out of its group's statistics and the loss.
"""

from __future__ import annotations

import inspect
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlft.errors import CallDied, CallFailed, CallTimeout, RewardError, RewardNameError
from rlft.registry import Registry, load_user_function, split_dotted
from rlft.workers.user_calls import IN_PROCESS, CallPolicy, describe, run_calls

if TYPE_CHECKING:
    from rlft.config.schemas.reward import RewardConfig

RewardFn = Callable[..., float]
REWARDS = Registry("reward function")


def call_policy(reward_cfg: RewardConfig) -> CallPolicy:
    """The CallPolicy of a RewardConfig (``num_workers``, ``timeout_s``, ``on_timeout``)."""
    return CallPolicy(reward_cfg.num_workers, reward_cfg.timeout_s, reward_cfg.on_timeout)


def resolve_reward(name: str) -> RewardFn:
    """A built-in by name, or a user function 'pkg.module:function' (or 'pkg.module.function').

    Raises:
        RewardNameError: ``name`` is malformed, or its module or function does not exist or is not callable.
        RewardError: importing the user's module raised (a SyntaxError, or any exception of its code).
    """
    if name in REWARDS:
        return REWARDS.get(name)
    builtins = ", ".join(REWARDS.names())
    if ":" not in name and "." not in name:
        raise RewardNameError(f"unknown reward '{name}'; built-ins: {builtins}, or a dotted path 'pkg.module:function'")
    if split_dotted(name) is None:
        raise RewardNameError(f"malformed reward '{name}': expected 'pkg.module:function' or a built-in ({builtins})")
    return load_user_function(name, "reward function", RewardNameError, RewardError)


@dataclass
class Sample:
    prompt: str
    completion: str
    answer: str
    num_tokens: int
    truncated: bool
    columns: dict[str, Any] = field(default_factory=dict)
    """The data row's other columns (reward keyword arguments)."""
    messages: list[dict[str, Any]] | None = None
    """The row's chat messages when its prompt is a message list (``prompt`` is then the last user message)."""


def score_samples(
    names: Sequence[str], weights: Sequence[float], samples: Sequence[Sample], max_new_tokens: int,
    policy: CallPolicy = IN_PROCESS, timed_out: Counter[str] | None = None,
) -> tuple[list[float], dict[str, list[float]]]:
    """Weighted sum of reward functions over samples.

    Args:
        policy: Where the calls run and their time limit (``reward.num_workers``, ``reward.timeout_s``,
            ``reward.on_timeout``).
        timed_out: Where to count, by function name, the samples scored ``reward.on_timeout`` because their
            call ran past the limit or its worker died (a batched call that did counts all its samples).

    Returns:
        The total reward per sample, and each function's raw scores by name. A None score is NaN in
        the function's list; a total is the weighted sum over the functions that scored the sample,
        NaN when none did (the sample is unscored).

    Raises:
        RewardError: a function raised, ran past the time limit (without ``on_timeout``), or returned
            something that is neither a finite number nor None.
    """
    fns = [resolve_reward(n) for n in names]
    per_fn: dict[str, list[float]] = {}
    for name, fn in zip(names, fns):
        if is_batched(fn):
            values = _call_batched(name, fn, samples, max_new_tokens, policy)
        else:
            values = _call_each(name, fn, samples, max_new_tokens, policy)
        lost = sum(v is _TIMED_OUT for v in values)
        if timed_out is not None and lost:
            timed_out[name] += lost
        per_fn[name] = [_number(name, policy.on_timeout if v is _TIMED_OUT else v, i, s)
                        for i, (v, s) in enumerate(zip(values, samples))]
    totals = []
    for i in range(len(samples)):
        scored = [w * per_fn[n][i] for n, w in zip(names, weights) if not math.isnan(per_fn[n][i])]
        totals.append(sum(scored) if scored else math.nan)
    return totals, per_fn


def is_batched(fn: RewardFn) -> bool:
    """TRL's batched signature: a parameter named ``completions``."""
    try:
        return "completions" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: the per-sample call
        return False


# What a call that timed out or died returns under reward.on_timeout, so that such samples are counted
# (the trainer logs their share) before they score the configured value.
_TIMED_OUT = object()


def _call_batched(name: str, fn: RewardFn, samples: Sequence[Sample], max_new_tokens: int,
                  policy: CallPolicy) -> list[Any]:
    names = dict.fromkeys(k for s in samples for k in s.columns)
    kwargs = dict({k: [s.columns.get(k) for s in samples] for k in names},
                  prompts=[s.prompt for s in samples], completions=[s.completion for s in samples],
                  answer=[s.answer for s in samples], num_tokens=[s.num_tokens for s in samples],
                  truncated=[s.truncated for s in samples], max_new_tokens=max_new_tokens)
    where = f"a batch of {len(samples)} completions (first: {_short(samples[0].completion)})"
    try:
        values: Any = run_calls(fn, [((), kwargs)], policy, timed_out=[_TIMED_OUT] * len(samples))[0]
    except CallFailed as e:
        raise RewardError(f"reward function '{name}' raised {describe(e.error)} on {where}") from None
    except CallTimeout:
        raise RewardError(_timeout_message(name, policy, where)) from None
    except CallDied as e:
        raise RewardError(_died_message(name, e, where)) from None
    if not isinstance(values, Sequence) or isinstance(values, str) or len(values) != len(samples):
        got = f"{len(values)} values" if isinstance(values, Sequence) else repr(values)[:60]
        raise RewardError(f"reward function '{name}' (batched) returned {got} for {len(samples)} completions; "
                          "return one number per completion")
    return list(values)


def _call_each(name: str, fn: RewardFn, samples: Sequence[Sample], max_new_tokens: int,
               policy: CallPolicy) -> list[Any]:
    calls = [((s.prompt, s.completion, s.answer),
              {**s.columns, "num_tokens": s.num_tokens, "truncated": s.truncated, "max_new_tokens": max_new_tokens})
             for s in samples]
    try:
        values = run_calls(fn, calls, policy, timed_out=_TIMED_OUT)
    except CallFailed as e:
        raise RewardError(f"reward function '{name}' raised {describe(e.error)} on {_where(e.index, samples[e.index])}"
                          ) from None
    except CallTimeout as e:
        raise RewardError(_timeout_message(name, policy, _where(e.index, samples[e.index]))) from None
    except CallDied as e:
        raise RewardError(_died_message(name, e, _where(e.index, samples[e.index]))) from None
    return values


def _timeout_message(name: str, policy: CallPolicy, where: str) -> str:
    return (f"reward function '{name}' did not return within reward.timeout_s={policy.timeout_s:g} s on {where} "
            "(set reward.on_timeout=SCORE to score such calls instead)")


def _died_message(name: str, e: CallDied, where: str) -> str:
    return (f"reward function '{name}' ended its worker process ({e.how}) on {where} (set reward.timeout_s and "
            "reward.on_timeout=SCORE to score such calls instead)")


def _where(index: int, s: Sample) -> str:
    return f"sample {index} (prompt={_short(s.prompt)}, completion={_short(s.completion)})"


def _number(name: str, value: Any, index: int, s: Sample) -> float:
    where = _where(index, s)
    if value is None:  # TRL's "no score from this function"
        return math.nan
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise RewardError(f"reward function '{name}' returned {value!r}, not a number, on {where}") from None
    if not math.isfinite(value):
        raise RewardError(f"reward function '{name}' returned {value} on {where} (return None for no score)")
    return value


def _short(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
