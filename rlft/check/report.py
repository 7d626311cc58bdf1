"""What ``rlft check`` found, as plain data (its JSON is ``dataclasses.asdict``), and the statistics it is made of.

No torch and no models here: :mod:`rlft.check.measure` fills a :class:`Report`, :mod:`rlft.check.verdicts` reads it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


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


@dataclass
class Report:
    """The sections of the check's table, each a dict of JSON values (see docs/usage.md, "Before a long run")."""

    run: dict[str, Any]
    """What was checked: algo, model, data, sampler, sampler.n, trainer.num_prompts, prompts sampled, steps."""
    signal: dict[str, Any]
    lengths: dict[str, Any]
    rendering: dict[str, Any]
    cost: dict[str, Any]
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
