"""None rewards (TRL's "no score"): NaN totals, left out of group statistics and the loss; data
columns reaching per-sample and batched rewards."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlft.algorithms import ADV_ESTIMATORS, AdvantageInputs
from rlft.algorithms.advantages import group_normalized_scores, informative_groups
from rlft.config import compose
from rlft.rewards import score_samples
from rlft.rewards.functions import Sample
from tests.support import ROOT, TINY, run_cli

NAN = float("nan")


def test_group_statistics_skip_unscored_samples():
    scores = torch.tensor([1.0, 0.0, NAN, 1.0, 5.0, NAN, NAN, NAN])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    adv = group_normalized_scores(scores, groups, norm_by_std=True, eps=0.0)
    mean, std = 2 / 3, math.sqrt(((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2)  # over the three scored: 1, 0, 1
    assert adv[:4].tolist() == pytest.approx([(1 - mean) / std, (0 - mean) / std, 0.0, (1 - mean) / std])
    assert adv[4:].tolist() == [0.0, 0.0, 0.0, 0.0]  # one scored member: no group statistics
    centred = group_normalized_scores(scores, groups, norm_by_std=False, eps=1e-6)
    assert centred.tolist() == pytest.approx([1 / 3, -2 / 3, 0.0, 1 / 3, 0.0, 0.0, 0.0, 0.0])
    full = torch.tensor([1.0, 0.0, 3.0, 1.0])  # no NaN: the plain formula, unchanged
    plain = (full - full.mean()) / (full.std() + 1e-6)
    assert group_normalized_scores(full, torch.zeros(4, dtype=torch.long), True, 1e-6).tolist() == pytest.approx(
        plain.tolist())


def test_grpo_advantages_stay_finite_and_informative_groups_ignore_nan():
    scores = torch.tensor([1.0, NAN, 1.0, NAN, 0.0, 1.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    mask = torch.ones(6, 3)
    mask[1] = mask[3] = 0  # prepare_batch zeroes the mask of unscored rows
    cfg = compose([])[0].algo
    adv, _ = ADV_ESTIMATORS.get("grpo")(AdvantageInputs(scores, mask, groups), cfg)
    assert torch.isfinite(adv).all() and (adv[[0, 1, 2, 3]] == 0).all() and (adv[4] < 0).all()
    assert informative_groups(scores, groups).tolist() == [1]  # group 0's scored members agree


SAMPLES = [Sample(f"p{i}", "x" * i, str(i), i, False, {"level": i % 3, "source": f"s{i}"}) for i in range(6)]


def test_columns_reach_per_sample_and_batched_rewards_alike():
    per, _ = score_samples(["tests.helpers:level_reward"], [1.0], SAMPLES, 8)
    batched, _ = score_samples(["tests.helpers:level_reward_batched"], [1.0], SAMPLES, 8)
    assert per == batched == pytest.approx([i % 3 + i / 100 for i in range(6)])


def test_none_scores_are_nan_and_totals_sum_the_scored_functions():
    names = ["tests.helpers:none_on_odd_length", "tests.helpers:none_on_level_2"]
    totals, per_fn = score_samples(names, [1.0, 2.0], SAMPLES, 8)
    first = [NAN if i % 2 else i / 10 for i in range(6)]
    second = [NAN if i % 3 == 2 else i / 10 for i in range(6)]
    assert per_fn[names[0]] == pytest.approx(first, nan_ok=True)
    assert per_fn[names[1]] == pytest.approx(second, nan_ok=True)
    # TRL's weighted sum over the functions that scored; NaN (unscored) when none did (sample 5).
    assert totals == pytest.approx([0.0, 0.2, 0.2, 0.6, 1.2, NAN], nan_ok=True)


def read_metrics(run) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_training_with_unscored_samples(tmp_path, algo):
    """Half the completions unscored (odd length): the step trains, its loss stays finite, the metrics skip them."""
    run = tmp_path / "run"
    proc = run_cli(["train", *TINY, "trainer.steps=1", f"algo={algo}", "reward.fns=[tests.helpers:none_on_odd_length]",
                    "reward.weights=[1]", f"hydra.run.dir={run}"], cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    step = read_metrics(run)[-1]
    assert 0 < step["reward/unscored_frac"] < 1, step
    for key in ("loss", "reward/mean", "reward/tests.helpers:none_on_odd_length", "adv/mean"):
        assert math.isfinite(step[key]), (key, step)
    assert step["response/mean_length"] == 8  # the random tiny model never stops: every row has 8 tokens
    assert step["response/loss_tokens"] == pytest.approx(2 * 4 * 8 * (1 - step["reward/unscored_frac"]))  # none unscored


@pytest.mark.slow
def test_a_reward_that_scores_nothing_in_a_step_is_absent_from_metrics(tmp_path):
    """Issue 23: a function that scored no sample was logged as the string "nan"; metrics.jsonl
    values are numbers. With no function scoring anything, reward/mean is absent too."""
    none = "tests.helpers:batched_none"
    for fns, weights, absent in ((f"[tests.helpers:char_count,{none}]", "[1,1]", [f"reward/{none}"]),
                                 (f"[{none}]", "[1]", [f"reward/{none}", "reward/mean"])):
        run = tmp_path / str(len(absent))
        proc = run_cli(["train", *TINY, "trainer.steps=1", f"reward.fns={fns}", f"reward.weights={weights}",
                        "logger.console=true",
                        f"hydra.run.dir={run}"], cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-2000:]
        rows = read_metrics(run)
        for row in rows:
            assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in row.values()), row
        step = rows[-1]
        assert step["step"] == 1 and not [k for k in absent if k in step], step
        assert step["reward/unscored_frac"] == (1.0 if len(absent) == 2 else 0.0)
