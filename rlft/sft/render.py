"""A conversation as the token ids a supervised example trains on, rendered as ``rlft train`` renders the same
conversation: the prompt by :func:`rlft.data.chat.prompt_ids` (the RL prompt, with ``data.system_prompt``), each
assistant turn as the policy would have sampled it (its text's ids, then the stop token that ends the turn), and
what comes between turns by :func:`rlft.episodes.tokens.turn_suffix_ids` (an episode's environment answer, with
the next assistant header). So the loss mask is the policy's own tokens, in every turn, the stop token included
(a model that never learns its end-of-turn token never stops), and nothing the template or the user wrote.

The text of every message is data: a special-token string inside it stays text (rlft.data.safe_tokens), in the
assistant's turns too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlft.data.chat import prompt_ids
from rlft.data.safe_tokens import render_ids
from rlft.episodes.tokens import turn_suffix_ids
from rlft.errors import DataError


@dataclass
class Example:
    """One supervised example: ``ids`` and, per id, whether it is the assistant's (in the loss)."""

    ids: list[int]
    mask: list[bool]

    @property
    def assistant_tokens(self) -> int:
        return sum(self.mask)


def render_conversation(tokenizer: Any, messages: list[dict[str, Any]], stop_id: int,
                        system_prompt: str | None = None, chat_template: bool = True) -> Example:
    """The ids and loss mask of ``messages`` (chat messages ending with an assistant turn); ``stop_id`` is the
    token that ends an assistant turn (the policy's stop token: :func:`stop_id`).

    Raises:
        DataError: no assistant turn, an empty assistant turn, a conversation that does not end with one, or two
            assistant turns with nothing between them (the row's fault; the caller names its file and line).
        ConfigError: the chat template cannot render the conversation turn by turn (it rewrites earlier turns).
    """
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if first is None:
        raise DataError("no assistant turn: nothing to learn from")
    if first == 0:
        raise DataError("the conversation begins with an assistant turn: it needs a prompt before it")
    if messages[-1].get("role") != "assistant":
        raise DataError(f"the conversation ends with a {messages[-1].get('role')!r} turn: the last turn must be the "
                        "assistant's (what follows it would never be trained)")
    ids = prompt_ids(tokenizer, messages[:first], system_prompt, chat_template)
    mask = [False] * len(ids)
    stop_text = tokenizer.decode([stop_id])
    i = first
    while i < len(messages):
        content = messages[i].get("content")
        if not isinstance(content, str) or not content:
            raise DataError(f"assistant turn {_turn(messages, i)} is empty: a completion must hold text")
        reply = render_ids(tokenizer, lambda c: c[0], [content]) + [stop_id]
        ids += reply
        mask += [True] * len(reply)
        j = i + 1
        while j < len(messages) and messages[j].get("role") != "assistant":
            j += 1
        if j == len(messages):
            break
        if j == i + 1:
            raise DataError(f"assistant turns {_turn(messages, i)} and {_turn(messages, j)} follow each other: "
                            "merge them, or put the user's or a tool's message between them")
        between = turn_suffix_ids(tokenizer, messages[i + 1:j], stop_text)
        ids += between
        mask += [False] * len(between)
        i = j
    return Example(ids, mask)


def _turn(messages: list[dict[str, Any]], i: int) -> int:
    """Assistant turn number (from 1) of message ``i``."""
    return sum(m.get("role") == "assistant" for m in messages[: i + 1])


def stop_id(tokenizer: Any, stop_ids: list[int]) -> int:
    """The token that ends the assistant's turn in this chat template: the first of ``stop_ids`` (the policy's
    stop tokens, :func:`rlft.samplers.base.stop_token_ids`) that the template writes right after a reply, else
    the tokenizer's EOS.

    Raises:
        DataError: none of ``stop_ids`` (no EOS either): a model trained on such examples could not stop.
    """
    if getattr(tokenizer, "chat_template", None):
        probe = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "rlft-probe-reply"}]
        text = tokenizer.apply_chat_template(probe, tokenize=False)
        after = text[text.rindex("rlft-probe-reply") + len("rlft-probe-reply"):]
        head = tokenizer(after, add_special_tokens=False)["input_ids"][:1]
        if head and head[0] in stop_ids:
            return head[0]
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id in stop_ids:
        return tokenizer.eos_token_id
    if stop_ids:
        return stop_ids[0]
    raise DataError("the model has no stop token (no EOS in its tokenizer or generation config)")
