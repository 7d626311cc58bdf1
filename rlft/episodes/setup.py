"""What a run's episodes are made of (``episode.*``, ``tools``), built once at start-up: the environment
of each episode, the limits, and how the first prompt shows the tools to the policy."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlft.config.validation import resolve_sampler_name
from rlft.data.chat import problem_ids
from rlft.data.safe_tokens import chat_ids
from rlft.episodes.env import load_env
from rlft.episodes.env_pool import EnvPool
from rlft.episodes.lockstep import Limits
from rlft.episodes.tokens import check_turns
from rlft.episodes.tool_env import ToolEnv, result_messages
from rlft.errors import ConfigError, RlftError
from rlft.tools.dispatch import ToolRunner
from rlft.tools.format import system_prompt, template_takes_tools
from rlft.tools.outcomes import ToolResult
from rlft.tools.spec import Tool, load_tools
from rlft.workers import server as worker_server

if TYPE_CHECKING:
    from rlft.config.schemas import Config
    from rlft.config.schemas.data import DataConfig
    from rlft.data import Problem, Task


@dataclass(frozen=True)
class EpisodeSetup:
    env_class: Any
    """Called with a problem, it gives that episode's environment (episode.env: a WorkerEnv of the run's pool)."""
    name: str
    """How errors name the environment (``episode.env=...``)."""
    limits: Limits
    tools: list[Tool] = field(default_factory=list)
    tool_format: str = "auto"
    """How the first prompt shows the tools: template (the chat template's tools=), rlft (a system prompt),
    auto (template when the chat template takes tools)."""
    max_tool_calls: int | None = None
    """The calls of one reply that are run (episode.max_tool_calls), told in rlft's system prompt; None: no cap."""
    tool_role: str = "tool"
    """The role the tool results come back in (episode.tool_role: tool, or user)."""
    continuous: bool = False
    """Episodes that do not wait for each other (episode.schedule, rlft.episodes.continuous); else lockstep."""
    workers: str | None = None
    """Where the worker processes of the user tools or episode.env are forked from, in words (None: none runs)."""
    closer: Callable[[], None] = lambda: None
    """Stops the episodes' worker processes and threads."""

    def close(self) -> None:
        """At the end of the job (each job of a sweep): its workers go, and the worker server with them, so that
        the next job's start with that job's environment, log and modules."""
        try:
            self.closer()
        finally:
            worker_server.stop()

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
            messages.insert(0, {"role": "system", "content": system_prompt(self.tools, own, self.max_tool_calls,
                                                                          self.tool_role)})
        # Every message's text stays text (rlft.data.safe_tokens): a data row's special-token strings cannot
        # write turns of their own.
        return chat_ids(tokenizer, messages, add_generation_prompt=True)

    def check_template(self, tokenizer: Any, task: Task, data_cfg: DataConfig) -> None:
        """Render what the episodes will need from the policy's chat template, at start-up (right after the tokenizer
        loads, before any sampling): a first prompt, and an answer after an assistant turn in the role the run
        sends it (tool results as episode.tool_role says; an environment's messages: probed as one user message).

        Raises:
            ConfigError: in one line, naming what the template does (raises on the role, rewrites earlier turns)
                and what to change.
        """
        if self.tools:  # the tools' description, as the template or rlft's system prompt shows it
            problem = (task.eval_problems or task.batch(0, 1))[0]
            try:
                self.prompt_ids(tokenizer, problem, data_cfg)
            except RlftError:  # said in one line already (a data row, a missing template)
                raise
            except Exception as e:  # noqa: BLE001  (a template may raise anything)
                raise ConfigError(_first_prompt_refused(e, self.tool_format, template_takes_tools(tokenizer))) from None
        check_turns(tokenizer, self.probe_messages(), self.probe_fix())

    def probe_messages(self) -> list[dict[str, Any]]:
        """What the environment's answer looks like to the chat template: two tool results when a reply may hold
        several calls (so a template that refuses consecutive tool messages shows it), one otherwise."""
        if not self.tools:
            return [{"role": "user", "content": "rlft-probe-environment-message"}]
        calls = 1 if self.max_tool_calls == 1 else 2
        results = [ToolResult(self.tools[0].name, f"rlft-probe-result-{i}") for i in range(calls)]
        return result_messages(results, self.tool_role)

    def probe_fix(self) -> str:
        """What to change when the template raises on the environment's answer."""
        if not self.tools:
            return (f"the environment ({self.name}) must answer in a role the template takes (one user message per "
                    "step suits a template that takes only alternating user/assistant turns)")
        if self.tool_role == "tool":
            return ("set episode.tool_role=user (each reply's tool results then come back in one user message), or "
                    "use a model whose chat template renders tool messages")
        return "the tool results come back in one user message there (episode.tool_role=user): use another model"


def prompt_overhead(episodes: EpisodeSetup | None, tokenizer: Any, task: Task, data_cfg: DataConfig) -> int:
    """Tokens the tools' description adds to a prompt (the same text for every problem; 0 without tools),
    for the prompt-length checks (rlft.data.chat.drop_long_prompts)."""
    if episodes is None or not episodes.tools:
        return 0
    problem = (task.eval_problems or task.batch(0, 1))[0]
    return len(episodes.prompt_ids(tokenizer, problem, data_cfg)) - len(problem_ids(tokenizer, problem, data_cfg))


def check_episodes(cfg: Config) -> None:
    """What :func:`episode_setup` stops on, without starting anything: ``episode.env`` or a tool that does not
    import, a python tool whose sandbox cannot start here.

    Raises:
        RlftError: in one line, naming what does not import or start.
    """
    if cfg.episode.env:
        load_env(cfg.episode.env)
    elif cfg.tools:
        load_tools(cfg.tools, cfg.episode)


def episode_setup(cfg: Config) -> EpisodeSetup | None:
    """The run's episodes; None when each episode is one reply (no ``episode.env``, no ``tools``)."""
    e = cfg.episode
    if not (e.env or cfg.tools):
        return None
    vllm = resolve_sampler_name(cfg.sampler.name) == "vllm"
    limits = Limits(e.max_turns, e.max_tokens or 2**62, cfg.sampler.vllm.max_model_len if vllm else None)
    continuous = e.schedule == "continuous" or (e.schedule == "auto" and vllm)
    if e.env:
        # Each episode's environment lives in a worker process (rlft.episodes.env_pool), bounded there by env_timeout_s.
        name = f"episode.env={e.env}"
        pool = EnvPool(load_env(e.env), name, e.env_workers, e.env_timeout_s, e.worker_start)
        return EpisodeSetup(pool.make, name, dataclasses.replace(limits, env_timeout_s=e.env_timeout_s),
                            continuous=continuous, workers=f"environment workers: {pool.started_from}",
                            closer=pool.close)
    # The tools bound their own calls (episode.tool_timeout_s each), so their environment has no limit.
    tools = load_tools(cfg.tools, e)
    runner = ToolRunner(tools, e)
    workers = f"tool workers: {runner.started_from}" if runner.started_from else None
    return EpisodeSetup(lambda problem: ToolEnv(runner, e.tool_role), "tools", limits, tools, e.tool_format,
                        e.max_tool_calls, e.tool_role, continuous, workers, runner.close)


def _first_prompt_refused(e: Exception, tool_format: str, takes_tools: bool) -> str:
    """The one line for a chat template that raised on the first prompt of a run with tools."""
    said = " ".join(str(e).split())[:200] or "no message"
    if tool_format == "template" or (tool_format == "auto" and takes_tools):
        how, fix = "the tools given as tools=", "set episode.tool_format=rlft (rlft's system prompt describes them)"
    else:
        how, fix = "rlft's system prompt describing the tools", \
            "use a model whose chat template takes a system message" + \
            (", or episode.tool_format=template (its template renders tools=)" if takes_tools else "")
    return f"the policy's chat template raised {type(e).__name__} ({said}) on the first prompt with {how}: {fix}"

