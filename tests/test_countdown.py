"""Countdown: the safe expression checker, the generated problems, and the data=countdown preset."""

from __future__ import annotations

import json
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest

from rlft.config import ConfigError, compose
from rlft.data import DataError, build_task
from rlft.data.countdown import generate
from rlft.rewards import RewardError, resolve_reward, score_samples
from rlft.rewards.countdown import UnsafeExpression, check, evaluate, extract_expression
from rlft.rewards.functions import Sample

REF = json.dumps({"numbers": [3, 5, 8], "target": 16})  # 8 * (5 - 3) = 16, and 3 + 5 + 8 = 16


def cd(**kw):
    base = dict(name="countdown", digits=2, ops=["+", "-", "*", "/"], num_numbers=[3, 4],
                template="Use {numbers} to make {target}.", num_eval=50)
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("reply, expected", [
    ("<answer>8 * (5 - 3)</answer>", 1.0),
    ("<answer> 3 + 5 + 8 </answer>", 1.0),
    ("<think>try 8*2</think><answer>(5 - 3) * 8</answer>", 1.0),
    ("<answer>8 × (5 − 3)</answer>", 1.0),  # Unicode times and minus
    ("<answer>8 * (5 - 3) = 16</answer>", 1.0),  # a trailing '= target' is dropped
    ("I will use all three.\n8 * (5 - 3)", 1.0),  # no tags: the last line that is an expression
    ("8 * (5 - 3) = 16.\nDone!", 1.0),
    ("<answer>8 / (3 / 5) * 5 / 5 * 1</answer>", 0.0),  # numbers not given
    ("<answer>8 * (5 - 3) + 0</answer>", 0.0),  # an extra number
    ("<answer>8 * 2</answer>", 0.0),  # 2 is not given; 3 and 5 unused
    ("<answer>8 + 5</answer>", 0.0),  # 3 unused
    ("<answer>8 + 8</answer>", 0.0),  # 8 used twice
    ("<answer>8 * 5 - 3</answer>", 0.0),  # uses each once, wrong value (37)
    ("<answer>(8 + 5) / 3</answer>", 0.0),  # 13/3, not 16
    ("<answer>16</answer>", 0.0),  # the target alone
    ("<answer>8 * (5 - 3)", 0.0),  # unclosed tag, and no line is an expression
    ("<answer>eight times two</answer>", 0.0),
    ("<answer>8 * (5 - 3)</answer> <answer>3 * 5</answer>", 0.0),  # the last tag counts
    ("", 0.0),
    # Unsafe or non-arithmetic text scores 0 and is never executed.
    ("<answer>__import__('os').system('echo hi')</answer>", 0.0),
    ("<answer>(lambda: 16)()</answer>", 0.0),
    ("<answer>2 ** 4 + 0 * 3 * 5 * 8</answer>", 0.0),
    ("<answer>-3 + 5 + 8 + 6</answer>", 0.0),  # unary minus is not allowed
    ("<answer>8 // 1 * (5 - 3)</answer>", 0.0),
    ("<answer>8 * (5 - 3) " + "+ 0 " * 100 + "</answer>", 0.0),  # over MAX_EXPRESSION_CHARS
])
def test_countdown_reward(reply, expected):
    assert resolve_reward("countdown_correct")("q", reply, REF) == expected


def test_evaluate_is_exact_and_refuses_everything_else():
    assert evaluate("8 / 3 * 3") == (Fraction(8), [8, 3, 3])
    assert evaluate("(1 + 2) / 4") == (Fraction(3, 4), [1, 2, 4])
    for bad in ["abs(3)", "3 ** 2", "3 % 2", "-3", "3.5 + 1", "'a' * 3", "x + 1", "[1, 2]", "1 if 1 else 2", "()"]:
        with pytest.raises(UnsafeExpression):
            evaluate(bad)
    with pytest.raises(ZeroDivisionError):
        evaluate("3 / (2 - 2)")
    assert not check("3 / (5 - 5) + 8", [3, 5, 5, 8], 16)
    assert check("(1 + 2) / 4", [4, 2, 1], 0.75)  # within 1e-6 of a float target


def test_extract_expression():
    assert extract_expression("Thinking...\n<answer> (1 + 2) / 3 </answer>") == "(1 + 2) / 3"
    assert extract_expression("The answer:\n(1 + 2) / 3.\nThat is all") == "(1 + 2) / 3"
    assert extract_expression("<answer>no</answer>\n1 + 2") is None  # the tag is the answer
    assert extract_expression("no expression here") is None


