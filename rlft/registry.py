"""Name -> function registries for the extension points (estimators, losses, rewards), and the loading of
user functions named by dotted path (rewards, tools)."""

from __future__ import annotations

import importlib
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


def split_dotted(entry: str) -> tuple[str, str] | None:
    """``('pkg.module', 'function')`` of ``'pkg.module:function'`` (or ``'pkg.module.function'``); None when
    ``entry`` is not of that shape."""
    module, _, attr = entry.partition(":") if ":" in entry else entry.rpartition(".")
    if not (all(part.isidentifier() for part in module.split(".")) and attr.isidentifier()):
        return None
    return module, attr


def load_user_function(entry: str, what: str, missing: type[Exception], failed: type[Exception]) -> Callable:
    """The function a config entry ``entry`` names by dotted path (a ``what``: "reward function", "tool"); the
    caller has checked its shape with :func:`split_dotted`.

    Raises:
        missing: the module itself does not exist (not one that it imports), it has no such attribute, or
            that attribute is not callable.
        failed: importing the module raised (a SyntaxError, or any exception of its code): one line.
    """
    module, attr = split_dotted(entry) or (entry, "")
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001  (the user's module may raise anything while it runs)
        if isinstance(e, ModuleNotFoundError) and e.name and f"{module}.".startswith(f"{e.name}."):
            raise missing(f"cannot load {what} '{entry}': {e}") from None
        first = (str(e).strip().splitlines() or [""])[0]
        raise failed(f"{what} '{entry}': importing {module} raised {type(e).__name__}: {first}") from None
    if not hasattr(mod, attr):
        raise missing(f"cannot load {what} '{entry}': module '{module}' has no attribute '{attr}'")
    fn = getattr(mod, attr)
    if not callable(fn):
        raise missing(f"{what} '{entry}' is not callable ({type(fn).__name__}): name a function")
    return fn
