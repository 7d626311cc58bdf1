"""What answers the policy between its turns: an :class:`Environment`. Tools are one (rlft.tools);
users write their own for games, simulated users or judges of code (``episode.env``).

An environment is a class built once per episode from the problem (``Env(problem)``), then stepped
with each of the policy's replies::

    class Guess:
        def __init__(self, problem):            # rlft.data.Problem: prompt, answer, columns, messages
            self.answer, self.tries = problem.answer, 0
        def step(self, reply: str) -> Step:      # the policy's reply text (special tokens removed)
            self.tries += 1
            if reply.strip() == self.answer:
                return Step(done=True, reward=1.0)
            return Step(messages=[{"role": "user", "content": "higher" if ... else "lower"}])

The messages of a Step are appended to the conversation (rendered by the policy's chat template)
and the policy replies again, until a Step says ``done``, or ``episode.max_turns`` /
``episode.max_tokens`` end the episode (truncated). Step rewards add up into the ``env_reward``
reward function's score.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rlft.errors import ConfigError


@dataclass
class Step:
    """An environment's answer to one reply of the policy."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    """Messages appended to the conversation before the policy's next turn (role tool, user, ...)."""
    done: bool = False
    """The episode ends here (the policy does not reply again)."""
    reward: float | None = None
    """Added to the episode's ``env_reward`` (None: nothing)."""
    events: dict[str, int] = field(default_factory=dict)
    """Counts to log, summed over the step's episodes (``episode/<name>``, e.g. tool calls and errors)."""


@runtime_checkable
class Environment(Protocol):
    def step(self, reply: str) -> Step: ...


def load_env(path: str) -> Any:
    """The environment class named 'pkg.module:Class'.

    Raises:
        ConfigError: naming ``episode.env`` and what is wrong.
    """
    module, _, attr = path.partition(":")
    if not (attr and all(p.isidentifier() for p in module.split(".")) and attr.isidentifier()):
        raise ConfigError(f"episode.env={path}: expected 'pkg.module:Class'")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError as e:
        raise ConfigError(f"episode.env={path}: {e}") from None
    except AttributeError:
        raise ConfigError(f"episode.env={path}: module '{module}' has no attribute '{attr}'") from None
    except Exception as e:  # noqa: BLE001  (the user's module may raise anything while it runs)
        raise ConfigError(f"episode.env={path}: importing {module} raised {type(e).__name__}: {e}") from None
    if not callable(cls):
        raise ConfigError(f"episode.env={path} is not a class")
    return cls
