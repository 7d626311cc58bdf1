"""What ``rlft check`` found, as plain data (its JSON is ``dataclasses.asdict``), and the statistics it is made of.

No torch and no models here: :mod:`rlft.check.measure` fills a :class:`Report`, :mod:`rlft.check.verdicts` reads it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict


@dataclass
class Verdict:
    """One finding: ``blocks`` when the run cannot learn as configured (exit 1), else a warning."""

    key: str
    """A stable name for scripts and tests (no_signal, truncated, judge_unparsed, ...)."""
    blocks: bool
    message: str
    """What was found and why it matters."""
    fix: str
    """The next step."""


class RunSection(TypedDict):
    """What was checked."""

    algo: str
    model: str
    data: str
    sampler: str
    n: int
    num_prompts: int
    """trainer.num_prompts: a step's prompts."""
    prompts: int
    """The prompts the check sampled."""
    samples: int
    steps: int
    overlong_filter: bool
    reward: list[str]
    """The reward functions, then ``model:PATH`` per reward model and ``judge:NAME`` per judge."""


class SignalSection(TypedDict):
    """Whether the reward gives the update something to learn from."""

    total: dict[str, Any]
    """:func:`distribution` of the total reward."""
    scorers: dict[str, dict[str, Any]]
    """:func:`distribution` of each scorer's scores, by name."""
    equal_groups: dict[str, Any]
    """:func:`equal_groups` of the totals."""
    groups_with_gradient: int
    groups: int
    learns_from_zero_advantages: bool
    dynamic_sampling: bool
    unscored_share: float
    timed_out_share: float | None
    """Of the reward functions' scores, those reward.on_timeout gave; None when reward.on_timeout is unset."""
    events: dict[str, int]
    events_share: dict[str, float]
    update_skipped: bool


class _Lengths(TypedDict):
    prompt_tokens: dict[str, float]
    max_prompt_tokens: int | None
    sampler_room: int | None
    dropped: dict[str, Any] | None
    reply_tokens: dict[str, float]
    max_new_tokens: int
    truncated_share: float
    stopped_share: float


class LengthsSection(_Lengths, total=False):
    """Prompt and reply lengths against their limits; with episodes, their turns and tool calls."""

    episodes: dict[str, Any]


class _Rendering(TypedDict):
    first_prompt: str
    chat_template: bool
    system_prompt: str | None
    first_reply: str
    stop_tokens: list[str]
    generation_prompt: bool | None


class RenderingSection(_Rendering, total=False):
    """The first prompt as the policy reads it and its first reply as the reward reads it."""

    generation_prompt_text: str | None
    turn_suffix: str
    turn_suffix_error: str


class _Cost(TypedDict):
    dtype: str
    dtype_reason: str
    device: str
    sync_check: dict[str, dict[str, Any]]
    """The sync check's result by when it ran (at start-up, after the update)."""
    seconds: dict[str, float]
    """Measured: setup, warm_up, sampling, scoring, update, logprobs, sync."""
    rounds: int
    skips_update: bool
    step: dict[str, float]
    """A step's projected seconds by phase."""
    step_s: float
    steps: int
    projected_s: float
    budget_s: float | None


class CostSection(_Cost, total=False):
    """What the run will cost: dtype, the sync check, measured and projected seconds, GPU memory."""

    memory: dict[str, Any] | None


@dataclass
class Report:
    """The sections of the check's table, each a typed dict of JSON values (see docs/guide/before-a-long-run.md)."""

    run: RunSection
    signal: SignalSection
    lengths: LengthsSection
    rendering: RenderingSection
    cost: CostSection
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def blocked(self) -> bool:
        return any(v.blocks for v in self.verdicts)


def distribution(values: Sequence[float]) -> dict[str, Any]:
    """A scorer's scores: mean, std, min, max over the scored ones, how many were unscored (NaN), and the
    distinct values (up to 6, for a scorer that gives a few levels)."""
    scored = [v for v in values if not math.isnan(v)]
    out: dict[str, Any] = {"count": len(values), "unscored": len(values) - len(scored)}
    if not scored:
        return out
    mean = sum(scored) / len(scored)
    std = math.sqrt(sum((v - mean) ** 2 for v in scored) / (len(scored) - 1)) if len(scored) > 1 else 0.0
    distinct = sorted(set(scored))
    out.update(mean=mean, std=std, min=distinct[0], max=distinct[-1], distinct=len(distinct),
               values=distinct if len(distinct) <= 6 else None)
    return out


def equal_groups(values: Sequence[float], groups: Sequence[int]) -> dict[str, Any]:
    """Groups whose scored samples all score the same (a group with one scored sample or none counts too:
    nothing to compare within it), and the common values, e.g. ``{"count": 7, "of": 8, "by_value": {"0": 7}}``."""
    by_group: dict[int, list[float]] = {}
    for v, g in zip(values, groups):
        by_group.setdefault(g, []).append(v)
    by_value: dict[str, int] = {}
    count = 0
    for vs in by_group.values():
        scored = [v for v in vs if not math.isnan(v)]
        if len(set(scored)) <= 1:
            count += 1
            key = f"{scored[0]:g}" if scored else "unscored"
            by_value[key] = by_value.get(key, 0) + 1
    return {"count": count, "of": len(by_group), "by_value": by_value}


def lengths(values: Sequence[int]) -> dict[str, float]:
    return {"min": float(min(values)), "mean": sum(values) / len(values), "max": float(max(values))} if values else {}


def share(part: float, whole: float) -> float:
    return part / whole if whole else 0.0
