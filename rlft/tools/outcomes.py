"""What the policy reads from each tool call: a result or an error of one of :data:`ERRORS`, worded for the policy,
never an exception. The refusal of a call that does not fit its tool (malformed, unknown, bad arguments) and the
wording of each way a call ends; :func:`call_user` is what a worker runs (rlft.tools.dispatch runs the calls)."""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from rlft.errors import ToolTimeout
from rlft.tools.builtin import cut_output
from rlft.tools.format import CALL_EXAMPLE, ToolCall
from rlft.workers.user_calls import CallDied, CallFailed, CallTimeout, describe

if TYPE_CHECKING:
    from rlft.config.schemas.episode import EpisodeConfig
    from rlft.tools.spec import Tool

ERRORS = ("malformed", "unknown_tool", "bad_arguments", "raised", "timeout", "died", "not_a_string", "too_many_calls")
"""Error categories of a ToolResult, in the order metrics list them."""

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list,),
    "object": (dict,), "null": (type(None),),
}


class ToolResult(NamedTuple):
    """What one call gave the policy: ``content`` (the text it reads) and ``error`` (None, or one of ERRORS)."""

    name: str
    content: str
    error: str | None = None

    def message(self) -> dict[str, str]:
        """The tool message of a conversation."""
        return {"role": "tool", "name": self.name, "content": self.content}


class NotAString(NamedTuple):
    """A user tool's result that is not text, told by its type and a short repr (what crosses from the worker)."""

    type_name: str
    preview: str


def count_errors(results: Sequence[ToolResult]) -> dict[str, int]:
    """The number of results in each error category (every category of ERRORS, 0 included)."""
    counts = Counter(r.error for r in results if r.error)
    return {kind: counts.get(kind, 0) for kind in ERRORS}


def call_user(tools: dict[str, Callable[..., Any]], name: str, arguments: dict[str, Any]) -> Any:
    """In a worker: the user tool's text, or what else it returned as NotAString (any object would have to be
    pickled back, and some cannot)."""
    return text_or_not(tools[name](**arguments))


def refusal(tools: dict[str, Tool], call: ToolCall, limit: int) -> ToolResult | None:
    """The result of a call that is not run (malformed, an unknown tool, arguments that do not fit), its text cut
    at ``limit`` characters; None for a call to run."""
    if call.error is not None:
        return error(call.name, "malformed", f"malformed tool call: {call.error}. Write {CALL_EXAMPLE}", limit)
    tool = tools.get(call.name)
    if tool is None:
        return error(call.name, "unknown_tool", f"there is no tool named {call.name!r}; the tools are: {', '.join(tools)}",
                     limit)
    why = bad_arguments(tool, call.arguments)
    if why is not None:
        return error(call.name, "bad_arguments",
                     f"bad arguments for {call.name}: {why}; call it as {call.name}{signature(tool)}", limit)
    return None


def outcome_result(tool: Tool, name: str, outcome: Any, cfg: EpisodeConfig) -> ToolResult:
    """A call's outcome (a text, NotAString, or how it failed) as the policy's message."""
    limit = cfg.tool_output_chars
    if isinstance(outcome, str):
        return ToolResult(name, outcome if tool.builtin else cut_output(outcome, limit))
    if isinstance(outcome, NotAString):
        return error(name, "not_a_string", f"{name} returned {outcome.type_name} ({outcome.preview}), "
                                           "not a string: a tool must return text", limit)
    if isinstance(outcome, CallFailed) and isinstance(outcome.error, ToolTimeout):
        return error(name, "timeout", str(outcome.error), limit)
    if isinstance(outcome, CallFailed):
        return error(name, "raised", f"{name} raised {describe(outcome.error)}", limit)
    if isinstance(outcome, CallTimeout):
        return error(name, "timeout", f"{name} did not return within {cfg.tool_timeout_s:g} s and was stopped", limit)
    assert isinstance(outcome, CallDied), outcome
    return error(name, "died", f"{name} ended its process ({outcome.how}) without returning", limit)


def error(name: str, kind: str, text: str, limit: int) -> ToolResult:
    """An error result of category ``kind`` (one of ERRORS), its text cut at ``limit`` characters."""
    return ToolResult(name, cut_output(f"Error: {text}", limit), kind)


def bad_arguments(tool: Tool, arguments: dict[str, Any]) -> str | None:
    """Why ``arguments`` do not fit the tool's signature and schema types, in words; None when they fit."""
    try:
        inspect.signature(tool.fn).bind(**arguments)
    except TypeError as e:
        return str(e)
    except ValueError:  # no signature to check against (a builtin): the call itself will tell
        pass
    properties = tool.schema.get("function", {}).get("parameters", {}).get("properties", {})
    for key, value in arguments.items():
        spec = properties.get(key, {})
        wanted = spec.get("type")
        kinds = [wanted] if isinstance(wanted, str) else list(wanted or [])
        if not kinds or (value is None and spec.get("nullable")):
            continue
        if not any(isinstance(value, _JSON_TYPES.get(k, object)) and not (k in ("integer", "number")
                   and isinstance(value, bool)) for k in kinds):
            return f"'{key}' must be {' or '.join(kinds)}, not {type(value).__name__} {value!r:.60}"
    return None


def too_many(index: int, cap: int) -> str:
    """What the policy reads for call ``index`` (from 1) of a reply whose first ``cap`` calls ran."""
    ran = "only one tool call of a reply is run" if cap == 1 else f"only the first {cap} tool calls of a reply are run"
    return f"call {index} of this reply was not run: {ran}; call it again after reading these results"


def text_or_not(value: Any) -> Any:
    """A tool's result as text: a string as it is, a number or boolean through str() (as TRL does), anything
    else a NotAString."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)):
        return str(value)
    return NotAString(type(value).__name__, f"{value!r:.80}")


def signature(tool: Tool) -> str:
    try:
        return str(inspect.signature(tool.fn))
    except (TypeError, ValueError):
        return "(...)"
