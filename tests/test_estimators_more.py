"""RLOO, REINFORCE++ and REINFORCE++-baseline estimators and the CISPO and GMPO losses: hand-computed
values, slow per-row loops, masks, a fake two-rank split, config checks and two tiny training steps."""

from __future__ import annotations

import math
import threading
from types import SimpleNamespace

import pytest
import torch

from rlft.algorithms import ADV_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES, AdvantageInputs, LossNorm
from rlft.algorithms.advantages import ppo_token_rewards
from rlft.algorithms.reinforce import discounted_returns
from rlft.config import ConfigError, compose
from rlft.training.loop import build_components, train_step
from tests.support import TINY

NAN = float("nan")
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
SCORES = torch.tensor([1.0, 0.0, 0.5, 2.0])
GROUPS = torch.tensor([0, 0, 0, 1])


def _est(name, inputs, gamma=1.0):
    return ADV_ESTIMATORS.get(name)(inputs, SimpleNamespace(gamma=gamma))


# ---- hand-computed values ---------------------------------------------------------------------------------------


def test_rloo_by_hand():
    adv, ret = _est("rloo", AdvantageInputs(SCORES, MASK, GROUPS))
    # group 0 = (1, 0, 0.5): 1 - (0 + 0.5)/2 = 0.75; 0 - (1 + 0.5)/2 = -0.75; 0.5 - (1 + 0)/2 = 0.
    # group 1 has one member: no other to average, 0.
    want = torch.tensor([[0.75, 0.75, 0.75], [-0.75, -0.75, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert torch.allclose(adv, want, atol=1e-7) and torch.equal(adv, ret)


def test_rloo_leaves_unscored_samples_out_of_the_baseline():
    scores = torch.tensor([1.0, 0.0, NAN, 2.0, 4.0])
    mask = torch.ones(5, 2)
    mask[2] = 0  # prepare_batch masks unscored rows
    adv, _ = _est("rloo", AdvantageInputs(scores, mask, torch.tensor([0, 0, 0, 1, 1])))
    # group 0's scored members (1, 0): 1 - 0 = 1, 0 - 1 = -1; group 1: 2 - 4 = -2, 4 - 2 = 2
    assert adv[:, 0].tolist() == [1.0, -1.0, 0.0, -2.0, 2.0]


def test_reinforce_pp_with_the_kl_in_the_reward_by_hand():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    ref = torch.zeros(2, 3)
    old = torch.tensor([[0.5, -1.0, 2.0], [1.0, 0.0, 7.0]])  # 7.0 is padding: must not leak in
    rewards = ppo_token_rewards(torch.tensor([1.0, 0.5]), old, ref, mask, kl_coef=0.1)
    # -0.1 (old - ref) per token, the score added on the last: [-0.05, 0.1, -0.2 + 1] and [-0.1, 0 + 0.5]
    assert torch.allclose(rewards, torch.tensor([[-0.05, 0.1, 0.8], [-0.1, 0.5, 0.0]]), atol=1e-7)
    adv, ret = _est("reinforce_pp", AdvantageInputs(torch.tensor([1.0, 0.5]), mask, torch.arange(2), rewards))
    # returns-to-go (gamma 1): row 0: 0.85, 0.9, 0.8; row 1: 0.4, 0.5
    assert torch.allclose(ret, torch.tensor([[0.85, 0.9, 0.8], [0.4, 0.5, 0.0]]), atol=1e-6)
    # whitened over the 5 tokens: mean 3.45 / 5 = 0.69, unbiased var (0.16^2 + 0.21^2 + 0.11^2 + 0.29^2 + 0.19^2) / 4
    std = math.sqrt(0.202 / 4)
    want = torch.tensor([[0.16, 0.21, 0.11], [-0.29, -0.19, 0.0]]) / std
    assert torch.allclose(adv, want, atol=1e-5)


def test_reinforce_pp_discounts_by_hand():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    rewards = torch.tensor([[0.1, -0.2, 1.0], [0.3, 0.5, 9.0]])  # 9.0 is padding
    adv, ret = _est("reinforce_pp", AdvantageInputs(torch.zeros(2), mask, torch.arange(2), rewards), gamma=0.5)
    # row 0: G2 = 1, G1 = -0.2 + 0.5 = 0.3, G0 = 0.1 + 0.15 = 0.25; row 1: G1 = 0.5, G0 = 0.3 + 0.25 = 0.55
    assert torch.allclose(ret, torch.tensor([[0.25, 0.3, 1.0], [0.55, 0.5, 0.0]]), atol=1e-6)
    mean, var = 2.6 / 5, (0.27**2 + 0.22**2 + 0.48**2 + 0.03**2 + 0.02**2) / 4
    assert torch.allclose(adv, (ret - mean) / math.sqrt(var) * mask, atol=1e-5)


def test_reinforce_pp_returns_skip_tokens_outside_the_mask_between_turns():
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]])  # two policy turns around two environment tokens
    rewards = torch.tensor([[0.1, 0.2, 9.0, 9.0, 0.3, 1.0, 0.0]])
    ret = discounted_returns(rewards, mask, gamma=0.5)
    # G5 = 1, G4 = 0.3 + 0.5 = 0.8, G1 = 0.2 + 0.5 * 0.8 = 0.6 (the environment tokens are skipped), G0 = 0.1 + 0.3
    assert torch.allclose(ret, torch.tensor([[0.4, 0.6, 0.0, 0.0, 0.8, 1.0, 0.0]]), atol=1e-6)


