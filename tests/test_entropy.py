"""The policy's entropy: the logged mean over response tokens, and the optional entropy bonus's
gradient (computed chunk by chunk) against autograd through dense logits."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlft.algorithms import LOSS_AGGREGATIONS, POLICY_LOSSES, LossNorm, masked_mean
from rlft.config.schemas.algo import AlgoConfig
from rlft.training.learner import _policy_loss
from rlft.training.logprobs import _TokenLogProbs, token_logprobs
from tests.test_learner import STATE, _batch, tiny_fp32_policy


@pytest.fixture(scope="module")
def tiny():
    return tiny_fp32_policy()


@pytest.mark.parametrize("temperature,chunk", [(0.7, 3), (1.3, 4), (1.0, 100)])
def test_entropy_gradient_matches_dense_autograd(temperature, chunk):
    """d(u1 . logp + u2 . H) against logits -> log_softmax -> entropy by autograd, in fp64."""
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(11, 6, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(19, 6, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 19, (11,), generator=g)
    u_logp, u_ent = torch.randn(11, generator=g, dtype=torch.float64), torch.randn(11, generator=g, dtype=torch.float64)

    logp, entropy = _TokenLogProbs.apply(hidden, weight, targets, temperature, chunk, True)
    (logp.double() * u_logp + entropy.double() * u_ent).sum().backward()
    got_h, got_w = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None

    all_lp = torch.log_softmax(hidden @ weight.t() / temperature, -1)
    dense_ent = -(all_lp.exp() * all_lp).sum(-1)
    (all_lp.gather(-1, targets[:, None]).squeeze(-1) * u_logp + dense_ent * u_ent).sum().backward()
    assert torch.allclose(entropy.double(), dense_ent.detach(), atol=1e-5)
    assert torch.allclose(got_h, hidden.grad, atol=1e-5)
    assert torch.allclose(got_w, weight.grad, atol=1e-5)
    # the entropy's own share is not negligible: without it the gradient is another one
    hidden.grad = weight.grad = None
    all_lp = torch.log_softmax(hidden @ weight.t() / temperature, -1)
    (all_lp.gather(-1, targets[:, None]).squeeze(-1) * u_logp).sum().backward()
    assert not torch.allclose(got_h, hidden.grad, atol=1e-3)


def test_entropy_carries_no_gradient_without_the_bonus():
    hidden = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(9, 6, dtype=torch.float64)
    logp, entropy = _TokenLogProbs.apply(hidden, weight, torch.tensor([0, 1, 2, 3]), 1.0, 2)
    assert logp.requires_grad and not entropy.requires_grad


def _grads(policy):
    return {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}


def _setup(tiny, seed=4):
    cfg, policy = tiny
    _, _, batch = _batch(n_rows=5, seed=seed)
    mask = batch.response_mask
    batch.advantages = torch.randn(mask.shape, generator=torch.Generator().manual_seed(seed)) * mask
    norm = LossNorm(float(batch.size), float(mask.sum()), 8.0)
    return cfg, policy, batch, norm


def test_coef_zero_is_the_plain_loss_bit_for_bit(tiny):
    """entropy_coef=0: loss and gradients are exactly those of the policy loss without any entropy term."""
    cfg, policy, batch, norm = _setup(tiny)
    algo = dataclasses.replace(cfg.algo, beta=0.0, entropy_coef=0.0)
    policy.model.zero_grad(set_to_none=True)
    loss, _ = _policy_loss(policy, batch, algo, STATE, 0.8, norm)
    loss.backward()
    got = _grads(policy)

    policy.model.zero_grad(set_to_none=True)
    with policy.autocast():
        logp, _ = token_logprobs(policy.model, batch, 0.8)
    pg, _ = POLICY_LOSSES.get(algo.policy_loss)(logp, logp.detach(), batch.advantages, batch.response_mask, algo,
                                                STATE)
    plain = LOSS_AGGREGATIONS.get(algo.loss_agg)(pg, batch.response_mask, norm)
    plain.backward()
    want = _grads(policy)
    assert torch.equal(loss, plain)
    assert got.keys() == want.keys() and got
    assert all(torch.equal(got[k], want[k]) for k in got)


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
def test_entropy_bonus_against_a_dense_forward(tiny, agg):
    """loss(coef) = loss(0) - coef * agg(H), and its gradient, with H from full logits by autograd; the logged
    ``entropy`` is the mean token entropy over the response."""
    cfg, policy, batch, norm = _setup(tiny, seed=6)
    mask, temperature, coef = batch.response_mask, 0.8, 0.3
    algo = dataclasses.replace(cfg.algo, beta=0.0, loss_agg=agg, entropy_coef=0.0)
    policy.model.zero_grad(set_to_none=True)
    base, _ = _policy_loss(policy, batch, algo, STATE, temperature, norm)
    base.backward()
    g_base = _grads(policy)
    policy.model.zero_grad(set_to_none=True)
    loss, metrics = _policy_loss(policy, batch, dataclasses.replace(algo, entropy_coef=coef), STATE, temperature,
                                 norm)
    loss.backward()
    g_bonus = _grads(policy)

    policy.model.zero_grad(set_to_none=True)
    rows = []
    for i in range(batch.size):
        n = int(batch.resp_len[i])
        end = int(batch.resp_start[i]) + n
        logits = policy.model(input_ids=batch.input_ids[i : i + 1, :end]).logits[0, end - n - 1 : end - 1]
        lp = torch.log_softmax(logits.float() / temperature, -1)
        rows.append(torch.nn.functional.pad(-(lp.exp() * lp).sum(-1), (0, mask.shape[1] - n)))
    dense = torch.stack(rows)
    h_agg = LOSS_AGGREGATIONS.get(agg)(dense, mask, norm)
    h_agg.backward()
    g_h = _grads(policy)

    assert float(metrics["entropy"]) == pytest.approx(float(masked_mean(dense.detach(), mask)), abs=1e-4)
    assert float(loss.detach()) == pytest.approx(float(base.detach()) - coef * float(h_agg.detach()), abs=1e-5)
    for k in g_base:
        assert torch.allclose(g_bonus[k], g_base[k] - coef * g_h[k], atol=1e-5, rtol=1e-3), k
    assert any(float(g_h[k].abs().max()) > 1e-4 for k in g_h)


def test_an_entropy_bonus_learns_from_zero_advantages():
    assert AlgoConfig(beta=0.0, entropy_coef=0.01).learns_from_zero_advantages
    assert not AlgoConfig(beta=0.0).learns_from_zero_advantages
