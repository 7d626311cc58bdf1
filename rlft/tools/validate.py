"""The checks of ``tools`` and ``episode`` that import nothing heavy: config validation runs them before torch
and transformers load (rlft.tools.spec loads the tools themselves)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rlft.errors import ConfigError
from rlft.registry import split_dotted

if TYPE_CHECKING:
    from rlft.config.schemas.episode import EpisodeConfig

BUILTIN_NAMES = ("calculator", "python")
TOOL_FORMATS = ("auto", "template", "rlft")
TOOL_ROLES = ("tool", "user")
"""episode.tool_role: the role tool results come back in (rlft.episodes.tool_env.result_messages)."""
SCHEDULES = ("auto", "continuous", "lockstep")
"""episode.schedule: how the episodes of a rollout advance (rlft.episodes.continuous, rlft.episodes.lockstep)."""
WORKER_STARTS = ("server", "fork")
"""episode.worker_start: where the workers kept for the run are forked from (rlft.workers.server)."""
SANDBOX_LEVELS = ("bwrap", "process")
"""episode.python_sandbox: rlft.tools.sandbox's bwrap, or a plain process."""


def check_tools(names: Sequence[str]) -> None:
    """The checks of ``tools`` that import nothing (for config validation, before torch loads): each entry is
    a built-in or of the shape 'pkg.module:function', and none is listed twice.

    Raises:
        ConfigError: naming the entry and what to write instead.
    """
    seen: set[str] = set()
    for entry in names:
        if entry in seen:
            raise ConfigError(f"tools: '{entry}' is listed twice; list each tool once")
        seen.add(entry)
        if entry in BUILTIN_NAMES:
            continue
        if ":" not in entry and "." not in entry:
            raise ConfigError(f"tools: unknown built-in tool '{entry}'; built-ins: {', '.join(BUILTIN_NAMES)}, "
                              "or a user function 'pkg.module:function'")
        if split_dotted(entry) is None:
            raise ConfigError(f"tools: malformed tool '{entry}': expected 'pkg.module:function' or a built-in "
                              f"({', '.join(BUILTIN_NAMES)})")


def check_episode(cfg: EpisodeConfig) -> None:
    """The ``episode`` section's choices (its numbers are held to their ranges by
    rlft.config.validation.check_ranges).

    Raises:
        ConfigError: naming the field and its valid choices.
    """
    if cfg.python_sandbox not in SANDBOX_LEVELS:
        raise ConfigError(f"episode.python_sandbox='{cfg.python_sandbox}'; valid choices: {', '.join(SANDBOX_LEVELS)}")
    default_procs = next(f.default for f in dataclasses.fields(cfg) if f.name == "python_max_procs")
    if cfg.python_sandbox == "process" and cfg.python_max_procs != default_procs:
        # RLIMIT_NPROC there would count every process of your user, the trainer's threads included.
        raise ConfigError(f"episode.python_max_procs={cfg.python_max_procs} does nothing with "
                          "episode.python_sandbox=process (it bounds the sandbox's processes): drop one of them")
    if cfg.tool_format not in TOOL_FORMATS:
        raise ConfigError(f"episode.tool_format='{cfg.tool_format}'; valid choices: {', '.join(TOOL_FORMATS)}")
    if cfg.tool_role not in TOOL_ROLES:
        raise ConfigError(f"episode.tool_role='{cfg.tool_role}'; valid choices: {', '.join(TOOL_ROLES)}")
    if cfg.worker_start not in WORKER_STARTS:
        raise ConfigError(f"episode.worker_start='{cfg.worker_start}'; valid choices: {', '.join(WORKER_STARTS)}")
    if cfg.schedule not in SCHEDULES:
        raise ConfigError(f"episode.schedule='{cfg.schedule}'; valid choices: {', '.join(SCHEDULES)}")
