"""What a run's episodes are made of (``episode.*``, ``tools``), built once at start-up: the environment
of each episode, the limits, and how the first prompt shows the tools to the policy."""

from __future__ import annotations

import atexit
import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlft.config.validation import resolve_sampler_name
from rlft.data.chat import problem_ids
from rlft.data.safe_tokens import chat_ids
from rlft.episodes.env import load_env
from rlft.episodes.run import Limits
from rlft.episodes.tool_env import ToolEnv
from rlft.errors import ConfigError
from rlft.tools.format import system_prompt, template_takes_tools
from rlft.tools.run import ToolRunner
from rlft.tools.spec import Tool, load_tools

if TYPE_CHECKING:
    from rlft.config.schemas import Config, DataConfig
    from rlft.data import Problem, Task


@dataclass(frozen=True)
class EpisodeSetup:
    env_class: Any
    """Called with a problem, it gives that episode's environment."""
    name: str
    """How errors name the environment (``episode.env=...``)."""
    limits: Limits
    tools: list[Tool] = field(default_factory=list)
    tool_format: str = "auto"
    """How the first prompt shows the tools: template (the chat template's tools=), rlft (a system prompt),
    auto (template when the chat template takes tools)."""
    max_tool_calls: int | None = None
    """The calls of one reply that are run (episode.max_tool_calls), told in rlft's system prompt; None: no cap."""

    def make(self, problem: Problem) -> Any:
        return self.env_class(problem)

    def prompt_ids(self, tokenizer: Any, problem: Problem, data_cfg: DataConfig) -> list[int]:
        """The first prompt's ids, the tools described in it (rlft.data.chat.problem_ids without tools)."""
        if not self.tools:
            return problem_ids(tokenizer, problem, data_cfg)
        messages = [{"role": "user", "content": problem.model_input}] if problem.messages is None \
            else [dict(m) for m in problem.messages]
        if not getattr(data_cfg, "chat_template", True) or not getattr(tokenizer, "chat_template", None):
            raise ConfigError("tools need the policy's chat template: drop data.chat_template=false")
        fmt = self.tool_format
        if fmt == "template" or (fmt == "auto" and template_takes_tools(tokenizer)):
            if data_cfg.system_prompt:
                messages.insert(0, {"role": "system", "content": data_cfg.system_prompt})
            return chat_ids(tokenizer, messages, tools=[t.schema for t in self.tools], add_generation_prompt=True)
        else:
            own = messages.pop(0)["content"] if messages[0]["role"] == "system" else data_cfg.system_prompt
            messages.insert(0, {"role": "system", "content": system_prompt(self.tools, own, self.max_tool_calls)})
        # Every message's text stays text (rlft.data.safe_tokens): a data row's special-token strings cannot
        # write turns of their own.
        return chat_ids(tokenizer, messages, add_generation_prompt=True)


def prompt_overhead(episodes: EpisodeSetup | None, tokenizer: Any, task: Task, data_cfg: DataConfig) -> int:
    """Tokens the tools' description adds to a prompt (the same text for every problem; 0 without tools),
    for the prompt-length checks (rlft.data.chat.drop_long_prompts)."""
    if episodes is None or not episodes.tools:
        return 0
    problem = (task.eval_problems or task.batch(0, 1))[0]
    return len(episodes.prompt_ids(tokenizer, problem, data_cfg)) - len(problem_ids(tokenizer, problem, data_cfg))


def episode_setup(cfg: Config) -> EpisodeSetup | None:
    """The run's episodes; None when each episode is one reply (no ``episode.env``, no ``tools``)."""
    e = cfg.episode
    if not (e.env or cfg.tools):
        return None
    limits = Limits(e.max_turns, e.max_tokens or 2**62,
                    cfg.sampler.vllm.max_model_len if resolve_sampler_name(cfg.sampler.name) == "vllm" else None)
    if e.env:
        return EpisodeSetup(load_env(e.env), f"episode.env={e.env}", dataclasses.replace(limits, env_timeout_s=e.env_timeout_s))
    # The tools bound their own calls (episode.tool_timeout_s each), so their environment has no limit.
    tools = load_tools(cfg.tools, e)
    runner = ToolRunner(tools, e)
    atexit.register(runner.close)
    return EpisodeSetup(lambda problem: ToolEnv(runner), "tools", limits, tools, e.tool_format, e.max_tool_calls)

