"""PPO and DAPO math against hand-computed values and slow loops."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rlft.algorithms import ADV_ESTIMATORS, POLICY_LOSSES, AdvantageInputs
from rlft.algorithms.advantages import gae, informative_groups, ppo_token_rewards, soft_overlong_penalty
from rlft.algorithms.kl_control import adaptive_kl_coef, penalty_beta_update
from rlft.algorithms.losses import clipped_value_loss
from rlft.algorithms.masked import masked_mean


def test_gae_by_hand_full_mask():
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.6, 0.7]])
    adv, ret = gae(r, v, torch.ones(1, 3), gamma=1.0, lam=0.95)
    # A2 = 1 - 0.7 = 0.3; A1 = (0.7 - 0.6) + 0.95 * 0.3 = 0.385; A0 = 0.1 + 0.95 * 0.385 = 0.46575
    assert torch.allclose(adv, torch.tensor([[0.46575, 0.385, 0.3]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[0.96575, 0.985, 1.0]]), atol=1e-6)


def test_gae_by_hand_stops_at_the_mask():
    r = torch.tensor([[0.0, 1.0, 5.0]])
    v = torch.tensor([[0.5, 0.6, 9.0]])
    adv, ret = gae(r, v, torch.tensor([[1.0, 1.0, 0.0]]), gamma=1.0, lam=0.95)
    # position 2 is padding: V_2 and r_2 must not leak in. A1 = 1 - 0.6 = 0.4; A0 = 0.1 + 0.95 * 0.4
    assert torch.allclose(adv, torch.tensor([[0.48, 0.4, 0.0]]), atol=1e-6)
    assert ret[0, 2] == 0


def test_gae_matches_slow_loop():
    g = torch.Generator().manual_seed(0)
    b, t, gamma, lam = 4, 7, 0.9, 0.8
    r, v = torch.randn(b, t, generator=g), torch.randn(b, t, generator=g)
    lengths = [7, 3, 1, 5]
    mask = torch.tensor([[1.0] * n + [0.0] * (t - n) for n in lengths])
    adv, _ = gae(r, v, mask, gamma, lam)
    for i, n in enumerate(lengths):
        for k in range(n):
            want = 0.0
            for j in range(k, n):
                v_next = v[i, j + 1].item() if j + 1 < n else 0.0
                delta = r[i, j].item() + gamma * v_next - v[i, j].item()
                want += (gamma * lam) ** (j - k) * delta
            assert adv[i, k].item() == pytest.approx(want, abs=1e-5)


def test_gae_skips_environment_tokens_by_hand():
    """A multi-turn row: policy, tool, tool, policy. The tool tokens (mask 0) are no steps: position 0's
    next value is position 3's, and the rewards and values at 1-2 never enter."""
    r = torch.tensor([[0.0, 7.0, 7.0, 1.0]])
    v = torch.tensor([[0.5, 9.0, 9.0, 0.6]])
    adv, ret = gae(r, v, torch.tensor([[1.0, 0.0, 0.0, 1.0]]), gamma=1.0, lam=0.95)
    # A3 = 1 - 0.6 = 0.4; A0 = (0 + 0.6 - 0.5) + 0.95 * 0.4 = 0.48
    assert torch.allclose(adv, torch.tensor([[0.48, 0.0, 0.0, 0.4]]), atol=1e-6)
    assert ret[0, 1] == 0 and ret[0, 2] == 0


def test_gae_with_holes_matches_slow_loop_over_the_policy_tokens():
    g = torch.Generator().manual_seed(1)
    b, t, gamma, lam = 3, 9, 0.9, 0.8
    r, v = torch.randn(b, t, generator=g), torch.randn(b, t, generator=g)
    mask = (torch.rand(b, t, generator=g) > 0.4).float()
    mask[:, 0] = 1.0
    adv, _ = gae(r, v, mask, gamma, lam)
    for i in range(b):
        steps = [j for j in range(t) if mask[i, j] > 0]  # the policy's tokens, in order
        for a, k in enumerate(steps):
            want = 0.0
            for d, j in enumerate(steps[a:]):
                nxt = steps[a + d + 1] if a + d + 1 < len(steps) else None
                delta = r[i, j].item() + gamma * (v[i, nxt].item() if nxt is not None else 0.0) - v[i, j].item()
                want += (gamma * lam) ** d * delta
            assert adv[i, k].item() == pytest.approx(want, abs=1e-5)
        assert all(adv[i, j] == 0 for j in range(t) if mask[i, j] == 0)


def test_ppo_token_rewards_put_the_score_on_the_last_policy_token():
    mask = torch.tensor([[1.0, 0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0, 0.0]])
    rew = ppo_token_rewards(torch.tensor([3.0, 2.0]), torch.zeros(2, 5), None, mask, kl_coef=0.1)
    assert rew.tolist() == [[0.0, 0.0, 3.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0, 0.0]]


