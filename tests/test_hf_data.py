"""data=hf: local data sets read by the datasets library (every format the same problems), splits,
columns reaching the rewards, one-line errors; the data=gsm8k preset on the real GSM8K."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from rlft.config import ConfigError, compose
from rlft.config.schemas.data import DataConfig
from rlft.data import DataError, build_task
from rlft.data.problem import Problem
from tests.support import GSM8K, ROOT, TINY, needs_gsm8k, one_error_line, run_cli

ROWS = [{"prompt": f"What is {i} + 1?", "answer": i + 1, "level": i % 3, "source": f"s{i}"} for i in range(8)]


def data_cfg(path, **kw) -> DataConfig:
    return DataConfig(**{"name": "hf", "path": str(path), "template": "Q: {prompt}", "num_eval": 2, **kw})


def write(rows: list[dict], path: Path, fmt: str) -> Path:
    """``rows`` in one of the formats data=hf reads; returns the path to give as data.path."""
    from datasets import Dataset

    if fmt == "save_to_disk":
        Dataset.from_list(rows).save_to_disk(str(path))
        return path
    out = path.with_suffix("." + fmt)
    if fmt == "parquet":
        Dataset.from_list(rows).to_parquet(str(out))
    elif fmt == "json":
        out.write_text(json.dumps(rows))
    elif fmt == "jsonl":
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "csv":
        with open(out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return out


def expected(rows: list[dict]) -> list[Problem]:
    return [Problem(f"Q: {r['prompt']}", str(r["answer"]), {"level": r["level"], "source": r["source"]}) for r in rows]


def fields(problems: list[Problem]) -> list[tuple]:
    return [(p.prompt, p.answer, p.columns, p.messages) for p in problems]


@pytest.mark.parametrize("fmt", ["save_to_disk", "parquet", "json", "jsonl", "csv"])
def test_every_format_gives_the_same_problems(tmp_path, fmt):
    task = build_task(data_cfg(write(ROWS, tmp_path / "d", fmt)), seed=0)
    assert fields(task.train_rows) == fields(expected(ROWS[:6]))
    assert fields(task.eval_problems) == fields(expected(ROWS[6:]))  # the last num_eval rows
    epoch = [p.prompt for i in range(3) for p in task.batch(i, 2)]
    assert sorted(epoch) == sorted(p.prompt for p in task.train_rows)  # one shuffled pass over the rows
    assert fields(build_task(data_cfg(write(ROWS, tmp_path / "d", fmt)), seed=0).batch(5, 4)) == fields(
        task.batch(5, 4))  # deterministic by (seed, batch index): a resumed run sees the same data


def test_jsonl_carries_extra_fields_as_columns(tmp_path):
    f = write(ROWS, tmp_path / "d", "jsonl")
    task = build_task(data_cfg(f, name="jsonl"), seed=0)
    assert fields(task.train_rows) == fields(expected(ROWS[:6]))


def test_eval_split_and_eval_path(tmp_path):
    from datasets import Dataset, DatasetDict

    train, test = ROWS[:6], ROWS[6:]
    DatasetDict({"train": Dataset.from_list(train), "test": Dataset.from_list(test)}).save_to_disk(str(tmp_path / "dd"))
    folder = tmp_path / "files"
    folder.mkdir()
    write(train, folder / "train", "jsonl")
    write(test, folder / "test", "jsonl")
    for path in (tmp_path / "dd", folder):
        task = build_task(data_cfg(path, eval_split="test", num_eval=5), seed=0)
        assert fields(task.train_rows) == fields(expected(train))  # nothing carved out of train
        assert fields(task.eval_problems) == fields(expected(test))
        swapped = build_task(data_cfg(path, split="test", eval_split="train", num_eval=1), seed=0)
        assert fields(swapped.train_rows) == fields(expected(test))
        assert fields(swapped.eval_problems) == fields(expected(train[:1]))  # the first num_eval rows
    task = build_task(data_cfg(write(train, tmp_path / "t", "parquet"),
                               eval_path=str(write(test, tmp_path / "e", "csv")), num_eval=1), seed=0)
    assert fields(task.train_rows) == fields(expected(train))
    assert fields(task.eval_problems) == fields(expected(test[:1]))
    task = build_task(data_cfg(write(train, tmp_path / "t", "parquet"), eval_path=str(tmp_path / "dd"),
                               eval_split="test"), seed=0)
    assert fields(task.eval_problems) == fields(expected(test[:2]))


def test_home_path_and_null_answer_field(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    write([{"ref" if k == "answer" else k: v for k, v in r.items()} for r in ROWS], tmp_path / "d", "parquet")
    task = build_task(data_cfg("~/d.parquet", answer_field=None), seed=0)
    assert task.eval_problems[0].answer == ""
    assert task.eval_problems[0].columns == {"ref": 7, "level": 0, "source": "s6"}
    with pytest.raises(DataError, match="column 'answer' has the name of a keyword argument"):
        build_task(data_cfg(write(ROWS, tmp_path / "a", "parquet"), answer_field=None), seed=0)


def _dataset_dict(tmp_path):
    from datasets import Dataset, DatasetDict

    DatasetDict({"train": Dataset.from_list(ROWS), "test": Dataset.from_list(ROWS)}).save_to_disk(str(tmp_path / "dd"))
    return tmp_path / "dd"


@pytest.mark.parametrize("case, message", [
    ("missing", "nope.parquet: no such file or directory"),
    ("split", "dd: no split 'validation'; available: train, test"),
    ("eval_split", "dd: no split 'dev'; available: train, test"),
    ("column", "d.parquet: no column 'question' (columns: prompt, answer, level, source)"),
    ("empty", "e.parquet: no rows"),
    ("bad_row", "b.parquet row 1: field 'prompt' must be a non-empty string or a list of chat messages"),
    ("bad_answer", "a.jsonl:2: field 'answer' must be a string or number"),
    ("reserved", "r.parquet: column 'num_tokens' has the name of a keyword argument"),
    ("reserved_jsonl", "r.jsonl:1: column 'completion' has the name of a keyword argument"),
    ("format", "d.txt: unknown format; data=hf reads .parquet, .json, .jsonl, .csv, .arrow files"),
    ("invalid_json", "bad.jsonl:2: invalid JSON"),
    ("single_file_split", "d.parquet: no split 'test'; available: train"),
    ("two_splits_eval_path", "dd: holds the splits train, test; name the eval one with data.eval_split"),
])
def test_bad_data_is_one_data_error(tmp_path, case, message):
    from datasets import Dataset

    parquet = write(ROWS, tmp_path / "d", "parquet")
    cfg = {
        "missing": lambda: data_cfg(tmp_path / "nope.parquet"),
        "split": lambda: data_cfg(_dataset_dict(tmp_path), split="validation"),
        "eval_split": lambda: data_cfg(_dataset_dict(tmp_path), eval_split="dev"),
        "column": lambda: data_cfg(parquet, prompt_field="question"),
        "empty": lambda: data_cfg(tmp_path / "e.parquet"),
        "bad_row": lambda: data_cfg(write([ROWS[0], {**ROWS[1], "prompt": None}], tmp_path / "b", "parquet")),
        "bad_answer": lambda: data_cfg(write([ROWS[0], {**ROWS[1], "answer": [1]}], tmp_path / "a", "jsonl")),
        "reserved": lambda: data_cfg(write([{**r, "num_tokens": 1} for r in ROWS], tmp_path / "r", "parquet")),
        "reserved_jsonl": lambda: data_cfg(write([{**r, "completion": "x"} for r in ROWS], tmp_path / "r", "jsonl"),
                                           name="jsonl"),
        "format": lambda: data_cfg(tmp_path / "d.txt"),
        "invalid_json": lambda: data_cfg(tmp_path / "bad.jsonl"),
        "single_file_split": lambda: data_cfg(parquet, eval_split="test"),
        "two_splits_eval_path": lambda: data_cfg(parquet, eval_path=str(_dataset_dict(tmp_path))),
    }[case]
    if case == "empty":
        Dataset.from_list(ROWS).select([]).to_parquet(str(tmp_path / "e.parquet"))
    (tmp_path / "d.txt").write_text("x")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "answer": 1}\n{"prompt": "b", "answer": 2\n')
    with pytest.raises(DataError) as err:
        build_task(cfg(), seed=0)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_json_with_mixed_types_is_read_row_by_row(tmp_path):
    """A column arrow cannot give one type (an int answer, then a string one) still loads."""
    rows = [{**ROWS[0], "answer": 1}, {**ROWS[1], "answer": "two"}, ROWS[2], ROWS[3]]
    task = build_task(data_cfg(write(rows, tmp_path / "m", "jsonl"), num_eval=1), seed=0)
    assert [p.answer for p in task.train_rows] == ["1", "two", "3"]


def test_bad_data_on_the_command_line_is_one_line_exit_2(tmp_path):
    parquet = write(ROWS, tmp_path / "d", "parquet")
    proc = run_cli(["train", *TINY, "data=hf", f"data.path={parquet}", "data.prompt_field=question",
                    f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    line = one_error_line(proc, 2)
    assert line == (f"rlft: error: {parquet}: no column 'question' (columns: prompt, answer, level, source); "
                    "set data.prompt_field / data.answer_field")


def test_config_checks():
    with pytest.raises(ConfigError, match="data=hf needs data.path=FILE_OR_DIR"):
        compose(["data=hf"])
    with pytest.raises(ConfigError, match="data=gsm8k is scored by the gsm8k_correct reward"):
        compose(["data=gsm8k", "data.path=x.jsonl", "reward=math"])
    with pytest.raises(ConfigError, match="data.eval_split=test names a split of a data=hf data set"):
        compose(["data=jsonl", "data.path=x.jsonl", "data.eval_split=test"])
    with pytest.raises(ConfigError, match="data.eval_split=train is the training split"):
        compose(["data=hf", "data.path=x.jsonl", "data.eval_split=train"])
    cfg, _, _ = compose(["data=gsm8k", "data.path=x.jsonl"])
    assert list(cfg.reward.fns) == ["gsm8k_correct"]  # the preset picks its reward
    assert (cfg.data.prompt_field, cfg.data.answer_field, cfg.data.num_eval) == ("question", "answer", 200)


@needs_gsm8k
def test_gsm8k_preset_reads_the_real_data():
    cfg, _, _ = compose(["data=gsm8k", f"data.path={GSM8K / 'train.jsonl'}", f"data.eval_path={GSM8K / 'test.jsonl'}",
                         "data.num_eval=3"])
    task = build_task(cfg.data, cfg.seed)
    assert len(task.train_rows) == 7473 and len(task.eval_problems) == 3
    first = task.eval_problems[0]
    assert first.prompt.startswith("Janet") and first.prompt.endswith('write the final answer as a number after "####".')
    assert first.answer == "18" and first.columns == {}  # N of "#### 18", not the worked solution
    from rlft.rewards import resolve_reward

    assert resolve_reward("gsm8k_correct")(first.prompt, "So she makes #### 18", first.answer) == 1.0


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_train_one_step_on_parquet_with_column_rewards(tmp_path):
    """End to end: a parquet data set, and a per-sample and a batched reward that read its columns."""
    parquet = write(ROWS, tmp_path / "d", "parquet")
    run = tmp_path / "run"
    fns = "[tests.helpers:level_reward,tests.helpers:level_reward_batched]"
    proc = run_cli(["train", *TINY, "trainer.steps=1", "data=hf", f"data.path={parquet}", "data.num_eval=2",
                    f"reward.fns={fns}", "reward.weights=[1,1]", f"hydra.run.dir={run}"], cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    step = read_metrics(run)[-1]
    assert step["step"] == 1 and step["loss"] == step["loss"]  # finite, not NaN
    per, batched = step["reward/tests.helpers:level_reward"], step["reward/tests.helpers:level_reward_batched"]
    assert per == pytest.approx(batched) and 0 < per < 3  # level in {0, 1, 2} plus a length bonus
    assert step["reward/mean"] == pytest.approx(per + batched) and step["reward/unscored_frac"] == 0.0


@needs_gsm8k
def test_gsm8k_command_starts(tmp_path):
    run = tmp_path / "run"
    proc = run_cli(["train", "data=gsm8k", f"data.path={GSM8K / 'train.jsonl'}", f"data.eval_path={GSM8K / 'test.jsonl'}",
                    "sampler.max_new_tokens=16", "model=tiny", "sampler=hf", "trainer.steps=1", "data.num_eval=4",
                    "trainer.num_prompts=2", "sampler.n=4", "logger.console=false", f"hydra.run.dir={run}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1] and "eval/accuracy" in rows[-1]
    assert "reward/gsm8k_correct" in rows[-1]


@pytest.mark.parametrize("name, content", [("e.jsonl", ""), ("e.json", "[]"), ("e.csv", "prompt,answer\n")])
def test_empty_files_have_no_rows(tmp_path, name, content):
    (tmp_path / name).write_text(content)
    with pytest.raises(DataError, match=f"{name}: no rows$"):
        build_task(data_cfg(tmp_path / name), seed=0)
