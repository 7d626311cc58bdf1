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
import signal
import threading
import time
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


def run_episodes(sampler: Sampler, tokenizer: Any, prompts: list[list[int]], params: SamplingParams,
                 make_env: Callable[[int], Any], limits: Limits, env_name: str = "environment",
                 progress: Progress | None = None) -> Episodes:
    """``params.n`` episodes per prompt (prompt-major, as Generations), ``make_env(prompt_index)`` building
    each one's environment; ``progress`` is told the episode counts as they change.

    Raises:
        EnvError: an environment raised, or returned something that is not a Step.
    """
    first = sampler.generate(prompts, params)
    seeds = completion_seeds(params) or [None] * len(first.completion_ids)
    texts = tokenizer.batch_decode(first.completion_ids, skip_special_tokens=True)
    episodes = []
    t0 = time.perf_counter()
    for i, p in enumerate(first.prompt_index):
        ep = _Episode(prompts[p], _build(make_env, p, env_name, limits.env_timeout_s))
        ep.add_turn(first.completion_ids[i], first.logprobs[i] if first.logprobs else None, first.truncated[i], texts[i])
        episodes.append(ep)
    env_s = time.perf_counter() - t0
    events: dict[str, int] = {}
    going = list(range(len(episodes)))
    while going:
        _tell(progress, len(episodes) - len(going), 0, len(going))
        t0 = time.perf_counter()
        going = _advance_all(episodes, going, tokenizer, limits, params, env_name, events)
        env_s += time.perf_counter() - t0
        _tell(progress, len(episodes) - len(going), len(going), 0)
        for room, idx in _by_room(episodes, going, limits, params.max_new_tokens).items():
            turn_params = dataclasses.replace(
                params, n=1, max_new_tokens=room, seed=None,
                prompt_seeds=None if seeds[0] is None else tuple(_turn_seed(seeds[i], episodes[i].turns) for i in idx))
            gens = sampler.generate([episodes[i].prompt + episodes[i].tokens for i in idx], turn_params)
            new_texts = tokenizer.batch_decode(gens.completion_ids, skip_special_tokens=True)
            for k, i in enumerate(idx):
                episodes[i].add_turn(gens.completion_ids[k], gens.logprobs[k] if gens.logprobs else None,
                                     gens.truncated[k], new_texts[k])
    _tell(progress, len(episodes), 0, 0)
    logged = first.logprobs is not None
    return Episodes(list(first.prompt_index), [e.tokens for e in episodes], [e.truncated for e in episodes],
                    [e.logprobs for e in episodes] if logged else None, [e.mask for e in episodes],
                    [e.turns for e in episodes], [e.transcript for e in episodes], [e.reward for e in episodes], events,
                    env_s, [e.env_s for e in episodes])


def _tell(progress: Progress | None, done: int, generating: int, waiting: int) -> None:
    if progress is not None:
        progress(done, generating, waiting)


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


def _advance_all(episodes: list[_Episode], going: list[int], tokenizer: Any, limits: Limits, params: SamplingParams,
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
            if _apply(episodes[i], step, seconds, tokenizer, limits, params, env_name, events)]


def _apply(ep: _Episode, step: Step, seconds: float, tokenizer: Any, limits: Limits, params: SamplingParams,
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
    if _room(ep, ids, limits, params.max_new_tokens) < 1:
        ep.truncated = True
        return False
    ep.add_context(ids, step.messages)
    return True


def _step_all(eps: list[_Episode], env_name: str, timeout_s: float) -> list[tuple[Step, float]]:
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
            step = _step(eps[k], env_name, timeout_s)
            out[k] = (step, time.perf_counter() - t0)
    for answer in out:
        assert answer is not None
        _check_step(answer[0], env_name)
    return out  # type: ignore[return-value]


def _step(ep: _Episode, env_name: str, timeout_s: float) -> Step:
    reply = ep.transcript[-1]["content"]
    with _user_call(env_name, f"step() on the reply {reply[:60]!r}", timeout_s):
        return ep.env.step(reply)


def _check_step(step: Any, env_name: str) -> None:
    if not isinstance(step, Step):
        raise EnvError(f"{env_name}: step() returned {type(step).__name__}, not rlft.episodes.env.Step")


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
    # The parts are ranks, stepping their environments at the same time: the longest wait is the round's.
    return Episodes(*common, [m for p in parts for m in p.policy_mask], [t for p in parts for t in p.turns],
                    [t for p in parts for t in p.transcripts], [r for p in parts for r in p.env_rewards], events,
                    max(p.env_s for p in parts), [s for p in parts for s in p.env_seconds])
