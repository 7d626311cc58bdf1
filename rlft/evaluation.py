"""Held-out evaluation: greedy accuracy of the current policy."""

from __future__ import annotations

from typing import Any

from rlft.data.chat import prompt_ids
from rlft.data.tasks import Problem
from rlft.rewards import score_samples
from rlft.rewards.registry import Sample
from rlft.rollout import Sampler, SamplingParams


def evaluate(sampler: Sampler, tokenizer: Any, problems: list[Problem], cfg: Any) -> dict[str, float]:
    """Greedy accuracy (the first reward function, usually correctness, > 0.5) on ``problems``.

    Returns:
        ``eval/accuracy`` and ``eval/mean_tokens``.
    """
    prompts = [prompt_ids(tokenizer, p.prompt, cfg.data.system_prompt) for p in problems]
    params = SamplingParams(n=1, max_new_tokens=cfg.sampler.max_new_tokens, greedy=True)
    gens = sampler.generate(prompts, params)
    texts = tokenizer.batch_decode(gens.completion_ids, skip_special_tokens=True)
    samples = [
        Sample(p.prompt, t, p.answer, len(ids), cut)
        for p, t, ids, cut in zip(problems, texts, gens.completion_ids, gens.truncated)
    ]
    _, per_fn = score_samples(cfg.reward.fns[:1], [1.0], samples, cfg.sampler.max_new_tokens)
    scores = per_fn[cfg.reward.fns[0]]
    return {
        "eval/accuracy": sum(s > 0.5 for s in scores) / len(scores),
        "eval/mean_tokens": gens.num_tokens / len(scores),
    }
