"""data=hf (and its preset data=gsm8k): a local data set read by the Hugging Face ``datasets`` library.

``data.path`` (and ``data.eval_path``) is one of:

- a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (a bare Dataset is
  the split ``train``);
- a folder of data files, split by file name as ``load_dataset(folder)`` does (``train.jsonl`` +
  ``test.jsonl``, ``data/train-00000-of-00001.parquet``, ...);
- one ``.parquet``, ``.json``, ``.jsonl``, ``.csv`` or ``.arrow`` file (optionally ``.gz``/``.bz2``/
  ``.xz``/``.zst`` compressed), which is the split ``train``.

Nothing is downloaded: a path that does not exist is an error, never a Hub name.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import lzma
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlft.data.problem import Problem, check_columns, to_problems
from rlft.data.tasks import Task, json_rows, split_eval
from rlft.errors import DataError
from rlft.paths import user_path
from rlft.rewards.gsm8k import parse_gsm8k_answer

if TYPE_CHECKING:
    from rlft.config.schemas.data import DataConfig

FORMATS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv", ".arrow": "arrow"}
"""File suffix -> the ``datasets`` builder that reads it."""
COMPRESSED = (".gz", ".bz2", ".xz", ".zst")


def hf_task(cfg: DataConfig, seed: int) -> Task:
    """Problems from ``cfg.path``'s split ``cfg.split``; eval from ``cfg.eval_split`` (of ``cfg.eval_path``
    when given, else of ``cfg.path``), or the only split of ``cfg.eval_path``, or the last ``cfg.num_eval``
    training rows. data=gsm8k reads each answer as the final number N of the worked solution."""
    parse = _gsm8k_answer if cfg.name == "gsm8k" else None
    rows = load_problems(cfg.path, cfg.split, cfg, parse)
    eval_rows = None
    if cfg.eval_split or cfg.eval_path:
        eval_rows = load_problems(cfg.eval_path or cfg.path, cfg.eval_split, cfg, parse)
    return split_eval(rows, eval_rows, cfg.num_eval, user_path(cfg.path), seed)


def _gsm8k_answer(text: str) -> str:
    return parse_gsm8k_answer(text)


def load_problems(path: str, split: str | None, cfg: DataConfig, parse_answer: Callable[[str], str] | None = None
                  ) -> list[Problem]:
    """The problems of one split (None: the data set's only split) of the data set at ``path``.

    Raises:
        DataError: one line naming the file: missing, unreadable, an unknown split (listing the
            available ones), a missing or reserved column (listing the columns), no rows, or a bad row.
    """
    where, rows, columns, names = read_split(path, split)
    for fld in (cfg.prompt_field, cfg.answer_field):
        if fld is not None and fld not in columns:
            raise DataError(f"{where}: no column '{fld}' (columns: {', '.join(columns)}); "
                            "set data.prompt_field / data.answer_field")
    check_columns(where, columns, cfg.prompt_field, cfg.answer_field)
    return to_problems(zip(names, rows), cfg, parse_answer)


def read_split(path: str, split: str | None) -> tuple[str, list[dict[str, Any]], list[str], list[str]]:
    """The rows of one split (None: the data set's only split) of the data set at ``path``.

    Returns:
        ``(where, rows, columns, names)``: the split as errors name it, its rows, its column names, and
        each row's name for errors (``FILE:LINE`` in a JSON-lines file, else ``WHERE row I``).

    Raises:
        DataError: one line naming the file: missing, unreadable, an unknown split (listing the
            available ones), or no rows.
    """
    p = user_path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file or directory")
    splits = _read(p)
    if split is None:
        if len(splits) != 1:
            raise DataError(f"{p}: holds the splits {', '.join(splits)}; name the eval one with data.eval_split")
        split = next(iter(splits))
    if split not in splits:
        raise DataError(f"{p}: no split '{split}'; available: {', '.join(splits)}")
    rows, columns = splits[split]
    where = f"{p} (split {split})" if p.is_dir() else str(p)
    if not rows:
        raise DataError(f"{where}: no rows")
    return where, rows, columns, _line_names(p, len(rows)) or [f"{where} row {i}" for i in range(len(rows))]


def _line_names(p: Path, n: int) -> list[str] | None:
    """``FILE:LINE`` of each row of a JSON-lines file (as data=jsonl names them); None for other files."""
    if not (p.is_file() and p.suffix.lower() in (".jsonl", ".json")):
        return None
    text = p.read_text(encoding="utf-8")
    lines = [i for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    return [f"{p}:{i}" for i in lines] if len(lines) == n and not text.lstrip().startswith("[") else None


Split = tuple[list[dict[str, Any]], list[str]]
"""A split's rows and its column names."""


def _read(p: Path) -> dict[str, Split]:
    """Every split of the data set at ``p``, by name."""
    import datasets  # seconds to import; only the hf and gsm8k tasks need it

    try:
        with _quiet():
            if p.is_dir():
                if (p / "dataset_dict.json").is_file() or (p / "state.json").is_file():
                    loaded = datasets.load_from_disk(str(p))
                else:
                    loaded = datasets.load_dataset(str(p.resolve()))
            else:
                loaded = datasets.load_dataset(_builder(p), data_files=str(p.resolve()))
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001  (the library raises many kinds; each becomes one line)
        if p.is_file() and _builder(p) == "json":
            return {"train": _json_rows(p, e)}  # names the bad line, or reads what arrow could not type
        if "corresponds to no data" in str(e):  # how datasets 5 reports a file without rows
            raise DataError(f"{p}: no rows") from None
        raise DataError(f"{p}: cannot read it with the datasets library ({type(e).__name__}: {_first(e)})") from None
    if isinstance(loaded, datasets.Dataset):
        loaded = {"train": loaded}
    return {name: (ds.to_list(), list(ds.column_names)) for name, ds in loaded.items()}


def _builder(p: Path) -> str:
    suffixes = [s.lower() for s in p.suffixes]
    if suffixes and suffixes[-1] in COMPRESSED:
        suffixes.pop()
    fmt = FORMATS.get(suffixes[-1] if suffixes else "")
    if fmt is None:
        raise DataError(f"{p}: unknown format; data=hf reads {', '.join(FORMATS)} files (optionally "
                        f"{'/'.join(COMPRESSED)} compressed) and folders (save_to_disk, or data files by split)")
    return fmt


def _json_rows(p: Path, error: Exception) -> Split:
    """Rows of a JSON list or JSON-lines file read with the json module, after ``datasets`` failed on it
    (``error``): names the line of invalid JSON or the row that is not an object; or, when each line is
    valid (a column arrow cannot give one type), the rows as read.
    """
    opener = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open, ".json": open, ".jsonl": open}.get(p.suffix.lower())
    if opener is None:
        raise DataError(f"{p}: cannot read it with the datasets library ({type(error).__name__}: {_first(error)})")
    with opener(p, "rt", encoding="utf-8") as f:
        text = f.read()
    rows = json_rows(p, text, as_list=text.lstrip().startswith("["))
    for where, row in rows:
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected an object, got {type(row).__name__}")
    columns = list(dict.fromkeys(k for _, row in rows for k in row))
    return [row for _, row in rows], columns


def _first(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No progress bars or log lines from the datasets library (errors come back as exceptions)."""
    import datasets  # seconds to import; only the hf and gsm8k tasks need it

    level, bars = datasets.logging.get_verbosity(), datasets.is_progress_bar_enabled()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL + 1)
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        datasets.logging.set_verbosity(level)
        if bars:
            datasets.enable_progress_bars()