def test_reinforce_pp_baseline_by_hand():
    adv, ret = _est("reinforce_pp_baseline", AdvantageInputs(SCORES, MASK, GROUPS))
    # centred: group 0 mean 0.5 -> 0.5, -0.5, 0; group 1 (one member: baseline 0, as verl) -> 2.
    # Token values 0.5 x3, -0.5 x2, 0, 2 x2: mean 4.5 / 8 = 0.5625, unbiased var 6.71875 / 7.
    std = math.sqrt(6.71875 / 7)
    want = (torch.tensor([0.5, -0.5, 0.0, 2.0])[:, None] - 0.5625) / std * MASK
    assert torch.allclose(adv, want, atol=1e-6) and torch.equal(adv, ret)


def test_cispo_by_hand_and_its_gradient():
    cfg = SimpleNamespace(clip_eps_low=0.2, clip_eps_high=0.28)
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 3.0]])).requires_grad_()
    adv = torch.tensor([[1.0, -2.0, 0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, m = POLICY_LOSSES.get("cispo")(logp, old, adv, mask, cfg, None)
    # weights clip(r, 0.8, 1.28): 1.28, 0.8, 1.1 (and 1.28 on the padding); loss = -w A logp
    w = torch.tensor([[1.28, 0.8, 1.1, 1.28]])
    assert torch.allclose(loss, -w * adv * logp.detach(), atol=1e-6)
    loss.sum().backward()
    # the weight is detached: d/dlogp = -w A, so even the clipped tokens keep a gradient (PPO's clip would cut them)
    assert torch.allclose(logp.grad, -w * adv, atol=1e-6)
    assert m["clip_frac/high"].item() == pytest.approx(1 / 3) and m["clip_frac/low"].item() == pytest.approx(1 / 3)


def test_cispo_with_clip_eps_low_at_least_one_has_no_lower_bound():
    cfg = SimpleNamespace(clip_eps_low=1.0, clip_eps_high=4.0)
    logp = torch.log(torch.tensor([[0.01, 7.0]]))
    loss, m = POLICY_LOSSES.get("cispo")(logp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), cfg, None)
    assert torch.allclose(loss, -torch.tensor([[0.01, 5.0]]) * logp, atol=1e-7)
    assert m["clip_frac/low"].item() == 0.0 and m["clip_frac/high"].item() == 0.5


def test_gmpo_by_hand_and_its_gradient():
    cfg = SimpleNamespace(clip_eps_low=0.4, clip_eps_high=0.4)
    old = torch.zeros(2, 3)
    d = torch.tensor([[0.6, -0.6, 0.1], [0.6, -0.6, 0.2]])
    logp = d.clone().requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([2.0, -1.0])[:, None] * mask
    loss, m = POLICY_LOSSES.get("gmpo")(logp, old, adv, mask, cfg, None)
    # A > 0: log-ratios clipped from above only: (0.4, -0.6, 0.1), mean -0.1/3; A < 0: from below only: (0.6, -0.4)
    g0, g1 = math.exp(-0.1 / 3), math.exp(0.1)
    assert torch.allclose(loss[0], torch.full((3,), -2.0 * g0)) and torch.allclose(loss[1], torch.full((3,), g1))
    total = LOSS_AGGREGATIONS.get("seq-mean-token-mean")(loss, mask, LossNorm(2.0, 5.0, 3.0))
    assert total.item() == pytest.approx((-2.0 * g0 + g1) / 2, rel=1e-6)
    total.backward()
    # d/dlogp_t = -A g / (2 n) on the unclipped tokens, 0 on the clipped ones and the padding
    want = torch.tensor([[0.0, -2.0 * g0 / 6, -2.0 * g0 / 6], [g1 / 4, 0.0, 0.0]])
    assert torch.allclose(logp.grad, want, atol=1e-6)
    assert m["clip_frac/high"].item() == pytest.approx(1 / 5) and m["clip_frac/low"].item() == pytest.approx(1 / 5)
    assert m["ratio/mean"].item() == pytest.approx((g0 + g1) / 2, rel=1e-6)


# ---- against slow per-row loops -------------------------------------------------------------------------------


def _random_batch(seed: int, b: int = 12, t: int = 6):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    scores = torch.randn(b, generator=g)
    scores[3] = NAN  # one unscored sample: masked, out of its group's statistics
    mask[3] = 0
    rewards = ppo_token_rewards(scores.nan_to_num(0.0), torch.randn(b, t, generator=g), torch.randn(b, t, generator=g),
                                mask, 0.1)
    groups = torch.arange(b) // 4
    return AdvantageInputs(scores, mask, groups, rewards)


def _slow_whiten(values: dict[tuple[int, int], float]) -> dict[tuple[int, int], float]:
    xs = list(values.values())
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1) + 1e-8)
    return {k: (v - mean) / std for k, v in values.items()}


