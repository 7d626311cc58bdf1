"""GSM8K: the reference answer of a worked solution, and a reward that reads a model's final number.

GSM8K's ``answer`` field is a worked solution whose last line is ``#### N`` (N an integer,
sometimes negative or written with thousands commas: ``#### 1,080``). Replies are compared
by value, so "18", "$18.00" and "18.0" all match N = 18.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from rlft.rewards.functions import REWARDS

# A number as replies write it: an optional minus (ASCII or U+2212) not glued to a word or digit
# before it (so "10-5" is 10 and 5, not 10 and -5), an optional "$" on either side of the minus,
# digits with correct thousands groups ("1,234,567"; "3,4" is two numbers), an optional fraction.
_NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>\$?\s?[-\u2212])?\$?\s?"
    r"(?P<int>\d{1,3}(?:,\d{3})+|\d+)(?:\.(?P<frac>\d+))?(?!\d)"
)
_BOXED = re.compile(r"\\boxed\s*\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")  # one level of inner braces: \boxed{\$18}
_HASHES = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:|=)\s*:?\s*([^\n]*)", re.IGNORECASE)


def numbers_in(text: str) -> list[Decimal]:
    """Every number written in ``text``, in order, as exact decimals ("1,234.50" -> Decimal("1234.50"))."""
    out = []
    for m in _NUMBER.finditer(text):
        digits = m["int"].replace(",", "") + (f".{m['frac']}" if m["frac"] else "")
        try:
            value = Decimal(digits)
        except InvalidOperation:  # cannot happen for the pattern above; kept as a guard
            continue
        # "17 - 3" is a subtraction, not 17 and -3: a minus after a digit or ")" is an operator.
        negative = m["sign"] is not None and text[: m.start()].rstrip()[-1:] not in tuple("0123456789)")
        out.append(-value if negative else value)
    return out


def parse_gsm8k_answer(text: str) -> str:
    """The final answer N of a GSM8K worked solution ("... #### 1,234" -> "1234").

    A reference without "####" is read as a bare number ("1,234" -> "1234"), so the reward also
    takes answers that were parsed already. The result is the plain decimal string of N.

    Raises:
        ValueError: no number after the last "####" (or in a reference without one).
    """
    tail = text.rsplit("####", 1)[-1]
    found = numbers_in(tail)
    if not found:
        raise ValueError(f"GSM8K answer has no number after '####': {text[-60:]!r}")
    return _plain(found[0])


def final_answer(reply: str) -> Decimal | None:
    """The number a reply gives as its answer, or None when it gives none.

    The first rule that applies wins:

    1. the last ``\\boxed{...}``: the last number inside it (``\\boxed{\\$1,234}`` -> 1234);
    2. the last ``#### ...`` line: its first number;
    3. the last "answer is ..." / "answer: ..." (any case): the first number after it, on that line;
    4. otherwise the last number anywhere in the reply.

    A box, "####" or "answer is" without a number gives None (the reply named its answer and it is
    not a number). Numbers may carry "$", a minus, thousands commas and a fraction; "%" and units
    after them are ignored. Fractions like 3/4 and LaTeX \\frac are not read as one value.
    """
    boxes = _BOXED.findall(reply)
    if boxes:
        found = numbers_in(boxes[-1])
        return found[-1] if found else None
    for pattern in (_HASHES, _ANSWER_IS):
        tails = pattern.findall(reply)
        if tails:
            found = numbers_in(tails[-1])
            return found[0] if found else None
    found = numbers_in(reply)
    return found[-1] if found else None


@REWARDS.register("gsm8k_correct")
def gsm8k_correct(prompt: str, completion: str, answer: str, **info: Any) -> float:
    """1.0 when the reply's final answer (see :func:`final_answer`) equals the GSM8K answer in value, else 0.0.

    ``answer`` is the worked solution ending in "#### N" or just N. Equal in value: "18", "18.00",
    "$18", "\\boxed{18}", "The answer is 18." all match 18; "1,234" matches 1234; "-7" matches -7.

    Raises:
        ValueError: ``answer`` holds no number (a data problem, reported with the sample).
    """
    want = Decimal(parse_gsm8k_answer(answer))
    got = final_answer(completion)
    return float(got is not None and got == want)


def _plain(value: Decimal) -> str:
    """The shortest decimal string of ``value``: 1234.00 -> "1234", -0.50 -> "-0.5"."""
    text = format(value.normalize(), "f")
    return "0" if text in ("-0", "0") else text
