"""GSM8K: the answer parser on the real data set and the reward on model-style replies."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from rlft.rewards import RewardError, resolve_reward, score_samples
from rlft.rewards.functions import Sample
from rlft.rewards.gsm8k import final_answer, numbers_in, parse_gsm8k_answer
from tests.support import GSM8K, needs_gsm8k


def gsm8k_rows(split: str) -> list[dict]:
    return [json.loads(line) for line in (GSM8K / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def rows() -> dict[str, list[dict]]:
    return {split: gsm8k_rows(split) for split in ("train", "test")}


# (split, line index, N as read by eye from the file's "#### ..." line): each answer format GSM8K has.
REAL = [
    ("train", 0, "72"),
    ("train", 2, "5"),
    ("train", 4, "624"),
    ("train", 21, "1080"),
    ("train", 345, "1080"),  # "#### 1,080"
    ("train", 367, "850000"),  # "#### 850,000"
    ("train", 644, "109200000"),  # "#### 109,200,000"
    ("train", 1264, "2520000"),
    ("train", 5715, "-7"),
    ("train", 5844, "-47"),
    ("test", 0, "18"),
    ("test", 1, "3"),
]


@needs_gsm8k
@pytest.mark.parametrize("split, index, expected", REAL)
def test_real_answers_parse_to_n(rows, split, index, expected):
    worked = rows[split][index]["answer"]
    assert parse_gsm8k_answer(worked) == expected
    reward = resolve_reward("gsm8k_correct")
    assert reward("q", worked, worked) == 1.0  # the worked solution itself ends in "#### N"
    assert reward("q", f"The answer is {expected}.", worked) == 1.0
    assert reward("q", f"The answer is {int(expected) + 1}.", worked) == 0.0


@needs_gsm8k
def test_every_real_answer_parses_and_scores(rows):
    reward = resolve_reward("gsm8k_correct")
    for split, data in rows.items():
        for i, row in enumerate(data):
            tail = row["answer"].split("#### ")[-1].strip()
            n = int(tail.replace(",", ""))  # every GSM8K answer is an integer, sometimes with commas
            assert parse_gsm8k_answer(row["answer"]) == str(n), (split, i, tail)
            assert reward(row["question"], f"So the total is \\boxed{{{tail}}}.", row["answer"]) == 1.0
            assert reward(row["question"], f"#### {n - 1}", row["answer"]) == 0.0


# (model reply, reference N, expected reward)
REPLIES = [
    ("72", "72", 1.0),
    ("$72", "72", 1.0),
    ("72.00", "72", 1.0),
    ("$72.00", "72", 1.0),
    ("72.0 dollars", "72", 1.0),
    ("1,234", "1234", 1.0),
    ("$1,234.00", "1234", 1.0),
    ("1234", "1,234", 1.0),  # a reference with commas
    ("\\boxed{72}", "72", 1.0),
    ("So she sold 48 + 24 = 72 clips. \\boxed{72}", "72", 1.0),
    ("The total is \\boxed{\\$1,080} dollars.", "1080", 1.0),
    ("\\boxed{72} clips, since 48 and 24 more make 72; checking: 3 steps", "72", 1.0),  # box beats last number
    ("The answer is 72.", "72", 1.0),
    ("The answer is: $72", "72", 1.0),
    ("Final answer: 72", "72", 1.0),
    ("The answer is 72. I hope this helps with step 2.", "72", 1.0),  # 'answer is' beats last number
    ("48/2 = 24\n48 + 24 = 72\n#### 72", "72", 1.0),
    ("#### 72\nThat took 3 steps.", "72", 1.0),
    ("-7", "-7", 1.0),
    ("The average temperature was -7 degrees.", "-7", 1.0),
    ("The answer is −7.", "-7", 1.0),  # Unicode minus
    ("It lost -$47 overall", "-47", 1.0),
    ("Half of 5 is 2.5", "2.5", 1.0),
    ("0.50", "0.5", 1.0),
    ("50%", "50", 1.0),
    ("Natalia sold 48 + 24 = 72 clips altogether.", "72", 1.0),
    # Wrong ones.
    ("73", "72", 0.0),
    ("7", "-7", 0.0),
    ("-72", "72", 0.0),
    ("72.5", "72", 0.0),
    ("1,234", "1235", 0.0),
    ("\\boxed{71} although some might say 72", "72", 0.0),  # the box is the answer
    ("The answer is 71. Not 72.", "72", 0.0),
    ("#### 71\n72", "72", 0.0),
    ("48 + 24 = 72 clips, then she gave away 2, so 70", "72", 0.0),  # last number
    ("I don't know", "72", 0.0),
    ("", "72", 0.0),
    ("\\boxed{seventy-two}", "72", 0.0),  # a boxed answer that is not a number
    ("The answer is 100 - 28", "72", 0.0),  # first number after 'answer is'
    ("12,34", "1234", 0.0),  # not a thousands grouping: 12 and 34
]


@pytest.mark.parametrize("reply, n, expected", REPLIES)
def test_reward_on_model_style_replies(reply, n, expected):
    reward = resolve_reward("gsm8k_correct")
    assert reward("q", reply, n) == expected
    assert reward("q", reply, f"Worked solution with 3 steps.\n#### {n}") == expected


def test_final_answer_values():
    assert final_answer("10 - 5 = 5") == Decimal(5)  # subtraction, not -5
    assert final_answer("x = -5") == Decimal(-5)
    assert final_answer("no numbers") is None
    assert numbers_in("3,4 and 1,234,567.5 and 10-2") == [Decimal(3), Decimal(4), Decimal("1234567.5"),
                                                          Decimal(10), Decimal(2)]


def test_reference_without_a_number_is_a_reward_error():
    with pytest.raises(RewardError, match="gsm8k_correct.*no number after '####'"):
        score_samples(["gsm8k_correct"], [1.0], [Sample("q", "72", "#### none", 2, False)], 8)
