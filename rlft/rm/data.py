"""Preference pairs: rows with a prompt, a chosen and a rejected reply, read as ``data=hf`` reads
its files (:func:`rlft.data.hf.read_split`: jsonl/json/parquet/csv/arrow files, save_to_disk
folders, folders of data files) and tokenized as ``reward.models`` scores them
(:func:`rlft.data.conversation.fit_conversation`: a sequence over ``data.max_length`` keeps its prompt
and its reply's end; a pair whose prompt leaves no room for the replies is dropped).

A row without its chosen or rejected reply is an error naming the file and row; a pair whose two
replies are the same carries no preference and is dropped (counted, and said in the run's log).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlft.data.chat import templated
from rlft.data.conversation import Rendering, fit_conversation
from rlft.data.hf import read_split
from rlft.errors import DataError

if TYPE_CHECKING:
    from rlft.config.rm_schema import PairsConfig


@dataclass(frozen=True)
class Pair:
    where: str
    """The row, as errors name it (``FILE:LINE`` or ``FILE row I``)."""
    prompt: Any
    """A string, or a list of chat messages."""
    chosen: Any
    """The preferred reply: a string, or assistant message(s)."""
    rejected: Any
    """The other reply."""
    margin: float | None = None
    """How much better chosen is (data.margin_field), or None."""


@dataclass
class Pairs:
    """The training and held-out pairs, and what was dropped from each."""

    train: list[Pair]
    eval: list[Pair]
    identical: tuple[int, int] = (0, 0)
    """Pairs dropped because chosen == rejected: (training, held-out)."""


def load_pairs(cfg: PairsConfig) -> Pairs:
    """The pairs of ``cfg.path`` (split ``cfg.split``); held out: ``cfg.eval_split`` (of ``cfg.eval_path``
    when given, else of ``cfg.path``), or the only split of ``cfg.eval_path``, or the last ``cfg.num_eval`` rows.

    Raises:
        DataError: one line naming the file (and row): missing, unreadable, a missing column, a row without
            its chosen or rejected reply, a margin that is not a number, no pairs left to train on.
    """
    train, dropped = _read_pairs(cfg.path, cfg.split, cfg)
    if cfg.eval_path or cfg.eval_split:
        held, dropped_eval = _read_pairs(cfg.eval_path or cfg.path, cfg.eval_split, cfg)
    else:
        n = cfg.num_eval
        if n >= len(train):
            raise DataError(f"{cfg.path}: {len(train)} distinct pairs leave none to train on after holding out "
                            f"data.num_eval={n}; lower it or give data.eval_path")
        held, train, dropped_eval = (train[len(train) - n:] if n else []), train[: len(train) - n], 0
    if not train:
        raise DataError(f"{cfg.path}: no pair with chosen != rejected to train on")
    return Pairs(train, held, (dropped, dropped_eval))


def _read_pairs(path: str, split: str | None, cfg: PairsConfig) -> tuple[list[Pair], int]:
    """The pairs of one split, and how many rows had chosen == rejected (dropped)."""
    where, rows, columns, names = read_split(path, split)
    fields = [cfg.prompt_field, cfg.chosen_field, cfg.rejected_field] + ([cfg.margin_field] if cfg.margin_field else [])
    for fld in fields:
        if fld not in columns:
            raise DataError(f"{where}: no column '{fld}' (columns: {', '.join(columns)}); set data.prompt_field / "
                            "data.chosen_field / data.rejected_field / data.margin_field")
    pairs = [_pair(name, row, cfg) for name, row in zip(names, rows)]
    kept = [p for p in pairs if p.chosen != p.rejected]
    return kept, len(pairs) - len(kept)


def _pair(where: str, row: dict[str, Any], cfg: PairsConfig) -> Pair:
    prompt = row.get(cfg.prompt_field)
    if not _is_text_or_messages(prompt) or not prompt:
        raise DataError(f"{where}: '{cfg.prompt_field}' is missing or empty (a string or a list of chat messages)")
    replies = []
    for fld in (cfg.chosen_field, cfg.rejected_field):
        value = row.get(fld)
        if value is None or (isinstance(value, (str, list)) and not value):
            raise DataError(f"{where}: no '{fld}' reply (a pair needs both {cfg.chosen_field} and {cfg.rejected_field})")
        if not _is_text_or_messages(value):
            raise DataError(f"{where}: '{fld}' is a {type(value).__name__}; expected a string or a list of chat "
                            "messages {role, content}")
        replies.append(value)
    margin = None
    if cfg.margin_field:
        margin = row.get(cfg.margin_field)
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin):
            raise DataError(f"{where}: margin '{cfg.margin_field}' is {margin!r}; expected a finite number")
        margin = float(margin)
    return Pair(where, prompt, replies[0], replies[1], margin)


def _is_text_or_messages(value: Any) -> bool:
    if isinstance(value, str):
        return True
    return isinstance(value, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)


@dataclass(frozen=True)
class Encoded:
    """A pair as token ids: the prompt followed by each reply, as the reward model scores it."""

    chosen: list[int]
    rejected: list[int]
    margin: float | None
    cut: bool = False
    """A reply's beginning was cut to fit data.max_length."""


def encode_pairs(pairs: list[Pair], tokenizer: Any, cfg: PairsConfig) -> tuple[list[Encoded], int]:
    """Token ids of each pair fitted to ``cfg.max_length``; returned with them: how many pairs were dropped
    because their prompt leaves no room for a reply.

    Raises:
        DataError: naming the row, for a message prompt or reply the tokenizer cannot render.
    """
    out = []
    for p in pairs:
        try:
            fits = [fit_conversation(tokenizer, p.prompt, reply, cfg.system_prompt, cfg.chat_template, cfg.max_length)
                    for reply in (p.chosen, p.rejected)]
        except DataError as e:
            raise DataError(f"{p.where}: {e}") from None
        if fits[0].ids is None or fits[1].ids is None:
            continue
        out.append(Encoded(fits[0].ids, fits[1].ids, p.margin, fits[0].cut or fits[1].cut))
    return out, len(pairs) - len(out)


def rendering(cfg: PairsConfig, tokenizer: Any) -> Rendering:
    """How the pairs were rendered, as the exported model records it (rlft.data.conversation.RECORD)."""
    chat = templated(tokenizer, cfg.chat_template)
    return Rendering(chat, cfg.system_prompt if chat else None, cfg.max_length)
