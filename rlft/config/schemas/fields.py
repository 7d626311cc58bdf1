"""What every config field is made of: its default, resume class, help section and valid range (:func:`knob`),
and the resume classes the groups' fields name."""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

# Resume classes: HARMLESS and NUMERICS changes are allowed and reported; HARMFUL ones refuse the resume.
# A (class, why) given to a section field covers every key under it (a row "section." in KEY_CLASSES).
HARMLESS, NUMERICS, HARMFUL = "harmless", "numerics only", "harmful"
LABEL = (HARMLESS, "a display label")
EVAL_ONLY = (HARMLESS, "evaluation only, greedy and outside the update")
CHECKPOINTING = (HARMLESS, "checkpointing only")
SYNC_CHECK = (HARMLESS, "a check of each weight sync; the steps run are unchanged")
WAITING = (HARMLESS, "how long a stop or a lost rank is waited for; the steps run are unchanged")
ALGORITHM = (HARMFUL, "the algorithm's advantages, loss or coefficients")
MODEL = (HARMFUL, "the model being trained")
ADAPTER = (HARMFUL, "the trained adapter")
SAMPLING = (HARMFUL, "the sampling distribution or batch")
REWARD = (HARMFUL, "the reward")
TIMEOUT = (HARMFUL, "which calls score reward.on_timeout, and that score")
PROBLEMS = (HARMFUL, "the training problems")
EVAL_ROWS = (HARMFUL, "on data=jsonl/hf, whether the eval rows are carved out of the training file")
OPTIMIZER = (HARMFUL, "the optimizer's updates or LR schedule")



@dataclass(frozen=True)
class Range:
    """The valid values of a numeric key, parsed from interval notation: ``"[0, 1]"``, ``"(0, 1]"``, ``"[1, inf)"``,
    ``"(-inf, inf)"`` (any finite number). None is valid too where the field's type allows it (``float | None``);
    on a list field (``list[float]``) the range is each entry's."""

    low: str
    high: str
    low_open: bool
    high_open: bool

    @classmethod
    def parse(cls, text: str) -> Range:
        m = re.fullmatch(r"([\[(])\s*([^,\s]+)\s*,\s*([^,\s]+)\s*([\])])", text)
        if m is None:
            raise ValueError(f"range {text!r}: expected interval notation such as '[0, 1]' or '(0, inf)'")
        r = cls(m[2], m[3], m[1] == "(", m[4] == ")")
        low, high = float(r.low), float(r.high)
        if not low < high or (math.isinf(low) and not r.low_open) or (math.isinf(high) and not r.high_open):
            raise ValueError(f"range {text!r}: needs low < high, and an open bracket at an infinite end")
        return r

    def __contains__(self, value: float) -> bool:
        low, high = float(self.low), float(self.high)
        above = value > low if self.low_open else value >= low
        below = value < high if self.high_open else value <= high
        return above and below  # NaN: neither

    def __str__(self) -> str:
        """What a value must be, as messages say it: ``in [0, 1]``, ``>= 1``, ``> 0``, ``a finite number``."""
        if math.isinf(float(self.low)) and math.isinf(float(self.high)):
            return "a finite number"
        if math.isinf(float(self.high)):
            return f"{'>' if self.low_open else '>='} {self.low}"
        if math.isinf(float(self.low)):
            return f"{'<' if self.high_open else '<='} {self.high}"
        return f"in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"


def knob(default: Any = None, resume: tuple[str, str] | None = None, *, factory: Callable[[], Any] | None = None,
         section: str | None = None, range: str | None = None) -> Any:
    """A field: its default (or a factory for a mutable one), its resume class, its help section and, for a
    number, its valid values (``range``: interval notation, see :class:`Range`)."""
    valid = Range.parse(range) if range is not None else None
    metadata = {k: v for k, v in (("resume", resume), ("section", section), ("range", valid)) if v is not None}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@cache
def field_types(cls: type) -> dict[str, Any]:
    """Each field's resolved type annotation."""
    return typing.get_type_hints(cls)


def valid_values(cls: type, name: str) -> str | None:
    """What field ``name`` of ``cls`` accepts, as its errors and ``--help`` say it (``in [0, 1]``, ``> 0, or null``,
    ``each entry >= 0``); None for a field without a range."""
    valid = next(f for f in dataclasses.fields(cls) if f.name == name).metadata.get("range")
    if valid is None:
        return None
    kind = field_types(cls)[name]
    if typing.get_origin(kind) is list:
        return f"each entry {valid}"
    return f"{valid}, or null" if type(None) in typing.get_args(kind) else str(valid)
