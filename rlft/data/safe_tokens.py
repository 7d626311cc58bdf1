"""Token ids of rendered text whose untrusted parts stay text: a special-token string (``<|im_end|>``)
that a policy, a data row, a tool or an environment wrote is tokenized as ordinary sub-tokens, never
as the special token itself.

Why: the policy can write ``<|im_end|>`` with ordinary sub-tokens; decoding keeps the text, and when
rlft renders that text into a chat template and tokenizes the whole, the string becomes the real
token and the reply forges a turn (closes the user turn, writes an assistant turn with "Score: 10").

How: a renderer is a function from the untrusted strings (message contents, rubric fields) to the
text. When none of them holds a special-token string the text is tokenized as always (the same ids
as before this module existed). Otherwise the renderer runs once more with random sentinels in place
of those strings, which places each one in the text; the text is cut at the special tokens the
template itself wrote (outside those places), and each piece between is tokenized with
``split_special_tokens=True``, as the tokenizer cuts at special tokens and tokenizes the pieces
between. A template that changes an untrusted string (trims it, say) cannot be mapped this way: the
special strings inside it are then broken by a zero-width space (:func:`neutralise`) and the text is
tokenized normally.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

Render = Callable[[list[str]], str]
"""The text for these untrusted strings (in the order the caller gave them)."""

ZERO_WIDTH = "\u200b"


@dataclass(frozen=True)
class Encoding:
    """A rendering's token ids, and what :func:`encode` was asked to find in its text."""

    ids: list[int]
    starts: list[int] = field(default_factory=list)
    """Each id's first character in the text (filled when spans were asked for)."""
    spans: dict[int, list[tuple[int, int]]] | None = None
    """Where the asked-for untrusted strings lie in the text, by their index (None: not found)."""


def special_strings(tokenizer: Any) -> tuple[str, ...]:
    """Every special token's text (added tokens marked special included)."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    out = set(getattr(tokenizer, "all_special_tokens", []) or [])
    out.update(t.content for t in added.values() if getattr(t, "special", False))
    return tuple(sorted((s for s in out if s), key=lambda s: (-len(s), s)))


@lru_cache(maxsize=32)
def _pattern(specials: tuple[str, ...]) -> re.Pattern[str]:
    # Longest first: at one position the alternation takes the longest token, as the tokenizer does.
    return re.compile("|".join(map(re.escape, specials)))


def holds_special(tokenizer: Any, text: str) -> bool:
    """Whether ``text`` holds a special token's string (so tokenizing it whole would make that token)."""
    return any(s in text for s in special_strings(tokenizer))


def neutralise(text: str, strings: Iterable[str]) -> str:
    """``text`` with each occurrence of ``strings`` broken by a zero-width space after its first
    character: it reads the same, but no longer matches (a special token, a rubric's delimiter)."""
    strings = tuple(sorted({s for s in strings if len(s) > 1}, key=len, reverse=True))
    if not strings:
        return text
    pattern = _pattern(strings)
    # Each pass breaks the leftmost of the overlapping occurrences; the space is in no special string,
    # so it makes no new one: the loop ends.
    while pattern.search(text):
        text = pattern.sub(lambda m: m.group(0)[0] + ZERO_WIDTH + m.group(0)[1:], text)
    return text


def contents_of(prompt: str | list[dict[str, Any]]) -> list[str]:
    """The strings of a prompt: itself, or its messages' string contents in order."""
    if isinstance(prompt, str):
        return [prompt]
    return [m["content"] for m in prompt if isinstance(m.get("content"), str)]


def with_contents(prompt: str | list[dict[str, Any]], contents: Sequence[str]) -> str | list[dict[str, Any]]:
    """``prompt`` with its strings (as :func:`contents_of` lists them) replaced by ``contents``."""
    if isinstance(prompt, str):
        return contents[0]
    it = iter(contents)
    return [dict(m, content=next(it)) if isinstance(m.get("content"), str) else m for m in prompt]


def render_ids(tokenizer: Any, render: Render, contents: Sequence[str], add_special_tokens: bool = False) -> list[int]:
    """Token ids of ``render(contents)``, no special token coming from inside ``contents``."""
    return encode(tokenizer, render, contents, add_special_tokens).ids


def chat_ids(tokenizer: Any, messages: list[dict[str, Any]], trusted: int = 0, **template_kwargs: Any) -> list[int]:
    """:func:`render_ids` of ``messages`` through the chat template (``template_kwargs`` passed on, e.g.
    ``add_generation_prompt``, ``tools``): the contents of the messages after the first ``trusted``
    (rlft's own system prompt, say) are untrusted."""
    head, rest = messages[:trusted], messages[trusted:]

    def render(c: list[str]) -> str:
        return tokenizer.apply_chat_template(head + with_contents(rest, c), tokenize=False, **template_kwargs)

    return render_ids(tokenizer, render, contents_of(rest))


