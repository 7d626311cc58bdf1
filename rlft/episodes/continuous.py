"""Episodes that do not wait for each other (``episode.schedule=continuous``, vLLM): every turn is its own request
in the engine, and an episode's next turn goes in as soon as its environment has answered, while the other
episodes generate or wait on theirs.

One loop in the trainer's thread drives two sources: the engine, one ``step()`` at a time (a token for each
running request, or a prefill), and the environments, whose steps run elsewhere (tool calls on the tool pool's
workers and threads, ``episode.env`` steps in the EnvPool's workers) and are collected without blocking while
the engine has work, or waited for when it has none. An environment stepped in this process (one handed to
``run_episodes`` directly) answers at once, inside the loop.

The episodes equal the lockstep loop's (rlft.episodes.lockstep) token for token where the sampler's tokens do not
depend on the batch (vLLM on the CPU in fp32, measured): each turn carries the seed the lockstep loop gives it
(turn 1 of completion j of a prompt seeded s: s + j, as vLLM seeds the children of a request; turn k: that
seed with k folded into its high bits).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

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
from rlft.samplers import SamplingParams

POLL_SLICE_S = 0.005
"""How long the loop waits on one source of environment answers when several are running and the engine is idle."""


def stream_episodes(sampler: Any, tokenizer: Any, prompts: list[list[int]], params: SamplingParams,
                    make_env: Callable[[int], Any], limits: Limits, env_name: str = "environment",
                    progress: Progress | None = None) -> Episodes:
    """As rlft.episodes.lockstep.run_episodes, on a sampler with ``submit``/``step``/``running`` (VLLMSampler)."""
    n = params.n
    seeds = first_seeds(params, len(prompts))
    episodes = []
    t0 = time.perf_counter()
    for i in range(len(prompts) * n):
        episodes.append(Episode(prompts[i // n], build_env(make_env, i // n, env_name, limits.env_timeout_s)))
    loop = _Loop(sampler, tokenizer, episodes, params, seeds, limits, env_name, progress)
    loop.env_s = time.perf_counter() - t0
    try:
        for i in range(len(episodes)):
            loop.submit_turn(i, params.max_new_tokens)
        loop.run()
    except BaseException:
        loop.abandon()
        raise
    tell(progress, len(episodes), 0, 0)
    logged = loop.logged
    return Episodes([i // n for i in range(len(episodes))], [e.tokens for e in episodes],
                    [e.truncated for e in episodes], [e.logprobs for e in episodes] if logged else None,
                    [e.mask for e in episodes], [e.turns for e in episodes], [e.transcript for e in episodes],
                    [e.reward for e in episodes], loop.events, loop.env_s, [e.env_s for e in episodes])


class _Loop:
    """The state of one continuous rollout: the episodes, what each waits on, and the environments' steppers."""

    def __init__(self, sampler: Any, tokenizer: Any, episodes: list[Episode], params: SamplingParams,
                 seeds: list[int | None], limits: Limits, env_name: str, progress: Progress | None):
        self.sampler, self.tokenizer, self.episodes, self.params = sampler, tokenizer, episodes, params
        self.seeds, self.limits, self.env_name, self.progress = seeds, limits, env_name, progress
        self.steppers: dict[int, Any] = {}
        """The environments' steppers in use, by id (one per tool runner or EnvPool, one for in-process ones)."""
        self.events: dict[str, int] = {}
        self.env_s = 0.0
        self.logged = True
        self.done = 0
        self.waiting = 0
        self._shown: tuple[int, int, int] | None = None

    def submit_turn(self, i: int, room: int) -> None:
        ep, seed = self.episodes[i], self.seeds[i]
        seed = seed if seed is None or ep.turns == 0 else turn_seed(seed, ep.turns)
        self.sampler.submit(i, ep.prompt + ep.tokens, dataclasses.replace(
            self.params, n=1, max_new_tokens=room, seed=seed, prompt_seeds=None))

    def run(self) -> None:
        while self.sampler.running or self.waiting:
            self._show()
            if self.sampler.running:
                for i, gens in self.sampler.step():
                    self._turn_done(i, gens)
                self._take_steps(0.0)
            else:
                t0 = time.perf_counter()
                self._take_steps(None)
                self.env_s += time.perf_counter() - t0

    def _turn_done(self, i: int, gens: Any) -> None:
        """The policy's turn of episode ``i`` came back: its environment gets the reply, unless it was cut."""
        ep = self.episodes[i]
        ids = gens.completion_ids[0]
        lps = gens.logprobs[0] if gens.logprobs else None
        self.logged = self.logged and lps is not None
        ep.add_turn(ids, lps, gens.truncated[0], self.tokenizer.decode(ids, skip_special_tokens=True))
        if ep.cut:  # cut mid-reply: the environment is not shown a partial turn
            ep.truncated = True
            self.done += 1
            return
        stepper = self._stepper(ep.env)
        self.waiting += 1
        t0 = time.perf_counter()
        stepper.submit(i, ep.env, ep.transcript[-1]["content"])
        self.env_s += time.perf_counter() - t0  # an in-process environment steps right here

    def _take_steps(self, timeout: float | None) -> None:
        """Collect the environments' answers (waiting up to ``timeout`` seconds, None: for one) and send the
        episodes that go on back to the engine."""
        busy = [s for s in self.steppers.values() if s.running]
        if not busy and timeout is None:  # nothing could ever answer: fail rather than wait forever
            raise RuntimeError(f"{self.waiting} episodes wait on environments that run nothing (an rlft bug)")
        if len(busy) > 1 and timeout is None:
            timeout = POLL_SLICE_S
        for stepper in busy:
            for i, step, seconds in stepper.poll(timeout):
                check_step(step, self.env_name)
                self.waiting -= 1
                self._answered(i, step, seconds)

    def _answered(self, i: int, step: Step, seconds: float) -> None:
        ep = self.episodes[i]
        if apply_step(ep, step, seconds, self.tokenizer, self.limits, self.params, self.env_name, self.events):
            self.submit_turn(i, room_after(ep, [], self.limits, self.params.max_new_tokens))
        else:
            self.done += 1

    def _stepper(self, env: Any) -> Any:
        make = getattr(env, "stepper", None)
        if make is None:
            return self.steppers.setdefault(0, _InProcess(self.env_name, self.limits.env_timeout_s))
        stepper = make()
        return self.steppers.setdefault(id(stepper), stepper)

    def _show(self) -> None:
        counts = (self.done, self.sampler.running, self.waiting)
        if counts != self._shown:
            self._shown = counts
            tell(self.progress, *counts)

    def abandon(self) -> None:
        """After a failure: the engine's requests are aborted and the environments' steps in flight dropped. Each
        step of the cleanup is tried whatever the others did, and none raises: the failure that started it is the
        one the run reports (a dead engine's abort, or a stepper whose workers are gone, goes to train.log)."""
        for what, undo in [("aborting the engine's requests", self.sampler.abort),
                           *[(f"dropping the steps of {type(s).__name__}", s.abandon) for s in self.steppers.values()]]:
            try:
                undo()
            except Exception as e:  # noqa: BLE001  (the first error is reported; this one is logged)
                logging.getLogger(__name__).warning("after the rollout failed, %s raised %s: %s", what,
                                                    type(e).__name__, e)


class _InProcess:
    """Steps environments that have no stepper of their own in this process, at once (under SIGALRM's limit)."""

    def __init__(self, env_name: str, timeout_s: float):
        self.env_name, self.timeout_s = env_name, timeout_s
        self.answers: list[tuple[int, Any, float]] = []

    def submit(self, key: int, env: Any, reply: str) -> None:
        t0 = time.perf_counter()
        step = step_inline(env, reply, self.env_name, self.timeout_s)
        self.answers.append((key, step, time.perf_counter() - t0))

    def poll(self, timeout: float | None) -> list[tuple[int, Any, float]]:
        out, self.answers = self.answers, []
        return out

    @property
    def running(self) -> int:
        return len(self.answers)

    def abandon(self) -> None:
        self.answers = []
