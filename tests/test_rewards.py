"""Reward functions: built-ins, user functions by dotted path, and clear errors."""

from __future__ import annotations

import sys
import textwrap

import pytest

from rlft.rewards import RewardError, resolve_reward, score_samples
from rlft.rewards.functions import Sample


def s(completion, answer="42", n=3, truncated=False):
    return Sample("What is 40 + 2?", completion, answer, n, truncated)


def test_math_correct_uses_last_number():
    fn = resolve_reward("math_correct")
    assert fn("q", "40 + 2 = 42", "42") == 1.0
    assert fn("q", "42? no, 43", "42") == 0.0
    assert fn("q", "The answer is 1,234.", "1234") == 1.0
    assert fn("q", "no number", "42") == 0.0
    assert fn("q", "-7", "-7") == 1.0


def test_format_and_length():
    assert resolve_reward("format_number")("q", " 42 ", "42") == 1.0
    assert resolve_reward("format_number")("q", "It is 42", "42") == 0.0
    assert resolve_reward("format_number")("q", "42", "42", truncated=True) == 0.0
    assert resolve_reward("length_penalty")("q", "x", "1", num_tokens=8, max_new_tokens=32) == -0.25


def test_weighted_sum():
    totals, per_fn = score_samples(
        ["math_correct", "format_number"], [1.0, 0.5], [s("42"), s("It is 42"), s("7")], 32
    )
    assert totals == [1.5, 1.0, 0.5]
    assert per_fn["format_number"] == [1.0, 0.0, 1.0]


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "myrewards.py").write_text(textwrap.dedent("""
        def score(prompt, completion, answer, **info):
            return float(len(completion))

        def broken(prompt, completion, answer, **info):
            if "bad" in completion:
                raise ValueError("cannot score this")
            return 1.0

        def nan(prompt, completion, answer, **info):
            return float("nan")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "myrewards"
    sys.modules.pop("myrewards", None)


def test_user_function_by_dotted_path(user_module):
    totals, _ = score_samples([f"{user_module}:score"], [2.0], [s("abc")], 32)
    assert totals == [6.0]
    assert resolve_reward(f"{user_module}.score")("q", "ab", "x") == 2.0


def test_raising_function_names_function_and_sample(user_module):
    with pytest.raises(RewardError) as err:
        score_samples([f"{user_module}:broken"], [1.0], [s("ok"), s("bad reply")], 32)
    msg = str(err.value)
    assert "reward function 'myrewards:broken' raised ValueError: cannot score this" in msg
    assert "sample 1" in msg and "'bad reply'" in msg


def test_nan_is_an_error(user_module):
    with pytest.raises(RewardError, match="'myrewards:nan' returned nan on sample 0"):
        score_samples([f"{user_module}:nan"], [1.0], [s("x")], 32)


def test_unknown_reward_lists_builtins():
    with pytest.raises(RewardError, match="unknown reward 'mathh'; built-ins: countdown_correct, env_reward, format_number, gsm8k_correct, length_penalty, math_correct, or a dotted path"):
        resolve_reward("mathh")
    with pytest.raises(RewardError, match="cannot load reward function 'nosuchpkg:fn'"):
        resolve_reward("nosuchpkg:fn")
