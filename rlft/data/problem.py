"""One problem of a task, and the conversion of a data row (a dict) into one, with one-line errors.

A row's prompt is a string or a list of chat messages (``{"role": ..., "content": ...}``, as many
Hugging Face datasets store them); its answer a string or number; every other column travels with
the problem and reaches the reward functions as a keyword argument.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlft.errors import DataError

if TYPE_CHECKING:
    from rlft.config.schemas.data import DataConfig


RESERVED_COLUMNS = ("prompt", "completion", "answer", "prompts", "completions", "num_tokens", "truncated",
                    "max_new_tokens", "transcript", "env_reward")
"""Keyword arguments rlft passes to reward functions itself: a data column may not take their names."""


@dataclass(frozen=True)
class Problem:
    prompt: str
    """The user message (after data.template) passed to rewards; for a message prompt, the last user message."""
    answer: str
    """Reference answer passed to reward functions."""
    columns: dict[str, Any] = field(default_factory=dict, hash=False)
    """The row's other columns, passed to reward functions as keyword arguments."""
    messages: list[dict[str, Any]] | None = field(default=None, hash=False)
    """The chat messages when the row's prompt is a message list (None: ``prompt`` is the user message)."""

    @property
    def model_input(self) -> str | list[dict[str, Any]]:
        """What is templated for the model: the messages, else the prompt text."""
        return self.messages if self.messages is not None else self.prompt


def to_problems(rows: Iterable[tuple[str, dict[str, Any]]], cfg: DataConfig,
                parse_answer: Callable[[str], str] | None = None) -> list[Problem]:
    """Problems from ``(where, row)`` pairs; ``where`` names the row in errors ("d.jsonl:3", "d.parquet: row 3").

    ``cfg`` (DataConfig) gives ``prompt_field``, ``answer_field`` (None: no reference, answer ""),
    ``template`` (fills ``{prompt}`` of string prompts), ``system_prompt`` and ``chat_template``.
    ``parse_answer`` maps the answer text (e.g. a GSM8K worked solution to its final number).

    Raises:
        DataError: naming the row: a missing or empty prompt, a malformed message list, a message list
            with data.chat_template=false, a system message and data.system_prompt both, an answer
            that is not a string or number, or a column named like a reward keyword argument.
    """
    pf, af = cfg.prompt_field, getattr(cfg, "answer_field", "answer")
    template = getattr(cfg, "template", "{prompt}") or "{prompt}"
    check_template(template)
    return [_problem(where, row, pf, af, template, cfg, parse_answer) for where, row in rows]


def check_template(template: str) -> None:
    """Raise DataError unless ``template`` formats with only ``{prompt}``."""
    try:
        template.format(prompt="")
    except (KeyError, IndexError, ValueError) as e:
        raise DataError(f"data.template={template!r} does not format ({type(e).__name__}: {e}): it may name only "
                        "{prompt}; write {{ and }} for literal braces") from None


def check_columns(where: str, names: Iterable[str], prompt_field: str, answer_field: str | None) -> None:
    """Raise DataError when a column other than the prompt and answer has a reserved name."""
    for name in names:
        if name not in (prompt_field, answer_field) and name in RESERVED_COLUMNS:
            raise DataError(f"{where}: column '{name}' has the name of a keyword argument rlft passes to reward "
                            f"functions ({', '.join(RESERVED_COLUMNS)}); rename or remove it")


def _problem(where: str, row: Any, pf: str, af: str | None, template: str, cfg: DataConfig,
             parse_answer: Callable[[str], str] | None) -> Problem:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object, got {type(row).__name__}")
    for fld in (pf, af):
        if fld is not None and fld not in row:
            raise DataError(f"{where}: missing field '{fld}' (has: {', '.join(row) or 'nothing'})")
    check_columns(where, row, pf, af)
    value = row[pf]
    messages = None
    if isinstance(value, list):
        messages = _messages(where, pf, value, cfg)
        prompt = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    elif isinstance(value, str) and value.strip():
        prompt = template.format(prompt=value)
    else:
        raise DataError(f"{where}: field '{pf}' must be a non-empty string or a list of chat messages")
    answer = "" if af is None else row[af]
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise DataError(f"{where}: field '{af}' must be a string or number")
    answer = str(answer)
    if parse_answer is not None:
        try:
            answer = parse_answer(answer)
        except ValueError as e:
            raise DataError(f"{where}: field '{af}': {e}") from None
    columns = {k: v for k, v in row.items() if k not in (pf, af)}
    return Problem(prompt, answer, columns, messages)


def _messages(where: str, pf: str, value: list, cfg: DataConfig) -> list[dict[str, Any]]:
    """Check a chat-message prompt: dicts with string role and content, at least one user message."""
    if not getattr(cfg, "chat_template", True):
        raise DataError(f"{where}: field '{pf}' holds chat messages, which need data.chat_template=true "
                        "(false sends the prompt as raw text)")
    for i, m in enumerate(value):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise DataError(f"{where}: field '{pf}' message {i} is not a {{\"role\": str, \"content\": str}} object")
    if not any(m["role"] == "user" for m in value):
        raise DataError(f"{where}: field '{pf}' has no message with role 'user'")
    if getattr(cfg, "system_prompt", None) and value[0]["role"] == "system":
        raise DataError(f"{where}: field '{pf}' begins with a system message and data.system_prompt is set; "
                        "drop one of them")
    return [{k: v for k, v in m.items() if v is not None} for m in value]  # arrow fills absent keys with None
