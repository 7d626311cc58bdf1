"""Nothing the policy writes ends the run: hostile and random replies through the tool-call parser, the runner
(with the calculator) and the whole tool environment. Each reply must give calls or error messages, never an
exception, and a call that parses must hold only what later stages (repr, pickle, json logs, a tokenizer) take."""

from __future__ import annotations

import json
import pickle
import random
import time
from typing import Any

import pytest

from rlft.config.schemas.episode import EpisodeConfig
from rlft.episodes.tool_env import ToolEnv
from rlft.tools.dispatch import ToolRunner
from rlft.tools.format import CLOSE, MAX_DEPTH, MAX_INT_DIGITS, OPEN, ToolCall, _too_deep, parse_tool_calls
from rlft.tools.outcomes import ERRORS, ToolResult
from rlft.tools.spec import load_tools


def _call(body: str) -> str:
    return f"{OPEN}{body}{CLOSE}"


def _calc(expression: Any) -> str:
    return json.dumps({"name": "calculator", "arguments": {"expression": expression}})


def _depth(value: Any) -> int:
    """Nesting of arrays and objects in a parsed value (a scalar is 0), walked without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def _strings(value: Any) -> list[str]:
    out, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            stack.extend([*item, *item.values()])
        elif isinstance(item, list):
            stack.extend(item)
    return out


def _check_call(call: Any) -> None:
    """What any later stage may rely on in a parsed call."""
    assert isinstance(call, ToolCall) and isinstance(call.name, str) and isinstance(call.arguments, dict)
    if call.error is not None:
        assert isinstance(call.error, str) and call.error and call.arguments == {}
        call.error.encode("utf-8")  # goes into the policy's context
        return
    assert call.name and _depth({"name": call.name, "arguments": call.arguments}) <= MAX_DEPTH
    for text in _strings(call.arguments) + [call.name]:
        text.encode("utf-8")  # no lone surrogate: a tokenizer and a UTF-8 log take it
    repr(call), pickle.dumps(call), json.dumps(call.arguments, allow_nan=False)  # logs, transcripts, workers


def _check_results(calls: list[ToolCall], results: list[Any]) -> None:
    assert len(results) == len(calls)
    for r in results:
        assert isinstance(r, ToolResult) and isinstance(r.content, str) and r.error in (None, *ERRORS)
        json.dumps(r.message()).encode("utf-8")
        r.content.encode("utf-8")


@pytest.fixture(scope="module")
def runner():
    cfg = EpisodeConfig(tool_timeout_s=5.0, max_tool_calls=4)
    with ToolRunner(load_tools(["calculator"], cfg), cfg, num_workers=2) as r:
        yield r


# ------------------------------------------------------------------------------------------ hostile replies


HOSTILE = {
    "1000 nested [": (_call("[" * 1000), f"more than {MAX_DEPTH} levels deep"),
    "1000 nested [ closed": (_call("[" * 1000 + "]" * 1000), f"more than {MAX_DEPTH} levels deep"),
    "deep arguments": (_call('{"name": "calculator", "arguments": {"expression": ' + '{"a": ' * 40 + "1" + "}" * 41 + "}"),
                       "levels deep"),
    "deep inside a string is text": (_call(_calc("[" * 1000)), None),
    "escaped quotes then depth": (_call('{"name": "f", "arguments": {"x": "\\"[[", "y": ' + "[" * 40 + "]" * 40 + "}}"),
                                  "levels deep"),
    "integer of 5000 digits": (_call('{"name": "f", "arguments": {"x": ' + "9" * 5000 + "}}"),
                               f"an integer of 5000 digits; at most {MAX_INT_DIGITS} are read"),
    "negative integer of 4301 digits": (_call('{"name": "f", "arguments": {"x": -' + "1" * 4301 + "}}"), "4301 digits"),
    "1e999": (_call('{"name": "f", "arguments": {"x": 1e999}}'), "the number 1e999 is out of range"),
    "-1e999": (_call('{"name": "f", "arguments": {"x": [-1e999]}}'), "out of range"),
    "long float": (_call('{"name": "f", "arguments": {"x": 0.' + "3" * 20000 + "}}"), None),
    "NaN": (_call('{"name": "f", "arguments": {"x": NaN}}'), "NaN is not JSON"),
    "Infinity": (_call('{"name": "f", "arguments": {"x": Infinity}}'), "Infinity is not JSON"),
    "-Infinity": (_call('{"name": "f", "arguments": {"x": -Infinity}}'), "-Infinity is not JSON"),
    "duplicate name": (_call('{"name": "calculator", "arguments": {}, "name": "python"}'), "the key 'name' appears twice"),
    "duplicate argument": (_call('{"name": "f", "arguments": {"x": 1, "x": 2}}'), "the key 'x' appears twice"),
    "escaped lone surrogate": (_call('{"name": "f", "arguments": {"x": "\\ud800"}}'), "lone UTF-16 surrogate"),
    "raw lone surrogate": (_call('{"name": "f", "arguments": {"x": "\ud800"}}'), "lone UTF-16 surrogate"),
    "surrogate in a name": (_call('{"name": "calc\\udfff", "arguments": {}}'), "lone UTF-16 surrogate"),
    "surrogate in a key": (_call('{"name": "f", "arguments": {"\\udc00": 1}}'), "lone UTF-16 surrogate"),
    "a surrogate pair is text": (_call('{"name": "f", "arguments": {"x": "\\ud83d\\ude00"}}'), None),
    "unterminated string": (_call('{"name": "calculator", "arguments": {"expression": "1+'), "not valid JSON"),
    "unterminated string of brackets": (_call('{"name": "f", "arguments": {"x": "' + "[" * 100), "not valid JSON"),
    "unclosed tag": (OPEN + '{"name": "calculator"}', "never closed"),
    "nested tags": (OPEN + _call(_calc("1+1")) + CLOSE, "not valid JSON"),
    "empty call": (_call(""), "not valid JSON"),
    "arguments a list": (_call('{"name": "calculator", "arguments": [1, 2]}'), "not an array"),
    "arguments a string": (_call('{"name": "calculator", "arguments": "1+1"}'), "not a string"),
    "arguments null": (_call('{"name": "calculator", "arguments": null}'), "not null"),
    "name a number": (_call('{"name": 7, "arguments": {}}'), 'has no "name"'),
    "name a list": (_call('{"name": ["calculator"], "arguments": {}}'), 'has no "name"'),
    "name empty": (_call('{"name": "", "arguments": {}}'), 'has no "name"'),
    "call a number": (_call("12"), "not a number"),
    "control characters": (_call('{"name": "calculator", "arguments": {"expression": "1\x00+\x1b2\x7f"}}'), None),
    "control characters in a name": (_call('{"name": "calc\x00\x07", "arguments": {}}'), None),
    "bidi and zero width": (_call('{"name": "calcu\u200blator", "arguments": {"expression": "\u202e1+1"}}'), None),
    "a huge expression": (_call(_calc("1+" * 50000 + "1")), None),
    "an expression of a huge power": (_call(_calc("9**9**9**9")), None),
    "tool name python (not loaded)": (_call('{"name": "python", "arguments": {"code": "import os; os.kill(os.getppid(), 9)"}}'),
                                      None),
    "json after a stray closer": (_call("]" * 100 + "[" * 100), "levels deep"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_replies_become_calls_or_errors(name, runner):
    reply, error = HOSTILE[name]
    start = time.monotonic()
    calls = parse_tool_calls(f"Let me see. {reply} Done.")
    assert time.monotonic() - start < 0.5
    assert len(calls) == 1
    _check_call(calls[0])
    if error is None:
        assert calls[0].error is None
    else:
        assert calls[0].error is not None and error in calls[0].error, calls[0].error
    results = runner.run(calls)
    _check_results(calls, results)
    if error is not None:
        assert results[0].error == "malformed" and results[0].content.startswith("Error: malformed tool call: ")


def test_hostile_replies_through_the_tool_environment(runner):
    env = ToolEnv(runner)
    for reply, _ in HOSTILE.values():
        step = env.step(reply)
        assert not step.done and len(step.messages) == 1 and step.events["tool_calls"] == 1
    everything = " ".join(reply for reply, _ in HOSTILE.values())  # one reply holding them all
    calls = parse_tool_calls(everything)
    step = env.step(everything)
    assert len(step.messages) == len(calls) and step.events["tool_calls"] == len(calls)
    assert step.events["tool_errors/too_many_calls"] == len(calls) - 4  # runner's cap: max_tool_calls=4


# ------------------------------------------------------------------------------------------- random replies


_FRAGMENTS = [
    OPEN, CLOSE, OPEN, CLOSE, "<tool_call", "</tool_", "<tool_call>\n", "\n</tool_call>",
    "{", "}", "[", "]", "{", "[", '"', '"', ":", ",", " ", "\n", "\\", '\\"', "\\\\", "\\u", "\\ud800", "\\udc00",
    "\\ud83d\\ude00", "\\n", '"name"', '"arguments"', '"calculator"', '"python"', '"expression"', '"1+2"',
    '"2**10"', '"9**9**9"', '"1/0"', "1", "-0", "3.5", "1e999", "-1e999", "1e-999", "1" * 5000, "NaN", "Infinity",
    "-Infinity", "true", "false", "null", "é", "😀", "\ud800", "\udfff", "\x00", "\x1b", "\t", "\u202e", "\u200b",
    "<|im_end|>", "<|im_start|>assistant\n", "[" * 40, "{\"a\":" * 40, "]" * 40, "[" * 1000,
]


def _random_json(rng: random.Random, depth: int) -> Any:
    """A random JSON value, nested up to ``depth`` (some of them past MAX_DEPTH)."""
    kind = rng.randrange(9 if depth > 0 else 6)
    if kind == 0:
        return rng.choice([0, -1, 7, 2**63, 10**rng.randrange(1, 1200), -(10**rng.randrange(1, 1200))])
    if kind == 1:
        return rng.choice([0.5, -2.25, 1e300, 5e-324, float("inf"), float("nan")])
    if kind == 2:
        return rng.choice([True, False, None])
    if kind in (3, 4, 5):
        return "".join(rng.choice(["1", "+", "*", "(", ")", "[", "]", "{", '"', "\\", "é", "\ud800", "\x00", " ", "9"])
                       for _ in range(rng.randrange(12)))
    if kind in (6, 7):
        return {rng.choice(["x", "expression", "", "name", "\ud801"]): _random_json(rng, depth - 1)
                for _ in range(rng.randrange(3))}
    return [_random_json(rng, depth - 1) for _ in range(rng.randrange(3))]


def _deep_json(rng: random.Random, depth: int) -> Any:
    """A value nested exactly ``depth`` deep: a spine of arrays and objects with random siblings."""
    value = _random_json(rng, 0)
    for _ in range(depth):
        siblings = [_random_json(rng, 1) for _ in range(rng.randrange(3))]
        if rng.random() < 0.5:
            value = [*siblings, value] if rng.random() < 0.5 else [value, *siblings]
        else:
            value = {**{f"k{i}": s for i, s in enumerate(siblings)}, "spine": value}
    return value


def _random_call(rng: random.Random) -> str:
    """A call-shaped JSON text: sometimes a well-formed calculator call, sometimes damaged."""
    if rng.random() < 0.3:
        expr = "".join(rng.choice(["1", "2", "9", "+", "-", "*", "/", "**", "(", ")", ".", "e", " "])
                       for _ in range(rng.randrange(1, 20)))
        body = {"name": "calculator", "arguments": {"expression": expr}}
    else:
        body = {"name": rng.choice(["calculator", "python", "", 3, None, ["x"]]),
                "arguments": _random_json(rng, 3) if rng.random() < 0.5 else _deep_json(rng, rng.randrange(1, 40))}
    try:
        text = json.dumps(body, ensure_ascii=rng.random() < 0.5)
    except RecursionError:  # cannot happen at these depths; keeps the generator honest
        text = "{}"
    if rng.random() < 0.3:  # damage it: cut, or splice a fragment in
        cut = rng.randrange(len(text) + 1)
        text = text[:cut] + (rng.choice(_FRAGMENTS) if rng.random() < 0.5 else "") + text[cut + rng.randrange(3):]
    return text


def _random_reply(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randrange(1, 8)):
        roll = rng.random()
        if roll < 0.35:
            parts.append(_call(_random_call(rng)))
        elif roll < 0.8:
            parts.append("".join(rng.choice(_FRAGMENTS) for _ in range(rng.randrange(1, 12))))
        else:  # any code point, surrogates included
            parts.append("".join(chr(rng.randrange(0x110000)) for _ in range(rng.randrange(1, 6))))
    return "".join(parts)


def test_random_replies_never_raise_and_each_gives_a_message(runner):
    rng = random.Random(1234)
    env = ToolEnv(runner)
    start, seen = time.monotonic(), {"ok": 0, "error": 0}
    for _ in range(3000):
        reply = _random_reply(rng)
        calls = parse_tool_calls(reply)
        for call in calls:
            _check_call(call)
            seen["error" if call.error else "ok"] += 1
        _check_results(calls, runner.run(calls))
        step = env.step(reply)
        assert step.done == (not calls) and len(step.messages) == len(calls)
        assert step.events["tool_calls"] == len(calls)
        assert step.events.get("tool_errors", 0) == sum(step.events.get(f"tool_errors/{k}", 0) for k in ERRORS)
    assert seen["ok"] > 300 and seen["error"] > 300, seen  # both kinds were exercised
    assert time.monotonic() - start < 60


def test_the_depth_scan_is_jsons_depth():
    """Where json reads a text whole, the scan's depth is the value's: a call is refused exactly when it nests
    past MAX_DEPTH (strings holding brackets and escaped quotes included)."""
    rng = random.Random(7)
    for _ in range(2000):
        text = json.dumps(_deep_json(rng, rng.randrange(25, 40)))
        value = json.loads(text)
        assert _too_deep(text) == (_depth(value) > MAX_DEPTH), text[:200]
