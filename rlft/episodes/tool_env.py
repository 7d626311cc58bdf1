"""The environment of an episode whose policy has ``tools``: each reply's tool calls are run (rlft.tools)
and their results come back as tool messages (``episode.tool_role=tool``), or together in one user message
(``user``: for chat templates that take only alternating user/assistant turns); a reply without a call ends
the episode."""

from __future__ import annotations

from collections.abc import Sequence

from rlft.episodes.env import Step
from rlft.tools.format import parse_tool_calls
from rlft.tools.run import ToolResult, ToolRunner, count_errors


class ToolEnv:
    """One episode's tool environment (the runner is shared by the run's episodes)."""

    def __init__(self, runner: ToolRunner, role: str = "tool"):
        self.runner, self.role = runner, role

    def step(self, reply: str) -> Step:
        calls = parse_tool_calls(reply)
        if not calls:  # the count is logged even when no episode calls (episode/tool_calls 0)
            return Step(done=True, events={"tool_calls": 0})
        results = self.runner.run_reply(calls)  # calls past episode.max_tool_calls read an error
        errors = count_errors(results)
        events = {"tool_calls": len(calls), "tool_errors": sum(errors.values()),
                  **{f"tool_errors/{kind}": n for kind, n in errors.items()}}
        return Step(messages=result_messages(results, self.role), events=events)


def result_messages(results: Sequence[ToolResult], role: str) -> list[dict[str, str]]:
    """The messages that bring a reply's tool results back: one tool message each (role ``tool``), or one user
    message holding each result in ``<tool_response></tool_response>``, in call order (role ``user``: the text
    Qwen2.5's template writes for a run of tool messages)."""
    if role == "tool":
        return [r.message() for r in results]
    return [{"role": "user", "content": "\n".join(f"<tool_response>\n{r.content}\n</tool_response>" for r in results)}]
