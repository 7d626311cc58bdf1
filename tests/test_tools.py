"""rlft.tools: loading tools, the call format, the built-ins and the runner, with real processes."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import pytest

from rlft.config.schemas.episode import EpisodeConfig
from rlft.config.validation import check_ranges
from rlft.errors import ConfigError
from rlft.tools.builtin import calculator
from rlft.tools.dispatch import ToolRunner
from rlft.tools.format import ToolCall, parse_tool_calls, system_prompt, template_takes_tools
from rlft.tools.outcomes import ERRORS, ToolResult, count_errors
from rlft.tools.spec import load_tools
from rlft.tools.validate import check_episode, check_tools
from tests.sandbox_attacks import running_named

H = "tests.tool_helpers"


def _call(name: str, **arguments) -> ToolCall:
    return ToolCall(name, arguments)


# ------------------------------------------------------------------------------------------- loading


def test_schema_of_a_docstring_function():
    (tool,) = load_tools([f"{H}:multiply"], EpisodeConfig())
    assert tool.name == "multiply" and not tool.builtin
    assert tool.schema["function"] == {
        "name": "multiply", "description": "Multiply two numbers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "description": "The first factor."},
            "b": {"type": "number", "description": "The second factor."}}, "required": ["a"]},
        "return": {"type": "string"}}
    assert tool.schema["type"] == "function"
    names = [t.name for t in load_tools(["calculator", "python"], EpisodeConfig())]
    assert names == ["calculator", "python"]


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    """A module that raises on import and one with a second function named ``multiply``."""
    (tmp_path / "tools_that_raise.py").write_text("raise RuntimeError('no database here')\n")
    (tmp_path / "other_tools.py").write_text(textwrap.dedent('''
        def multiply(x: int) -> str:
            """Another multiply.

            Args:
                x: A number.
            """
            return str(x)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.parametrize("entries, message", [
    (["pythn"], "tools: unknown built-in tool 'pythn'; built-ins: calculator, python, or a user function"),
    ([".m:f"], "tools: malformed tool '.m:f': expected 'pkg.module:function'"),
    (["calculator", "calculator"], "tools: 'calculator' is listed twice"),
    (["no_such_pkg_q.tools:f"], "cannot load tool 'no_such_pkg_q.tools:f': No module named 'no_such_pkg_q'"),
    (["tools_that_raise:f"], "tool 'tools_that_raise:f': importing tools_that_raise raised RuntimeError: no database"),
    ([f"{H}:nothing"], f"cannot load tool '{H}:nothing': module '{H}' has no attribute 'nothing'"),
    ([f"{H}:NOT_CALLABLE"], f"tool '{H}:NOT_CALLABLE' is not callable (int): name a function"),
    ([f"{H}:no_docstring"], "cannot describe it to the model (Cannot generate JSON schema for no_docstring because "
                            "it has no docstring!): it needs a docstring with a description, an Args section"),
    ([f"{H}:no_type_hints"], "(Argument x is missing a type hint in function no_type_hints): it needs a docstring"),
    ([f"{H}:multiply", "other_tools:multiply"], f"tools: '{H}:multiply' and 'other_tools:multiply' are both named "
                                                "'multiply'"),
])
def test_each_bad_tools_entry_is_one_line(user_modules, entries, message):
    with pytest.raises(ConfigError) as err:
        load_tools(entries, EpisodeConfig())
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_check_tools_imports_nothing_and_the_episode_checks():
    check_tools(["python", "calculator", "no_such_pkg_q.tools:f"])  # the shape only: importing is load_tools's job
    with pytest.raises(ConfigError, match="unknown built-in tool 'calc'"):
        check_tools(["calc"])
    check_episode(EpisodeConfig())
    with pytest.raises(ConfigError, match="episode.tool_format='xml'; valid choices: auto, template, rlft"):
        check_episode(EpisodeConfig(tool_format="xml"))
    with pytest.raises(ConfigError, match=r"^episode.python_max_procs=4 does nothing with episode.python_sandbox="
                                          r"process \(it bounds the sandbox's processes\): drop one of them$"):
        check_episode(EpisodeConfig(python_sandbox="process", python_max_procs=4))
    check_episode(EpisodeConfig(python_sandbox="process"))
    check_episode(EpisodeConfig(python_max_procs=4))
    check_ranges(EpisodeConfig(), "episode.")
    for field, value, message in [("tool_timeout_s", 0.0, "episode.tool_timeout_s=0.0 must be > 0"),
                                  ("max_turns", 0, "episode.max_turns=0 must be >= 1"),
                                  ("python_memory_mb", 8, "episode.python_memory_mb=8 must be >= 32"),
                                  ("max_tool_calls", 0, "episode.max_tool_calls=0 must be >= 1")]:
        with pytest.raises(ConfigError) as err:
            check_ranges(EpisodeConfig(**{field: value}), "episode.")
        assert str(err.value) == message


# -------------------------------------------------------------------------------------------- format


def test_parse_tool_calls_on_model_replies():
    one = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "123 * 456"}}\n</tool_call>'
    assert parse_tool_calls(one) == [ToolCall("calculator", {"expression": "123 * 456"}, None)]
    two = ('<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call> and then '
           '<tool_call>{"name": "python", "arguments": {"code": "print(1)\nprint(2)"}}</tool_call> done.')
    assert parse_tool_calls(two) == [ToolCall("calculator", {"expression": "2+2"}),
                                     ToolCall("python", {"code": "print(1)\nprint(2)"})]  # a raw newline in a string
    assert parse_tool_calls("The answer is 56088.") == []
    bad_json = parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {"expression": 2+2}}</tool_call>')
    assert bad_json[0].error.startswith("the call is not valid JSON (Expecting ',' delimiter")
    unclosed = parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}')
    assert unclosed == [ToolCall("", {}, "the <tool_call> tag is never closed: end each call with </tool_call>")]
    as_string = parse_tool_calls('<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1\\"}"}'
                                 '</tool_call>')
    assert as_string == [ToolCall("calculator", {}, '"arguments" must be a JSON object, not a string')]
    assert parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>')[0].error == \
        'the call has no "name" (a string naming the tool)'
    assert parse_tool_calls("<tool_call>[1, 2]</tool_call>")[0].error.endswith("not an array")
    assert parse_tool_calls('<tool_call>{"name": "now"}</tool_call>') == [ToolCall("now", {})]  # no arguments: {}
    # A good call after a malformed one is still read.
    mixed = parse_tool_calls('<tool_call>oops</tool_call><tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
    assert [c.error is None for c in mixed] == [False, True] and mixed[1].arguments == {"x": 1}


def test_system_prompt_lists_the_schemas_and_the_call_format():
    tools = load_tools(["calculator"], EpisodeConfig())
    text = system_prompt(tools, preamble="Solve the problem.")
    assert text.startswith("Solve the problem.\n\nYou can call tools.")
    assert '{"type": "function", "function": {"name": "calculator", "description": "Evaluate an arithmetic' in text
    assert '<tool_call>{"name": NAME, "arguments": {...}}</tool_call>' in text
    assert "answer without a tool call" in text
    assert "write one call per reply" in system_prompt(tools, max_calls=1)
    assert "you may write up to 3 calls in one reply" in system_prompt(tools, max_calls=3)


_TOOLS_TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>{% endif %}"
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}")


def test_template_takes_tools(compose_cfg):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from rlft.models.loading import load_tokenizer

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")))
    assert not template_takes_tools(tok)  # no chat template at all
    tok.chat_template = _TOOLS_TEMPLATE
    assert template_takes_tools(tok)
    tok.chat_template = _TOOLS_TEMPLATE.split("{% endif %}")[1]  # the same template without its tools part
    assert not template_takes_tools(tok)
    assert not template_takes_tools(load_tokenizer(compose_cfg("model=tiny").model))  # SmolLM2's template


# ---------------------------------------------------------------------------------------- calculator


def test_calculator_values():
    cases = {"2 + 3 * 4": "14", "-(3 - 5) ** 2": "-4", "7 // 2": "3", "-7 % 3": "2", "1 / 4": "0.25",
             "2 ** 10": "1024", "(1 + 2) * (3 + 4)": "21", "2 ** 0.5": "1.4142135623730951", "123 * 456": "56088",
             "2 ** -1": "0.5", " 10 - 2.5 ": "7.5", "+5": "5"}
    assert {expr: calculator(expr) for expr in cases} == cases


def test_calculator_errors_are_fast():
    for expr, error, message in [
        ("9**9**9", OverflowError, "more than 4096 bits"), ("10 ** 5000", OverflowError, "more than 4096 bits"),
        ("1e308 * 10", OverflowError, "too large"), ("1 / 0", ZeroDivisionError, "division by zero"),
        ("__import__('os').system('true')", ValueError, "not Call"), ("x + 1", ValueError, "not Name"),
        ("True + 1", ValueError, "not Constant"), ("(-8) ** 0.5", ValueError, "not a real number"),
        ("2 +", ValueError, "cannot parse"), ("(" * 2000, ValueError, "longer than 1000 characters"),
        ("[1, 2]", ValueError, "not List"),
    ]:
        start = time.monotonic()
        with pytest.raises(error, match=message):
            calculator(expr)
        assert time.monotonic() - start < 0.5, expr


# -------------------------------------------------------------------------------------------- python


def _python(cfg: EpisodeConfig, code: str) -> ToolResult:
    with ToolRunner(load_tools(["python"], cfg), cfg) as runner:
        (result,) = runner.run([_call("python", code=code)])
    return result


@pytest.mark.parametrize("level", ["bwrap", "process"])
def test_python_prints_and_cannot_read_the_parents_environment(monkeypatch, level):
    monkeypatch.setenv("RLFT_TEST_SECRET", "hunter2")
    cfg = EpisodeConfig(python_sandbox=level)
    code = "import os\nprint(6 * 7)\nprint(os.environ.get('RLFT_TEST_SECRET'), sorted(os.environ))\nprint(os.getcwd())"
    result = _python(cfg, code)
    assert result.error is None
    lines = result.content.splitlines()
    env = ["HOME", "LANG", "MKL_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PATH", "TMPDIR"]
    assert lines[:2] == ["42", f"None {sorted(env + ['PWD'] if level == 'bwrap' else env)}"]  # bwrap sets PWD
    assert "hunter2" not in result.content
    if level == "bwrap":
        assert lines[2] == "/tmp"  # the sandbox's own tmpfs
    else:
        assert Path(lines[2]).name.startswith("rlft-python-") and not Path(lines[2]).exists()  # its workdir is gone
    failed = _python(cfg, "import sys\nprint('partial')\nsys.exit(3)")
    assert failed == ToolResult("python", "partial\n\n[exited with code 3]", None)
    assert _python(cfg, "x = 1").content == "[no output: print() the values you want to see]"
    interleaved = "import sys\nprint('out 1')\nsys.stderr.write('err 2\\n')\nprint('out 3')"
    assert _python(cfg, interleaved).content == "out 1\nerr 2\nout 3\n"  # in order: unbuffered
    raised = _python(cfg, "1 / 0").content
    assert raised.endswith("ZeroDivisionError: division by zero\n\n[exited with code 1]") and '"<stdin>"' in raised


@pytest.mark.parametrize("level", ["bwrap", "process"])
def test_python_cannot_outlive_its_timeout(level):
    name = f"rlftkid{os.getpid() % 10**6}"  # comm holds 15 characters
    code = textwrap.dedent(f"""
        import ctypes, os, time
        for _ in range(2):  # the program and a child of its own go by one name
            if os.fork() == 0:
                break
        ctypes.CDLL(None).prctl(15, {name.encode()!r}, 0, 0, 0)
        print("started", flush=True)
        time.sleep(60)
    """)
    start = time.monotonic()
    result = _python(EpisodeConfig(tool_timeout_s=1.0, python_sandbox=level), code)
    took = time.monotonic() - start
    assert result.error == "timeout" and took < 3.0
    assert result.content.startswith("Error: python did not finish within 1 s and was killed; its output so far:\n")
    assert "started" in result.content
    deadline = time.monotonic() + 2.0
    while running_named(name) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running_named(name) == []


def test_python_memory_hog_fails_with_memory_error():
    result = _python(EpisodeConfig(python_memory_mb=256), "x = bytearray(1024 * 2**20)\nprint('allocated')")
    assert "MemoryError" in result.content and "allocated" not in result.content
    assert result.content.endswith("[exited with code 1]")


def test_python_output_is_cut():
    result = _python(EpisodeConfig(tool_output_chars=100), "print('x' * 10000)")
    assert result.content == "x" * 100 + "\n[output cut to its first 100 characters]"
    # Past the file-size limit (4 MiB) the child's writes fail (OSError: File too large); the parent reads only a
    # prefix of the output file.
    flood = _python(EpisodeConfig(tool_output_chars=50), "for _ in range(10):\n    print('y' * 10**6)")
    assert flood.content == "y" * 50 + "\n[output cut to its first 50 characters]\n[exited with code 1]"


# -------------------------------------------------------------------------------------------- runner


def test_user_tools_that_fail_become_error_messages():
    names = ["multiply", "fails", "hangs", "exits_hard", "calls_sys_exit", "returns_dict", "returns_int"]
    cfg = EpisodeConfig(tool_timeout_s=1.0, tool_output_chars=200)
    with ToolRunner(load_tools([f"{H}:{n}" for n in names] + ["calculator"], cfg), cfg, num_workers=2) as runner:
        calls = [_call("fails", x=1), _call("hangs", x=1), _call("exits_hard", x=1), _call("calls_sys_exit", x=1),
                 _call("returns_dict", x=1), _call("returns_int", x=21), _call("multiply", a=3),
                 _call("multiply", b=2.0), _call("multiply", a=3, c=1), _call("multiply", a="3"),
                 _call("divide", a=1), *parse_tool_calls("<tool_call>{oops}</tool_call>"),
                 _call("calculator", expression="1/0"), _call("multiply", a=2, b=2.5)]
        start = time.monotonic()
        results = runner.run(calls)
        assert time.monotonic() - start < 5.0
        assert [(r.name, r.error) for r in results] == [
            ("fails", "raised"), ("hangs", "timeout"), ("exits_hard", "died"), ("calls_sys_exit", "raised"),
            ("returns_dict", "not_a_string"), ("returns_int", None), ("multiply", None), ("multiply", "bad_arguments"),
            ("multiply", "bad_arguments"), ("multiply", "bad_arguments"), ("divide", "unknown_tool"), ("", "malformed"),
            ("calculator", "raised"), ("multiply", None)]
        contents = [r.content for r in results]
        assert contents[0] == "Error: fails raised ValueError: no luck with 1"
        assert contents[1] == "Error: hangs did not return within 1 s and was stopped"
        assert contents[2] == "Error: exits_hard ended its process (exited with code 3) without returning"
        assert contents[3] == "Error: calls_sys_exit raised SystemExit(2)"
        assert contents[4] == "Error: returns_dict returned dict ({'value': 1}), not a string: a tool must return text"
        assert contents[5:7] == ["42", "3.0"]  # a number goes through str(), as TRL does
        assert contents[7] == ("Error: bad arguments for multiply: missing a required argument: 'a'; call it as "
                               "multiply(a: int, b: float = 1.0) -> str")
        assert contents[8].startswith("Error: bad arguments for multiply: got an unexpected keyword argument 'c'")
        assert contents[9].startswith("Error: bad arguments for multiply: 'a' must be integer, not str '3'")
        assert contents[10] == "Error: there is no tool named 'divide'; the tools are: " + ", ".join(names + ["calculator"])
        assert contents[11].startswith("Error: malformed tool call: the call is not valid JSON (")
        assert contents[12] == "Error: calculator raised ZeroDivisionError: division by zero"
        assert contents[13] == "5.0"
        assert count_errors(results) == {"malformed": 1, "unknown_tool": 1, "bad_arguments": 3, "raised": 3,
                                         "timeout": 1, "died": 1, "not_a_string": 1, "too_many_calls": 0}
        assert list(count_errors([])) == list(ERRORS)
        # The runner goes on after all that.
        assert runner.run([_call("multiply", a=4, b=0.5)]) == [ToolResult("multiply", "2.0", None)]
        assert results[0].message() == {"role": "tool", "name": "fails", "content": contents[0]}


def test_long_results_and_messages_are_cut():
    cfg = EpisodeConfig(tool_output_chars=20)
    with ToolRunner(load_tools([f"{H}:multiply"], cfg), cfg) as runner:
        (result,) = runner.run([_call("multiply", a=10**40, b=1)])
    assert result.content == "1" + "0" * 19 + "\n[output cut to its first 20 characters]"
