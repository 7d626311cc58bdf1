"""Each algorithm preset runs end to end on the tiny model, and each switch does what it says."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rlft.config import compose
from rlft.training.loop import build_components, train_step
from rlft.training.prepare import prepare_batch
from rlft.training.rollout import collect_rollout
from tests.support import TINY

VARIED = ["reward.fns=[math_correct,tests.helpers:char_count]", "reward.weights=[1,1]"]


def _components(*overrides):
    cfg, _, _ = compose(TINY + VARIED + list(overrides))
    return cfg, build_components(cfg)


@pytest.mark.parametrize("algo", ["grpo", "dapo", "ppo", "drgrpo", "gspo"])
def test_preset_runs_two_steps(algo):
    # A random model never ends within 8 tokens: DAPO's overlong filter would mask every row.
    extra = ["algo.overlong_filter=false"] if algo == "dapo" else []
    cfg, c = _components(f"algo={algo}", "optim.lr=1e-2", *extra)
    before = [p.detach().clone() for p in c.policy.trainable_parameters()]
    for step in (1, 2):
        m = train_step(step, c, cfg)
        assert m["update/skipped"] == 0.0 or algo == "dapo"
        for k in ("loss", "entropy", "approx_kl", "grad_norm", "clip_frac/low", "clip_frac/high", "adv/mean"):
            if m["update/skipped"] == 0.0:
                assert math.isfinite(m[k]), k
    after = c.policy.trainable_parameters()
    assert any(not torch.equal(a, b) for a, b in zip(after, before))


def test_ppo_trains_critic_and_logs_value_metrics():
    # value_clip=0: with clipping, a value that left V_old +- eps gets no gradient, and A of a
    # zero-initialised LoRA B would never move within one step.
    cfg, c = _components("algo=ppo", "optim.lr=1e-2", "algo.critic_lr=1e-2", "algo.value_clip=0")
    assert c.critic is not None and c.critic.adapter == "critic"
    critic_before = [p.detach().clone() for p in c.critic.parameters()]
    policy_ids = {id(p) for p in c.policy.trainable_parameters()}
    assert not policy_ids & {id(p) for p in c.critic.parameters()}  # disjoint adapters
    m = train_step(1, c, cfg)
    for k in ("value_loss", "value/explained_var", "kl_coef", "kl/seq_ref"):
        assert math.isfinite(m[k]), k
    assert m["epochs_run"] == cfg.algo.ppo_epochs
    moved = [not torch.equal(a, b) for a, b in zip(c.critic.parameters(), critic_before)]
    assert all(moved)
    assert m["kl_coef"] != cfg.algo.kl_reward_coef  # the adaptive controller moved it


def test_ppo_early_stopping_cuts_epochs():
    cfg, c = _components("algo=ppo", "algo.ppo_epochs=4", "algo.early_stop_kl=1e-12", "optim.lr=5e-2")
    m = train_step(1, c, cfg)
    assert m["epochs_run"] < 4


def test_ppo_penalty_adapts_beta():
    cfg, c = _components("algo=ppo", "algo.policy_loss=kl_penalty", "algo.penalty_target_kl=1.0", "optim.lr=1e-3")
    m = train_step(1, c, cfg)
    assert "penalty_kl_after" in m
    assert m["penalty_beta"] == 0.5  # KL far below target / 1.5: halved


def test_no_reference_pass_when_beta_is_zero():
    cfg, c = _components("algo=dapo", "algo.dynamic_sampling=false", "algo.num_mini_batches=1")
    r = collect_rollout(c, cfg)
    prepare_batch(c, r.batch, cfg)
    assert r.batch.ref_logp is None and r.batch.old_logp is None
    cfg, c = _components("algo=grpo", "algo.beta=0.1")
    r = collect_rollout(c, cfg)
    prepare_batch(c, r.batch, cfg)
    assert r.batch.ref_logp is not None


@pytest.mark.parametrize("overrides,switches", [
    (["algo=grpo"], (True, False, False, True)),  # two mini-batches: an old pass; beta=0.04: a KL term
    (["algo=grpo", "algo.num_mini_batches=1", "algo.beta=0"], (False, False, False, False)),
    (["algo=dapo"], (True, False, False, False)),
    (["algo=ppo"], (True, False, True, True)),
    (["algo=ppo", "algo.kl_ctrl=fixed", "algo.policy_loss=kl_penalty"], (True, True, False, True)),
    (["algo=grpo", "algo.beta=0", "algo.policy_loss=kl_penalty"], (True, True, False, True)),
])
def test_algorithm_switches_of_presets_and_overrides(overrides, switches):
    a = compose(overrides)[0].algo
    assert (a.needs_old_logprobs, a.uses_ppo_penalty, a.adapts_kl_coef, a.learns_from_zero_advantages) == switches


def test_overlong_filter_masks_truncated_rows():
    cfg, c = _components("algo=dapo", "algo.dynamic_sampling=false", "sampler.max_new_tokens=3", "algo.overlong_cache=2")
    r = collect_rollout(c, cfg)
    assert r.batch.truncated.any()  # a random model rarely says EOS within 3 tokens
    prepare_batch(c, r.batch, cfg)
    assert torch.all(r.batch.response_mask[r.batch.truncated] == 0)
    assert torch.all(r.batch.response_mask[~r.batch.truncated].sum(1) > 0)
    cfg, c = _components("algo=dapo", "algo.dynamic_sampling=false", "sampler.max_new_tokens=3", "algo.overlong_cache=2",
                         "algo.overlong_filter=false")
    r = collect_rollout(c, cfg)
    prepare_batch(c, r.batch, cfg)
    assert torch.all(r.batch.response_mask.sum(1) > 0)


def test_overlong_penalty_enters_the_reward():
    cfg, c = _components("algo=dapo", "algo.dynamic_sampling=false", "sampler.max_new_tokens=4",
                         "algo.overlong_cache=2")
    r = collect_rollout(c, cfg)
    assert "reward/overlong_penalty" in r.metrics
    lengths = r.batch.resp_len.float()
    assert r.metrics["reward/overlong_penalty"] == pytest.approx(
        float(torch.where(lengths <= 2, 0.0, (2 - lengths) / 2).mean()), abs=1e-6
    )


def test_dynamic_sampling_keeps_only_informative_groups_and_caps_rounds():
    # math_correct alone on a random model: every group is all-wrong, so nothing is informative
    cfg, _, _ = compose(TINY + ["algo=dapo", "algo.max_sampling_rounds=3"])
    c = build_components(cfg)
    m = train_step(1, c, cfg)
    assert m["dynamic/rounds"] == 3 and m["dynamic/kept_frac"] == 0.0 and m["update/skipped"] == 1.0
    assert c.cursor == 3
    # char_count varies within groups: every group is kept in one round
    cfg, c = _components("algo=dapo")
    r = collect_rollout(c, cfg)
    assert r.metrics["dynamic/rounds"] == 1 and r.metrics["dynamic/kept_frac"] == 1.0
    assert len(torch.unique(r.batch.group_ids)) == cfg.trainer.num_prompts


def _paper_loss(algo: str, logp, old, adv, mask, max_tokens: float) -> float:
    """Each preset's objective written out from its paper, loop by loop (not through the registries)."""
    eps = {"grpo": (0.2, 0.2), "dapo": (0.2, 0.28), "drgrpo": (0.2, 0.2), "ppo": (0.2, 0.2), "gspo": (3e-4, 4e-4)}
    lo, hi = 1 - eps[algo][0], 1 + eps[algo][1]
    rows, total, tokens = [], 0.0, 0.0
    for i in range(logp.shape[0]):
        n = int(mask[i].sum())
        if algo == "gspo":  # one ratio per sequence: exp of the mean token log-ratio
            s = math.exp(sum(float(logp[i, t] - old[i, t]) for t in range(n)) / n)
            a = float(adv[i, 0])
            rows.append(-min(s * a, min(max(s, lo), hi) * a))
            continue
        per_token = []
        for t in range(n):
            r, a = math.exp(float(logp[i, t] - old[i, t])), float(adv[i, t])
            per_token.append(-min(r * a, min(max(r, lo), hi) * a))
        rows.append(sum(per_token) / n)
        total += sum(per_token)
        tokens += n
    g = len(rows)
    if algo in ("dapo", "ppo"):  # token-level: every token of the batch weighs the same
        return total / tokens
    if algo == "drgrpo":  # a constant normaliser G * L_max
        return total / (g * max_tokens)
    return sum(rows) / g  # GRPO, GSPO: per-sequence mean, then the mean over sequences


