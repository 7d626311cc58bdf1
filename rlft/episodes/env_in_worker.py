"""What runs in an ``episode.env`` worker (rlft.episodes.env_pool): kept apart from the pool, whose imports
(the episode loop's) the worker server would otherwise load into every worker."""

from __future__ import annotations

from typing import Any

_HELD: dict[int, Any] = {}
"""In a worker: its environments by id."""


def env_call(env_class: Any, op: str, eid: int, arg: Any, drops: list[int]) -> Any:
    """In a worker: drop the finished environments, then build environment ``eid`` from problem ``arg``
    (``op`` build) or step it with reply ``arg`` (``op`` step)."""
    for d in drops:
        _HELD.pop(d, None)
    if op == "build":
        _HELD[eid] = env_class(arg)
        return None
    return _HELD[eid].step(arg)
