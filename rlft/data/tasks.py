"""Tasks: a deterministic stream of training problems and a disjoint held-out split."""

from __future__ import annotations

import itertools
import json
import operator
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlft.data.problem import Problem, to_problems
from rlft.errors import DataError
from rlft.paths import user_path

if TYPE_CHECKING:
    from rlft.config.schemas.data import DataConfig

__all__ = ["DataError", "Problem", "Task", "rows_task"]

_EVAL_SEED = 20240601  # the held-out split does not depend on the run's seed
FILE_TASKS = ("jsonl", "hf", "gsm8k")
"""Tasks read from a finite data set (the others are generated streams)."""


class Task:
    """Training problems drawn by batch index (so a resumed run sees the same data) and eval problems."""

    def __init__(self, train: Callable[[int, int], list[Problem]], eval_problems: list[Problem],
                 rows: list[Problem] | None = None, seed: int = 0):
        self._train = train
        self.eval_problems = eval_problems
        self.train_rows = rows
        """The finite training set of a file-based task (None: a generated stream)."""
        self.seed = seed
        self.dropped = (0, 0)
        """Training and eval problems dropped as too long (see rlft.data.chat.drop_long_prompts)."""
        self.dropped_by = ""
        """The limit they were longer than, e.g. 'data.max_prompt_tokens=512'."""

    def batch(self, index: int, size: int) -> list[Problem]:
        """The ``index``-th training batch of ``size`` problems (deterministic)."""
        return self._train(index, size)


_OPS: dict[str, Callable[[int, int], int]] = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def arithmetic_task(cfg: DataConfig, seed: int) -> Task:
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


def json_rows(p: Path, text: str, as_list: bool) -> list[tuple[str, Any]]:
    """``(where, object)`` per row of a JSON list (``as_list``) or of JSON lines.

    Raises:
        DataError: naming the file and line of invalid JSON.
    """
    if as_list:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{p}:{e.lineno}: invalid JSON ({e.msg})") from None
        if not isinstance(data, list):
            raise DataError(f"{p}: expected a JSON list of objects, got {type(data).__name__}")
        return [(f"{p} (item {i})", obj) for i, obj in enumerate(data)]
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((f"{p}:{lineno}", json.loads(line)))
        except json.JSONDecodeError as e:
            raise DataError(f"{p}:{lineno}: invalid JSON ({e.msg})") from None
    return rows


def read_records(path: str | Path, cfg: DataConfig) -> list[Problem]:
    """Problems of a JSONL file (one object per line) or a JSON file holding a list of objects.

    ``cfg`` (DataConfig): ``prompt_field``, ``answer_field``, ``template`` and the chat settings
    (see :func:`rlft.data.problem.to_problems`); the row's other fields become the problem's columns.

    Raises:
        DataError: naming the file and line (or item) of the first bad row.
    """
    p = user_path(path)
    if not p.is_file():
        raise DataError(f"{p}: no such file")
    text = p.read_text(encoding="utf-8")
    rows = json_rows(p, text, as_list=p.suffix == ".json")
    problems = to_problems(rows, cfg)
    if not problems:
        raise DataError(f"{p}: no rows")
    return problems


def rows_task(rows: list[Problem], eval_rows: list[Problem], seed: int) -> Task:
    """A task over a finite training set: epoch after epoch, each in an order drawn from ``(seed, epoch)``."""

    def train(index: int, size: int) -> list[Problem]:
        out = []
        for j in range(index * size, (index + 1) * size):
            epoch, pos = divmod(j, len(rows))
            perm = np.random.default_rng([seed, epoch]).permutation(len(rows))
            out.append(rows[perm[pos]])
        return out

    return Task(train, eval_rows, rows, seed)


def split_eval(rows: list[Problem], eval_rows: list[Problem] | None, num_eval: int, source: Any,
               seed: int) -> Task:
    """The first ``num_eval`` of ``eval_rows``; without those, the last ``num_eval`` rows (at most half)."""
    if eval_rows is not None:
        eval_rows = eval_rows[:num_eval]
    else:
        k = min(num_eval, len(rows) // 2)
        rows, eval_rows = rows[: len(rows) - k], rows[len(rows) - k :]
    if not rows:
        raise DataError(f"{source}: no training rows left after the eval split")
    return rows_task(rows, eval_rows, seed)


def file_task(cfg: DataConfig, seed: int) -> Task:
    """Problems from a local JSONL/JSON file; eval from ``eval_path`` or the last rows of ``path``."""
    rows = read_records(cfg.path, cfg)
    eval_rows = read_records(cfg.eval_path, cfg) if cfg.eval_path else None
    return split_eval(rows, eval_rows, cfg.num_eval, cfg.path, seed)


