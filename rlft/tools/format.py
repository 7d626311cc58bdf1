"""The tool-call format: how tools are shown to the policy and how its calls are read back.

rlft's format is the one of Qwen2.5 / Hermes chat templates: the tools' JSON schemas inside
``<tools></tools>``, and each call as a JSON object inside ``<tool_call></tool_call>``::

    <tool_call>{"name": "calculator", "arguments": {"expression": "123 * 456"}}</tool_call>

so that one parser reads the calls of a model whose chat template renders ``tools=`` (Qwen2.5, Hermes)
and those of a model prompted with :func:`system_prompt` (SmolLM2, whose template has no tools support).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from rlft.tools.spec import Tool

OPEN, CLOSE = "<tool_call>", "</tool_call>"
CALL_EXAMPLE = '<tool_call>{"name": NAME, "arguments": {...}}</tool_call>'


class ToolCall(NamedTuple):
    """One call read from a reply; ``error`` (what is wrong with it, in words) when it is malformed."""

    name: str
    arguments: dict[str, Any]
    error: str | None = None


def system_prompt(tools: Sequence[Tool], preamble: str | None = None) -> str:
    """The system prompt that describes ``tools`` in rlft's format, after ``preamble`` (the run's own system
    prompt, if any)."""
    schemas = "\n".join(json.dumps(t.schema, ensure_ascii=False) for t in tools)
    text = ("You can call tools. Their descriptions (JSON schemas) are within <tools></tools>:\n"
            f"<tools>\n{schemas}\n</tools>\n\n"
            f"To call a tool, write {CALL_EXAMPLE} with its arguments as a JSON object; "
            "you may write several calls in one reply. The result of each call comes back in a tool message. "
            "When you are done, answer without a tool call.")
    return f"{preamble}\n\n{text}" if preamble else text


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>...</tool_call>`` of a reply, in order. Never raises: a malformed call (not JSON, no
    name, arguments that are not an object, a tag left open) comes back with ``error`` set."""
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
    try:
        call = json.loads(body, strict=False)  # strict=False: a raw newline inside a string (code) is accepted
    except json.JSONDecodeError as e:
        return ToolCall("", {}, f"the call is not valid JSON ({e})")
    if not isinstance(call, dict):
        return ToolCall("", {}, f"the call must be a JSON object with \"name\" and \"arguments\", not {_kind(call)}")
    name = call.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall("", {}, "the call has no \"name\" (a string naming the tool)")
    arguments = call.get("arguments", {})  # a tool without parameters may be called without them
    if not isinstance(arguments, dict):
        return ToolCall(name, {}, f"\"arguments\" must be a JSON object, not {_kind(arguments)}")
    return ToolCall(name, arguments)


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
