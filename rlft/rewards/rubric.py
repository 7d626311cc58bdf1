"""A judge's text side: its rubric template (placeholders, the built-in rubrics), the checks of a judge's
config entry, and the parsers that read a score out of its reply. Pure functions on strings;
rlft.rewards.judges runs the model.

A reply that states no readable score parses to None (the sample is unscored by that judge),
never an exception: a judge's reply is model output, not something the user can fix.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Mapping
from typing import TYPE_CHECKING

from rlft.errors import ConfigError

if TYPE_CHECKING:
    from rlft.config.schemas import JudgeConfig

PLACEHOLDERS = ("prompt", "reply", "answer")
"""What a rubric may name: the task prompt, the policy's reply, the reference answer ('' when none)."""

DEFAULT_VERDICTS = {"correct": 1.0, "incorrect": 0.0}

# {lo}/{hi}/{words} are filled when the rubric is chosen; {prompt}/{reply}/{answer} per sample.
DEFAULT_TEMPLATES = {
    "score": (
        "You are grading a reply to a task.\n\nTask:\n{prompt}\n\nReference answer (may be empty):\n{answer}\n\n"
        "Reply to grade:\n{reply}\n\nHow good is the reply, from {lo} (wrong or useless) to {hi} (correct and "
        "complete)? Explain in one or two sentences, then give your score on the last line as: Score: N"
    ),
    "verdict": (
        "You are checking a reply to a task.\n\nTask:\n{prompt}\n\nReference answer (may be empty):\n{answer}\n\n"
        "Reply to check:\n{reply}\n\nExplain in one or two sentences, then give your verdict on the last line, "
        "one word of: {words}"
    ),
}

KINDS = tuple(DEFAULT_TEMPLATES)
"""What a judge's reply states: a score on a range, or a verdict word."""

_NUM = r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?![\w])"
_OF = r"\s*(?:/|out\s+of)\s*"
# In order of trust; within a rule, the last match wins (a judge's final word comes last).
_BRACKETED = re.compile(rf"\[\[\s*({_NUM})(?:{_OF}({_NUM}))?\s*\]\]", re.IGNORECASE)
_LABELLED = re.compile(rf"\b(?:score|rating|grade)\b(?:\s+(?:is|of))?[\s:=*]*({_NUM})(?:[\s*]*(?:/|out\s+of)\s*({_NUM}))?",
                       re.IGNORECASE)
_FRACTION = re.compile(rf"({_NUM}){_OF}({_NUM})", re.IGNORECASE)
_BARE = re.compile(_NUM)


def default_template(kind: str, lo: float, hi: float, verdicts: Mapping[str, float]) -> str:
    """The built-in rubric of ``kind``, its range or verdict words written in."""
    words = " or ".join(verdicts)
    return DEFAULT_TEMPLATES[kind].format(prompt="{prompt}", reply="{reply}", answer="{answer}",
                                          lo=f"{lo:g}", hi=f"{hi:g}", words=words)


def check_template(template: str, where: str) -> None:
    """Raise ConfigError (naming ``where``, e.g. ``reward.judges[0].template``) unless ``template``
    formats with the :data:`PLACEHOLDERS` only and names ``{reply}``."""
    valid = ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise ConfigError(f"{where} does not format ({e}): placeholders are {valid}; write a literal brace "
                          "twice ({{ or }})") from None
    unknown = [n for n in names if n not in PLACEHOLDERS]
    if unknown:
        raise ConfigError(f"{where} has the unknown placeholder {{{unknown[0]}}}; valid: {valid} (a literal brace "
                          "is written twice)")
    if "reply" not in names:
        has = ", ".join(f"{{{n}}}" for n in dict.fromkeys(names)) or "no placeholder"
        raise ConfigError(f"{where} has no {{reply}} placeholder (it has {has}): the judge would never see the "
                          f"reply it scores; valid: {valid}")


