"""The HF sampler's decode loop against transformers' generate, and the sampling rules."""

from __future__ import annotations

import torch

from rlft.config import compose
from rlft.models import build_policy
from rlft.samplers import Sampler, SamplingParams, build_sampler, sync_sampler
from rlft.samplers.hf import sample_next
from tests.support import TINY


def _sampler(dtype="fp32"):
    cfg, _, _ = compose(TINY + [f"model.dtype={dtype}"])
    policy, copy = build_policy(cfg.model, 0, need_reference=False)
    return build_sampler(cfg.sampler, cfg.model, copy, policy.tokenizer, 0), policy.tokenizer


def test_greedy_matches_transformers_generate():
    sampler, tok = _sampler()
    prompts = [[1, 50, 60, 70], [1, 900], [1, 5, 6, 7, 8, 9, 10], [300, 301]]
    gens = sampler.generate(prompts, SamplingParams(n=1, max_new_tokens=12, greedy=True))
    for p, got, cut in zip(prompts, gens.completion_ids, gens.truncated):
        ref = sampler.model.generate(
            torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), max_new_tokens=12,
            do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        )[0, len(p) :].tolist()
        if tok.eos_token_id in ref:
            ref = ref[: ref.index(tok.eos_token_id) + 1]
        assert got == ref
        assert cut == (tok.eos_token_id not in got)
        assert len(got) <= 12


def test_eos_ends_a_row_and_others_continue():
    sampler, tok = _sampler()
    eos = tok.eos_token_id
    with torch.no_grad():  # make EOS the argmax after token 77 only
        head = sampler.model.get_output_embeddings().weight
        emb = sampler.model.get_input_embeddings().weight
        head[eos] = emb[77] * 50
    gens = sampler.generate([[5, 77], [5, 78]], SamplingParams(n=1, max_new_tokens=6, greedy=True))
    assert gens.completion_ids[0] == [eos] and gens.truncated[0] is False


def test_groups_are_prompt_major_and_sampled():
    sampler, _ = _sampler()
    gens = sampler.generate([[1, 2, 3], [4, 5]], SamplingParams(n=3, max_new_tokens=5, temperature=1.0))
    assert gens.prompt_index == [0, 0, 0, 1, 1, 1]
    assert len({tuple(c) for c in gens.completion_ids[:3]}) > 1  # random model at T=1: distinct samples


def test_sample_next_rules():
    g = torch.Generator().manual_seed(0)
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]] * 4000)
    greedy = sample_next(logits, SamplingParams(greedy=True), g)
    assert torch.all(greedy == 1)
    assert torch.all(sample_next(logits, SamplingParams(top_k=1), g) == 1)
    assert torch.all(sample_next(logits, SamplingParams(top_p=0.5), g) == 1)  # p(1) = 0.64 >= 0.5
    top2 = sample_next(logits, SamplingParams(top_k=2), g)
    assert set(top2.tolist()) == {1, 2}
    counts = torch.bincount(sample_next(logits, SamplingParams(temperature=2.0), g), minlength=4).float() / 4000
    want = torch.softmax(logits[0] / 2.0, -1)
    assert torch.allclose(counts, want, atol=0.03)


def test_every_eos_of_the_generation_config_stops_a_row():
    """Chat models list several EOS ids (end of turn, end of text); the tokenizer knows one."""
    from rlft.samplers.base import stop_token_ids

    sampler, tok = _sampler()
    prompt = [[1, 50, 60, 70]]
    free = sampler.generate(prompt, SamplingParams(n=1, max_new_tokens=12, greedy=True)).completion_ids[0]
    k = next(i for i in range(1, len(free)) if free[i] not in free[:i])  # a token first seen at position k
    sampler.model.generation_config.eos_token_id = [tok.eos_token_id, free[k]]
    stop = stop_token_ids(sampler.model.generation_config, tok)
    assert stop == sorted({tok.eos_token_id, free[k]})
    cfg, _, _ = compose(TINY + ["model.dtype=fp32"])
    two_eos = build_sampler(cfg.sampler, cfg.model, sampler.model, tok, 0)
    gens = two_eos.generate(prompt, SamplingParams(n=1, max_new_tokens=12, greedy=True))
    assert gens.completion_ids[0] == free[: k + 1] and gens.truncated == [False]


def test_the_run_seed_changes_the_hf_samplers_draws():
    """Prompt seeds carry the run seed in their high 32 bits, which torch's CPU generator drops: the
    hf sampler folds them in, so seeds 1, 2 and 12345 draw other noise for the same step and prompt,
    and a run's completions keep distinct generator seeds."""
    from rlft.samplers.base import completion_seeds
    from rlft.samplers.hf import generator_seed
    from rlft.training.rollout import prompt_seeds

    def draws(run_seed: int) -> torch.Tensor:
        params = SamplingParams(n=4, max_new_tokens=8, prompt_seeds=prompt_seeds(run_seed, 3, range(2), 2, 4))
        return torch.stack([torch.rand(8, generator=torch.Generator().manual_seed(generator_seed(s)))
                            for s in completion_seeds(params)])

    a, b, c = draws(1), draws(2), draws(12345)
    assert not torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(b, c)
    assert torch.equal(a, draws(1))
    seeds = [s for cursor in range(50) for s in
             completion_seeds(SamplingParams(n=8, prompt_seeds=prompt_seeds(7, cursor, range(16), 16, 8)))]
    assert len({generator_seed(s) for s in seeds}) == len(seeds)


def test_the_hf_sampler_is_a_sampler_synced_by_weights():
    """It has every member the trainer calls (no hasattr there): its sleep keeps the weights and the
    next call samples as before; a sync pushes weights, never an adapter."""
    sampler, tok = _sampler()
    assert isinstance(sampler, Sampler) and not sampler.serves_adapter
    params = SamplingParams(n=2, max_new_tokens=8, greedy=True)
    before = sampler.generate([[1, 50, 60]], params)
    sampler.sleep()
    assert sampler.generate([[1, 50, 60]], params).completion_ids == before.completion_ids
    cfg, _, _ = compose(TINY + ["model.dtype=fp32"])
    policy, _ = build_policy(cfg.model, 1, need_reference=False)  # another seed: other weights
    merged = dict(policy.sampler_weights())
    assert not all(torch.equal(sampler.model.get_parameter(n), w) for n, w in merged.items())
    sync_sampler(sampler, policy)  # load_weights (load_adapter would raise)
    assert all(torch.equal(sampler.model.get_parameter(n), w) for n, w in merged.items())
