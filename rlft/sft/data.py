"""Demonstrations for ``rlft sft``: rows read as ``data=hf`` reads its files (:func:`rlft.data.hf.read_split`:
JSON lines, JSON, parquet, csv, arrow files, save_to_disk folders), each a conversation, in either of TRL's two
formats:

- prompt-completion: ``{"prompt": str or messages, "completion": str or [one assistant message]}``;
- conversational: ``{"messages": [{"role": ..., "content": ...}, ...]}``, multi-turn, with ``tool`` messages
  between the assistant's turns. An assistant message with structured ``tool_calls`` and no text is written as
  rlft's episodes read calls (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, rlft.tools.format).

A row whose conversation cannot train (no assistant turn, an empty completion, one over the length limit) is
dropped, counted by reason, and the first such row of each reason is named by file and line in the run's log.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rlft.data.hf import read_split
from rlft.errors import DataError
from rlft.tools.format import CLOSE, OPEN


@dataclass
class Dropped:
    """Rows left out, by reason: how many, and the first one's ``FILE:LINE`` and message."""

    counts: dict[str, int] = field(default_factory=dict)
    first: dict[str, str] = field(default_factory=dict)

    def add(self, reason: str, where: str, why: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        self.first.setdefault(reason, f"{where}: {why}")

    def merge(self, other: Dropped) -> None:
        """Add ``other``'s counts (its first rows kept where this one has none of that reason)."""
        for reason, n in other.counts.items():
            self.counts[reason] = self.counts.get(reason, 0) + n
            self.first.setdefault(reason, other.first[reason])

    def lines(self) -> list[str]:
        """One line per reason, for the run's log."""
        return [f"dropped {n} row{'s' * (n != 1)} ({reason}); the first: {self.first[reason]}"
                for reason, n in self.counts.items()]


def read_conversations(path: str, split: str | None, prompt_field: str = "prompt",
                       completion_field: str = "completion", messages_field: str = "messages"
                       ) -> tuple[list[tuple[str, list[dict[str, Any]]]], Dropped]:
    """The conversations of one split of the data set at ``path``, each with its row's name (``FILE:LINE``), and
    the rows dropped as unusable (no assistant turn, an empty completion).

    Raises:
        DataError: one line naming the file (and row): missing or unreadable, neither format's columns, a value
            of the wrong type (a completion that is not text, a message without a role).
    """
    where, rows, columns, names = read_split(path, split)
    conversational = messages_field in columns
    if not conversational and not {prompt_field, completion_field} <= set(columns):
        raise DataError(f"{where}: no '{messages_field}' column and no '{prompt_field}' + '{completion_field}' "
                        f"columns (columns: {', '.join(columns)}); set data.messages_field, or data.prompt_field and "
                        "data.completion_field")
    out, dropped = [], Dropped()
    for name, row in zip(names, rows):
        messages = (_messages(name, row.get(messages_field), messages_field) if conversational
                    else _prompt_completion(name, row, prompt_field, completion_field))
        reason = _unusable(messages)
        if reason:
            dropped.add(reason[0], name, reason[1])
            continue
        out.append((name, messages))
    return out, dropped


def _prompt_completion(where: str, row: dict[str, Any], prompt_field: str, completion_field: str
                       ) -> list[dict[str, Any]]:
    prompt, completion = row.get(prompt_field), row.get(completion_field)
    head = ([{"role": "user", "content": prompt}] if isinstance(prompt, str)
            else _messages(where, prompt, prompt_field))
    if completion is None or isinstance(completion, str):
        return [*head, {"role": "assistant", "content": completion or ""}]
    return [*head, *_messages(where, completion, completion_field)]


def _messages(where: str, value: Any, fld: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise DataError(f"{where}: '{fld}' is a {type(value).__name__}; expected a list of chat messages "
                        "{role, content}")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise DataError(f"{where}: '{fld}' message {i} has no role (each message is {{role, content}})")
        content = m.get("content")
        if m.get("tool_calls") and not content:
            content = _calls_text(where, m["tool_calls"])
        if content is not None and not isinstance(content, str):
            raise DataError(f"{where}: '{fld}' message {i} ({m['role']}) has a {type(content).__name__} content; "
                            "expected text")
        out.append({**{k: v for k, v in m.items() if k != "tool_calls"}, "content": content or ""})
    return out


def _calls_text(where: str, calls: Any) -> str:
    """Structured tool calls (OpenAI's ``[{"function": {"name", "arguments"}}]``) as rlft's call text."""
    parts = []
    for call in calls if isinstance(calls, list) else [calls]:
        fn = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise DataError(f"{where}: a tool call without a function name: {str(call)[:80]}")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                raise DataError(f"{where}: tool call {fn['name']}'s arguments are not JSON: {args[:80]}") from None
        parts.append(f"{OPEN}{json.dumps({'name': fn['name'], 'arguments': args}, ensure_ascii=False)}{CLOSE}")
    return "\n".join(parts)


def _unusable(messages: list[dict[str, Any]]) -> tuple[str, str] | None:
    """``(reason, message)`` when the conversation has nothing to train on."""
    assistant = [m for m in messages if m.get("role") == "assistant"]
    if not assistant:
        return "no assistant turn", "no assistant turn: nothing to learn from"
    if any(not m["content"] for m in assistant):
        return "empty completion", "an assistant turn without text"
    return None
