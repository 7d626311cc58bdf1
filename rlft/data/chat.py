"""Chat templating of prompts."""

from __future__ import annotations

from typing import Any


def prompt_ids(tokenizer: Any, text: str, system_prompt: str | None = None) -> list[int]:
    """Token ids of ``text`` as a user turn, ready for the assistant's reply.

    Uses the tokenizer's chat template when it has one (None system prompt keeps the
    template's default), else the raw text.
    """
    if getattr(tokenizer, "chat_template", None):
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
            {"role": "user", "content": text}
        ]
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    return list(tokenizer(text)["input_ids"])