def test_gae_estimator_whitens_over_mask():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    inputs = AdvantageInputs(torch.zeros(2), mask, torch.arange(2), torch.randn(2, 3), torch.randn(2, 3))
    cfg = SimpleNamespace(gamma=1.0, lam=0.95, whiten_advantages=True)
    adv, ret = ADV_ESTIMATORS.get("gae")(inputs, cfg)
    assert masked_mean(adv, mask).item() == pytest.approx(0.0, abs=1e-6)
    assert adv[mask.bool()].std().item() == pytest.approx(1.0, abs=1e-3)
    assert adv[0, 2] == 0


def test_ppo_token_rewards_by_hand():
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, 0.0]])
    ref = torch.tensor([[-1.5, -2.0, -2.0], [-0.5, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    rew = ppo_token_rewards(torch.tensor([1.0, 2.0]), old, ref, mask, kl_coef=0.1)
    # -0.1 * (old - ref) everywhere, + score on the last response token
    assert torch.allclose(rew, torch.tensor([[-0.05, 0.0, 0.1 + 1.0], [0.05, 2.0, 0.0]]), atol=1e-6)
    no_kl = ppo_token_rewards(torch.tensor([1.0, 2.0]), old, None, mask, kl_coef=0.1)
    assert no_kl.tolist() == [[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]]


def test_clipped_value_loss_by_hand():
    v, v_old, ret = torch.tensor([1.0, 1.0]), torch.tensor([0.5, 0.9]), torch.tensor([2.0, 0.0])
    loss = clipped_value_loss(v, v_old, ret, clip_eps=0.2)
    # row 0: max((1-2)^2, (0.7-2)^2) = 1.69; row 1: V within the clip: (1-0)^2 = 1
    assert torch.allclose(loss, torch.tensor([0.845, 0.5]))
    assert torch.allclose(clipped_value_loss(v, v_old, ret, clip_eps=0.0), torch.tensor([0.5, 0.5]))


def test_kl_penalty_loss_by_hand():
    # The coefficient is the adapted one (state), not the config's starting value.
    cfg, state = SimpleNamespace(penalty_beta=0.5), SimpleNamespace(penalty_beta=2.0)
    logp = torch.log(torch.tensor([[1.5]]))
    loss, m = POLICY_LOSSES.get("kl_penalty")(logp, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), cfg, state)
    kl = 1.5 - 1 - math.log(1.5)
    assert loss.item() == pytest.approx(-1.5 + 2.0 * kl, abs=1e-6)
    assert m["penalty_kl"].item() == pytest.approx(kl, abs=1e-6)


def test_gspo_sequence_ratio_by_hand():
    cfg = SimpleNamespace(clip_eps_low=0.1, clip_eps_high=0.1)
    logp = torch.tensor([[0.1, 0.3, 7.0], [-0.1, 0.1, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
    loss, m = POLICY_LOSSES.get("gspo")(logp, torch.zeros(2, 3), adv, mask, cfg, SimpleNamespace(penalty_beta=1.0))
    # row 0: s = exp(0.2) = 1.2214 > 1.1 with A > 0: clipped, -1.1; row 1: s = exp(0) = 1: -(1 * -2) = 2
    assert loss[0, 0].item() == pytest.approx(-1.1, abs=1e-6) and loss[0, 1].item() == pytest.approx(-1.1, abs=1e-6)
    assert loss[1, 0].item() == pytest.approx(2.0, abs=1e-6)
    assert m["clip_frac/high"].item() == pytest.approx(0.5)
    (loss * mask).sum().backward()
    assert torch.all(logp.grad[0] == 0)  # clipped sequence: no gradient
    # d/dlogp_t of -(s A) summed over 2 tokens: -A * s / n per token, times 2 tokens = -A * s = 2 * 1 / 2 * 2
    assert logp.grad[1, 0].item() == pytest.approx(2.0, abs=1e-6)


def test_soft_overlong_penalty_by_hand():
    lengths = torch.tensor([10, 15, 16, 18, 20, 21])
    got = soft_overlong_penalty(lengths, max_len=20, cache_len=5)
    assert torch.allclose(got, torch.tensor([0.0, 0.0, -0.2, -0.6, -1.0, -1.0]))


def test_informative_groups():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    assert informative_groups(scores, groups).tolist() == [1, 3]


def test_kl_controllers_by_hand():
    assert penalty_beta_update(1.0, kl=0.02, target=0.01) == 2.0
    assert penalty_beta_update(1.0, kl=0.005, target=0.01) == 0.5
    assert penalty_beta_update(1.0, kl=0.01, target=0.01) == 1.0
    # error clipped to 0.2: 0.1 * (1 + 0.2 * 100 / 1000) = 0.102
    assert adaptive_kl_coef(0.1, kl=60.0, target=6.0, n_steps=100, horizon=1000) == pytest.approx(0.102)
    # error = 5.4 / 6 - 1 = -0.1: 0.1 * (1 - 0.1 * 0.1)
    assert adaptive_kl_coef(0.1, kl=5.4, target=6.0, n_steps=100, horizon=1000) == pytest.approx(0.099)
