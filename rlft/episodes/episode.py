"""One episode's state and the calls into its environment, shared by the lockstep loop (rlft.episodes.lockstep) and the
continuous one (rlft.episodes.continuous)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rlft.episodes.env import Step
from rlft.episodes.tokens import turn_suffix_ids
from rlft.errors import EnvError, EnvOvertime
from rlft.samplers import Generations, SamplingParams
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
        env_s: Wall-clock seconds spent waiting on the environments (building them and every step).
        env_seconds: Per episode, the seconds its own environment calls took (its longest chain).
    """

    policy_mask: list[list[int]] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    transcripts: list[list[dict[str, Any]]] = field(default_factory=list)
    env_rewards: list[float | None] = field(default_factory=list)
    events: dict[str, int] = field(default_factory=dict)
    env_s: float = 0.0
    env_seconds: list[float] = field(default_factory=list)


Progress = Callable[[int, int, int], None]
"""Told ``(done, generating, waiting on the environment)`` episode counts as a rollout's episodes advance."""


@dataclass
class Episode:
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
    env_s: float = 0.0

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


def tell(progress: Progress | None, done: int, generating: int, waiting: int) -> None:
    if progress is not None:
        progress(done, generating, waiting)


@contextmanager
def user_call(env_name: str, what: str, timeout_s: float) -> Iterator[None]:
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


def build_env(make_env: Callable[[int], Any], prompt_index: int, env_name: str, timeout_s: float) -> Any:
    with user_call(env_name, "building it", timeout_s):
        return make_env(prompt_index)


def apply_step(ep: Episode, step: Step, seconds: float, tokenizer: Any, limits: Limits, params: SamplingParams,
           env_name: str, events: dict[str, int]) -> bool:
    """Take the environment's answer into the episode; True when the policy takes another turn."""
    ep.env_s += seconds
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
    if room_after(ep, ids, limits, params.max_new_tokens) < 1:
        ep.truncated = True
        return False
    ep.add_context(ids, step.messages)
    return True


def step_inline(env: Any, reply: str, env_name: str, timeout_s: float) -> Step:
    """``env.step(reply)`` in this process, as user code (user_call)."""
    with user_call(env_name, f"step() on the reply {reply[:60]!r}", timeout_s):
        return env.step(reply)


def check_step(step: Any, env_name: str) -> None:
    if not isinstance(step, Step):
        raise EnvError(f"{env_name}: step() returned {type(step).__name__}, not rlft.episodes.env.Step")


def room_after(ep: Episode, extra: list[int], limits: Limits, max_new_tokens: int) -> int:
    """New tokens the policy's next turn may take after ``extra`` is appended."""
    used = len(ep.tokens) + len(extra)
    room = min(max_new_tokens, limits.max_tokens - used)
    if limits.max_context is not None:
        room = min(room, limits.max_context - len(ep.prompt) - used)
    return room


def turn_seed(seed: int, turns_done: int) -> int:
    return seed ^ (turns_done << 40)


def first_seeds(params: SamplingParams, num_prompts: int) -> list[int | None]:
    """Each episode's first-turn seed: what the lockstep loop's one request per prompt gives its n children."""
    if params.prompt_seeds is not None:
        return list(completion_seeds(params))
    if params.seed is not None:
        return [params.seed + j for _ in range(num_prompts) for j in range(params.n)]
    return [None] * (num_prompts * params.n)