@pytest.mark.parametrize("algo", ["grpo", "dapo", "drgrpo", "gspo", "ppo"])
def test_each_presets_loss_matches_its_paper_on_a_fixed_batch(algo):
    """Ratios 0.75-1.25 on rows of 1-5 tokens: clip-high (1.28 vs 1.2), the aggregation and the
    sequence ratio each change the value, so a preset that lost one of them fails here."""
    from rlft.algorithms import LOSS_AGGREGATIONS, POLICY_LOSSES, LossNorm

    cfg, _, _ = compose([f"algo={algo}"])
    a = cfg.algo
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.float32)
    old = torch.full(mask.shape, -1.5)
    steps = torch.tensor([0.25, -0.28, 0.22, 0.1, -0.2])
    logp = old + torch.stack([steps, -steps, steps.flip(0), steps * 0.5]) * mask
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5])[:, None] * mask
    state = SimpleNamespace(penalty_beta=a.penalty_beta)  # as the trainer starts (no preset adapts a coefficient here)
    per_token, _ = POLICY_LOSSES.get(a.policy_loss)(logp, old, adv, mask, a, state)
    norm = LossNorm(4.0, float(mask.sum()), 5.0)
    got = float(LOSS_AGGREGATIONS.get(a.loss_agg)(per_token, mask, norm))
    assert got == pytest.approx(_paper_loss(algo, logp, old, adv, mask, 5.0), abs=1e-6)
    if algo == "dapo":  # the same batch under GRPO's symmetric clip and seq-mean differs
        assert got != pytest.approx(_paper_loss("grpo", logp, old, adv, mask, 5.0), abs=1e-3)
