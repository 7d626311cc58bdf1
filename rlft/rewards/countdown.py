"""Countdown (the TinyZero task): reach a target from given numbers with + - * /.

The reference answer of a countdown problem is JSON: ``{"numbers": [3, 5, 8], "target": 16,
"solution": "(3 + 5) * ..."}`` (see rlft.data.countdown). A reply's expression is parsed with
:mod:`ast` and evaluated by walking the tree; raw text is never passed to ``eval``.
"""

from __future__ import annotations

import ast
import json
import re
from fractions import Fraction
from typing import Any

from rlft.errors import UnsafeExpression
from rlft.rewards.functions import REWARDS

MAX_EXPRESSION_CHARS = 200
"""Longer expressions are rejected before parsing (a deep nesting could exhaust the parser)."""

_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: a / b}
_ALLOWED_CHARS = re.compile(r"[\d\s+\-*/().]+")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
# Symbols models write for the four operations, mapped to Python's.
_SYMBOLS = str.maketrans({"\u00d7": "*", "\u00f7": "/", "\u2212": "-", "\u2013": "-", "\u22c5": "*"})


def evaluate(expr: str) -> tuple[Fraction, list[int]]:
    """The exact value of an arithmetic expression and the integers it uses (in order of appearance).

    Allowed: non-negative integer literals, binary + - * /, parentheses. Anything else (names,
    calls, unary minus, **, %, floats, strings) raises :class:`UnsafeExpression`.

    Raises:
        UnsafeExpression: the text is not such an expression, or it is longer than MAX_EXPRESSION_CHARS.
        ZeroDivisionError: it divides by zero.
    """
    if len(expr) > MAX_EXPRESSION_CHARS or not _ALLOWED_CHARS.fullmatch(expr):
        raise UnsafeExpression(f"not an arithmetic expression: {expr[:60]!r}")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        raise UnsafeExpression(f"cannot parse {expr[:60]!r}") from None
    used: list[int] = []
    return _walk(tree.body, used), used


def _walk(node: ast.AST, used: list[int]) -> Fraction:
    # Fractions keep 8 / 3 * 3 exactly 8, where floats would round.
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_walk(node.left, used), _walk(node.right, used))
    raise UnsafeExpression(f"not allowed in an expression: {type(node).__name__}")


def extract_expression(reply: str) -> str | None:
    """The expression a reply gives: the last ``<answer>...</answer>``, else its last line that is one.

    A trailing ``= N`` (``(3 + 5) * 2 = 16``) and a final period are dropped; the signs ×, ⋅, ÷
    and the Unicode minus become * / -. A tagged answer that is no expression gives None.
    """
    tags = _ANSWER_TAG.findall(reply)
    candidates = [tags[-1]] if tags else reversed(reply.splitlines())
    for text in candidates:
        expr = text.translate(_SYMBOLS).split("=")[0].strip().rstrip(".").strip()
        if expr and _ALLOWED_CHARS.fullmatch(expr) and re.search(r"\d", expr):
            return expr
        if tags:  # the tagged answer is the answer, even when it is not an expression
            return None
    return None


def check(expr: str, numbers: list[int], target: float) -> bool:
    """Whether ``expr`` uses each of ``numbers`` exactly once (as a multiset) and equals ``target`` within 1e-6."""
    try:
        value, used = evaluate(expr)
    except (UnsafeExpression, ZeroDivisionError):
        return False
    return sorted(used) == sorted(numbers) and abs(value - Fraction(target)) <= Fraction(1, 10**6)


def parse_countdown_answer(answer: str) -> tuple[list[int], int]:
    """``(numbers, target)`` of a countdown reference answer (JSON with "numbers" and "target").

    Raises:
        ValueError: the answer is not such JSON.
    """
    try:
        ref = json.loads(answer)
        return [int(n) for n in ref["numbers"]], ref["target"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f'countdown answer must be JSON {{"numbers": [...], "target": N}}, got {answer[:60]!r} '
                         f"({type(e).__name__})") from None


@REWARDS.register("countdown_correct")
def countdown_correct(prompt: str, completion: str, answer: str, **info: Any) -> float:
    """1.0 when the reply's expression equals the target and uses every given number exactly once, else 0.0.

    The expression is found by :func:`extract_expression` and checked by :func:`check`. ``answer`` is the task's JSON reference (``{"numbers": [...], "target": N}``).

    Raises:
        ValueError: ``answer`` is not a countdown reference (a data problem, reported with the sample).
    """
    numbers, target = parse_countdown_answer(answer)
    expr = extract_expression(completion)
    return float(expr is not None and check(expr, numbers, target))
