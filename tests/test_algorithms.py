"""The math, against values computed by hand and against slow loop implementations."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rlft.algorithms import ADV_ESTIMATORS, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES, AdvantageInputs, LossNorm
from rlft.algorithms.masked import masked_mean, masked_whiten
from rlft.config import ConfigError

ALGO = SimpleNamespace(clip_eps_low=0.2, clip_eps_high=0.2, norm_adv_by_std=True, adv_eps=1e-6)
STATE = SimpleNamespace(penalty_beta=1.0)  # the coefficients adapted in training (the clip loss reads none)


def test_grpo_advantages_by_hand():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    mask = torch.tensor([[1, 1, 0]] * 6, dtype=torch.float32)
    adv, ret = ADV_ESTIMATORS.get("grpo")(AdvantageInputs(scores, mask, groups), ALGO)
    # group 0: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735 -> +-0.866025
    expected = torch.tensor([0.866025, -0.866025, -0.866025, 0.866025, 0.0, 0.0])
    assert torch.allclose(adv[:, 0], expected, atol=1e-5)
    assert torch.equal(adv[:, 1], adv[:, 0])  # same advantage on every token
    assert torch.all(adv[:, 2] == 0)  # zero outside the mask
    assert torch.equal(adv, ret)


def test_grpo_without_std_only_centres():
    algo = SimpleNamespace(**{**vars(ALGO), "norm_adv_by_std": False})
    scores = torch.tensor([3.0, 1.0, 5.0, 5.0])
    adv, _ = ADV_ESTIMATORS.get("grpo")(
        AdvantageInputs(scores, torch.ones(4, 1), torch.tensor([7, 7, 2, 2])), algo
    )
    assert adv[:, 0].tolist() == [1.0, -1.0, 0.0, 0.0]


def test_grpo_advantages_match_slow_loop():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(24, generator=g)
    groups = torch.arange(6).repeat_interleave(4)[torch.randperm(24, generator=g)]
    adv, _ = ADV_ESTIMATORS.get("grpo")(AdvantageInputs(scores, torch.ones(24, 1), groups), ALGO)
    for i in range(24):
        members = [scores[j].item() for j in range(24) if groups[j] == groups[i]]
        mean = sum(members) / len(members)
        std = math.sqrt(sum((m - mean) ** 2 for m in members) / (len(members) - 1))
        assert adv[i, 0].item() == pytest.approx((scores[i].item() - mean) / (std + 1e-6), abs=1e-5)


def test_k3_kl_by_hand():
    logp, ref = torch.log(torch.tensor([[0.5]])), torch.log(torch.tensor([[0.25]]))
    # d = ref - logp = log 0.5; exp(d) - d - 1 = 0.5 + 0.693147 - 1
    assert KL_ESTIMATORS.get("k3")(logp, ref).item() == pytest.approx(0.193147, abs=1e-6)
    assert KL_ESTIMATORS.get("k1")(logp, ref).item() == pytest.approx(math.log(2), abs=1e-6)
    assert KL_ESTIMATORS.get("k2")(logp, ref).item() == pytest.approx(0.5 * math.log(2) ** 2, abs=1e-6)


def test_k3_is_never_negative_and_zero_at_equality():
    x = torch.randn(100, 5)
    y = torch.randn(100, 5)
    assert torch.all(KL_ESTIMATORS.get("k3")(x, y) >= 0)
    assert torch.all(KL_ESTIMATORS.get("k3")(x, x) == 0)


def test_clipped_surrogate_by_hand():
    ratio = torch.tensor([[1.5, 0.5, 0.5, 1.5, 1.1]])
    old = torch.zeros_like(ratio)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, 2.0]])
    mask = torch.ones_like(ratio)
    loss, m = POLICY_LOSSES.get("clip")(torch.log(ratio), old, adv, mask, ALGO, STATE)
    # min(rA, clip(r)A): 1.2 (clipped high), -0.8 (clipped low), 0.5, -1.5, 2.2
    assert torch.allclose(loss, -torch.tensor([[1.2, -0.8, 0.5, -1.5, 2.2]]), atol=1e-6)
    assert m["clip_frac/high"].item() == pytest.approx(0.2)
    assert m["clip_frac/low"].item() == pytest.approx(0.2)


def test_clip_gradient_is_zero_when_clipped():
    logp = torch.log(torch.tensor([[1.5, 1.1]])).requires_grad_()
    loss, _ = POLICY_LOSSES.get("clip")(logp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), ALGO, STATE)
    loss.sum().backward()
    assert logp.grad[0, 0].item() == 0.0  # r = 1.5 > 1.2 with A > 0: no gradient
    assert logp.grad[0, 1].item() == pytest.approx(-1.1)  # d(-r A)/dlogp = -r A


def test_aggregations_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    norm = LossNorm(num_seqs=2, num_tokens=4, max_tokens=3)
    assert LOSS_AGGREGATIONS.get("seq-mean-token-mean")(loss, mask, norm).item() == pytest.approx((2 + 4) / 2)
    assert LOSS_AGGREGATIONS.get("token-mean")(loss, mask, norm).item() == pytest.approx(10 / 4)
    assert LOSS_AGGREGATIONS.get("seq-mean-token-sum-norm")(loss, mask, norm).item() == pytest.approx(10 / 6)


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"])
def test_aggregation_over_micro_batches_sums_to_whole(mode):
    g = torch.Generator().manual_seed(1)
    loss = torch.randn(8, 6, generator=g)
    mask = (torch.rand(8, 6, generator=g) > 0.3).float()
    mask[:, 0] = 1
    norm = LossNorm(8, float(mask.sum()), 6)
    fn = LOSS_AGGREGATIONS.get(mode)
    parts = sum(fn(loss[i : i + 3], mask[i : i + 3], norm) for i in range(0, 8, 3))
    assert parts.item() == pytest.approx(fn(loss, mask, norm).item(), abs=1e-6)


def test_grpo_objective_matches_slow_loop():
    """(1/G) sum_i (1/|o_i|) sum_t -[min(r A, clip(r) A) - beta D] with the registry functions."""
    g = torch.Generator().manual_seed(2)
    b, t, beta = 6, 5, 0.04
    logp = -torch.rand(b, t, generator=g) * 3
    old = logp + 0.3 * torch.randn(b, t, generator=g)
    ref = logp + 0.3 * torch.randn(b, t, generator=g)
    mask = torch.ones(b, t)
    mask[0, 3:] = 0
    mask[4, 1:] = 0
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    adv, _ = ADV_ESTIMATORS.get("grpo")(AdvantageInputs(scores, mask, groups), ALGO)
    pg, _ = POLICY_LOSSES.get("clip")(logp, old, adv, mask, ALGO, STATE)
    per_token = pg + beta * KL_ESTIMATORS.get("k3")(logp, ref)
    fast = LOSS_AGGREGATIONS.get("seq-mean-token-mean")(per_token, mask, LossNorm(b, float(mask.sum()), t))
    total = 0.0
    for i in range(b):
        n_i = int(mask[i].sum())
        s = 0.0
        for k in range(n_i):
            r = math.exp(logp[i, k] - old[i, k])
            a = adv[i, k].item()
            surrogate = min(r * a, min(max(r, 0.8), 1.2) * a)
            d = ref[i, k].item() - logp[i, k].item()
            s += surrogate - beta * (math.exp(d) - d - 1)
        total += s / n_i
    assert fast.item() == pytest.approx(-total / b, abs=1e-5)


def test_masked_helpers():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert masked_mean(x, mask).item() == pytest.approx(2.0)
    w = masked_whiten(x, mask)
    assert masked_mean(w, mask).item() == pytest.approx(0.0, abs=1e-6)
    assert w[0, 2].item() == 0.0


def test_unknown_registry_name_lists_choices():
    with pytest.raises(ConfigError, match="valid choices: .*seq-mean-token-mean.*token-mean"):
        LOSS_AGGREGATIONS.check("tokenmean", "algo.loss_agg")


def _exact_group_advantages(scores: list[float], groups: list[int], norm_by_std: bool, eps: float) -> list[float]:
    """The slow reference: each group's mean and variance as exact fractions of the float32 scores."""
    from fractions import Fraction

    out = []
    for s, g in zip(scores, groups):
        members = [Fraction(x) for x, h in zip(scores, groups) if h == g]
        mean = sum(members) / len(members)
        centred = Fraction(s) - mean
        if norm_by_std:
            var = sum((m - mean) ** 2 for m in members) / (len(members) - 1)
            out.append(float(centred) / (math.sqrt(var) + eps))
        else:
            out.append(float(centred))
    return out


