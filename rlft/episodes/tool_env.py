"""The environment of an episode whose policy has ``tools``: each reply's tool calls are run (rlft.tools)
and their results come back as tool messages; a reply without a call ends the episode."""

from __future__ import annotations

from rlft.episodes.env import Step
from rlft.tools.format import parse_tool_calls
from rlft.tools.run import ToolRunner, count_errors


class ToolEnv:
    """One episode's tool environment (the runner is shared by the run's episodes)."""

    def __init__(self, runner: ToolRunner):
        self.runner = runner

    def step(self, reply: str) -> Step:
        calls = parse_tool_calls(reply)
        if not calls:  # the count is logged even when no episode calls (episode/tool_calls 0)
            return Step(done=True, events={"tool_calls": 0})
        results = self.runner.run_reply(calls)  # calls past episode.max_tool_calls read an error
        errors = count_errors(results)
        events = {"tool_calls": len(calls), "tool_errors": sum(errors.values()),
                  **{f"tool_errors/{kind}": n for kind, n in errors.items()}}
        return Step(messages=[r.message() for r in results], events=events)
