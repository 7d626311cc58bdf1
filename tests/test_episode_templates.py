"""Chat templates that multi-turn episodes cannot use are refused at start-up, in one line (exit 2), before any
sampling: one that rewrites earlier turns (Qwen3-style: a <think> block in the last assistant turn, stripped from
earlier ones), one that takes only alternating user/assistant turns (Gemma/Mistral-style raise_exception) on a tool
message, which episode.tool_role=user then serves; a ChatML template passes (issue 35 item 2)."""

from __future__ import annotations

import copy
import json

import pytest

from rlft.config import compose
from rlft.config.schemas.episode import EpisodeConfig
from rlft.data import Problem
from rlft.episodes.lockstep import Limits
from rlft.episodes.setup import EpisodeSetup
from rlft.episodes.tokens import turn_suffix_ids
from rlft.episodes.tool_env import ToolEnv
from rlft.errors import ConfigError
from rlft.tools.format import system_prompt
from rlft.tools.spec import load_tools
from rlft.tools.validate import check_episode
from tests import envs
from tests.support import TINY, one_error_line, run_cli, write_eos_model

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

# Qwen3's template, its turns' logic as it ships (tools= and tool_calls left out): the assistant turns after the
# last user query get a <think> block (an empty one in the last turn); earlier ones lose theirs.
QWEN3 = """{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == "user" or message.role == "system" %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"""