def check_judge(j: JudgeConfig, where: str) -> None:
    """Raise ConfigError (naming ``where``, e.g. ``reward.judges[0]``) unless judge ``j``'s fields are valid
    (its model is checked at start-up: rlft.rewards.judges.check_judge_model; its name with the other
    scorers': rlft.config.validation)."""
    if j.kind not in KINDS:
        raise ConfigError(f"{where}.kind='{j.kind}'; valid choices: {', '.join(KINDS)}")
    if j.template is not None:
        check_template(j.template, f"{where}.template")
    if j.kind == "score" and not j.min_score < j.max_score:
        raise ConfigError(f"{where}: min_score={j.min_score:g} must be below max_score={j.max_score:g}")
    if j.kind == "verdict" and j.verdicts is not None and (not j.verdicts or not all(w.strip() for w in j.verdicts)):
        raise ConfigError(f"{where}.verdicts={dict(j.verdicts)} needs at least one verdict, each a non-empty word")
    if j.max_new_tokens < 1 or j.batch_size < 1:
        raise ConfigError(f"{where}: max_new_tokens={j.max_new_tokens} and batch_size={j.batch_size} must be at "
                          "least 1")
    if not math.isfinite(j.weight):
        raise ConfigError(f"{where}.weight={j.weight} must be a finite number")
    if j.temperature < 0:
        raise ConfigError(f"{where}.temperature={j.temperature:g} must be >= 0 (0: greedy)")
    if j.sampler not in ("auto", "hf", "vllm"):
        raise ConfigError(f"{where}.sampler='{j.sampler}'; valid choices: auto, hf, vllm")


def render(template: str, prompt: str, reply: str, answer: str) -> str:
    """The rubric for one sample (``template`` passed :func:`check_template`)."""
    return template.format(prompt=prompt, reply=reply, answer=answer)


def parse_score(text: str, lo: float, hi: float) -> float | None:
    """The score a judge's reply states, on the scale [lo, hi]; None when it states none in range.

    Rules, most explicit first, the last match of the first rule that matches deciding:
    ``[[7]]`` (MT-Bench style); a label ``Score: 7`` / ``rating is 7`` / ``Grade = 7`` (markdown bold
    allowed); a fraction ``7/10`` or ``7 out of 10``; else the reply's last number. A fraction N/D,
    labelled or not, is read as the share N/D of the scale: lo + N/D * (hi - lo), so ``8/10`` on
    [0, 10] is 8 and ``4/5`` is 8. A number outside [lo, hi] (or a fraction outside [0, 1]) is
    not clipped: the reply is unscored (None).
    """
    for rule in (_BRACKETED, _LABELLED, _FRACTION):
        matches = list(rule.finditer(text))
        if matches:
            num, den = matches[-1].group(1), matches[-1].group(2)
            return _on_scale(float(num), float(den) if den else None, lo, hi)
    numbers = _BARE.findall(text)
    return _on_scale(float(numbers[-1]), None, lo, hi) if numbers else None


def _on_scale(value: float, denominator: float | None, lo: float, hi: float) -> float | None:
    if denominator is not None:
        if denominator <= 0 or not 0 <= value <= denominator:
            return None
        return lo + value / denominator * (hi - lo)
    return value if lo <= value <= hi else None


def normalise(score: float, lo: float, hi: float) -> float:
    """A score on [lo, hi] as a share of the scale, in [0, 1]."""
    return (score - lo) / (hi - lo)


def parse_verdict(text: str, verdicts: Mapping[str, float]) -> float | None:
    """The value of the last verdict word in the reply (whole words, any case; multi-word verdicts
    match across any whitespace); None when it names none. "incorrect" does not contain the word
    "correct", but "not correct" does: rubrics should ask for the bare verdict on the last line."""
    if not verdicts:
        return None
    by_word = {" ".join(w.lower().split()): v for w, v in verdicts.items()}
    alternatives = "|".join(r"\s+".join(map(re.escape, w.split())) for w in sorted(by_word, key=len, reverse=True))
    matches = re.findall(rf"(?<!\w)({alternatives})(?!\w)", text, re.IGNORECASE)
    return by_word[" ".join(matches[-1].lower().split())] if matches else None
