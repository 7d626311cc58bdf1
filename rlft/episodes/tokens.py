"""Token ids between the policy's turns, rendered by its chat template without re-tokenising what the
policy wrote: the trajectory is the policy's own token ids, then the ids of what the environment
says and of the next assistant header, then the policy's next ids, and so on.

The template renders a whole conversation; the text it adds after an assistant turn is found by
rendering a probe conversation with and without the new messages. The policy's turn ended with its
stop token (``<|im_end|>``); whatever the template writes after that token (ChatML's newline) comes
first in the next ids. The messages' contents are tokenized as text: a tool output or an environment
message that writes ``<|im_end|>`` cannot end its turn and open one of its own (rlft.data.safe_tokens).

:func:`check_turns` renders that probe at start-up (rlft.episodes.setup), so a template that cannot be used
so (it raises on the role, or rewrites earlier turns) stops the run before any sampling; the same checks in
:func:`turn_suffix_ids` stay as the backstop for what an environment sends later.
"""

from __future__ import annotations

from typing import Any

from rlft.data.safe_tokens import contents_of, render_ids, with_contents
from rlft.errors import ConfigError

_PROBE = "rlft-probe-reply-7f3a"
_PROBE_TURNS = [{"role": "user", "content": "rlft-probe-question"}, {"role": "assistant", "content": _PROBE}]


def turn_suffix_ids(tokenizer: Any, messages: list[dict[str, Any]], stop_text: str, fix: str = "") -> list[int]:
    """The ids that follow an assistant turn ended by the token whose text is ``stop_text``: the rest of
    that turn's closing, ``messages`` as the template renders them, and the next assistant header.

    Raises:
        ConfigError: the chat template does not render ``messages`` after an assistant turn as an
            extension of the conversation (it raises on them, rewrites earlier turns, or there is no
            template); ``fix``: what the user can change when the template raises on the messages' roles.
    """
    closing = _closing(tokenizer)
    if closing.startswith(stop_text):
        closing = closing[len(stop_text):]
    before = _render(tokenizer, _PROBE_TURNS, False)
    after = _render(tokenizer, _PROBE_TURNS + list(messages), True, messages, fix)
    if not after.startswith(before):
        raise ConfigError(f"the policy's chat template rewrites earlier turns once {_roles(messages)} follows the "
                          "assistant's turn (it renders them differently then: Qwen3's, for one, writes a <think> "
                          "block into the last assistant turn and strips it from earlier ones); "
                          "multi-turn episodes continue from the exact token ids sampled, so they need a template "
                          "that only appends: give the model's tokenizer such a chat_template (tokenizer_config.json "
                          "or chat_template.jinja in model.path), or use another model")

    def render(contents: list[str]) -> str:
        return closing + _render(tokenizer, _PROBE_TURNS + with_contents(list(messages), contents), True)[len(before):]

    # What a tool or an environment says is not the template's: its special-token strings stay text.
    return render_ids(tokenizer, render, contents_of(list(messages)))


def check_turns(tokenizer: Any, messages: list[dict[str, Any]], fix: str) -> None:
    """Render ``messages`` after an assistant turn as the episode loop will (start-up, before any sampling).

    Raises:
        ConfigError: as :func:`turn_suffix_ids`, in one line naming what the template does and what to do.
    """
    stop = getattr(tokenizer, "eos_token", None) or ""
    turn_suffix_ids(tokenizer, messages, stop, fix)


def _roles(messages: list[dict[str, Any]]) -> str:
    """The messages' roles in words: "a `tool` message", "a `user` and a `tool` message"."""
    roles = list(dict.fromkeys(str(m.get("role")) for m in messages)) or ["no"]
    return " and ".join(f"a `{r}`" for r in roles) + " message"


def _closing(tokenizer: Any) -> str:
    """What the template writes after an assistant message's content."""
    text = _render(tokenizer, _PROBE_TURNS, False)
    return text[text.rindex(_PROBE) + len(_PROBE):]


def _render(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool,
            new: list[dict[str, Any]] | None = None, fix: str = "") -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError("multi-turn episodes need a chat template: the policy's tokenizer has none")
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    except Exception as e:  # noqa: BLE001  (a template may raise anything: raise_exception, a missing key, ...)
        said = " ".join(str(e).split())[:200] or "no message"
        if new is None:
            raise ConfigError(f"the policy's chat template raised {type(e).__name__} ({said}) on a user turn and an "
                              "assistant turn: multi-turn episodes need a template that renders a conversation") from None
        raise ConfigError(f"the policy's chat template raised {type(e).__name__} ({said}) on {_roles(new)} after "
                          "the assistant's turn, where multi-turn episodes put the environment's answer"
                          f"{': ' + fix if fix else ''}") from None
