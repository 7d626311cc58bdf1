"""Chat templating of prompts, and dropping prompts over data.max_prompt_tokens or over what the
sampler's engine can complete (sampler.vllm.max_model_len)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlft.config.validation import resolve_sampler_name
from rlft.data.problem import Problem
from rlft.data.safe_tokens import contents_of, holds_special, render_ids, with_contents
from rlft.data.tasks import Task, rows_task
from rlft.errors import DataError

if TYPE_CHECKING:
    from rlft.config.schemas.data import DataConfig
    from rlft.config.schemas.sampler import SamplerConfig

Prompt = str | list[dict[str, Any]]
"""A user message, or a list of chat messages ``{"role": ..., "content": ...}``."""


def prompt_ids(tokenizer: Any, prompt: Prompt, system_prompt: str | None = None,
               chat_template: bool = True) -> list[int]:
    """Token ids of ``prompt`` ready for the assistant's reply.

    With ``chat_template`` (the default) and a tokenizer that has a chat template: a string prompt is
    one user turn, a message list is used as given; ``system_prompt`` (None: the template's default)
    comes first as a system message. Otherwise the raw text, ``tokenizer(prompt)``. The prompt's text
    is data: a special-token string inside it stays text (rlft.data.safe_tokens).

    Raises:
        DataError: a message list without a chat template to render it, or a message list that begins
            with a system message while ``system_prompt`` is given.
    """
    return filled_prompt_ids(tokenizer, lambda c: with_contents(prompt, c), contents_of(prompt), system_prompt,
                             chat_template)


def filled_prompt_ids(tokenizer: Any, fill: Callable[[list[str]], Prompt], contents: list[str],
                      system_prompt: str | None = None, chat_template: bool = True) -> list[int]:
    """:func:`prompt_ids` of the prompt ``fill(contents)``, where ``contents`` are the untrusted strings
    (a rubric's fields, say) and the rest of what ``fill`` writes is trusted."""
    return render_ids(tokenizer, lambda c: _render(tokenizer, fill(c), system_prompt, chat_template)[0], contents,
                      not templated(tokenizer, chat_template))


def problem_ids(tokenizer: Any, problem: Problem, data_cfg: DataConfig) -> list[int]:
    """:func:`prompt_ids` of a problem under the data config's ``system_prompt`` and ``chat_template``."""
    return prompt_ids(tokenizer, problem.model_input, data_cfg.system_prompt, getattr(data_cfg, "chat_template", True))


def templated(tokenizer: Any, chat_template: bool) -> bool:
    """Whether prompts go through the tokenizer's chat template (else: raw text with its special tokens)."""
    return bool(chat_template and getattr(tokenizer, "chat_template", None))


def _render(tokenizer: Any, prompt: Prompt, system_prompt: str | None, chat_template: bool) -> tuple[str, bool]:
    """The text to tokenize, and whether the tokenizer adds its special tokens to it."""
    if not templated(tokenizer, chat_template):
        if not isinstance(prompt, str):
            raise messages_need_template(chat_template)
        return prompt, True
    return tokenizer.apply_chat_template(chat_messages(prompt, system_prompt), tokenize=False,
                                         add_generation_prompt=True), False


def messages_need_template(chat_template: bool) -> DataError:
    """The error of a message prompt (or reply) that cannot be rendered: no chat template to use."""
    why = "data.chat_template=false" if not chat_template else "the tokenizer has no chat template"
    return DataError(f"a prompt is a list of chat messages but {why}: give string prompts, or a model whose "
                     "tokenizer has a chat template")


def chat_messages(prompt: Prompt, system_prompt: str | None) -> list[dict[str, Any]]:
    """A prompt as chat messages, ``system_prompt`` (when given) first."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system_prompt:
        if messages[0]["role"] == "system":
            raise DataError("a prompt's messages begin with a system message and data.system_prompt is set; "
                            "drop one of them")
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def drop_long_prompts(task: Task, tokenizer: Any, data_cfg: DataConfig,
                      engine_room: tuple[int, str] | None = None, overhead: int = 0) -> tuple[Task, int, int]:
    """The task without the problems whose prompt, as the model sees it (chat template and system prompt
    included, plus ``overhead`` tokens: the tools' description), is longer than ``data_cfg.max_prompt_tokens``
    tokens (0: no limit) or than ``engine_room`` (the sampler's room for a prompt and what sets it, see
    :func:`prompt_room`). Also checks that every prompt renders (message prompts need a chat template).

    Returns:
        The task (the same object when nothing is dropped; ``task.dropped`` holds the counts and
        ``task.dropped_by`` the limit) and the numbers of training and eval problems dropped.

    Raises:
        DataError: every training prompt is too long, data.max_prompt_tokens on a generated task (no
            finite set to filter), or a generated task whose prompts do not fit ``engine_room``.
    """
    own = getattr(data_cfg, "max_prompt_tokens", 0) or 0
    limits = ([(own, f"data.max_prompt_tokens={own}")] if own > 0 else []) + ([engine_room] if engine_room else [])
    rows = task.train_rows
    if not limits:
        chat = next((p for p in (rows or []) + task.eval_problems if p.messages is not None), None)
        if chat is not None:  # a message prompt the tokenizer cannot render fails now, not at the first rollout
            _render(tokenizer, chat.model_input, None, getattr(data_cfg, "chat_template", True))
        return task, 0, 0
    if rows is None:
        if own > 0:
            raise DataError(f"data.max_prompt_tokens={own} filters data sets read from files (data=jsonl, hf, "
                            f"gsm8k); data={data_cfg.name} generates its prompts: set data.max_prompt_tokens=0")
        _check_generated_fit(task, tokenizer, data_cfg, *limits[0], overhead)
        return task, 0, 0
    limit, why = min(limits)
    lengths = [n + overhead for n in _lengths(tokenizer, rows + task.eval_problems, data_cfg)]
    train_len, eval_len = lengths[: len(rows)], lengths[len(rows) :]
    kept = [p for p, n in zip(rows, train_len) if n <= limit]
    kept_eval = [p for p, n in zip(task.eval_problems, eval_len) if n <= limit]
    if not kept:
        raise DataError(f"{why}: all {len(rows)} training prompts are longer "
                        f"(the shortest has {min(train_len)} tokens)")
    dropped = (len(rows) - len(kept), len(task.eval_problems) - len(kept_eval))
    if dropped == (0, 0):
        return task, 0, 0
    out = rows_task(kept, kept_eval, task.seed)
    out.dropped, out.dropped_by = dropped, why
    return out, *dropped


def prompt_room(sampler_cfg: SamplerConfig) -> tuple[int, str] | None:
    """The longest prompt the sampler can complete to ``max_new_tokens`` without the engine refusing it
    or cutting the completion short, and what sets it; None when the sampler has no such limit (hf
    generates any length)."""
    if resolve_sampler_name(sampler_cfg.name) != "vllm":
        return None
    total, new = sampler_cfg.vllm.max_model_len, sampler_cfg.max_new_tokens
    return total - new, (f"sampler.vllm.max_model_len={total} with sampler.max_new_tokens={new} "
                         f"(prompts up to {total - new} tokens)")


def _check_generated_fit(task: Task, tokenizer: Any, data_cfg: DataConfig, limit: int, why: str,
                         overhead: int) -> None:
    """A generated stream cannot be filtered: its held-out problems and first training batch stand for
    the rest (their prompts come from one template, so their lengths hardly vary)."""
    sample = task.eval_problems + task.batch(0, 32)
    longest = max(_lengths(tokenizer, sample, data_cfg), default=0) + overhead
    if longest > limit:
        raise DataError(f"{why}: a data={data_cfg.name} prompt has {longest} tokens; raise "
                        "sampler.vllm.max_model_len (or shorten data.template / data.system_prompt)")


def _lengths(tokenizer: Any, problems: list[Problem], data_cfg: DataConfig) -> list[int]:
    """Prompt lengths in tokens, as :func:`problem_ids` counts them (tokenized in one batch call)."""
    rendered = [_render(tokenizer, p.model_input, data_cfg.system_prompt, getattr(data_cfg, "chat_template", True))
                for p in problems]
    out = [0] * len(problems)
    for special in (True, False):
        idx = [i for i, (_, s) in enumerate(rendered) if s == special]
        if idx:
            ids = tokenizer([rendered[i][0] for i in idx], add_special_tokens=special)["input_ids"]
            for i, x in zip(idx, ids):
                out[i] = len(x)
    for i, p in enumerate(problems):  # a special-token string in the data tokenizes as text: longer
        if any(holds_special(tokenizer, c) for c in contents_of(p.model_input)):
            out[i] = len(problem_ids(tokenizer, p, data_cfg))
    return out
