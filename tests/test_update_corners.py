"""Corners of the update: PPO-Penalty, KL early stopping, and steps with nothing to learn from."""

from __future__ import annotations

import pytest
import torch

from rlft.algorithms.losses import kl_penalty_surrogate
from rlft.config import compose
from rlft.models import build_policy
from rlft.training.learner import update_policy
from rlft.training.loop import build_components, train_step
from rlft.training.prepare import prepare_batch
from rlft.training.rollout import collect_rollout
from tests.support import ROOT, TINY, run_cli

VARIED = ["reward.fns=[tests.helpers:char_count]", "reward.weights=[1]"]


def _components(*overrides):
    cfg, _, _ = compose(TINY + VARIED + list(overrides))
    return cfg, build_components(cfg)


def _trainable(c) -> list[torch.Tensor]:
    return [p.detach().clone() for p in c.policy.trainable_parameters()]


@pytest.mark.parametrize("extra", [["algo.policy_loss=kl_penalty"], ["algo.early_stop_kl=0.01"]])
def test_single_step_options_that_cannot_act_are_refused(extra):
    r = run_cli(["train", *TINY, "algo=grpo", "algo.num_mini_batches=1", *extra], ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "algo.num_mini_batches > 1" in r.stderr


def test_penalty_gradient_matches_hand_computation_once_the_policy_moved():
    """d/dlogp [-r A + beta (r - 1 - log r)] = -r A + beta (r - 1), with r = exp(logp - old)."""
    old = torch.tensor([[-1.0, -2.0, -0.5]])
    delta = torch.tensor([[0.3, -0.2, 0.0]])
    adv = torch.tensor([[1.0, -2.0, 0.5]])
    mask = torch.ones(1, 3)
    grads = {}
    for beta in (0.0, 2.0):
        logp = (old + delta).requires_grad_(True)
        state = type("S", (), {"penalty_beta": beta})()
        loss, _ = kl_penalty_surrogate(logp, old, adv, mask, None, state)
        loss.sum().backward()
        grads[beta] = logp.grad
    r = torch.exp(delta)
    assert torch.allclose(grads[0.0], -r * adv, atol=1e-6)
    assert torch.allclose(grads[2.0], -r * adv + 2.0 * (r - 1), atol=1e-6)
    assert grads[2.0][0, 2] == grads[0.0][0, 2]  # where the policy has not moved the penalty is silent


@pytest.mark.parametrize("target,direction", [(1e-9, 2.0), (10.0, 0.5)])
def test_penalty_beta_moves_both_ways_on_real_steps(target, direction):
    cfg, c = _components("algo=grpo", "algo.policy_loss=kl_penalty", f"algo.penalty_target_kl={target}",
                         "optim.lr=1e-2")
    betas = [train_step(step, c, cfg)["penalty_beta"] for step in (1, 2, 3)]
    assert betas == [direction, direction**2, direction**3]


def test_tiny_early_stop_threshold_takes_exactly_one_step_per_rollout():
    cfg, c = _components("algo=ppo", "algo.ppo_epochs=4", "algo.num_mini_batches=2", "algo.early_stop_kl=1e-12",
                         "optim.lr=5e-2")
    for step in (1, 2):
        m = train_step(step, c, cfg)
        assert m["update/optimizer_steps"] == 1.0 and m["epochs_run"] == 1.0
    assert c.scheduler.last_epoch == 2  # one scheduler step per rollout
    cfg, c = _components("algo=ppo", "algo.ppo_epochs=2", "algo.num_mini_batches=2", "optim.lr=5e-2")
    assert train_step(1, c, cfg)["update/optimizer_steps"] == 4.0  # without the threshold: every step


def test_all_truncated_with_overlong_filter_leaves_weights_bit_identical():
    # The tiny random model never emits EOS within 8 tokens: the filter masks every row.
    cfg, c = _components("algo=dapo", "optim.weight_decay=0.1")
    fresh, _ = build_policy(cfg.model, cfg.seed, need_reference=False)
    for step in (1, 2):
        m = train_step(step, c, cfg)
        assert m["response/loss_tokens"] == 0.0 and m["update/skipped"] == 1.0
        assert m["update/optimizer_steps"] == 0.0
    assert c.scheduler.last_epoch == 0 and not c.optimizer.state
    for a, b in zip(c.policy.trainable_parameters(), fresh.trainable_parameters()):
        assert torch.equal(a, b)


def test_a_fully_masked_mini_batch_is_skipped_and_the_rest_still_updates():
    cfg, c = _components("algo=dapo", "algo.dynamic_sampling=false", "optim.lr=1e-2")
    rollout = collect_rollout(c, cfg)
    batch = rollout.batch
    probe = torch.Generator()
    probe.set_state(c.shuffle.get_state())
    first, second = torch.randperm(batch.size, generator=probe).chunk(cfg.algo.num_mini_batches)
    batch.truncated[:] = False
    batch.truncated[first] = True  # the overlong filter empties the first mini-batch only
    prepare_batch(c, batch, cfg)
    before = _trainable(c)
    m = update_policy(c, batch, cfg)
    assert m["update/optimizer_steps"] == 1.0 and m["update/skipped"] == 0.0
    assert c.scheduler.last_epoch == 1
    assert any(not torch.equal(a, b) for a, b in zip(c.policy.trainable_parameters(), before))


def test_zero_advantages_without_kl_or_critic_leave_weights_bit_identical():
    # math_correct on a random model: every group all wrong, every advantage 0, and beta=0: no signal.
    cfg, _, _ = compose(TINY + ["algo=grpo", "algo.beta=0", "optim.weight_decay=0.1"])
    c = build_components(cfg)
    before = _trainable(c)
    m = train_step(1, c, cfg)
    assert m["adv/std"] == 0.0 and m["response/loss_tokens"] > 0 and m["update/skipped"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(c.policy.trainable_parameters(), before))
    cfg, _, _ = compose(TINY + ["algo=grpo", "algo.beta=0.04"])  # a KL term is a signal: the step is taken
    c = build_components(cfg)
    assert train_step(1, c, cfg)["update/skipped"] == 0.0


def test_ppo_penalty_steps_on_zero_advantages():
    """PPO-Penalty's pull back to the old policy is a gradient of its own once the policy moved."""
    cfg, _, _ = compose(TINY + ["algo=grpo", "algo.beta=0", "algo.policy_loss=kl_penalty"])
    c = build_components(cfg)
    m = train_step(1, c, cfg)
    assert m["adv/std"] == 0.0 and m["update/optimizer_steps"] == float(cfg.algo.num_mini_batches)
