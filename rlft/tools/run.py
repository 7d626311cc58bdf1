"""Running the policy's tool calls: every outcome, a bad call or a failing tool included, is a message the
policy reads, never an exception.

User tools are user code that may raise, hang, call ``sys.exit`` or ``os._exit`` or kill their process:
they run in forked worker processes (rlft.calls) with ``episode.tool_timeout_s`` as the limit of each
call. The built-ins are rlft's code and bound themselves (the python tool kills its own process group
at the limit): they run in this process, on threads, since a worker killed at the limit would leave the
python tool's process behind.
"""

from __future__ import annotations

import inspect
import os
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NamedTuple

from rlft.calls import CallDied, CallFailed, CallPolicy, CallTimeout, describe, settle_calls
from rlft.errors import ToolTimeout
from rlft.tools.builtin import cut_output
from rlft.tools.format import CALL_EXAMPLE, ToolCall

if TYPE_CHECKING:
    from rlft.config.schemas import EpisodeConfig
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


class ToolRunner:
    """Runs calls of ``tools`` under ``cfg``'s limits (``tool_timeout_s``, ``tool_output_chars``).

    Args:
        num_workers: Calls run at once (worker processes for user tools, threads for the built-ins);
            0: one per CPU core this process may use.
    """

    def __init__(self, tools: Sequence[Tool], cfg: EpisodeConfig, num_workers: int = 0):
        self.tools = {t.name: t for t in tools}
        self.cfg = cfg
        self.num_workers = num_workers or len(os.sched_getaffinity(0))
        self._threads: ThreadPoolExecutor | None = None

    def run(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """One result per call, in order. User tools run first, then the built-ins: forking workers while
        threads of this process are inside subprocess calls could copy a held lock into the workers."""
        results: list[ToolResult | None] = [self._refusal(c) for c in calls]
        pending = [i for i, r in enumerate(results) if r is None]
        user = [i for i in pending if not self.tools[calls[i].name].builtin]
        builtin = [i for i in pending if self.tools[calls[i].name].builtin]
        if user:
            policy = CallPolicy(min(self.num_workers, len(user)), self.cfg.tool_timeout_s)
            names = [calls[i].name for i in user]
            outcomes = settle_calls(self._call_user, [((calls[i].name, calls[i].arguments), {}) for i in user], policy)
            for i, name, outcome in zip(user, names, outcomes):
                results[i] = self._result(name, outcome)
        if builtin:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(self.num_workers, thread_name_prefix="rlft-tool")
            futures = [self._threads.submit(self._call_builtin, calls[i].name, calls[i].arguments) for i in builtin]
            for i, future in zip(builtin, futures):
                results[i] = self._result(calls[i].name, future.result())
        return [r for r in results if r is not None]

    def run_reply(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """One result per call of one reply: the first ``episode.max_tool_calls`` are run (run()), each call
        after them reads a too_many_calls error instead (a reply full of hanging calls would cost a timeout
        each)."""
        cap = self.cfg.max_tool_calls
        extra = [self._error(c.name, "too_many_calls", _too_many(i, cap)) for i, c in enumerate(calls[cap:], cap + 1)]
        return self.run(calls[:cap]) + extra

    def close(self) -> None:
        """Stop the threads (worker processes live only while run() runs)."""
        if self._threads is not None:
            self._threads.shutdown()
            self._threads = None

    def __enter__(self) -> ToolRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _refusal(self, call: ToolCall) -> ToolResult | None:
        """The result of a call that is not run: malformed, an unknown tool, arguments that do not fit."""
        if call.error is not None:
            return self._error(call.name, "malformed", f"malformed tool call: {call.error}. Write {CALL_EXAMPLE}")
        tool = self.tools.get(call.name)
        if tool is None:
            return self._error(call.name, "unknown_tool",
                               f"there is no tool named {call.name!r}; the tools are: {', '.join(self.tools)}")
        why = bad_arguments(tool, call.arguments)
        if why is not None:
            return self._error(call.name, "bad_arguments",
                               f"bad arguments for {call.name}: {why}; call it as {call.name}{_signature(tool)}")
        return None

    def _call_user(self, name: str, arguments: dict[str, Any]) -> Any:
        """In a worker: the tool's text, or what else it returned as NotAString (any object would have to be
        pickled back, and some cannot)."""
        return _text_or_not(self.tools[name].fn(**arguments))

    def _call_builtin(self, name: str, arguments: dict[str, Any]) -> Any:
        try:
            return _text_or_not(self.tools[name].fn(**arguments))
        except Exception as e:  # noqa: BLE001  (worded for the policy)
            return CallFailed(0, e)

    def _result(self, name: str, outcome: Any) -> ToolResult:
        """A call's outcome (a text, NotAString, or how it failed) as the policy's message."""
        if isinstance(outcome, str):
            return ToolResult(name, outcome if self.tools[name].builtin else cut_output(outcome, self._limit))
        if isinstance(outcome, NotAString):
            return self._error(name, "not_a_string", f"{name} returned {outcome.type_name} ({outcome.preview}), "
                                                     "not a string: a tool must return text")
        if isinstance(outcome, CallFailed) and isinstance(outcome.error, ToolTimeout):
            return self._error(name, "timeout", str(outcome.error))
        if isinstance(outcome, CallFailed):
            return self._error(name, "raised", f"{name} raised {describe(outcome.error)}")
        if isinstance(outcome, CallTimeout):
            return self._error(name, "timeout", f"{name} did not return within {self.cfg.tool_timeout_s:g} s and was "
                                                "stopped")
        assert isinstance(outcome, CallDied), outcome
        return self._error(name, "died", f"{name} ended its process ({outcome.how}) without returning")

    def _error(self, name: str, kind: str, text: str) -> ToolResult:
        return ToolResult(name, cut_output(f"Error: {text}", self._limit), kind)

    @property
    def _limit(self) -> int:
        return self.cfg.tool_output_chars


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


def _too_many(index: int, cap: int) -> str:
    """What the policy reads for call ``index`` (from 1) of a reply whose first ``cap`` calls ran."""
    ran = "only one tool call of a reply is run" if cap == 1 else f"only the first {cap} tool calls of a reply are run"
    return f"call {index} of this reply was not run: {ran}; call it again after reading these results"


def _text_or_not(value: Any) -> Any:
    """A tool's result as text: a string as it is, a number or boolean through str() (as TRL does), anything
    else a NotAString."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)):
        return str(value)
    return NotAString(type(value).__name__, f"{value!r:.80}")


def _signature(tool: Tool) -> str:
    try:
        return str(inspect.signature(tool.fn))
    except (TypeError, ValueError):
        return "(...)"