# Gemma's template (system folded into the first user turn; roles must alternate), as it ships.
GEMMA = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}{%- set role = "model" -%}{%- else -%}{%- set role = message['role'] -%}{%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{'<start_of_turn>model\n'}}{%- endif -%}"""

# Mistral v0.1's template: alternating roles, and no system message at all.
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
           "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
           "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
           "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")

BASE = [a for a in TINY if not a.startswith("model=")] + ["model.dtype=fp32"]


@pytest.fixture(scope="module")
def tok():
    from rlft.models.loading import load_tokenizer

    cfg, _, _ = compose(TINY)
    return load_tokenizer(cfg.model)


def _with(tok, template):
    t = copy.deepcopy(tok)
    t.chat_template = template
    return t


def _setup(tool_role="tool", max_tool_calls=1, env=False, tool_format="auto"):
    cfg = EpisodeConfig(tool_role=tool_role, max_tool_calls=max_tool_calls)
    if env:
        return EpisodeSetup(envs.EchoEnv, "episode.env=tests.envs:EchoEnv", Limits(2, 100))
    return EpisodeSetup(None, "tools", Limits(2, 100), load_tools(["calculator"], cfg), tool_format, max_tool_calls,
                        tool_role)


class _Task:
    eval_problems = [Problem("What is 2 + 3?", "5")]


def _check(tok, setup):
    cfg, _, _ = compose(BASE)
    setup.check_template(tok, _Task(), cfg.data)


@pytest.mark.parametrize("env", [False, True], ids=["tools", "env"])
def test_a_template_that_rewrites_earlier_turns_is_refused_at_start_up(tok, env):
    with pytest.raises(ConfigError) as e:
        _check(_with(tok, QWEN3), _setup(env=env))
    message = str(e.value)
    assert "rewrites earlier turns once a `" + ("user" if env else "tool") + "` message follows" in message
    assert "Qwen3's" in message and "only appends" in message and "\n" not in message


@pytest.mark.parametrize("max_tool_calls", [1, 3])
def test_alternating_roles_refuse_a_tool_message_at_start_up_and_tool_role_user_serves_them(tok, max_tool_calls):
    gemma = _with(tok, GEMMA)
    with pytest.raises(ConfigError) as e:
        _check(gemma, _setup(max_tool_calls=max_tool_calls))
    message = str(e.value)
    assert message.startswith("the policy's chat template raised TemplateError (Conversation roles must alternate "
                              "user/assistant/user/assistant/...) on a `tool` message after the assistant's turn")
    assert "set episode.tool_role=user" in message and "\n" not in message
    _check(gemma, _setup(tool_role="user", max_tool_calls=max_tool_calls))  # one user message: it alternates
    _check(gemma, _setup(env=True))  # an environment's messages are probed as a user message


@pytest.mark.parametrize("template", [None, CHATML], ids=["tiny", "chatml"])
@pytest.mark.parametrize("setup", [{}, {"tool_role": "user", "max_tool_calls": 2}, {"env": True}],
                         ids=["tool", "user", "env"])
def test_a_template_that_only_appends_passes(tok, template, setup):
    _check(_with(tok, template) if template else tok, _setup(**setup))


def test_a_template_that_refuses_the_first_prompts_system_message_is_one_line(tok):
    with pytest.raises(ConfigError) as e:
        _check(_with(tok, MISTRAL), _setup())
    assert str(e.value).startswith("the policy's chat template raised TemplateError (Conversation roles must "
                                   "alternate user/assistant/user/assistant/...) on the first prompt with rlft's "
                                   "system prompt describing the tools: use a model whose chat template takes a "
                                   "system message")
    _check(_with(tok, MISTRAL), _setup(env=True))  # no system message: an environment's user message alternates


def test_the_mid_rollout_check_stays_a_backstop_for_what_an_environment_sends(tok):
    with pytest.raises(ConfigError, match=r"raised TemplateError \(Conversation roles must alternate .*\) on a `tool` "
                                          r"message after the assistant's turn.*: the environment \(X\) must answer"):
        turn_suffix_ids(_with(tok, GEMMA), [{"role": "tool", "content": "42"}], "<|im_end|>",
                        "the environment (X) must answer in roles the template takes")
    with pytest.raises(ConfigError, match="rewrites earlier turns once a `user` and a `tool` message follows"):
        turn_suffix_ids(_with(tok, QWEN3), [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}], "")


def test_tool_results_in_a_user_turn_are_what_gemmas_template_writes_after_the_stop_token(tok):
    results = [{"role": "user", "content": "<tool_response>\n6\n</tool_response>"}]
    gemma = _with(tok, GEMMA)
    ids = turn_suffix_ids(gemma, results, "<|im_end|>")
    assert gemma.decode(ids) == ("<end_of_turn>\n<start_of_turn>user\n<tool_response>\n6\n</tool_response><end_of_turn>\n"
                                 "<start_of_turn>model\n")


def test_tool_role_user_brings_a_replys_results_back_in_one_user_message():
    from rlft.tools.dispatch import ToolRunner

    cfg = EpisodeConfig(tool_timeout_s=5.0, max_tool_calls=3, tool_role="user")
    env = ToolEnv(ToolRunner(load_tools(["calculator"], cfg), cfg), "user")
    step = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>'
                    '<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>')
    assert step.messages == [{"role": "user", "content": "<tool_response>\n6\n</tool_response>\n<tool_response>\n"
                                                         "Error: calculator raised ZeroDivisionError: division by zero"
                                                         "\n</tool_response>"}]
    assert step.events["tool_calls"] == 2 and step.events["tool_errors/raised"] == 1
    tools = load_tools(["calculator"], cfg)
    assert "The result of each call comes back in a tool message." in system_prompt(tools)
    assert ("The results of a reply's calls come back in one user message, each within "
            "<tool_response></tool_response>.") in system_prompt(tools, result_role="user")


def test_tool_role_is_one_of_its_choices():
    check_episode(EpisodeConfig(tool_role="user"))
    with pytest.raises(ConfigError, match="episode.tool_role='assistant'; valid choices: tool, user"):
        check_episode(EpisodeConfig(tool_role="assistant"))


# ---------------------------------------------------------------------------------------
# Through the CLI: one line, exit 2, before any sampling


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny EOS-prone model (tests.support.write_eos_model) under each template, as model.path directories."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("templates")
    write_eos_model(root / "chatml")
    out = {"chatml": root / "chatml"}
    for name, template in [("qwen3", QWEN3), ("gemma", GEMMA)]:
        import shutil

        shutil.copytree(root / "chatml", root / name)
        t = AutoTokenizer.from_pretrained(str(root / name))
        t.chat_template = template
        t.save_pretrained(root / name)
        out[name] = root / name
    return out


RUN = [*BASE, "model=local", "sampler.n=2", "sampler.max_new_tokens=6", "trainer.num_prompts=2", "trainer.steps=1",
       "episode.max_turns=2", "data.num_eval=2", "logger.console=false"]


@pytest.mark.slow
def test_cli_refuses_a_template_that_rewrites_earlier_turns_before_any_sampling(tmp_path, models):
    # UnbuildableEnv raises when its first episode is built (after the first sampling): exit 1 there. Exit 2 with the
    # template's line says the check came first.
    proc = run_cli(["train", *RUN, f"model.path={models['qwen3']}", "episode.env=tests.envs:UnbuildableEnv",
                    "hydra.run.dir=run"], tmp_path)
    line = one_error_line(proc, 2)
    assert "chat template rewrites earlier turns once a `user` message follows the assistant's turn" in line
    proc = run_cli(["eval", *RUN, f"model.path={models['qwen3']}", "episode.env=tests.envs:UnbuildableEnv"], tmp_path)
    assert "rewrites earlier turns" in one_error_line(proc, 2)


@pytest.mark.slow
def test_cli_refuses_a_tool_message_that_the_template_refuses_and_runs_with_tool_role_user(tmp_path, models):
    args = ["train", *RUN, f"model.path={models['gemma']}", "tools=[calculator]", "reward.fns=[math_correct]"]
    line = one_error_line(run_cli([*args, "hydra.run.dir=run"], tmp_path), 2)
    assert "raised TemplateError (Conversation roles must alternate user/assistant/user/assistant/...) on a `tool` " \
           "message after the assistant's turn" in line and "set episode.tool_role=user" in line
    proc = run_cli([*args, "episode.tool_role=user", "hydra.run.dir=user"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = [json.loads(x) for x in (tmp_path / "user/metrics.jsonl").read_text().splitlines()][-1]
    assert m["step"] == 1 and "episode/tool_calls" in m


@pytest.mark.slow  # a whole training run (~40 s): the refusal tests above stay in make test
def test_cli_runs_episodes_under_a_chatml_template(tmp_path, models):
    proc = run_cli(["train", *RUN, f"model.path={models['chatml']}", "episode.env=tests.envs:TwoTurnEnv",
                    "reward.fns=[env_reward]", "hydra.run.dir=run"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
