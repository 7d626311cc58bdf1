"""The environment of an episode whose policy has ``tools``: each reply's tool calls are run (rlft.tools)
and their results come back as tool messages (``episode.tool_role=tool``), or together in one user message
(``user``: for chat templates that take only alternating user/assistant turns); a reply without a call ends
the episode."""

from __future__ import annotations

from collections.abc import Sequence

from rlft.episodes.env import Step
from rlft.tools.dispatch import ToolRunner
from rlft.tools.format import parse_tool_calls
from rlft.tools.outcomes import ToolResult, count_errors


class ToolEnv:
    """One episode's tool environment (the runner is shared by the run's episodes)."""

    def __init__(self, runner: ToolRunner, role: str = "tool"):
        self.runner, self.role = runner, role

    def step(self, reply: str) -> Step:
        return self.step_batch([self], [reply])[0][0]

    def stepper(self) -> ToolSteps:
        """What steps this episode in the continuous loop (rlft.episodes.continuous): one per runner."""
        steps = getattr(self.runner, "steps", None)
        if steps is None:
            steps = self.runner.steps = ToolSteps(self.runner)
        return steps

    @staticmethod
    def step_batch(envs: Sequence[ToolEnv], replies: Sequence[str]) -> list[tuple[Step, float]]:
        """Each episode's step for its reply, and the seconds its calls ran: the calls of every reply run at once
        (rlft.episodes.lockstep steps all waiting episodes through this), one runner's calls in one batch."""
        out: list[tuple[Step, float] | None] = [None] * len(envs)
        parsed = [parse_tool_calls(r) for r in replies]
        for runner in {id(e.runner): e.runner for e in envs}.values():
            mine = [i for i, e in enumerate(envs) if e.runner is runner and parsed[i]]
            results, seconds = runner.run_replies([parsed[i] for i in mine])
            for i, res, s in zip(mine, results, seconds):
                out[i] = (envs[i].finish(len(parsed[i]), res), s)
        # a reply without a call ends the episode; the count is logged even when no episode calls (tool_calls 0)
        return [o if o is not None else (Step(done=True, events={"tool_calls": 0}), 0.0) for o in out]

    def finish(self, calls: int, results: list[ToolResult]) -> Step:
        errors = count_errors(results)
        events = {"tool_calls": calls, "tool_errors": sum(errors.values()),
                  **{f"tool_errors/{kind}": n for kind, n in errors.items()}}
        return Step(messages=result_messages(results, self.role), events=events)


class ToolSteps:
    """ToolEnv steps started one reply at a time and handed back as each reply's calls are all done (the
    continuous episode loop, rlft.episodes.continuous): ``submit(key, env, reply)``, then ``poll(timeout)``."""

    def __init__(self, runner: ToolRunner):
        self.runner = runner
        self.open: dict[int, tuple[ToolEnv, int]] = {}
        """The replies whose calls run: their environment and number of calls."""
        self.answers: list[tuple[int, Step, float]] = []

    def submit(self, key: int, env: ToolEnv, reply: str) -> None:
        calls = parse_tool_calls(reply)
        if not calls:  # a reply without a call ends the episode
            self.answers.append((key, Step(done=True, events={"tool_calls": 0}), 0.0))
            return
        self.open[key] = (env, len(calls))
        self.runner.start_replies([(key, calls)])

    def poll(self, timeout: float | None) -> list[tuple[int, Step, float]]:
        """The answers of replies whose calls are all done (waiting up to ``timeout`` seconds for one, None: as
        long as it takes)."""
        if not self.answers:
            if self.open and not self.runner.running:  # nothing could ever answer: fail rather than wait forever
                raise RuntimeError(f"{len(self.open)} tool replies are not running (an rlft bug)")
            for key, results, seconds in self.runner.poll(timeout):
                env, calls = self.open.pop(key)
                self.answers.append((key, env.finish(calls, results), seconds))
        out, self.answers = self.answers, []
        return out

    @property
    def running(self) -> int:
        return len(self.open) + len(self.answers)

    def abandon(self) -> None:
        self.runner.abandon()
        self.open, self.answers = {}, []


def result_messages(results: Sequence[ToolResult], role: str) -> list[dict[str, str]]:
    """The messages that bring a reply's tool results back: one tool message each (role ``tool``), or one user
    message holding each result in ``<tool_response></tool_response>``, in call order (role ``user``: the text
    Qwen2.5's template writes for a run of tool messages)."""
    if role == "tool":
        return [r.message() for r in results]
    return [{"role": "user", "content": "\n".join(f"<tool_response>\n{r.content}\n</tool_response>" for r in results)}]