@pytest.mark.parametrize("value", [0.2, 0.32, -0.32, 1.2, 0.7, 1 / 3, -1.5, 1.0])
@pytest.mark.parametrize("norm_by_std", [True, False], ids=["grpo", "dr-grpo"])
def test_a_group_of_equal_scores_gets_exactly_zero_advantage(value, norm_by_std):
    """Issue 23: eight scores of 1.2 (a float32 mean one rounding step off) gave every member +0.106
    under (R - mean) / (std + 1e-6); 0.2 gave -0.015 and -0.32 gave -0.029. No signal, no gradient."""
    algo = SimpleNamespace(**{**vars(ALGO), "norm_adv_by_std": norm_by_std})
    for size in (2, 4, 8, 16, 64):
        scores = torch.full((size,), value)
        adv, _ = ADV_ESTIMATORS.get("grpo")(AdvantageInputs(scores, torch.ones(size, 3), torch.zeros(size)), algo)
        assert torch.count_nonzero(adv) == 0, (value, size, adv[0, 0].item())


def test_equal_and_varied_groups_match_exact_fractions():
    """Weighted sums as rewards make them (math_correct + 0.2 format - 0.32 length): the equal groups
    get 0, the others what exact arithmetic gives, and the float32 formula's values (as before)."""
    g = torch.Generator().manual_seed(1)
    parts = torch.randint(0, 2, (3, 64), generator=g).float()
    scores = parts[0] + 0.2 * parts[1] - 0.32 * parts[2] * torch.rand(64, generator=g)
    scores[:8] = 1.2  # all correct, all with the format bonus
    scores[8:16] = -0.32
    scores[16:24] = 0.2
    groups = torch.arange(8).repeat_interleave(8)
    for norm_by_std in (True, False):
        algo = SimpleNamespace(**{**vars(ALGO), "norm_adv_by_std": norm_by_std})
        adv, _ = ADV_ESTIMATORS.get("grpo")(AdvantageInputs(scores, torch.ones(64, 1), groups), algo)
        want = _exact_group_advantages(scores.tolist(), groups.tolist(), norm_by_std, 1e-6)
        assert adv[:24, 0].tolist() == [0.0] * 24
        assert adv[:, 0].tolist() == pytest.approx(want, rel=1e-6, abs=1e-7)
        for k in range(3, 8):  # varied groups: the float32 formula, up to float32 rounding
            s = scores[groups == k]
            old = (s - s.mean()) / (s.std() + 1e-6) if norm_by_std else s - s.mean()
            assert adv[groups == k, 0].tolist() == pytest.approx(old.tolist(), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("value", [0.2, 0.32, -0.32, 0.7, 1.2])
def test_whitening_a_batch_of_equal_values_gives_exactly_zero(value):
    """PPO's whitening divides by sqrt(var + 1e-8): a float32 mean off by one rounding step became
    ~1e-4 on every token (0.7: +6e-4)."""
    mask = torch.ones(16, 50)
    mask[3, 20:] = 0
    w = masked_whiten(torch.full((16, 50), value), mask)
    assert torch.count_nonzero(w) == 0
    # GAE with gamma = lam = 1 and no values: every token's advantage is its row's score.
    inputs = AdvantageInputs(torch.zeros(16), mask, torch.arange(16), torch.zeros(16, 50), torch.zeros(16, 50))
    inputs.token_rewards[torch.arange(16), mask.sum(1).long() - 1] = value
    adv, _ = ADV_ESTIMATORS.get("gae")(inputs, SimpleNamespace(gamma=1.0, lam=1.0, whiten_advantages=True))
    assert torch.count_nonzero(adv) == 0


def test_whitening_matches_exact_fractions():
    from fractions import Fraction

    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 9, generator=g)
    mask = (torch.rand(6, 9, generator=g) < 0.7).float()
    vals = [Fraction(v) for v, m in zip(x.flatten().tolist(), mask.flatten().tolist()) if m]
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
    want = [float(Fraction(v) - mean) / std * m for v, m in zip(x.flatten().tolist(), mask.flatten().tolist())]
    assert masked_whiten(x, mask, eps=0.0).flatten().tolist() == pytest.approx(want, rel=1e-6, abs=1e-7)
