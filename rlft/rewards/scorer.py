"""Scorers: the parts the reward is a weighted sum of (reward functions, reward models, judges).

A scorer has a ``name`` (its metric ``reward/<name>``), a ``weight``, a ``kind`` (``function``, or a
learned scorer: ``model``, ``judge``), ``score(samples)`` (one float per sample, NaN: no score for
it), ``take_counts()`` (events since the last call, logged as ``reward/<name>/<event>_frac``) and
``describe()`` (its line in the run log). As in TRL, a sample's total is the weighted sum over the
scorers that scored it, NaN (unscored) when none did.

The learned scorers' weighted sum is logged as ``reward/model``, and with it a rule-based checker's
score as ``reward/gold`` (``reward.gold``: evaluation only, never in the reward), so that a policy
that learns to please the model without getting answers right shows as the two curves parting.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from rlft.rewards.functions import Sample, call_policy, score_samples
from rlft.rewards.judges import build_judges
from rlft.rewards.models import load_reward_models
from rlft.workers.user_calls import IN_PROCESS, CallPolicy

if TYPE_CHECKING:
    import torch

    from rlft.config.schemas import Config

# The task's rule-based checker: reward.gold=auto's choice when learned scorers drive training.
TASK_CHECKERS = {"arithmetic": "math_correct", "gsm8k": "gsm8k_correct", "countdown": "countdown_correct"}


class Scorer(Protocol):
    name: str
    weight: float
    kind: str

    def score(self, samples: Sequence[Sample]) -> list[float]: ...

    def take_counts(self) -> dict[str, int]: ...

    def describe(self) -> str: ...


@dataclass
class FunctionScorer:
    """One entry of ``reward.fns`` (calls run under ``policy``: in-process or in worker processes)."""

    name: str
    weight: float
    max_new_tokens: int
    policy: CallPolicy = IN_PROCESS
    kind: str = "function"
    _timed_out: Counter[str] = field(default_factory=Counter, repr=False)

    def score(self, samples: Sequence[Sample]) -> list[float]:
        return score_samples([self.name], [1.0], samples, self.max_new_tokens, self.policy,
                             self._timed_out)[1][self.name]

    def take_counts(self) -> dict[str, int]:
        """``timed_out``: samples scored ``reward.on_timeout`` since the last call (only with it set: without
        it such a call ends the run)."""
        n, self._timed_out = self._timed_out[self.name], Counter()
        return {} if self.policy.on_timeout is None else {"timed_out": n}

    def describe(self) -> str:
        return f"{self.weight:g} x {self.name}"


@dataclass
class Scores:
    """A batch's scores: the totals, each scorer's raw scores by name (plus ``model`` and ``gold``
    when present), and event counts by ``name/event``."""

    totals: list[float]
    per_name: dict[str, list[float]]
    counts: dict[str, int] = field(default_factory=dict)


def weighted_total(scorers: Sequence[Scorer], per_name: dict[str, list[float]], n: int) -> list[float]:
    """Per sample, the weighted sum over ``scorers`` that scored it (NaN when none did)."""
    out = []
    for i in range(n):
        scored = [s.weight * per_name[s.name][i] for s in scorers if not math.isnan(per_name[s.name][i])]
        out.append(sum(scored) if scored else math.nan)
    return out


def score_all(scorers: Sequence[Scorer], samples: Sequence[Sample], gold: Scorer | None = None) -> Scores:
    """Every scorer on ``samples``; the gold checker too, outside the totals.

    Raises:
        RewardError: a reward function failed (see :func:`rlft.rewards.functions.score_samples`).
    """
    per = {s.name: s.score(samples) for s in scorers}
    counts = {f"{s.name}/{k}": v for s in scorers for k, v in s.take_counts().items()}
    learned = [s for s in scorers if s.kind != "function"]
    if learned:
        per["model"] = weighted_total(learned, per, len(samples))
    if gold is not None:  # a checker among reward.fns is not called twice
        fn = next((s for s in scorers if s.name == gold.name and s.kind == "function"), None)
        per["gold"] = list(per[fn.name]) if fn is not None else gold.score(samples)
    return Scores(weighted_total(scorers, per, len(samples)), per, counts)


def gold_name(cfg: Config) -> str | None:
    """``reward.gold`` resolved: a reward function's name, or None (off)."""
    g = cfg.reward.gold
    if g is None or str(g).lower() in ("none", "null", ""):
        return None
    if g == "auto":
        return TASK_CHECKERS.get(cfg.data.name) if cfg.reward.models or cfg.reward.judges else None
    return g


def eval_reward(cfg: Config) -> str | None:
    """The reward function evaluation judges correctness by (> 0.5): the gold checker when there is one,
    else the first of ``reward.fns``; None when neither exists (evaluation is skipped)."""
    return gold_name(cfg) or (cfg.reward.fns[0] if cfg.reward.fns else None)


def build_scorers(cfg: Config, device: torch.device, compute_dtype: str) -> tuple[list[Scorer], Scorer | None]:
    """The run's scorers: reward.fns, then reward.models, then reward.judges (models and judges loaded
    once, on ``device``); and the gold checker (None: off)."""
    r, policy = cfg.reward, call_policy(cfg.reward)
    mnt = cfg.sampler.max_new_tokens
    scorers: list[Scorer] = [FunctionScorer(n, float(w), mnt, policy) for n, w in zip(r.fns, r.weights)]
    scorers += load_reward_models(r.models, device, compute_dtype)
    scorers += build_judges(cfg, compute_dtype, device)
    gold = gold_name(cfg)
    return scorers, FunctionScorer(gold, 0.0, mnt, policy) if gold else None
