"""Token ids between the policy's turns, rendered by its chat template without re-tokenising what the
policy wrote: the trajectory is the policy's own token ids, then the ids of what the environment
says and of the next assistant header, then the policy's next ids, and so on.

The template renders a whole conversation; the text it adds after an assistant turn is found by
rendering a probe conversation with and without the new messages. The policy's turn ended with its
stop token (``<|im_end|>``); whatever the template writes after that token (ChatML's newline) comes
first in the next ids. The messages' contents are tokenized as text: a tool output or an environment
message that writes ``<|im_end|>`` cannot end its turn and open one of its own (rlft.data.safe_tokens).
"""

from __future__ import annotations

from typing import Any

from rlft.data.safe_tokens import contents_of, render_ids, with_contents
from rlft.errors import ConfigError

_PROBE = "rlft-probe-reply-7f3a"
_PROBE_TURNS = [{"role": "user", "content": "rlft-probe-question"}, {"role": "assistant", "content": _PROBE}]


def turn_suffix_ids(tokenizer: Any, messages: list[dict[str, Any]], stop_text: str) -> list[int]:
    """The ids that follow an assistant turn ended by the token whose text is ``stop_text``: the rest of
    that turn's closing, ``messages`` as the template renders them, and the next assistant header.

    Raises:
        ConfigError: the chat template does not render ``messages`` after an assistant turn as an
            extension of the conversation (it rewrites earlier turns, or has no template).
    """
    closing = _closing(tokenizer)
    if closing.startswith(stop_text):
        closing = closing[len(stop_text):]
    before = _render(tokenizer, _PROBE_TURNS, False)
    after = _render(tokenizer, _PROBE_TURNS + list(messages), True)
    if not after.startswith(before):
        raise ConfigError("the policy's chat template renders the conversation differently once an environment "
                          "message follows the assistant's turn (it rewrites earlier turns): multi-turn episodes "
                          "need a template that only appends")

    def render(contents: list[str]) -> str:
        return closing + _render(tokenizer, _PROBE_TURNS + with_contents(list(messages), contents), True)[len(before):]

    # What a tool or an environment says is not the template's: its special-token strings stay text.
    return render_ids(tokenizer, render, contents_of(list(messages)))


def _closing(tokenizer: Any) -> str:
    """What the template writes after an assistant message's content."""
    text = _render(tokenizer, _PROBE_TURNS, False)
    return text[text.rindex(_PROBE) + len(_PROBE):]


def _render(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError("multi-turn episodes need a chat template: the policy's tokenizer has none")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
