"""A prompt and a reply as a reward model reads them, shared by ``rlft rm`` (its training pairs) and
``reward.models`` (scoring): the rendering, the fit to ``max_length``, and the record an exported
reward model keeps of how it was trained (:class:`Rendering`).

The fit keeps the whole prompt part (everything before the reply: the question, the chat header)
and the reply's end, where a reward model reads its score, and cuts the reply's beginning; when the
prompt part and the template's closing leave no room for any reply token, nothing is scored (None).
verl's reward-model worker truncates on the right instead (``truncation: right`` in
``_switch_chat_template``): the score token then sits inside the reply, never at its end, and what
the reply ends with is not seen. Keeping the last tokens (rlft before this module) saw the end but
dropped the question and the chat header, so the model scored a reply without knowing what it answers.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlft.data.chat import Prompt, chat_messages, messages_need_template, templated
from rlft.data.safe_tokens import Encoding, Render, contents_of, encode, render_ids, with_contents
from rlft.errors import ModelError

RECORD = "rlft_rendering.json"
"""The file beside an exported reward model saying how ``rlft rm`` rendered its pairs."""


@dataclass(frozen=True)
class Rendering:
    """How a reward model reads a conversation. The defaults are what a model without a record (from TRL,
    say) gets: its chat template when it has one, no system prompt, at most 1024 tokens."""

    chat_template: bool = True
    """Render through the tokenizer's chat template when it has one (False: prompt text + reply text)."""
    system_prompt: str | None = None
    """A system message before the prompt (None: none; a row's own system message stands in for it)."""
    max_length: int = 1024
    """Longest rendering in tokens, cut by the rule of the module docstring (0: no limit)."""


def write_rendering(directory: Path, rendering: Rendering) -> None:
    (directory / RECORD).write_text(json.dumps(asdict(rendering), indent=1) + "\n")


def read_rendering(directory: Path) -> Rendering | None:
    """The record in ``directory``; None when it has none.

    Raises:
        ModelError: the record is there but cannot be read.
    """
    path = directory / RECORD
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
        return Rendering(bool(raw["chat_template"]), raw.get("system_prompt"), int(raw["max_length"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelError(f"{path}: not a readable rendering record ({type(e).__name__}: {e}); delete it to score "
                         "with the defaults") from None


@dataclass(frozen=True)
class Fitted:
    ids: list[int] | None
    """None: the prompt part leaves no room for the reply within max_length."""
    cut: bool = False
    """The reply's beginning was cut."""


def conversation_ids(tokenizer: Any, prompt: Prompt, reply: Prompt, system_prompt: str | None = None,
                     chat_template: bool = True) -> list[int]:
    """Token ids of ``prompt`` followed by the assistant's ``reply`` (a string, or a list of messages
    that continue the conversation), whole. Templated as :func:`rlft.data.chat.prompt_ids` does; without
    a chat template, the prompt text followed by the reply text. Special-token strings in the prompt or
    the reply stay text (rlft.data.safe_tokens).

    Raises:
        DataError: a message prompt or reply without a chat template.
    """
    render, contents, _, special = _conversation(tokenizer, prompt, reply, system_prompt, chat_template)
    return render_ids(tokenizer, render, contents, special)


def fit_conversation(tokenizer: Any, prompt: Prompt, reply: Prompt, system_prompt: str | None = None,
                     chat_template: bool = True, max_length: int = 0) -> Fitted:
    """:func:`conversation_ids` within ``max_length`` tokens (0: no limit), by the rule of the module
    docstring. A template that rewrites the reply (so it cannot be found in the text) leaves a rendering
    that is too long unscored too.

    Raises:
        DataError: as :func:`conversation_ids`.
    """
    render, contents, reply_at, special = _conversation(tokenizer, prompt, reply, system_prompt, chat_template)
    ids = render_ids(tokenizer, render, contents, special)
    if not max_length or len(ids) <= max_length:
        return Fitted(ids)
    return Fitted(keep_reply_end(encode(tokenizer, render, contents, special, reply_at), reply_at, max_length), True)


def keep_reply_end(enc: Encoding, reply_at: list[int], max_length: int) -> list[int] | None:
    """``enc``'s ids before the reply, then its last ids up to ``max_length`` in all; None when that
    keeps no reply token (or the reply was not found)."""
    spans = [span for i in reply_at for span in (enc.spans or {}).get(i, [])]
    if not spans:
        return None
    start, end = min(a for a, _ in spans), max(b for _, b in spans)
    head = next((k for k, s in enumerate(enc.starts) if s >= start), len(enc.ids))
    closing = sum(s >= end for s in enc.starts[head:])
    room = max_length - head
    if room <= closing:
        return None
    return enc.ids[:head] + enc.ids[len(enc.ids) - room:]


def _conversation(tokenizer: Any, prompt: Prompt, reply: Prompt, system_prompt: str | None,
                  chat_template: bool) -> tuple[Render, list[str], list[int], bool]:
    """The renderer of prompt + reply, its untrusted strings, the indices of the reply's among them,
    and whether the tokenizer adds its special tokens."""
    if not templated(tokenizer, chat_template):
        if not (isinstance(prompt, str) and isinstance(reply, str)):
            raise messages_need_template(chat_template)
        return (lambda c: c[0] + c[1]), [prompt, reply], [1], True
    turns = [{"role": "assistant", "content": reply}] if isinstance(reply, str) else list(reply)
    asked, said = contents_of(prompt), contents_of(turns)
    k = len(asked)

    def render(c: list[str]) -> str:
        messages = chat_messages(with_contents(prompt, c[:k]), system_prompt) + with_contents(turns, c[k:])
        return tokenizer.apply_chat_template(messages, tokenize=False)

    return render, asked + said, list(range(k, k + len(said))), False
