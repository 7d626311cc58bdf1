"""Demonstrations for rlft's generated tasks, so ``rlft sft`` can teach a model that starts at 0% the answer's
form and some of its skill: countdown solved by an exhaustive search, arithmetic by its exact answer.

The completions are written in the form the tasks' rewards read (``countdown_correct``: the expression in
``<answer> </answer>`` tags; ``math_correct``: the last number), and each is checked by that reward's own parser
before it is kept.
"""

from __future__ import annotations

import itertools
from fractions import Fraction
from functools import lru_cache

from rlft.rewards.countdown import check

_OPS = ("+", "-", "*", "/")


def solve_countdown(numbers: list[int], target: int) -> str | None:
    """An expression using each of ``numbers`` exactly once, with + - * / and parentheses, equal to ``target``
    (exact arithmetic); None when there is none. Deterministic: the first found in a fixed search order."""
    found = _solve(tuple(sorted(numbers)), Fraction(target))
    return None if found is None else _strip_outer(found)


@lru_cache(maxsize=4096)
def _solve(numbers: tuple[int, ...], target: Fraction) -> str | None:
    for expr, value in _expressions(numbers):
        if value == target:
            return expr
    return None


@lru_cache(maxsize=4096)
def _expressions(numbers: tuple[int, ...]) -> tuple[tuple[str, Fraction], ...]:
    """Every expression over the multiset ``numbers`` (each once), with its exact value; duplicates by value and
    text pruned per split, which keeps 4 numbers to a few thousand."""
    if len(numbers) == 1:
        return ((str(numbers[0]), Fraction(numbers[0])),)
    out: dict[tuple[str, Fraction], None] = {}
    idx = range(len(numbers))
    for k in range(1, len(numbers) // 2 + 1):
        for left_idx in itertools.combinations(idx, k):
            if 2 * k == len(numbers) and 0 not in left_idx:
                continue  # the same split seen from the other side
            left = tuple(numbers[i] for i in left_idx)
            right = tuple(numbers[i] for i in idx if i not in left_idx)
            for (a, va), (b, vb) in itertools.product(_expressions(left), _expressions(right)):
                for (x, vx), (y, vy) in (((a, va), (b, vb)), ((b, vb), (a, va))):
                    for op in _OPS:
                        if op == "/" and vy == 0:
                            continue
                        value = {"+": vx + vy, "-": vx - vy, "*": vx * vy, "/": vx / vy if vy else None}[op]
                        out.setdefault((f"({x} {op} {y})", value), None)
    return tuple(out)


def _strip_outer(expr: str) -> str:
    return expr[1:-1] if expr.startswith("(") and expr.endswith(")") and _balanced(expr[1:-1]) else expr


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if depth < 0:
            return False
    return depth == 0


def countdown_completion(numbers: list[int], target: int) -> str | None:
    """The reply a demonstration trains on: the expression that reaches ``target``, in answer tags, checked by
    ``countdown_correct``'s own check; None when no expression reaches it."""
    expr = solve_countdown(numbers, target)
    if expr is None or not check(expr, numbers, target):
        return None
    return f"{expr} = {target}\n<answer> {expr} </answer>"
