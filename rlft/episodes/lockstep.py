"""Sampling whole episodes: the policy's turn, the environment's answer, the policy's next turn, ...

Every episode of a call advances together: one sampler call per turn for the episodes still going
(grouped by the room each has left), each continuing from its exact token ids (prompt, the policy's
earlier turns, the environment's messages). vLLM caches the shared prefixes across turns. Between two
turns the environments of all episodes waiting on them are stepped at once: an environment class with a
``step_batch(envs, replies)`` (the tools' ToolEnv, the worker-held user environments) takes its episodes
together; any other is stepped one episode after another in this process.

Sampling seeds: turn 1 of episode j is seeded as a single-turn completion would be (the rollout's
per-prompt seeds); turn k > 1 draws from that seed with k folded into bits 40+, which no seed of the
rollout's first turns uses, so episodes are reproducible and independent of how they are batched.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from rlft.episodes.continuous import stream_episodes
from rlft.episodes.env import Step
from rlft.episodes.episode import (
    Episode,
    Episodes,
    Limits,
    Progress,
    apply_step,
    build_env,
    check_step,
    first_seeds,
    room_after,
    step_inline,
    tell,
    turn_seed,
)
from rlft.errors import ConfigError
from rlft.samplers import Generations, Sampler, SamplingParams

__all__ = ["Episodes", "Limits", "Progress", "concat", "run_episodes"]


def run_episodes(sampler: Sampler, tokenizer: Any, prompts: list[list[int]], params: SamplingParams,
                 make_env: Callable[[int], Any], limits: Limits, env_name: str = "environment",
                 progress: Progress | None = None, continuous: bool = False) -> Episodes:
    """``params.n`` episodes per prompt (prompt-major, as Generations), ``make_env(prompt_index)`` building
    each one's environment; ``progress`` is told the episode counts as they change. ``continuous``: episodes
    that do not wait for each other (rlft.episodes.continuous; the sampler must take requests one at a time).

    Raises:
        EnvError: an environment raised, or returned something that is not a Step.
    """
    # episode.max_tokens bounds the first turn too (the later turns: rlft.episodes.episode.room_after), both schedules.
    params = dataclasses.replace(params, max_new_tokens=min(params.max_new_tokens, limits.max_tokens))
    if continuous:
        if not hasattr(sampler, "submit"):
            raise ConfigError(f"{type(sampler).__name__} runs episodes in lockstep only (episode.schedule=lockstep)")
        return stream_episodes(sampler, tokenizer, prompts, params, make_env, limits, env_name, progress)
    first = sampler.generate(prompts, params)
    seeds = first_seeds(params, len(prompts))
    texts = tokenizer.batch_decode(first.completion_ids, skip_special_tokens=True)
    episodes = []
    t0 = time.perf_counter()
    for i, p in enumerate(first.prompt_index):
        ep = Episode(prompts[p], build_env(make_env, p, env_name, limits.env_timeout_s))
        ep.add_turn(first.completion_ids[i], first.logprobs[i] if first.logprobs else None, first.truncated[i], texts[i])
        episodes.append(ep)
    env_s = time.perf_counter() - t0
    events: dict[str, int] = {}
    going = list(range(len(episodes)))
    while going:
        tell(progress, len(episodes) - len(going), 0, len(going))
        t0 = time.perf_counter()
        going = _advance_all(episodes, going, tokenizer, limits, params, env_name, events)
        env_s += time.perf_counter() - t0
        tell(progress, len(episodes) - len(going), len(going), 0)
        for room, idx in _by_room(episodes, going, limits, params.max_new_tokens).items():
            turn_params = dataclasses.replace(
                params, n=1, max_new_tokens=room, seed=None,
                prompt_seeds=None if seeds[idx[0]] is None else tuple(turn_seed(seeds[i], episodes[i].turns) for i in idx))
            gens = sampler.generate([episodes[i].prompt + episodes[i].tokens for i in idx], turn_params)
            new_texts = tokenizer.batch_decode(gens.completion_ids, skip_special_tokens=True)
            for k, i in enumerate(idx):
                episodes[i].add_turn(gens.completion_ids[k], gens.logprobs[k] if gens.logprobs else None,
                                     gens.truncated[k], new_texts[k])
    tell(progress, len(episodes), 0, 0)
    logged = first.logprobs is not None
    return Episodes(list(first.prompt_index), [e.tokens for e in episodes], [e.truncated for e in episodes],
                    [e.logprobs for e in episodes] if logged else None, [e.mask for e in episodes],
                    [e.turns for e in episodes], [e.transcript for e in episodes], [e.reward for e in episodes], events,
                    env_s, [e.env_s for e in episodes])


def _advance_all(episodes: list[Episode], going: list[int], tokenizer: Any, limits: Limits, params: SamplingParams,
                 env_name: str, events: dict[str, int]) -> list[int]:
    """Show the environments of ``going`` the policy's last replies, all at once; the episodes whose policy takes
    another turn."""
    stepped = []
    for i in going:
        if episodes[i].cut:  # cut mid-reply: the environment is not shown a partial turn
            episodes[i].truncated = True
        else:
            stepped.append(i)
    steps = _step_all([episodes[i] for i in stepped], env_name, limits.env_timeout_s)
    return [i for i, (step, seconds) in zip(stepped, steps)
            if apply_step(episodes[i], step, seconds, tokenizer, limits, params, env_name, events)]


def _step_all(eps: list[Episode], env_name: str, timeout_s: float) -> list[tuple[Step, float]]:
    """Each episode's Step for its last reply and the seconds it took: the environments whose class has a
    ``step_batch`` all at once, class by class; the others one after another."""
    out: list[tuple[Step, float] | None] = [None] * len(eps)
    by_class: dict[type, list[int]] = {}
    for k, ep in enumerate(eps):
        by_class.setdefault(type(ep.env), []).append(k)
    for cls, ks in by_class.items():
        batch = getattr(cls, "step_batch", None)
        if batch is not None:
            for k, answer in zip(ks, batch([eps[k].env for k in ks], [eps[k].transcript[-1]["content"] for k in ks])):
                out[k] = answer
            continue
        for k in ks:
            t0 = time.perf_counter()
            step = step_inline(eps[k].env, eps[k].transcript[-1]["content"], env_name, timeout_s)
            out[k] = (step, time.perf_counter() - t0)
    for answer in out:
        assert answer is not None
        check_step(answer[0], env_name)
    return out  # type: ignore[return-value]


def _by_room(episodes: list[Episode], going: list[int], limits: Limits, max_new_tokens: int) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i in going:
        out.setdefault(room_after(episodes[i], [], limits, max_new_tokens), []).append(i)
    return out


def concat(prompt_index: list[int], parts: list[Generations]) -> Generations:
    """Generations (or Episodes, when every part is) one after another, with the given prompt indices."""
    lps = [p.logprobs for p in parts]
    common = (prompt_index, [c for p in parts for c in p.completion_ids], [t for p in parts for t in p.truncated],
              None if any(lp is None for lp in lps) else [x for lp in lps for x in lp])
    if not all(isinstance(p, Episodes) for p in parts):
        return Generations(*common)
    events: dict[str, int] = {}
    for p in parts:
        for k, v in p.events.items():
            events[k] = events.get(k, 0) + v
    # The parts are ranks, stepping their environments at the same time: the longest wait is the round's.
    return Episodes(*common, [m for p in parts for m in p.policy_mask], [t for p in parts for t in p.turns],
                    [t for p in parts for t in p.transcripts], [r for p in parts for r in p.env_rewards], events,
                    max(p.env_s for p in parts), [s for p in parts for s in p.env_seconds])
