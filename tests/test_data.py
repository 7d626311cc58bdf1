"""Tasks: generated arithmetic and file-based data with clear errors."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from rlft.data import DataError, build_task
from rlft.data.chat import prompt_ids


def arith(**kw):
    base = dict(name="arithmetic", digits=2, ops=["+"], template="What is {a} {op} {b}?", num_eval=50)
    return SimpleNamespace(**{**base, **kw})


def jsonl(path, **kw):
    base = dict(name="jsonl", path=str(path), eval_path=None, prompt_field="prompt", answer_field="answer",
                template="{prompt}", num_eval=2)
    return SimpleNamespace(**{**base, **kw})


def test_arithmetic_eval_is_disjoint_from_training():
    task = build_task(arith(), seed=0)
    held = {p.prompt for p in task.eval_problems}
    assert len(held) == 50
    seen = {p.prompt for i in range(200) for p in task.batch(i, 8)}
    assert not held & seen


def test_arithmetic_answers_and_digits():
    task = build_task(arith(ops=["+", "-", "*"]), seed=3)
    for p in task.batch(0, 30):
        a, op, b = p.prompt.removeprefix("What is ").removesuffix("?").split()
        assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99
        assert int(p.answer) == eval(f"{a}{op}{b}")


def test_arithmetic_is_deterministic_by_seed_and_index():
    t1, t2, t3 = build_task(arith(), 0), build_task(arith(), 0), build_task(arith(), 1)
    assert t1.batch(5, 4) == t2.batch(5, 4)
    assert t1.batch(5, 4) != t1.batch(6, 4)
    assert t1.batch(5, 4) != t3.batch(5, 4)
    assert t1.eval_problems == t3.eval_problems  # eval split does not depend on the seed


def test_one_digit_eval_is_capped_to_half_the_space():
    task = build_task(arith(digits=1, num_eval=200), 0)
    assert len(task.eval_problems) == 50


def test_jsonl_reads_rows_and_splits_eval(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(json.dumps({"prompt": f"q{i}", "answer": i}) for i in range(6)) + "\n")
    task = build_task(jsonl(f), 0)
    assert [p.prompt for p in task.eval_problems] == ["q4", "q5"]
    train = {p.prompt for i in range(4) for p in task.batch(i, 2)}
    assert train == {"q0", "q1", "q2", "q3"}
    assert task.eval_problems[0].answer == "4"


def test_json_list_file(tmp_path):
    f = tmp_path / "d.json"
    f.write_text(json.dumps([{"q": "a", "a": "1"}, {"q": "b", "a": "2"}, {"q": "c", "a": "3"}]))
    task = build_task(jsonl(f, prompt_field="q", answer_field="a", num_eval=1), 0)
    assert task.eval_problems[0].prompt == "c"


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"prompt": "a", "answer": 1}\n{"prompt": "b", "answer": 2\n', "d.jsonl:2: invalid JSON"),
        ('{"prompt": "a", "answer": 1}\n\n{"prompt": "b"}\n', "d.jsonl:3: missing field 'answer'"),
        ('[1, 2]\n', "d.jsonl:1: expected an object"),
        ('{"prompt": "", "answer": 1}\n', "d.jsonl:1: field 'prompt' must be a non-empty string"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, content, message):
    f = tmp_path / "d.jsonl"
    f.write_text(content)
    with pytest.raises(DataError, match=message):
        build_task(jsonl(f), 0)


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        build_task(jsonl(tmp_path / "nope.jsonl"), 0)


def test_chat_template_applied():
    from rlft.models.loading import load_tokenizer

    tok = load_tokenizer(SimpleNamespace(source="smollm2_gguf", path=None))
    text = tok.decode(prompt_ids(tok, "What is 1 + 2?"))
    assert text.endswith("<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<|im_start|>assistant\n")
    custom = tok.decode(prompt_ids(tok, "hi", system_prompt="Be brief."))
    assert custom.startswith("<|im_start|>system\nBe brief.<|im_end|>")


def test_three_digit_mixed_ops_from_the_command_line():
    from rlft.config import compose

    cfg, _, _ = compose(["data.ops=[+,-,*]", "data.digits=3", "data.num_eval=100"])
    assert cfg.data.ops == ["+", "-", "*"] and cfg.data.digits == 3
    task = build_task(cfg.data, cfg.seed)
    apply = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    train = [p for i in range(50) for p in task.batch(i, 8)]
    seen_ops = set()
    for p in train + task.eval_problems:
        a, op, b = p.prompt.removeprefix("What is ").removesuffix("? Reply with just the number.").split()
        assert 100 <= int(a) <= 999 and 100 <= int(b) <= 999
        assert p.answer == str(apply[op](int(a), int(b)))  # exact integers, negative when b > a
        seen_ops.add(op)
    assert seen_ops == {"+", "-", "*"}  # each problem draws its operator
    assert len(task.eval_problems) == 100
    assert not {p.prompt for p in task.eval_problems} & {p.prompt for p in train}


@pytest.mark.parametrize("ops, message", [(["/"], "unknown operator '/'"), ([], "data.ops is empty")])
def test_arithmetic_refuses_bad_ops(ops, message):
    with pytest.raises(DataError, match=message):
        build_task(arith(ops=ops), 0)