def _slow_sequence_rewards(inp):
    rows = range(inp.mask.shape[0])
    return {i: sum(float(inp.token_rewards[i, t]) for t in range(int(inp.mask[i].sum()))) for i in rows
            if math.isfinite(float(inp.scores[i]))}


def _slow(name: str, inp, gamma: float) -> dict[tuple[int, int], float]:
    """Each estimator written row by row from verl's definitions (NaN rows out of every group)."""
    b = inp.mask.shape[0]
    n = {i: int(inp.mask[i].sum()) for i in range(b)}
    seq = _slow_sequence_rewards(inp)
    groups: dict[int, list[int]] = {}
    for i in seq:
        groups.setdefault(int(inp.group_ids[i]), []).append(i)
    if name == "reinforce_pp":
        out = {}
        for i in range(b):
            running = 0.0
            for t in reversed(range(n[i])):
                running = float(inp.token_rewards[i, t]) + gamma * running
                out[(i, t)] = running
        return _slow_whiten(out)
    per_row = {}
    for i in seq:
        others = [seq[j] for j in groups[int(inp.group_ids[i])] if j != i]
        if name == "rloo":
            per_row[i] = seq[i] - sum(others) / len(others) if others else 0.0
        else:
            per_row[i] = seq[i] - (sum(others) + seq[i]) / (len(others) + 1) if others else seq[i]
    tokens = {(i, t): per_row[i] for i in per_row for t in range(n[i])}
    return tokens if name == "rloo" else _slow_whiten(tokens)


@pytest.mark.parametrize("name", ["rloo", "reinforce_pp", "reinforce_pp_baseline"])
@pytest.mark.parametrize("seed", [0, 1])
def test_estimators_match_slow_loops(name, seed):
    inp = _random_batch(seed)
    adv, _ = _est(name, inp, gamma=0.9)
    want = _slow(name, inp, 0.9)
    for i in range(inp.mask.shape[0]):
        for t in range(inp.mask.shape[1]):
            assert adv[i, t].item() == pytest.approx(want.get((i, t), 0.0), abs=1e-5), (i, t)


def _slow_cispo(logp, old, adv, mask, lo, hi):
    return [[-min(max(math.exp(float(logp[i, t] - old[i, t])), lo), hi) * float(adv[i, t]) * float(logp[i, t])
             for t in range(int(mask[i].sum()))] for i in range(logp.shape[0])]


