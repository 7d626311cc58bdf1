"""Whole runs with reward.models (real CLI processes, the tiny policy and a tiny random reward model): the
trained-on scores are the hand-computed mix, whitened by numpy's running statistics; resume is exact with
the statistics; 2 ranks give the same run as 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rlft.config import compose
from rlft.config.schemas.reward import RewardModelConfig
from rlft.data import build_task
from rlft.models.loading import load_tokenizer
from rlft.rewards.functions import Sample
from rlft.rewards.models import RewardModel
from rlft.rewards.normalize import EPS
from tests.support import (
    DIST_ARGS,
    DIST_STEPS,
    ROOT,
    TINY,
    comparable_metrics,
    dist_env,
    run_cli,
    saved_weights,
    write_reward_model,
)

pytestmark = pytest.mark.slow  # each test runs 2-3 training processes (~15-30 s each here)

W_RM = 0.5


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]


def _rm_arg(path: Path, **extra: object) -> str:
    fields = ", ".join(f"{k}: {v}" for k, v in {"path": path, "weight": W_RM, "dtype": "fp32", **extra}.items())
    return f"reward.models=[{{{fields}}}]"


def test_scores_are_the_weighted_mix_whitened_by_running_statistics(tmp_path):
    """3 GRPO steps: every trained-on score equals (char_count + 0.5 x the reward model, called by hand on the
    decoded reply) whitened with numpy's mean and std of every raw total so far, then clipped."""
    rm_dir, run = tmp_path / "rm", tmp_path / "run"
    write_reward_model(rm_dir, pad_token=False)
    args = [*[a for a in TINY if not a.startswith("trainer.steps")], "trainer.steps=3", "logger.rollouts=true",
            "reward.fns=[tests.helpers:char_count]", "reward.weights=[1.0]", _rm_arg(rm_dir), "reward.normalize=true",
            "reward.clip=1.5", "optim.lr=1e-2"]
    r = run_cli(["train", *args, f"hydra.run.dir={run}"], ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    log = (run / "train.log").read_text()
    assert "reward model rm: its tokenizer has no pad token; padding with its EOS token" in log
    assert "gold: math_correct" in log

    cfg, _, _ = compose(args)
    task, tok = build_task(cfg.data, cfg.seed), load_tokenizer(cfg.model)
    rm = RewardModel(RewardModelConfig(path=str(rm_dir)), torch.device("cpu"), "fp32")
    seen: list[float] = []
    metrics = comparable_metrics(run)[1:]
    for step, m in enumerate(metrics, 1):
        rows = [x for x in _rows(run) if x["step"] == step]
        problems = task.batch(step - 1, cfg.trainer.num_prompts)
        texts = [tok.decode(x["completion_ids"], skip_special_tokens=True) for x in rows]
        samples = [Sample(problems[x["group"]].prompt, t, problems[x["group"]].answer, 0, False)
                   for x, t in zip(rows, texts)]
        model = np.array(rm.score(samples))
        raw = np.array([len(t) / 10.0 for t in texts]) + W_RM * model
        seen += raw.tolist()
        white = (raw - np.mean(seen)) / (np.std(seen, ddof=1) + EPS)
        assert np.allclose([x["score"] for x in rows], np.clip(white, -1.5, 1.5), atol=1e-4), step
        assert np.isclose(m["reward/model"], W_RM * model.mean(), atol=1e-5)
        assert np.isclose(m["reward/raw_mean"], raw.mean(), atol=1e-5)
        assert np.isclose(m["reward/running_mean"], np.mean(seen), atol=1e-5)
        assert m["reward/clipped_frac"] == np.mean(np.abs(white) > 1.5)
        assert m["reward/gold"] == 0.0 and m["reward/rm/truncated_frac"] == 0.0
    assert any(m["reward/clipped_frac"] > 0 for m in metrics), "the clip should bite at least once"


def test_resume_is_exact_with_a_reward_model_and_normalisation(reward_model_dir, tmp_path):
    args = [*[a for a in TINY if not a.startswith(("trainer.steps", "trainer.eval_every"))], "trainer.steps=4",
            "trainer.eval_every=2", "logger.rollouts=true", "reward=model", _rm_arg(reward_model_dir, batch_size=4),
            "reward.normalize=true", "optim.lr=1e-2"]
    a, b = tmp_path / "a", tmp_path / "b"
    for extra, run in (([], a), (["trainer.steps=2"], b), (["trainer.resume=auto"], b)):
        r = run_cli(["train", *args, *extra, f"hydra.run.dir={run}"], ROOT)
        assert r.returncode == 0, r.stderr[-3000:]
    ma, mb = comparable_metrics(a), comparable_metrics(b)
    assert [m["step"] for m in mb] == [0, 1, 2, 3, 4] and ma == mb
    assert len({m["reward/running_mean"] for m in ma[1:]}) == 4  # the statistics moved every step
    assert "eval/accuracy" in ma[0] and "reward/gold" in ma[1]  # reward=model: the gold checker evaluates
    assert _rows(a) == _rows(b)
    wa, wb = saved_weights(a, 4), saved_weights(b, 4)
    assert all(bool((wa[k] == wb[k]).all()) for k in wa)
    state = json.loads((b / "checkpoints" / "step_000004" / "trainer_state.json").read_text())
    assert state["algo"]["reward_moments"][0] == 4 * 2 * 4  # steps x prompts x samples scored


def test_two_ranks_score_their_shares_like_one_process(reward_model_dir, tmp_path):
    """batch_size=1: each reply is scored alone, so the scores are bitwise those of one process whatever the
    split; the running statistics see every rank's scores."""
    args = [*DIST_ARGS, _rm_arg(reward_model_dir, batch_size=1), "reward.normalize=true"]
    one, two = tmp_path / "one", tmp_path / "two"
    for extra, run in (([], one), (["trainer.nproc=2"], two)):
        r = subprocess.run([sys.executable, "-m", "rlft", "train", *args, *extra, f"hydra.run.dir={run}"], cwd=ROOT,
                           env=dist_env(), capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
    assert _rows(one) == _rows(two)
    m1, m2 = comparable_metrics(one), comparable_metrics(two)
    for key in ("reward/model", "reward/running_mean", "reward/running_std", "reward/mean"):
        assert [m.get(key) for m in m1] == [m.get(key) for m in m2], key
    a, b = saved_weights(one, DIST_STEPS), saved_weights(two, DIST_STEPS)
    for k in a:
        assert float((a[k] - b[k]).norm()) <= 1e-5 * float(a[k].norm().clamp(min=1e-12)), k
