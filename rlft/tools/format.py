"""The tool-call format: how tools are shown to the policy and how its calls are read back.

rlft's format is the one of Qwen2.5 / Hermes chat templates: the tools' JSON schemas inside
``<tools></tools>``, and each call as a JSON object inside ``<tool_call></tool_call>``::

    <tool_call>{"name": "calculator", "arguments": {"expression": "123 * 456"}}</tool_call>

so that one parser reads the calls of a model whose chat template renders ``tools=`` (Qwen2.5, Hermes)
and those of a model prompted with :func:`system_prompt` (SmolLM2, whose template has no tools support).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from rlft.errors import RefusedValue

if TYPE_CHECKING:
    from rlft.tools.spec import Tool

OPEN, CLOSE = "<tool_call>", "</tool_call>"
CALL_EXAMPLE = '<tool_call>{"name": NAME, "arguments": {...}}</tool_call>'

MAX_DEPTH = 32
"""Arrays and objects of a call nested deeper than this (the call's own braces are level 1) are refused: json
recurses once per level (1000 ``[`` raise RecursionError), and so do repr, pickle and the logs of a call."""
MAX_INT_DIGITS = 1000
"""Integer literals with more digits than this are refused: Python converts int and str only up to 4300 digits
(json raises ValueError past it), and a tool that prints the value, or its square, must stay under that."""


class ToolCall(NamedTuple):
    """One call read from a reply; ``error`` (what is wrong with it, in words) when it is malformed."""

    name: str
    arguments: dict[str, Any]
    error: str | None = None


def system_prompt(tools: Sequence[Tool], preamble: str | None = None, max_calls: int | None = None,
                  result_role: str = "tool") -> str:
    """The system prompt that describes ``tools`` in rlft's format, after ``preamble`` (the run's own system
    prompt, if any); ``max_calls``: the calls of one reply that are run (episode.max_tool_calls; None: no cap);
    ``result_role``: the role the results come back in (episode.tool_role)."""
    schemas = "\n".join(json.dumps(t.schema, ensure_ascii=False) for t in tools)
    text = ("You can call tools. Their descriptions (JSON schemas) are within <tools></tools>:\n"
            f"<tools>\n{schemas}\n</tools>\n\n"
            f"To call a tool, write {CALL_EXAMPLE} with its arguments as a JSON object; "
            f"{_how_many(max_calls)}. {_results(result_role)} "
            "When you are done, answer without a tool call.")
    return f"{preamble}\n\n{text}" if preamble else text


def _results(role: str) -> str:
    """Where the results come back, in words for the system prompt (rlft.episodes.tool_env.result_messages)."""
    if role == "tool":
        return "The result of each call comes back in a tool message."
    return "The results of a reply's calls come back in one user message, each within <tool_response></tool_response>."


def _how_many(max_calls: int | None) -> str:
    """How many calls one reply may hold, in words for the system prompt."""
    if max_calls is None:
        return "you may write several calls in one reply"
    return "write one call per reply" if max_calls == 1 else f"you may write up to {max_calls} calls in one reply"


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>...</tool_call>`` of a reply, in order. Never raises, whatever the text: a malformed call
    (not JSON, no name, arguments that are not an object, a tag left open) or one holding what later stages could
    not handle (nesting past MAX_DEPTH, an integer past MAX_INT_DIGITS, NaN or an infinite number, a key twice in
    one object, a lone UTF-16 surrogate) comes back with ``error`` set."""
    calls: list[ToolCall] = []
    pos = 0
    while (start := text.find(OPEN, pos)) >= 0:
        end = text.find(CLOSE, start + len(OPEN))
        if end < 0:
            calls.append(ToolCall("", {}, f"the {OPEN} tag is never closed: end each call with {CLOSE}"))
            break
        calls.append(_parse_one(text[start + len(OPEN):end]))
        pos = end + len(CLOSE)
    return calls


def _parse_one(body: str) -> ToolCall:
    if _too_deep(body):  # before json, which would recurse through every level
        return ToolCall("", {}, f"the call nests arrays and objects more than {MAX_DEPTH} levels deep")
    try:
        call = json.loads(body, strict=False,  # strict=False: a raw newline inside a string (code) is accepted
                          parse_int=_read_int, parse_float=_read_float, parse_constant=_refuse_constant,
                          object_pairs_hook=_read_object)
    except RefusedValue as e:
        return ToolCall("", {}, str(e))
    except json.JSONDecodeError as e:
        return ToolCall("", {}, f"the call is not valid JSON ({e})")
    except (ValueError, RecursionError) as e:  # a last guard: the checks above leave json nothing else to raise
        return ToolCall("", {}, f"the call cannot be read ({type(e).__name__})")
    if _has_surrogate(call):  # a lone \ud800 escape: not text any tokenizer or UTF-8 file takes
        return ToolCall("", {}, "the call holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its pair)")
    if not isinstance(call, dict):
        return ToolCall("", {}, f"the call must be a JSON object with \"name\" and \"arguments\", not {_kind(call)}")
    name = call.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall("", {}, "the call has no \"name\" (a string naming the tool)")
    arguments = call.get("arguments", {})  # a tool without parameters may be called without them
    if not isinstance(arguments, dict):
        return ToolCall(name, {}, f"\"arguments\" must be a JSON object, not {_kind(arguments)}")
    return ToolCall(name, arguments)


# One token of a JSON text for _too_deep: a string (to the end of the text when it is never closed, where json
# stops too), or a bracket. Brackets inside strings are not nesting.
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)
_SURROGATE = re.compile("[\ud800-\udfff]")


def _too_deep(body: str) -> bool:
    """Whether ``body`` nests arrays and objects past MAX_DEPTH, counted without recursion. On the part json
    reads before it stops, strings and brackets are told apart as json does, so the count is json's depth."""
    depth = 0
    for match in _JSON_TOKEN.finditer(body):
        char = body[match.start()]
        if char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif char in "]}":
            depth = max(depth - 1, 0)  # a stray closer is a JSON error; it must not hide the brackets after it
    return False


def _read_int(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise RefusedValue(f"the call holds an integer of {digits} digits; at most {MAX_INT_DIGITS} are read")
    return int(text)


def _read_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 reads as inf, which JSON cannot write back
        raise RefusedValue(f"the number {text:.40} is out of range: numbers must be finite")
    return value


def _refuse_constant(name: str) -> Any:
    raise RefusedValue(f"{name} is not JSON: numbers must be finite")


def _read_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object, refused when a key comes twice (json would keep the last silently: which one is meant?)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise RefusedValue(f"the key {key!r:.60} appears twice in one object")
        out[key] = value
    return out


def _has_surrogate(value: Any) -> bool:
    """Whether a string anywhere in ``value`` (keys included) holds a UTF-16 surrogate; walked without recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _kind(value: Any) -> str:
    """A JSON value's type in words."""
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array"}
    return names.get(type(value), type(value).__name__)


_PROBE = "rlft_probe_tool_q7x"


def template_takes_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders ``tools=`` (a probe tool's name shows in its output)."""
    probe = {"type": "function", "function": {"name": _PROBE, "description": "A probe.",
                                              "parameters": {"type": "object", "properties": {}}}}
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tools=[probe], tokenize=False,
                                             add_generation_prompt=True)
    except Exception:  # noqa: BLE001  (no template, or a template that fails on tools: it does not take them)
        return False
    return isinstance(text, str) and _PROBE in text