def _slow_gmpo(logp, old, adv, mask, lo, hi):
    rows = []
    for i in range(logp.shape[0]):
        n = int(mask[i].sum())
        a = float(adv[i, 0])
        logs = []
        for t in range(n):
            d = float(logp[i, t] - old[i, t])
            # pessimistic for the sign of A: the clip binds only where it lowers the objective
            logs.append(min(d, hi) if a > 0 else max(d, -lo) if a < 0 else 0.0)
        rows.append(-math.exp(sum(logs) / n) * a)
    return rows


def test_cispo_and_gmpo_match_slow_loops_under_every_allowed_aggregation():
    g = torch.Generator().manual_seed(3)
    b, t = 6, 5
    mask = (torch.arange(t)[None, :] < torch.tensor([5, 1, 3, 4, 2, 5])[:, None]).float()
    old = -torch.rand(b, t, generator=g) * 3
    logp = old + torch.randn(b, t, generator=g) * 0.5
    adv = torch.randn(b, generator=g)[:, None].expand(b, t).contiguous()
    norm = LossNorm(float(b), float(mask.sum()), float(t))
    cfg = SimpleNamespace(clip_eps_low=0.2, clip_eps_high=0.28)
    cispo, _ = POLICY_LOSSES.get("cispo")(logp, old, adv, mask, cfg, None)
    per_token = _slow_cispo(logp, old, adv, mask, 0.8, 1.28)
    want = {"token-mean": sum(map(sum, per_token)) / float(mask.sum()),
            "seq-mean-token-mean": sum(sum(r) / len(r) for r in per_token) / b,
            "seq-mean-token-sum-norm": sum(map(sum, per_token)) / (b * t)}
    for agg, value in want.items():
        assert LOSS_AGGREGATIONS.get(agg)(cispo, mask, norm).item() == pytest.approx(value, rel=1e-5), agg
    gmpo, _ = POLICY_LOSSES.get("gmpo")(logp, old, adv, mask, SimpleNamespace(clip_eps_low=0.3, clip_eps_high=0.2), None)
    got = LOSS_AGGREGATIONS.get("seq-mean-token-mean")(gmpo, mask, norm).item()
    assert got == pytest.approx(sum(_slow_gmpo(logp, old, adv, mask, 0.3, 0.2)) / b, rel=1e-5)


# ---- masks --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["rloo", "reinforce_pp", "reinforce_pp_baseline"])
def test_a_masked_out_token_changes_no_advantage(name):
    inp = _random_batch(5)
    adv, _ = _est(name, inp, gamma=0.9)
    noisy = inp.token_rewards + 100.0 * (1 - inp.mask)
    adv2, _ = _est(name, AdvantageInputs(inp.scores, inp.mask, inp.group_ids, noisy), gamma=0.9)
    assert torch.equal(adv, adv2)
    assert torch.all(adv[inp.mask == 0] == 0)


@pytest.mark.parametrize("name", ["cispo", "gmpo"])
def test_a_masked_out_token_changes_no_loss_and_no_gradient(name):
    cfg = SimpleNamespace(clip_eps_low=0.2, clip_eps_high=0.28)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.5, -0.5])[:, None] * mask
    old = torch.full((2, 3), -1.0)
    results = []
    for pad in (0.0, 3.0):
        logp = (old + torch.tensor([[0.1, -0.05, pad], [0.2, pad, -pad]])).requires_grad_()
        loss, _ = POLICY_LOSSES.get(name)(logp, old, adv, mask, cfg, None)
        total = LOSS_AGGREGATIONS.get("seq-mean-token-mean")(loss, mask, LossNorm(2.0, 3.0, 3.0))
        total.backward()
        results.append((total.item(), logp.grad.clone()))
    assert results[0][0] == results[1][0] and torch.equal(results[0][1], results[1][1])
    assert torch.all(results[0][1][mask == 0] == 0)


# ---- data parallelism ----------------------------------------------------------------------------------------


