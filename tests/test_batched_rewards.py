"""TRL-style batched reward functions beside per-sample ones."""

from __future__ import annotations

from collections import Counter

import pytest

from rlft.output.tracking import read_metrics
from rlft.rewards import RewardError, score_samples
from rlft.rewards.functions import Sample, is_batched
from tests import helpers
from tests.support import ROOT, TINY, run_cli

SAMPLES = [Sample(f"p{i}", "x" * (3 * i + 1), str(i), 3 * i + 1, i % 2 == 0) for i in range(7)]


def test_signature_decides_batched():
    assert is_batched(helpers.char_count_batched) and is_batched(helpers.trl_style_length_penalty)
    assert not is_batched(helpers.char_count) and not is_batched(helpers.answer_is_even)


def test_batched_and_per_sample_give_the_same_scores():
    per, by_fn = score_samples(["tests.helpers:char_count"], [1.0], SAMPLES, 32)
    bat, by_fn_b = score_samples(["tests.helpers:char_count_batched"], [1.0], SAMPLES, 32)
    assert per == bat == [len(s.completion) / 10.0 for s in SAMPLES]
    mixed, parts = score_samples(["tests.helpers:char_count_batched", "tests.helpers:trl_style_length_penalty"],
                                 [1.0, 2.0], SAMPLES, 32)
    assert mixed == pytest.approx([len(s.completion) / 10.0 - 0.02 * s.num_tokens for s in SAMPLES])
    assert parts["tests.helpers:trl_style_length_penalty"] == pytest.approx([-0.01 * s.num_tokens for s in SAMPLES])


@pytest.mark.parametrize("name, message", [
    ("batched_wrong_length", "returned 1 values for 7 completions"),
    ("batched_nan", r"returned nan on sample 0 .*\(return None for no score\)"),
])
def test_bad_batched_returns_are_one_clear_error(name, message):
    with pytest.raises(RewardError, match=message):
        score_samples([f"tests.helpers:{name}"], [1.0], SAMPLES, 32)


def test_batched_none_leaves_every_sample_unscored():
    totals, _ = score_samples(["tests.helpers:batched_none"], [1.0], SAMPLES, 32)
    assert len(totals) == len(SAMPLES) and all(t != t for t in totals)  # NaN: unscored (tests/test_unscored.py)


@pytest.mark.slow  # several CLI runs; kept out of make test's 10 minutes
def test_training_with_a_batched_reward_equals_the_per_sample_one(tmp_path):
    runs = {}
    for fn in ("char_count", "char_count_batched"):
        r = run_cli(["train", *TINY, f"reward.fns=[tests.helpers:{fn}]", "reward.weights=[1]", "optim.lr=1e-2",
                     f"hydra.run.dir={tmp_path / fn}"], ROOT)
        assert r.returncode == 0, r.stderr[-2000:]
        runs[fn] = [{k: v for k, v in m.items() if not k.startswith(("time/", "throughput/", "reward/tests"))}
                    for m in read_metrics(tmp_path / fn / "metrics.jsonl")]
    assert runs["char_count"] == runs["char_count_batched"]
    assert any(m.get("reward/mean", 0) > 0 for m in runs["char_count"])


def _hang_samples():
    return [Sample(f"p{i}", "c", str(i), 1, False) for i in range(4)]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_hanging_reward_is_one_error_within_twice_the_timeout(workers):
    import time

    from rlft.workers.user_calls import CallPolicy

    t0 = time.perf_counter()
    with pytest.raises(RewardError, match=r"did not return within reward.timeout_s=1 s on sample 0 \(prompt='p0'"):
        score_samples(["tests.helpers:sleeps_on_first"], [1.0], _hang_samples(), 8, CallPolicy(workers, 1.0))
    assert time.perf_counter() - t0 < 2.0


def test_a_hanging_reward_scores_on_timeout_and_the_rest_are_scored():
    import time

    from rlft.workers.user_calls import CallPolicy

    t0 = time.perf_counter()
    counted: Counter[str] = Counter()
    totals, _ = score_samples(["tests.helpers:sleeps_on_first"], [1.0], _hang_samples(), 8, CallPolicy(2, 1.0, -0.5),
                              counted)
    assert totals == [-0.5, 1.0, 1.0, 1.0] and time.perf_counter() - t0 < 3.0
    assert counted == {"tests.helpers:sleeps_on_first": 1}


def test_a_function_scorer_counts_its_timed_out_samples_once():
    """reward/<name>/timed_out_frac's count: the samples scored on_timeout, taken once; none logged without
    on_timeout (a timeout then ends the run)."""
    from rlft.rewards.scorer import FunctionScorer
    from rlft.workers.user_calls import CallPolicy

    scorer = FunctionScorer("tests.helpers:sleeps_on_first", 1.0, 8, CallPolicy(2, 1.0, 0.0))
    assert scorer.take_counts() == {"timed_out": 0}
    assert scorer.score(_hang_samples()) == [0.0, 1.0, 1.0, 1.0]
    assert scorer.take_counts() == {"timed_out": 1} and scorer.take_counts() == {"timed_out": 0}
    assert FunctionScorer("tests.helpers:char_count", 1.0, 8, CallPolicy(2, 1.0)).take_counts() == {}


def test_pool_gives_the_same_scores_and_errors_as_in_process():
    from rlft.workers.user_calls import CallPolicy

    pooled, _ = score_samples(["tests.helpers:char_count", "tests.helpers:char_count_batched"], [1.0, 1.0], SAMPLES,
                              32, CallPolicy(num_workers=2))
    assert pooled == [2 * len(s.completion) / 10.0 for s in SAMPLES]
    with pytest.raises(RewardError, match="raised ValueError: a bug in the user's reward on sample 0"):
        score_samples(["tests.helpers:raise_always"], [1.0], SAMPLES, 32, CallPolicy(num_workers=2))


def test_cli_hanging_reward_ends_the_run_in_one_line(tmp_path):
    import time

    from rlft.models.loading import smollm2_dir

    smollm2_dir()  # on a new machine the first run converts the tokenizer's model: not what this times
    t0 = time.perf_counter()
    r = run_cli(["train", *TINY, "reward.fns=[math_correct,tests.helpers:hangs]", "reward.weights=[1,1]",
                 "reward.timeout_s=1", "data.num_eval=0", f"hydra.run.dir={tmp_path}"], ROOT)
    assert time.perf_counter() - t0 < 45  # start-up, then the 1 s limit: not the 60 s the reward sleeps
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and "did not return within reward.timeout_s=1 s" in lines[0], r.stderr
    bad = run_cli(["train", *TINY, "reward.on_timeout=0", f"hydra.run.dir={tmp_path}/x"], ROOT)
    assert bad.returncode == 2 and "reward.on_timeout=0.0 scores calls that pass reward.timeout_s" in bad.stderr


def test_a_hanging_batched_reward_scores_on_timeout_for_every_completion():
    from rlft.workers.user_calls import CallPolicy

    counted: Counter[str] = Counter()
    totals, _ = score_samples(["tests.helpers:hangs_batched"], [1.0], SAMPLES, 32, CallPolicy(0, 1.0, -0.5), counted)
    assert totals == [-0.5] * len(SAMPLES) and counted == {"tests.helpers:hangs_batched": len(SAMPLES)}
    with pytest.raises(RewardError, match="did not return within reward.timeout_s=1 s on a batch of 7 completions"):
        score_samples(["tests.helpers:hangs_batched"], [1.0], SAMPLES, 32, CallPolicy(0, 1.0))
