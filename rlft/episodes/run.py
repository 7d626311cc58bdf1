"""Sampling whole episodes: the policy's turn, the environment's answer, the policy's next turn, ...

Every episode of a call advances together: one sampler call per turn for the episodes still going
(grouped by the room each has left), each continuing from its exact token ids (prompt, the policy's
earlier turns, the environment's messages). vLLM caches the shared prefixes across turns.

Sampling seeds: turn 1 of episode j is seeded as a single-turn completion would be (the rollout's
per-prompt seeds); turn k > 1 draws from that seed with k folded into bits 40+, which no seed of the
rollout's first turns uses, so episodes are reproducible and independent of how they are batched.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rlft.episodes.env import Step
from rlft.episodes.tokens import turn_suffix_ids
from rlft.errors import EnvError, EnvOvertime
from rlft.samplers import Generations, Sampler, SamplingParams
from rlft.samplers.base import completion_seeds


@dataclass(frozen=True)
class Limits:
    max_turns: int
    """Policy turns per episode at most."""
    max_tokens: int
    """Tokens after the prompt at most (the policy's and the environment's)."""
    max_context: int | None = None
    """The sampler's longest sequence, prompt included (vLLM's max_model_len; None: no limit)."""
    env_timeout_s: float = 0.0
    """Wall-clock limit of one call into the environment (0: none)."""


@dataclass
class Episodes(Generations):
    """Generations whose completions are whole episodes: everything after the prompt.

    Attributes (besides Generations'; ``logprobs`` are 0.0 on tokens the policy did not write):
        policy_mask: Per episode, 1 on each token the policy wrote, 0 on the environment's.
        turns: The policy's turns per episode.
        transcripts: Per episode, the messages after the prompt: the policy's replies (role
            assistant, special tokens removed) and the environment's messages.
        env_rewards: Per episode, the sum of its Step rewards (None: no step gave one).
        events: Step events summed over the episodes, by name.
    """

    policy_mask: list[list[int]] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    transcripts: list[list[dict[str, Any]]] = field(default_factory=list)
    env_rewards: list[float | None] = field(default_factory=list)
    events: dict[str, int] = field(default_factory=dict)


@dataclass
class _Episode:
    prompt: list[int]
    env: Any
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    transcript: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    cut: bool = False
    """The last turn hit its token cap without a stop token."""
    truncated: bool = False
    reward: float | None = None

    def add_turn(self, ids: list[int], lps: list[float] | None, cut: bool, text: str) -> None:
        self.tokens += ids
        self.mask += [1] * len(ids)
        self.logprobs += lps if lps is not None else [0.0] * len(ids)
        self.transcript.append({"role": "assistant", "content": text})
        self.turns += 1
        self.cut = cut

    def add_context(self, ids: list[int], messages: list[dict[str, Any]]) -> None:
        self.tokens += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.transcript += messages


def run_episodes(sampler: Sampler, tokenizer: Any, prompts: list[list[int]], params: SamplingParams,
                 make_env: Callable[[int], Any], limits: Limits, env_name: str = "environment") -> Episodes:
    """``params.n`` episodes per prompt (prompt-major, as Generations), ``make_env(prompt_index)`` building
    each one's environment.

    Raises:
        EnvError: an environment raised, or returned something that is not a Step.
    """
    first = sampler.generate(prompts, params)
    seeds = completion_seeds(params) or [None] * len(first.completion_ids)
    texts = tokenizer.batch_decode(first.completion_ids, skip_special_tokens=True)
    episodes = []
    for i, p in enumerate(first.prompt_index):
        ep = _Episode(prompts[p], _build(make_env, p, env_name, limits.env_timeout_s))
        ep.add_turn(first.completion_ids[i], first.logprobs[i] if first.logprobs else None, first.truncated[i], texts[i])
        episodes.append(ep)
    events: dict[str, int] = {}
    going = list(range(len(episodes)))
    while going:
        going = [i for i in going if _advance(episodes[i], tokenizer, limits, params, env_name, events)]
        for room, idx in _by_room(episodes, going, limits, params.max_new_tokens).items():
            turn_params = dataclasses.replace(
                params, n=1, max_new_tokens=room, seed=None,
                prompt_seeds=None if seeds[0] is None else tuple(_turn_seed(seeds[i], episodes[i].turns) for i in idx))
            gens = sampler.generate([episodes[i].prompt + episodes[i].tokens for i in idx], turn_params)
            new_texts = tokenizer.batch_decode(gens.completion_ids, skip_special_tokens=True)
            for k, i in enumerate(idx):
                episodes[i].add_turn(gens.completion_ids[k], gens.logprobs[k] if gens.logprobs else None,
                                     gens.truncated[k], new_texts[k])
    logged = first.logprobs is not None
    return Episodes(list(first.prompt_index), [e.tokens for e in episodes], [e.truncated for e in episodes],
                    [e.logprobs for e in episodes] if logged else None, [e.mask for e in episodes],
                    [e.turns for e in episodes], [e.transcript for e in episodes], [e.reward for e in episodes], events)


@contextmanager
def _user_call(env_name: str, what: str, timeout_s: float) -> Iterator[None]:
    """Run user environment code: what it raises (SystemExit too), or running past ``timeout_s``
    (SIGALRM, main thread only), becomes one EnvError naming the environment and ``what`` it did."""
    timed = timeout_s > 0 and threading.current_thread() is threading.main_thread()
    if timed:
        def fire(signum: int, frame: Any) -> None:
            raise EnvOvertime

        previous = signal.signal(signal.SIGALRM, fire)
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        yield
    except EnvOvertime:
        raise EnvError(f"{env_name}: {what} ran past episode.env_timeout_s={timeout_s:g}s") from None
    except (Exception, SystemExit) as e:  # noqa: BLE001  (user code)
        raise EnvError(f"{env_name}: {what} raised {type(e).__name__}: {e}") from None
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def _build(make_env: Callable[[int], Any], prompt_index: int, env_name: str, timeout_s: float) -> Any:
    with _user_call(env_name, "building it", timeout_s):
        return make_env(prompt_index)


def _advance(ep: _Episode, tokenizer: Any, limits: Limits, params: SamplingParams, env_name: str,
             events: dict[str, int]) -> bool:
    """Show the environment the policy's last reply; True when the policy takes another turn."""
    if ep.cut:  # cut mid-reply: the environment is not shown a partial turn
        ep.truncated = True
        return False
    step = _step(ep, env_name, limits.env_timeout_s)
    for name, count in step.events.items():
        events[name] = events.get(name, 0) + count
    if step.reward is not None:
        ep.reward = (ep.reward or 0.0) + float(step.reward)
    if step.done:
        return False
    if ep.turns >= limits.max_turns:
        ep.truncated = True
        return False
    stop = ep.tokens[-1] if ep.tokens else None
    # The start-up check (EpisodeSetup.check_template) rendered a probe answer; what an environment sends may differ.
    ids = turn_suffix_ids(tokenizer, step.messages, tokenizer.decode([stop]) if stop is not None else "",
                          f"the environment ({env_name}) must answer in roles the template takes")
    if _room(ep, ids, limits, params.max_new_tokens) < 1:
        ep.truncated = True
        return False
    ep.add_context(ids, step.messages)
    return True


