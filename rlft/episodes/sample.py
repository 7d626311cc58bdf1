"""Sampling problems into scored-ready samples: one reply each, or whole episodes (rlft.episodes.lockstep).
Shared by the rollout and evaluation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlft.data.chat import problem_ids
from rlft.episodes.lockstep import Episodes, Progress, run_episodes
from rlft.rewards.functions import Sample
from rlft.samplers import Generations, Sampler, SamplingParams

if TYPE_CHECKING:
    from rlft.config.schemas.data import DataConfig
    from rlft.data import Problem
    from rlft.episodes.setup import EpisodeSetup


def sample_problems(sampler: Sampler, tokenizer: Any, problems: list[Problem], data_cfg: DataConfig,
                    params: SamplingParams, episodes: EpisodeSetup | None = None, progress: Progress | None = None
                    ) -> tuple[list[list[int]], Generations, list[Sample]]:
    """``params.n`` completions (or episodes) per problem: the prompts' ids, the generations, and one
    Sample per completion for the reward functions.

    An episode's Sample: ``completion`` is the policy's last reply, ``num_tokens`` the tokens the policy
    wrote, and the reward functions also get ``transcript`` (the messages after the prompt) and
    ``env_reward`` (the sum of the environment's step rewards, or None). ``progress`` is told the episode
    counts as they change.
    """
    prompts = [episodes.prompt_ids(tokenizer, p, data_cfg) if episodes else problem_ids(tokenizer, p, data_cfg)
               for p in problems]
    if episodes is None:
        gens = sampler.generate(prompts, params)
        texts = tokenizer.batch_decode(gens.completion_ids, skip_special_tokens=True)
        return prompts, gens, [
            Sample(problems[i].prompt, text, problems[i].answer, len(ids), cut, problems[i].columns, problems[i].messages)
            for i, text, ids, cut in zip(gens.prompt_index, texts, gens.completion_ids, gens.truncated)]
    eps = run_episodes(sampler, tokenizer, prompts, params, lambda i: episodes.make(problems[i]), episodes.limits,
                       episodes.name, progress, episodes.continuous)
    return prompts, eps, [_episode_sample(problems[i], eps, k) for k, i in enumerate(eps.prompt_index)]


def _episode_sample(problem: Problem, eps: Episodes, k: int) -> Sample:
    transcript = eps.transcripts[k]
    last = next((m["content"] for m in reversed(transcript) if m["role"] == "assistant"), "")
    columns = {**problem.columns, "transcript": transcript, "env_reward": eps.env_rewards[k]}
    return Sample(problem.prompt, last, problem.answer, sum(eps.policy_mask[k]), eps.truncated[k], columns,
                  problem.messages)
