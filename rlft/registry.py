"""Name -> function registries for the extension points (estimators, losses, rewards)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from rlft.errors import ConfigError

F = TypeVar("F", bound=Callable)


class Registry:
    """A named table of functions; an unknown name fails listing the valid ones."""

    def __init__(self, kind: str):
        self.kind = kind
        self._fns: dict[str, Callable] = {}

    def register(self, name: str) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            if name in self._fns:
                raise ValueError(f"{self.kind} '{name}' is already registered")
            self._fns[name] = fn
            return fn

        return deco

    def names(self) -> list[str]:
        return sorted(self._fns)

    def __contains__(self, name: str) -> bool:
        return name in self._fns

    def check(self, name: str, key: str) -> None:
        """Raise ConfigError naming ``key`` and the valid choices if ``name`` is unknown."""
        if name not in self._fns:
            raise ConfigError(f"{key}='{name}' is not a known {self.kind}; valid choices: {', '.join(self.names())}")

    def get(self, name: str) -> Callable:
        self.check(name, self.kind)
        return self._fns[name]