def _step(ep: _Episode, env_name: str, timeout_s: float) -> Step:
    reply = ep.transcript[-1]["content"]
    with _user_call(env_name, f"step() on the reply {reply[:60]!r}", timeout_s):
        step = ep.env.step(reply)
    if not isinstance(step, Step):
        raise EnvError(f"{env_name}: step() returned {type(step).__name__}, not rlft.episodes.env.Step")
    return step


def _room(ep: _Episode, extra: list[int], limits: Limits, max_new_tokens: int) -> int:
    """New tokens the policy's next turn may take after ``extra`` is appended."""
    used = len(ep.tokens) + len(extra)
    room = min(max_new_tokens, limits.max_tokens - used)
    if limits.max_context is not None:
        room = min(room, limits.max_context - len(ep.prompt) - used)
    return room


def _by_room(episodes: list[_Episode], going: list[int], limits: Limits, max_new_tokens: int) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i in going:
        out.setdefault(_room(episodes[i], [], limits, max_new_tokens), []).append(i)
    return out


def _turn_seed(seed: int, turns_done: int) -> int:
    return seed ^ (turns_done << 40)


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
    return Episodes(*common, [m for p in parts for m in p.policy_mask], [t for p in parts for t in p.turns],
                    [t for p in parts for t in p.transcripts], [r for p in parts for r in p.env_rewards], events)
