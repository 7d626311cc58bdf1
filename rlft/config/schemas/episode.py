"""``episode``: multi-turn episodes (tools, the user's environment), their limits and workers."""

from __future__ import annotations

from dataclasses import dataclass

from rlft.config.schemas.fields import HARMFUL, HARMLESS, NUMERICS, knob

EPISODES = (HARMFUL, "the episodes: what the policy sees after its own turns")


@dataclass
class EpisodeConfig:
    """Multi-turn episodes (rlft/episodes): the policy's replies may call ``tools``; each call's result is
    appended as a tool message and the policy continues, until it replies without a call or a limit
    below ends the episode."""

    env: str | None = knob(None, EPISODES)
    """An environment class 'pkg.module:Class' that answers the policy between its turns (rlft.episodes.env:
    built per episode from its problem, stepped with each reply); None: the tools, or one reply per episode."""
    max_turns: int = knob(4, EPISODES, range="[1, inf)")
    """Policy turns per episode at most; an episode whose last turn still calls a tool ends truncated."""
    max_tokens: int = knob(0, EPISODES, range="[0, inf)")
    """Tokens of an episode after its prompt at most (the policy's and the environment's); a turn that
    would pass it ends the episode truncated (0: no total cap; each turn takes up to
    sampler.max_new_tokens, and episode.max_turns bound the episode)."""
    env_timeout_s: float = knob(60.0, (HARMLESS, "a limit that, when it acts, ends the run"), range="[0, inf)")
    """Wall-clock limit of one call into episode.env (building an environment, or one step); past it the
    run ends with one line naming the environment (0: no limit). The environments run in worker processes
    (episode.env_workers): a call blocked inside C code is stopped too (its worker is killed)."""
    schedule: str = knob("auto", (NUMERICS, "which turns share an engine step (batched kernels' rounding)"))
    """How the episodes of a rollout advance: continuous (each turn is its own request, and an episode's next
    turn enters the engine as soon as its environment has answered, while others generate or wait: vLLM only),
    lockstep (every episode's turn k, then every environment, then turn k + 1), or auto (continuous under
    sampler=vllm, lockstep under hf). The same seeds give the same episodes either way (token for token in fp32 on
    the CPU; in bf16 and on a GPU up to the rounding of kernels that depend on the batch)."""
    env_workers: int = knob(32, (HARMLESS, "how many environment calls run at once; the episodes are unchanged"),
                            range="[1, inf)")
    """Worker processes that run the user tools' calls (and hold the episode.env environments) of the episodes
    waiting on them, all at once: sized for calls that wait (an API, a test suite), not for cores. Kept for the
    whole run; a tool's worker that dies or hangs is replaced. The built-in python tool runs at most one program
    per CPU core."""
    worker_start: str = knob("server", (HARMLESS, "where workers start; what they run is the same code"))
    """Where the user tools' and episode.env's worker processes are forked from: server (a small process started
    once per job, which imports their modules afresh: what your program sets in those modules after import, such as
    a client stored in a module global, is not seen there) or fork (the trainer: the workers see its state as it
    was when each started, and each keeps a copy of the memory the trainer writes afterwards, which ran a 24 GB
    machine out of memory at trainer.micro_batch_size=16 on the tool task: docs/results.md). Closures, functions
    of the trainer's script and modules a fresh import does not find are forked under server too (said at start-up)."""
    tool_timeout_s: float = knob(10.0, EPISODES, range="(0, inf)")
    """Wall-clock limit of one tool call; past it the call is stopped and the policy reads an error
    message instead of a result."""
    tool_output_chars: int = knob(2000, EPISODES, range="[1, inf)")
    """A tool result longer than this many characters is cut to them (the policy reads a note saying so)."""
    python_memory_mb: int = knob(1024, EPISODES, range="[32, inf)")
    """Memory limit of the built-in python tool: of each of its processes (address space), and of all of them
    together where a cgroup can be made (python_sandbox=bwrap as root, or a delegated cgroup v2; its /tmp
    files count); docs/guide/agents-and-tools.md#the-python-sandbox."""
    python_sandbox: str = knob("bwrap", EPISODES)
    """Where the python tool runs the policy's code: bwrap (namespaces: no view of your files, the trainer's
    processes or the network; the run stops at start-up when it cannot start here) or process (a process of
    your user under limits only: it can read and write what you can). docs/guide/agents-and-tools.md#the-python-sandbox."""
    python_max_procs: int = knob(16, EPISODES, range="[1, inf)")
    """Processes and threads of one python tool call at most, all together (python_sandbox=bwrap: its cgroup's
    pids limit, else RLIMIT_NPROC in its own user namespace)."""
    tool_format: str = knob("auto", EPISODES)
    """How the tools are shown to the policy and its calls read: template (the tokenizer's chat template
    renders them, tools=), rlft (rlft's system prompt with <tool_call>{json}</tool_call> calls: see
    docs/guide/agents-and-tools.md#tools), or auto (template when the chat template takes tools, else rlft)."""
    tool_role: str = knob("tool", EPISODES)
    """The role tool results come back in: tool (one tool message per call), or user (one user message holding
    each result in <tool_response></tool_response>: for chat templates that take only alternating user/assistant
    turns, as Gemma's and Mistral's; the run stops at start-up, saying so, when the template refuses a tool message)."""
    max_tool_calls: int = knob(1, EPISODES, range="[1, inf)")
    """Tool calls of one reply that are run, at most (>= 1); the policy reads an error for each call after them
    (too_many_calls). The default is verl's multi-turn max_parallel_calls (1, in verl/trainer/config/rollout/
    rollout.yaml), which drops the extra calls unanswered instead."""
