"""Log-probs and the update against slow, independent computations on the tiny model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlft.algorithms import LossNorm
from rlft.config import compose
from rlft.models import build_policy
from rlft.training.batch import RolloutBatch, pack
from rlft.training.learner import _policy_loss
from rlft.training.logprobs import token_logprobs
from tests.support import TINY

STATE = SimpleNamespace(penalty_beta=1.0)  # the coefficients adapted in training (the clip loss reads none)


@pytest.fixture(scope="module")
def tiny():
    return tiny_fp32_policy()


def tiny_fp32_policy():
    """The tiny model in fp32 with a non-trivial adapter, and its config."""
    cfg, _, _ = compose(TINY + ["model.dtype=fp32"])
    policy, _ = build_policy(cfg.model, 0, need_reference=True)
    with torch.no_grad():  # a non-trivial adapter
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    return cfg, policy


def _batch(n_rows=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(5, 3000, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist() for _ in range(n_rows)]
    comps = [torch.randint(5, 3000, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g).tolist() for _ in range(n_rows)]
    ids, start, length, mask = pack(prompts, comps, pad_id=2)
    groups = torch.arange(n_rows) // 2
    scores = torch.randn(n_rows, generator=g)
    cut = torch.zeros(n_rows, dtype=torch.bool)
    return prompts, comps, RolloutBatch(ids, start, length, mask, groups, scores, cut)


def test_pack_layout():
    ids, start, length, mask = pack([[7, 8], [9]], [[1, 2, 3], [4]], pad_id=0)
    assert ids.tolist() == [[7, 8, 1, 2, 3], [9, 4, 0, 0, 0]]
    assert start.tolist() == [2, 1] and length.tolist() == [3, 1]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]]


def test_select_trims_padding():
    _, _, batch = _batch()
    sub = batch.select(torch.tensor([1, 3]))
    assert sub.size == 2
    assert sub.input_ids.shape[1] == int((sub.resp_start + sub.resp_len).max())
    assert sub.response_mask.shape[1] == int(sub.resp_len.max())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_match_full_forward_per_row(tiny, temperature):
    cfg, policy = tiny
    prompts, comps, batch = _batch()
    with torch.no_grad():
        fast, entropy = token_logprobs(policy.model, batch, temperature, chunk_tokens=3)
        for i, (p, c) in enumerate(zip(prompts, comps)):
            logits = policy.model(input_ids=torch.tensor([p + c])).logits[0].float() / temperature
            logp_all = torch.log_softmax(logits, -1)
            for t, tok in enumerate(c):
                want = logp_all[len(p) + t - 1, tok]
                assert fast[i, t].item() == pytest.approx(want.item(), abs=1e-4)
                probs = logp_all[len(p) + t - 1].exp()
                ent = -(probs * logp_all[len(p) + t - 1]).sum()
                assert entropy[i, t].item() == pytest.approx(ent.item(), abs=1e-3)


@pytest.mark.parametrize("train", [False, True])
def test_tokens_outside_the_loss_mask_stay_in_the_context(tiny, train):
    """An episode's environment tokens (0 in the response mask) are context: the policy's later tokens
    get the log-probs of a full forward over the whole row, with the prompt-sharing pass and without it."""
    cfg, policy = tiny
    prompts, comps, _ = _batch(n_rows=4, seed=5)
    comps = [c + [40, 41, 42, 43] + c for c in comps]  # reply, 4 environment tokens, reply
    ids, start, length, mask = pack(prompts, comps, pad_id=2)
    for i, c in enumerate(comps):
        half = (len(c) - 4) // 2
        mask[i, half: half + 4] = 0
    batch = RolloutBatch(ids, start, length, mask, torch.arange(4) // 2, torch.zeros(4), torch.zeros(4, dtype=torch.bool))
    was = policy.model.training
    policy.model.train(train)
    if train:
        policy.model.gradient_checkpointing_enable()
    try:
        with torch.no_grad():
            fast, _ = token_logprobs(policy.model, batch, 0.7)
            whole, _ = token_logprobs(policy.model, batch, 0.7, whole_rows=True)
            assert torch.allclose(fast, whole, atol=1e-5)
            for i, (p, c) in enumerate(zip(prompts, comps)):
                logp_all = torch.log_softmax(policy.model(input_ids=torch.tensor([p + c])).logits[0].float() / 0.7, -1)
                for t, tok in enumerate(c):
                    want = logp_all[len(p) + t - 1, tok].item() if mask[i, t] else 0.0
                    assert fast[i, t].item() == pytest.approx(want, abs=1e-4), (i, t)
    finally:
        if train:
            policy.model.gradient_checkpointing_disable()
        policy.model.train(was)


def _grads(policy, batch, cfg, micro):
    policy.model.zero_grad(set_to_none=True)
    norm = LossNorm(float(batch.size), float(batch.response_mask.sum()), float(cfg.sampler.max_new_tokens))
    for rows in torch.arange(batch.size).split(micro):
        loss, _ = _policy_loss(policy, batch.select(rows), cfg.algo, STATE, 1.0, norm)
        loss.backward()
    return {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
def test_gradient_accumulation_equals_one_pass(tiny, agg):
    cfg, policy = tiny
    cfg.algo.loss_agg = agg
    _, _, batch = _batch(n_rows=6, seed=3)
    batch.advantages = torch.randn(batch.response_mask.shape) * batch.response_mask
    with torch.no_grad(), policy.reference() as ref:
        batch.ref_logp, _ = token_logprobs(ref, batch, 1.0)
    whole = _grads(policy, batch, cfg, micro=6)
    parts = _grads(policy, batch, cfg, micro=2)
    assert whole.keys() == parts.keys() and whole
    for k in whole:
        assert torch.allclose(whole[k], parts[k], atol=1e-6, rtol=1e-4), k


def test_reference_is_base_model_without_adapter(tiny):
    cfg, policy = tiny
    _, _, batch = _batch()
    with torch.no_grad():
        on, _ = token_logprobs(policy.model, batch, 1.0)
        with policy.reference() as ref:
            off, _ = token_logprobs(ref, batch, 1.0)
        plain = policy.model.get_base_model()
        with policy.model.disable_adapter():
            base = plain(input_ids=batch.input_ids[:1, : int(batch.resp_start[0] + batch.resp_len[0])]).logits
    mask = batch.response_mask.bool()
    assert not torch.allclose(on[mask], off[mask], atol=1e-3)
    lp = torch.log_softmax(base[0].float(), -1)
    first = lp[int(batch.resp_start[0]) - 1, int(batch.input_ids[0, batch.resp_start[0]])]
    assert off[0, 0].item() == pytest.approx(first.item(), abs=1e-4)


@pytest.mark.parametrize("temperature,chunk", [(1.0, 4), (0.7, 3), (1.3, 100)])
def test_chunked_logprob_gradients_match_autograd(temperature, chunk):
    """The hand-written backward (recomputed chunks) against autograd through a full log_softmax, in fp64."""
    from rlft.training.logprobs import _TokenLogProbs

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(10, 6, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(17, 6, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 17, (10,), generator=g)
    upstream = torch.randn(10, generator=g, dtype=torch.float64)

    logp, entropy = _TokenLogProbs.apply(hidden, weight, targets, temperature, chunk)
    (logp.double() * upstream).sum().backward()
    got_h, got_w = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None

    all_lp = torch.log_softmax(hidden @ weight.t() / temperature, -1)
    want = all_lp.gather(-1, targets[:, None]).squeeze(-1)
    (want * upstream).sum().backward()
    assert torch.allclose(logp.double(), want.detach(), atol=1e-5)
    assert torch.allclose(entropy.double(), -(all_lp.exp() * all_lp).sum(-1).detach(), atol=1e-5)
    assert torch.allclose(got_h, hidden.grad, atol=1e-5)
    assert torch.allclose(got_w, weight.grad, atol=1e-5)


def test_shared_prompt_pass_equals_full_forward_with_gradients(tiny):
    """Rows with the same prompt share one prompt pass: log-probs and gradients equal per-row forwards."""
    cfg, policy = tiny
    g = torch.Generator().manual_seed(5)
    base_prompts = [[1, 77, 300, 41], [1, 9, 2500, 600, 12, 7]]
    prompts = [base_prompts[i // 3] for i in range(6)]
    comps = [torch.randint(5, 3000, (n,), generator=g).tolist() for n in (3, 1, 5, 4, 2, 5)]
    ids, start, length, mask = pack(prompts, comps, pad_id=2)
    batch = RolloutBatch(ids, start, length, mask, torch.arange(6) // 3, torch.zeros(6),
                         torch.zeros(6, dtype=torch.bool))
    weights = torch.randn(mask.shape, generator=g) * mask
    params = [p for p in policy.model.parameters() if p.requires_grad]

    policy.model.zero_grad(set_to_none=True)
    shared, _ = token_logprobs(policy.model, batch, 0.9)
    (shared * weights).sum().backward()
    grads_shared = [p.grad.clone() for p in params]

    policy.model.zero_grad(set_to_none=True)
    for i, (p, c) in enumerate(zip(prompts, comps)):
        logits = policy.model(input_ids=torch.tensor([p + c])).logits[0].float() / 0.9
        lp = torch.log_softmax(logits[len(p) - 1 : len(p) + len(c) - 1], -1).gather(-1, torch.tensor(c)[:, None])
        assert torch.allclose(shared[i, : len(c)].detach(), lp.squeeze(-1).detach(), atol=1e-4)
        (lp.squeeze(-1) * weights[i, : len(c)]).sum().backward()
    for a, p in zip(grads_shared, params):
        assert torch.allclose(a, p.grad, atol=1e-5, rtol=1e-3)
    assert any(a.abs().max() > 0 for a in grads_shared)


def _mismatched_batch(policy, shifts):
    """A batch with random advantages, the policy's log-probs as old_logp, and sampler log-probs such that
    old - sampler = shifts[t] at column t of every row."""
    _, _, batch = _batch(n_rows=4, seed=7)
    mask = batch.response_mask
    batch.advantages = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)) * mask
    with torch.no_grad():
        batch.old_logp, _ = token_logprobs(policy.model, batch, 1.0)
    shift = torch.tensor(shifts)[: mask.shape[1]]
    batch.sampler_logp = (batch.old_logp - shift[None, :]) * mask
    return batch, shift


def test_tis_weight_and_mismatch_metrics_on_a_constructed_batch(tiny):
    """weight = min(exp(old - sampler), cap) per token, multiplying the policy-gradient loss."""
    import dataclasses

    cfg, policy = tiny
    batch, shift = _mismatched_batch(policy, [0.5, -0.3, 1.2, 0.0, -2.0])
    mask = batch.response_mask
    algo = dataclasses.replace(cfg.algo, tis_cap=2.0, beta=0.0, loss_agg="token-mean")
    norm = LossNorm(float(batch.size), float(mask.sum()), 8.0)
    loss, m = _policy_loss(policy, batch, algo, STATE, 1.0, norm)
    weight = torch.exp(shift).clamp(max=2.0)[None, :].expand_as(mask)
    want_mean = float((weight * mask).sum() / mask.sum())
    assert float(m["rollout/is_weight_mean"]) == pytest.approx(want_mean, abs=1e-5)
    assert float(m["rollout/logp_abs_diff_max"]) == pytest.approx(float((shift.abs()[None, :] * mask).max()), abs=1e-5)
    # At the rollout policy the ratio is 1, so the clipped loss of a token is -A, times its weight.
    want_loss = float((-batch.advantages * weight * mask).sum() / mask.sum())
    assert float(loss.detach()) == pytest.approx(want_loss, abs=1e-4)
    plain, _ = _policy_loss(policy, batch, dataclasses.replace(algo, tis_cap=0.0), STATE, 1.0, norm)
    assert float(plain) != pytest.approx(want_loss, abs=1e-3)


@pytest.mark.parametrize("mode", ["seq_mask", "token_mask", "seq_tis", "seq_geo_mask", "seq_geo_tis"])
def test_rollout_corrections_weight_the_policy_loss(tiny, mode):
    """The mode's weight multiplies the policy-gradient term (not the KL term) and its metrics are logged."""
    import dataclasses

    from rlft.algorithms import ROLLOUT_CORRECTIONS

    cfg, policy = tiny
    batch, _ = _mismatched_batch(policy, [0.3, -0.6, 1.1, 0.0, -0.2])
    mask = batch.response_mask
    with torch.no_grad(), policy.reference() as ref:
        batch.ref_logp, _ = token_logprobs(ref, batch, 1.0)
    # every row's geometric-mean ratio is exp(0.2) = 1.22: seq_geo_tis clips it only under a band below that
    high = 1.1 if mode == "seq_geo_tis" else 1.6
    algo = dataclasses.replace(cfg.algo, rollout_correction=mode, rollout_is_low=0.6, rollout_is_high=high,
                               beta=0.04, loss_agg="token-mean")
    norm = LossNorm(float(batch.size), float(mask.sum()), 8.0)
    loss, m = _policy_loss(policy, batch, algo, STATE, 1.0, norm)
    weight, want_m = ROLLOUT_CORRECTIONS.get(mode)(batch.old_logp, batch.sampler_logp, mask, 0.6, high)
    assert 0 < float((weight == 0).float().mul(mask).sum() + (weight == high).float().mul(mask).sum())
    for k, v in want_m.items():
        assert float(m[k]) == pytest.approx(float(v), abs=1e-6), k
    # At the rollout policy the ratio is 1 and the k3 KL is computed against the reference.
    logp, _ = token_logprobs(policy.model, batch, 1.0)
    d = batch.ref_logp - logp.detach()
    kl = torch.exp(d) - d - 1
    want_loss = float(((-batch.advantages * weight + 0.04 * kl) * mask).sum() / mask.sum())
    assert float(loss) == pytest.approx(want_loss, abs=1e-4)


@pytest.mark.parametrize("targets", ["[q_proj,v_proj]", "[embed_tokens,q_proj]"])
def test_the_optimizer_holds_every_weight_the_adapter_trains(targets):
    """LoRA on an embedding too: peft names its weights lora_embedding_A.default (no '.default.'), which
    the optimizer left out, so that adapter never trained."""
    from rlft.training.optimizer import build_optimizer

    cfg, _, _ = compose([*TINY, "sampler=hf", f"model.lora.target_modules={targets}"])
    policy, _ = build_policy(cfg.model, 0, need_reference=False)
    opt, _ = build_optimizer(policy, cfg, 10)
    held = {id(p) for g in opt.param_groups for p in g["params"]}
    trained = {n: p for n, p in policy.model.named_parameters() if p.requires_grad}
    assert trained and all(id(p) in held for p in trained.values()), [n for n, p in trained.items() if id(p) not in held]
    assert len(held) == len(trained)