def test_bad_reference_is_a_reward_error():
    with pytest.raises(RewardError, match="countdown_correct.*must be JSON"):
        score_samples(["countdown_correct"], [1.0], [Sample("q", "<answer>1</answer>", "16", 2, False)], 8)


@pytest.mark.parametrize("ops", [["+", "-", "*", "/"], ["+", "-"], ["*", "/"], ["-"]])
def test_generated_problems_are_solvable_by_their_expression(ops):
    rng = np.random.default_rng(7)
    for _ in range(200):
        numbers, target, solution = generate(rng, [3, 4], 2, ops)
        assert len(numbers) in (3, 4) and all(1 <= n <= 99 for n in numbers)
        assert 1 <= target <= 99
        value, used = evaluate(solution)  # the checker's own parser, not the generator's arithmetic
        assert value == target and sorted(used) == sorted(numbers)
        assert {c for c in solution if c in "+-*/"} <= set(ops)


def test_task_problems_carry_a_solution_the_reward_accepts():
    task = build_task(cd(), seed=0)
    reward = resolve_reward("countdown_correct")
    for p in task.eval_problems + [p for i in range(20) for p in task.batch(i, 8)]:
        ref = json.loads(p.answer)
        assert p.prompt == f"Use {ref['numbers']} to make {ref['target']}."
        assert reward(p.prompt, f"<answer>{ref['solution']}</answer>", p.answer) == 1.0


def key(problem):
    ref = json.loads(problem.answer)
    return tuple(sorted(ref["numbers"])), ref["target"]


def test_countdown_eval_is_disjoint_and_deterministic():
    t0, t0b, t1 = build_task(cd(), 0), build_task(cd(), 0), build_task(cd(), 1)
    held = {key(p) for p in t0.eval_problems}
    assert len(held) == 50
    assert not held & {key(p) for i in range(300) for p in t0.batch(i, 8)}
    assert t0.batch(3, 8) == t0b.batch(3, 8)
    assert t0.batch(3, 8) != t0.batch(4, 8) and t0.batch(3, 8) != t1.batch(3, 8)
    assert t0.eval_problems == t1.eval_problems  # the split does not depend on the seed
    sizes = {len(json.loads(p.answer)["numbers"]) for i in range(20) for p in t0.batch(i, 8)}
    assert sizes == {3, 4}


@pytest.mark.parametrize("kw, message", [
    (dict(ops=["^"]), "unknown operator '\\^'"),
    (dict(ops=[]), "data.ops is empty"),
    (dict(num_numbers=[1]), "between 2 and 6"),
    (dict(digits=0), "at least 1"),
    (dict(digits=1, num_numbers=[2], ops=["+"], num_eval=200), "200 held-out problems .* too small"),
    (dict(digits=1, num_numbers=[6], ops=["*"]), "no target in \\[1, 9\\] in 1000 draws"),
])
def test_countdown_config_errors(kw, message):
    with pytest.raises(DataError, match=message):
        build_task(cd(**kw), 0)


def test_compose_countdown_preset_end_to_end():
    cfg, _, _ = compose(["data=countdown", "reward=countdown", "data.num_eval=5", "data.num_numbers=[3]"])
    assert cfg.reward.fns == ["countdown_correct"]
    task = build_task(cfg.data, cfg.seed)
    batch = task.batch(0, 4)
    assert len(task.eval_problems) == 5 and len(batch) == 4
    assert all("<answer>" in p.prompt and len(json.loads(p.answer)["numbers"]) == 3 for p in batch)
    ref = json.loads(batch[0].answer)
    totals, _ = score_samples(cfg.reward.fns, cfg.reward.weights,
                              [Sample(batch[0].prompt, f"<answer>{ref['solution']}</answer>", batch[0].answer, 9, False),
                               Sample(batch[0].prompt, f"<answer>{ref['target']}</answer>", batch[0].answer, 3, False)], 64)
    assert totals == [1.0, 0.0]


def test_countdown_needs_its_reward():
    with pytest.raises(ConfigError, match="data=countdown is scored by the countdown_correct reward.*reward=countdown"):
        compose(["data=countdown"])
    cfg, _, _ = compose(["data=countdown", "reward.fns=[countdown_correct,length_penalty]", "reward.weights=[1,0.1]"])
    assert cfg.data.name == "countdown"