class _TwoRanks:
    """Two ranks as two threads: ``reduce`` sums each rank's tensor over both, as DataParallel.sum_ does."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(2)
        self.slots: list = [None, None]

    def reduce_for(self, rank: int):
        def reduce(t: torch.Tensor) -> torch.Tensor:
            self.slots[rank] = t.clone()
            self.barrier.wait()
            total = self.slots[0] + self.slots[1]
            self.barrier.wait()
            return t.copy_(total)
        return reduce


@pytest.mark.parametrize("name", ["rloo", "reinforce_pp", "reinforce_pp_baseline"])
def test_batch_statistics_are_world_size_invariant(name):
    inp = _random_batch(7)
    whole, _ = _est(name, inp, gamma=0.9)
    ranks, out = _TwoRanks(), [None, None]
    halves = [slice(0, 8), slice(8, 12)]  # whole groups per rank, unequal token counts

    def run(rank: int) -> None:
        s = halves[rank]
        part = AdvantageInputs(inp.scores[s], inp.mask[s], inp.group_ids[s], inp.token_rewards[s],
                               reduce=ranks.reduce_for(rank))
        out[rank] = _est(name, part, gamma=0.9)[0]

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    assert torch.allclose(torch.cat(out), whole, atol=1e-6)
    if name != "rloo":  # whitening over one rank's tokens alone differs: the statistics were summed
        alone, _ = _est(name, AdvantageInputs(inp.scores[:8], inp.mask[:8], inp.group_ids[:8], inp.token_rewards[:8]))
        assert not torch.allclose(alone, whole[:8], atol=1e-3)


# ---- config ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides, expected", [
    (["algo=rloo", "sampler.n=1"], "sampler.n=1: group-relative advantages need at least 2 completions per prompt"),
    (["algo=gmpo", "algo.loss_agg=token-mean"], "algo.policy_loss=gmpo averages one term per sequence"),
    (["algo=gmpo", "algo.adv_estimator=reinforce_pp"], "algo.policy_loss=gmpo needs one advantage per sequence"),
    (["algo=grpo", "algo.clip_eps_low=1.0"], "algo.clip_eps_low must be in [0, 1)"),
])
def test_combinations_the_formulas_do_not_allow_are_refused(overrides, expected):
    with pytest.raises(ConfigError) as err:
        compose(overrides)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_allowed_combinations_compose():
    assert compose(["algo=reinforce_pp_baseline", "sampler.n=1"])[0].algo.adv_estimator == "reinforce_pp_baseline"
    assert compose(["algo=cispo", "algo.loss_agg=seq-mean-token-sum-norm"])[0].algo.clip_eps_low == 1.0
    assert compose(["algo=gmpo", "algo.adv_estimator=rloo"])[0].algo.policy_loss == "gmpo"


@pytest.mark.parametrize("algo, switches", [
    ("rloo", (True, True, True, False)),  # the in-reward KL reads the old and the reference log-probs
    ("reinforce_pp", (True, True, True, False)),
    ("reinforce_pp_baseline", (True, True, True, False)),
    ("cispo", (False, False, True, False)),
    ("gmpo", (False, False, True, False)),
])
def test_preset_switches(algo, switches):
    a = compose([f"algo={algo}"])[0].algo
    assert (a.uses_token_rewards, a.needs_reference, a.needs_old_logprobs, a.adapts_kl_coef) == switches
    assert compose([f"algo={algo}", "algo.kl_ctrl=adaptive"])[0].algo.adapts_kl_coef == a.uses_token_rewards


# ---- end to end --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["rloo", "reinforce_pp", "reinforce_pp_baseline", "cispo", "gmpo"])
def test_new_preset_trains_two_steps(algo):
    cfg, _, _ = compose(TINY + ["reward.fns=[math_correct,tests.helpers:char_count]", "reward.weights=[1,1]",
                                f"algo={algo}", "optim.lr=1e-2"])
    c = build_components(cfg)
    before = [p.detach().clone() for p in c.policy.trainable_parameters()]
    for step in (1, 2):
        m = train_step(step, c, cfg)
        assert m["update/skipped"] == 0.0
        for k in ("loss", "entropy", "approx_kl", "grad_norm", "clip_frac/low", "clip_frac/high", "adv/mean"):
            assert math.isfinite(m[k]), k
        if cfg.algo.kl_in_reward:
            assert math.isfinite(m["kl/seq_ref"])
    after = c.policy.trainable_parameters()
    assert any(not torch.equal(a, b) for a, b in zip(after, before))
