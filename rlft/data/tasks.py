"""Tasks: a deterministic stream of training problems and a disjoint held-out split."""

from __future__ import annotations

import json
import operator
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlft.paths import user_path

_EVAL_SEED = 20240601  # the held-out split does not depend on the run's seed


class DataError(ValueError):
    """A problem with the user's data; the message names the file and line."""


@dataclass(frozen=True)
class Problem:
    prompt: str
    """The user message (before chat templating)."""
    answer: str
    """Reference answer passed to reward functions."""


class Task:
    """Training problems drawn by batch index (so a resumed run sees the same data) and eval problems."""

    def __init__(self, train: Callable[[int, int], list[Problem]], eval_problems: list[Problem]):
        self._train = train
        self.eval_problems = eval_problems

    def batch(self, index: int, size: int) -> list[Problem]:
        """The ``index``-th training batch of ``size`` problems (deterministic)."""
        return self._train(index, size)


_OPS: dict[str, Callable[[int, int], int]] = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def arithmetic_task(cfg: Any, seed: int) -> Task:
    """Problems 'a op b' with operands of ``cfg.digits`` digits; eval problems never appear in training."""
    for op in cfg.ops:
        if op not in _OPS:
            raise DataError(f"data.ops: unknown operator '{op}'; valid: {', '.join(_OPS)}")
    if cfg.digits < 1:
        raise DataError(f"data.digits={cfg.digits} must be at least 1")
    lo = 0 if cfg.digits == 1 else 10 ** (cfg.digits - 1)
    hi = 10**cfg.digits
    space = (hi - lo) ** 2 * len(cfg.ops)
    num_eval = min(cfg.num_eval, space // 2)

    def draw(rng: np.random.Generator) -> tuple[int, str, int]:
        a, b = (int(x) for x in rng.integers(lo, hi, size=2))
        return a, cfg.ops[int(rng.integers(len(cfg.ops)))], b

    def make(key: tuple[int, str, int]) -> Problem:
        a, op, b = key
        return Problem(cfg.template.format(a=a, op=op, b=b), str(_OPS[op](a, b)))

    rng = np.random.default_rng(_EVAL_SEED + cfg.digits)
    held_out: dict[tuple[int, str, int], None] = {}
    while len(held_out) < num_eval:
        held_out[draw(rng)] = None

    def train(index: int, size: int) -> list[Problem]:
        rng = np.random.default_rng([seed, index])
        out = []
        while len(out) < size:
            key = draw(rng)
            if key not in held_out:
                out.append(make(key))
        return out

    return Task(train, [make(k) for k in held_out])


def read_records(path: str | Path, prompt_field: str, answer_field: str) -> list[Problem]:
    """Read a JSONL file (one object per line) or a JSON file holding a list of objects.

    Raises:
        DataError: naming the file and line (or item) of the first bad row.
    """
    p = user_path(path)
    if not p.is_file():
        raise DataError(f"{p}: no such file")
    text = p.read_text(encoding="utf-8")
    rows: list[tuple[str, Any]] = []
    if p.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{p}:{e.lineno}: invalid JSON ({e.msg})") from None
        if not isinstance(data, list):
            raise DataError(f"{p}: expected a JSON list of objects, got {type(data).__name__}")
        rows = [(f"item {i}", obj) for i, obj in enumerate(data)]
    else:
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append((f"line {lineno}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise DataError(f"{p}:{lineno}: invalid JSON ({e.msg})") from None
    problems = []
    for where, obj in rows:
        loc = f"{p}:{where.split()[-1]}" if where.startswith("line") else f"{p} ({where})"
        if not isinstance(obj, dict):
            raise DataError(f"{loc}: expected an object, got {type(obj).__name__}")
        for fld in (prompt_field, answer_field):
            if fld not in obj:
                raise DataError(f"{loc}: missing field '{fld}' (has: {', '.join(obj) or 'nothing'})")
        prompt, answer = obj[prompt_field], obj[answer_field]
        if not isinstance(prompt, str) or not prompt.strip():
            raise DataError(f"{loc}: field '{prompt_field}' must be a non-empty string")
        if not isinstance(answer, (str, int, float)):
            raise DataError(f"{loc}: field '{answer_field}' must be a string or number")
        problems.append(Problem(prompt, str(answer)))
    if not problems:
        raise DataError(f"{p}: no rows")
    return problems


def file_task(cfg: Any, seed: int) -> Task:
    """Problems from a local JSONL/JSON file; eval from ``eval_path`` or the last rows of ``path``."""
    rows = read_records(cfg.path, cfg.prompt_field, cfg.answer_field)
    rows = [Problem(cfg.template.format(prompt=r.prompt), r.answer) for r in rows]
    if cfg.eval_path:
        eval_rows = read_records(cfg.eval_path, cfg.prompt_field, cfg.answer_field)[: cfg.num_eval]
        eval_rows = [Problem(cfg.template.format(prompt=r.prompt), r.answer) for r in eval_rows]
    else:
        k = min(cfg.num_eval, len(rows) // 2)
        rows, eval_rows = rows[: len(rows) - k], rows[len(rows) - k :]
    if not rows:
        raise DataError(f"{cfg.path}: no training rows left after the eval split")

    def train(index: int, size: int) -> list[Problem]:
        out = []
        for j in range(index * size, (index + 1) * size):
            epoch, pos = divmod(j, len(rows))
            perm = np.random.default_rng([seed, epoch]).permutation(len(rows))
            out.append(rows[perm[pos]])
        return out

    return Task(train, eval_rows)


def build_task(cfg: Any, seed: int) -> Task:
    """The task named by ``cfg.name`` (DataConfig)."""
    if cfg.name == "arithmetic":
        return arithmetic_task(cfg, seed)
    if cfg.name == "jsonl":
        return file_task(cfg, seed)
    raise DataError(f"data.name='{cfg.name}'; valid choices: arithmetic, jsonl")
