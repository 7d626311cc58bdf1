"""Tasks: a deterministic stream of training problems and a disjoint held-out split."""

from __future__ import annotations

import itertools
import json
import operator
from collections.abc import Callable, Hashable
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
    check_ops(cfg.ops, _OPS)
    if cfg.digits < 1:
        raise DataError(f"data.digits={cfg.digits} must be at least 1")
    lo = 0 if cfg.digits == 1 else 10 ** (cfg.digits - 1)
    hi = 10**cfg.digits
    space = (hi - lo) ** 2 * len(cfg.ops)
    num_eval = min(cfg.num_eval, space // 2)

    def draw(rng: np.random.Generator) -> tuple[tuple[int, str, int], Problem]:
        # Each problem draws its operator: with ops=[+,-,*] a batch mixes all three.
        a, b = (int(x) for x in rng.integers(lo, hi, size=2))
        op = cfg.ops[int(rng.integers(len(cfg.ops)))]
        return (a, op, b), Problem(cfg.template.format(a=a, op=op, b=b), str(_OPS[op](a, b)))

    return held_out_task(draw, num_eval, np.random.default_rng(_EVAL_SEED + cfg.digits), seed)


def check_ops(ops: list[str], valid: Any) -> None:
    """Raise DataError unless ``ops`` is a non-empty list of operators from ``valid``."""
    if not ops:
        raise DataError(f"data.ops is empty; give at least one of {', '.join(valid)}")
    for op in ops:
        if op not in valid:
            raise DataError(f"data.ops: unknown operator '{op}'; valid: {', '.join(valid)}")


def held_out_task(
    draw: Callable[[np.random.Generator], tuple[Hashable, Problem]],
    num_eval: int,
    eval_rng: np.random.Generator,
    seed: int,
    max_tries: int | None = None,
) -> Task:
    """A generated task whose ``num_eval`` held-out problems never appear in training.

    Args:
        draw: one random problem and its identity key (problems with equal keys are the same problem).
        eval_rng: draws the held-out problems (a fixed seed: the split does not depend on ``seed``).
        seed: with the batch index, seeds each training batch, so a resumed run sees the same data.
        max_tries: draws allowed per wanted problem before giving up (None: no limit; only safe
            when at most half the problem space is held out, as arithmetic ensures).

    Raises:
        DataError: ``max_tries`` draws did not give enough distinct (or not held-out) problems.
    """
    held_out: dict[Hashable, Problem] = {}
    for tries in itertools.count(1):
        if len(held_out) >= num_eval:
            break
        _check_tries(tries, max_tries, num_eval, "held-out")
        key, problem = draw(eval_rng)
        held_out.setdefault(key, problem)

    def train(index: int, size: int) -> list[Problem]:
        rng = np.random.default_rng([seed, index])
        out: list[Problem] = []
        for tries in itertools.count(1):
            if len(out) >= size:
                break
            _check_tries(tries, max_tries, size, "training")
            key, problem = draw(rng)
            if key not in held_out:
                out.append(problem)
        return out

    return Task(train, list(held_out.values()))


def _check_tries(tries: int, max_tries: int | None, wanted: int, what: str) -> None:
    if max_tries is not None and tries > max_tries * max(wanted, 1):
        raise DataError(f"could not draw {wanted} {what} problems in {tries - 1} tries: the problem space is too "
                        "small (raise data.digits or lower data.num_eval)")


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
    if cfg.name == "countdown":
        from rlft.data.countdown import countdown_task  # imported here: it builds on this module

        return countdown_task(cfg, seed)
    raise DataError(f"data.name='{cfg.name}'; valid choices: arithmetic, countdown, jsonl")