def encode(tokenizer: Any, render: Render, contents: Sequence[str], add_special_tokens: bool = False,
           find: Iterable[int] = ()) -> Encoding:
    """The ids of ``render(contents)`` (see the module docstring); with ``find`` (indices of ``contents``),
    also each id's start in the text and where those strings lie."""
    contents, find = list(contents), sorted(set(find))
    text = render(contents)
    specials = special_strings(tokenizer)
    risky = [i for i, c in enumerate(contents) if any(s in c for s in specials)]
    if not risky:
        if not find:
            return Encoding(list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]))
        enc = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
        return Encoding(list(enc["input_ids"]), [a for a, _ in enc["offset_mapping"]],
                        locate(render, contents, find, text))
    spans = locate(render, contents, set(risky) | set(find), text)
    if spans is None:  # the template changed an untrusted string: break its special strings instead
        safe = [neutralise(c, specials) if i in risky else c for i, c in enumerate(contents)]
        return encode(tokenizer, render, safe, add_special_tokens, find)
    untrusted = sorted(span for i in risky for span in spans[i])
    ids, starts = _encode_pieces(tokenizer, text, untrusted, specials, add_special_tokens)
    return Encoding(ids, starts, {i: spans[i] for i in find})


def locate(render: Render, contents: list[str], which: Iterable[int], text: str) -> dict[int, list[tuple[int, int]]] | None:
    """Where each string ``contents[i]`` (``i`` in ``which``) lies in ``text == render(contents)``: every
    place the renderer put it; None when rendering random sentinels instead does not give ``text`` back
    with the strings in their places (the template changes what it is given)."""
    nonce = secrets.token_hex(6)  # unguessable: a string cannot pose as a sentinel
    which = set(which)
    marked = render([f"\ue000{nonce}{i}\ue001" if i in which else c for i, c in enumerate(contents)])
    spans: dict[int, list[tuple[int, int]]] = {i: [] for i in which}
    parts, size, last = [], 0, 0
    for m in re.finditer(f"\ue000{nonce}(\\d+)\ue001", marked):
        i = int(m.group(1))
        if i not in which:
            return None
        parts += [marked[last:m.start()], contents[i]]
        size += m.start() - last
        spans[i].append((size, size + len(contents[i])))
        size, last = size + len(contents[i]), m.end()
    parts.append(marked[last:])
    return spans if "".join(parts) == text else None


def _encode_pieces(tokenizer: Any, text: str, untrusted: list[tuple[int, int]], specials: tuple[str, ...],
                   add_special_tokens: bool) -> tuple[list[int], list[int]]:
    """Ids and starts of ``text``: special tokens only where the template wrote them (outside the
    ``untrusted`` spans), the text between them tokenized with special strings split."""
    cuts = _template_specials(tokenizer, text, untrusted, specials)
    ids: list[int] = []
    starts: list[int] = []
    pos = 0
    for start, end, token_id in [*cuts, (len(text), len(text), None)]:
        if start > pos:
            enc = tokenizer(text[pos:start], add_special_tokens=False, split_special_tokens=True,
                            return_offsets_mapping=True)
            ids += enc["input_ids"]
            starts += [pos + a for a, _ in enc["offset_mapping"]]
        if token_id is not None:
            ids.append(token_id)
            starts.append(start)
        pos = end
    if add_special_tokens:
        head, tail = _wrapping(tokenizer)
        ids, starts = head + ids + tail, [0] * len(head) + starts + [len(text)] * len(tail)
    return ids, starts


def _template_specials(tokenizer: Any, text: str, untrusted: list[tuple[int, int]],
                       specials: tuple[str, ...]) -> list[tuple[int, int, int]]:
    """``(start, end, id)`` of each special token in ``text`` outside the ``untrusted`` spans; a token
    whose added-token entry strips whitespace on its left or right takes that whitespace, as the
    tokenizer does."""
    pattern = _pattern(specials)
    strip = {t.content: (getattr(t, "lstrip", False), getattr(t, "rstrip", False))
             for t in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).values()}
    out: list[tuple[int, int, int]] = []
    pos = 0
    for lo, hi in [*untrusted, (len(text), len(text))]:
        for m in pattern.finditer(text, pos, lo):
            start, end = m.span()
            left, right = strip.get(m.group(0), (False, False))
            floor = max(out[-1][1] if out else 0, pos)
            while left and start > floor and text[start - 1].isspace():
                start -= 1
            while right and end < lo and text[end].isspace():
                end += 1
            out.append((start, end, tokenizer.convert_tokens_to_ids(m.group(0))))
        pos = max(pos, hi)
    return out


def _wrapping(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after a text when it adds its special tokens (BOS, EOS)."""
    full = list(tokenizer("a", add_special_tokens=True)["input_ids"])
    bare = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    at = next((i for i in range(len(full) - len(bare) + 1) if full[i:i + len(bare)] == bare), 0)
    return full[:at], full[at + len(bare):]
