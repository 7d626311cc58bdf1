"""Tools by name: the built-ins and user functions named by dotted path, each with the JSON schema that
describes it to the policy (transformers' ``get_json_schema``: from the signature and the docstring).
Imports transformers (seconds): config validation uses rlft.tools.validate instead."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from transformers.utils import get_json_schema

from rlft.errors import ConfigError
from rlft.registry import load_user_function
from rlft.tools.builtin import calculator, python_tool
from rlft.tools.validate import BUILTIN_NAMES, check_tools

if TYPE_CHECKING:
    from rlft.config.schemas.episode import EpisodeConfig

BUILTINS: dict[str, Callable[[EpisodeConfig], Callable[..., Any]]] = {
    "calculator": lambda cfg: calculator,
    "python": python_tool,
}
assert tuple(BUILTINS) == BUILTIN_NAMES
_SCHEMA_HINT = ("it needs a docstring with a description, an Args section describing each argument, and a type "
                "hint on each argument")


@dataclass(frozen=True)
class Tool:
    """A tool the policy may call by ``name``.

    Attributes:
        schema: ``{"type": "function", "function": {"name", "description", "parameters", ...}}``.
        builtin: rlft's own tool, bounded in time by itself: the runner calls it in its own process.
    """

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]
    builtin: bool = False


def load_tools(names: Sequence[str], cfg: EpisodeConfig) -> list[Tool]:
    """The tools of ``cfg.tools`` (``names``): built-ins by name, user functions by 'pkg.module:function'.

    Raises:
        ConfigError: an entry names no built-in, its module cannot be imported (or raised), it has no such
            callable, transformers cannot build its schema, or two entries give tools of one name.
    """
    check_tools(names)
    tools = [_load(entry, cfg) for entry in names]
    first: dict[str, str] = {}
    for entry, tool in zip(names, tools):
        if tool.name in first:
            raise ConfigError(f"tools: '{first[tool.name]}' and '{entry}' are both named '{tool.name}' (the policy "
                              "calls tools by name): rename one of the functions")
        first[tool.name] = entry
    return tools


def _load(entry: str, cfg: EpisodeConfig) -> Tool:
    if entry in BUILTINS:
        fn = BUILTINS[entry](cfg)
        return Tool(entry, fn, _schema(entry, fn), builtin=True)
    fn = load_user_function(entry, "tool", ConfigError, ConfigError)  # its shape: checked by check_tools
    schema = _schema(entry, fn)
    return Tool(schema["function"]["name"], fn, schema)


def _schema(entry: str, fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return get_json_schema(fn)
    except Exception as e:  # noqa: BLE001  (its parsers raise their own exception classes, or TypeError)
        first = (str(e).strip().splitlines() or [""])[0]
        raise ConfigError(f"tool '{entry}': cannot describe it to the model ({first}): {_SCHEMA_HINT}") from None
