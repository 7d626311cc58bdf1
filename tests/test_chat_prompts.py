"""Chat-message prompts, the system prompt, data.chat_template=false, and data.max_prompt_tokens."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from rlft.config import ConfigError, compose
from rlft.config.schemas import DataConfig
from rlft.data import DataError, build_task
from rlft.data.chat import drop_long_prompts, problem_ids, prompt_ids

CHAT = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3 + 3?"}]


@pytest.fixture(scope="module")
def tok():
    """SmolLM2's tokenizer (the tiny model's too), with its chat template."""
    from rlft.models.loading import load_tokenizer

    return load_tokenizer(SimpleNamespace(source="smollm2_gguf", path=None))


def reference(tok, messages) -> list[int]:
    return list(tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)["input_ids"])


def test_message_prompts_match_the_tokenizers_own_template(tok):
    assert prompt_ids(tok, CHAT) == reference(tok, CHAT)
    system = {"role": "system", "content": "Be brief."}
    assert prompt_ids(tok, CHAT, "Be brief.") == reference(tok, [system, *CHAT])
    assert prompt_ids(tok, [system, *CHAT]) == reference(tok, [system, *CHAT])  # the data's own system message
    assert prompt_ids(tok, "And 3 + 3?", "Be brief.") == reference(tok, [system, CHAT[2]])
    assert prompt_ids(tok, "And 3 + 3?") == reference(tok, [CHAT[2]])  # the template's default system message


def test_chat_template_false_sends_the_raw_text(tok):
    assert prompt_ids(tok, "And 3 + 3?", chat_template=False) == tok("And 3 + 3?")["input_ids"]
    with pytest.raises(DataError, match="a prompt is a list of chat messages but data.chat_template=false"):
        prompt_ids(tok, CHAT, chat_template=False)
    with pytest.raises(DataError, match="begin with a system message and data.system_prompt is set"):
        prompt_ids(tok, [{"role": "system", "content": "x"}, *CHAT], "Be brief.")


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_message_rows_load_with_the_last_user_message_as_the_reward_prompt(tmp_path, tok):
    f = write_jsonl(tmp_path / "d.jsonl", [{"prompt": CHAT, "answer": 6, "id": 0},
                                           {"prompt": "What is 1 + 1?", "answer": 2, "id": 1}])
    for name in ("jsonl", "hf"):
        cfg = DataConfig(name=name, path=str(f), eval_path=str(f), template="Q: {prompt}", system_prompt="Be brief.")
        chat, text = build_task(cfg, seed=0).eval_problems
        assert (chat.prompt, chat.answer, chat.columns, chat.messages) == ("And 3 + 3?", "6", {"id": 0}, CHAT)
        assert (text.prompt, text.messages) == ("Q: What is 1 + 1?", None)  # the template formats strings only
        system = {"role": "system", "content": "Be brief."}
        assert problem_ids(tok, chat, cfg) == reference(tok, [system, *CHAT])
        assert problem_ids(tok, text, cfg) == reference(tok, [system, {"role": "user", "content": "Q: What is 1 + 1?"}])


@pytest.mark.parametrize("prompt, kw, message", [
    (CHAT, {"chat_template": False}, "d.jsonl:1: field 'prompt' holds chat messages, which need data.chat_template=true"),
    ([{"role": "system", "content": "s"}, CHAT[0]], {"system_prompt": "Be brief."},
     "d.jsonl:1: field 'prompt' begins with a system message and data.system_prompt is set"),
    ([{"role": "user"}], {}, "d.jsonl:1: field 'prompt' message 0 is not a"),
    ([{"role": "assistant", "content": "x"}], {}, "d.jsonl:1: field 'prompt' has no message with role 'user'"),
])
def test_bad_message_rows_are_one_data_error_at_load(tmp_path, prompt, kw, message):
    f = write_jsonl(tmp_path / "d.jsonl", [{"prompt": prompt, "answer": 1}, {"prompt": "x", "answer": 1}])
    for name in ("jsonl", "hf"):
        with pytest.raises(DataError) as err:
            build_task(DataConfig(name=name, path=str(f), template="{prompt}", **kw), seed=0)
        assert message in str(err.value) and "\n" not in str(err.value)


def test_a_bad_template_is_one_data_error(tmp_path):
    f = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "x", "answer": 1}])
    with pytest.raises(DataError, match=r"data.template='Give \\\\boxed\{\}: \{prompt\}' does not format"):
        build_task(DataConfig(name="hf", path=str(f), template="Give \\boxed{}: {prompt}"), seed=0)


def test_long_prompts_are_dropped_and_counted(tmp_path, tok):
    rows = [{"prompt": "word " * n, "answer": n} for n in (1, 50, 2, 60, 3, 4, 70, 5)]
    f = write_jsonl(tmp_path / "d.jsonl", rows)
    cfg = DataConfig(name="hf", path=str(f), template="{prompt}", num_eval=3)
    task = build_task(cfg, seed=0)  # eval: the last 3 rows (n = 4, 70, 5)
    lengths = {p.answer: len(problem_ids(tok, p, cfg)) for p in task.train_rows + task.eval_problems}
    limit = lengths["5"]
    assert lengths["50"] > limit >= lengths["4"]
    cfg.max_prompt_tokens = limit
    out, n_train, n_eval = drop_long_prompts(task, tok, cfg)
    assert (n_train, n_eval) == out.dropped == (2, 1)
    assert [p.answer for p in out.train_rows] == ["1", "2", "3"]
    assert [p.answer for p in out.eval_problems] == ["4", "5"]
    assert {p.answer for i in range(3) for p in out.batch(i, 1)} == {"1", "2", "3"}  # training never sees them
    cfg.max_prompt_tokens = 1000
    assert drop_long_prompts(task, tok, cfg) == (task, 0, 0) and task.dropped == (0, 0)
    cfg.max_prompt_tokens = lengths["1"] - 1
    with pytest.raises(DataError, match=rf"data.max_prompt_tokens={lengths['1'] - 1}: all 5 training prompts are "
                                        rf"longer \(the shortest has {lengths['1']} tokens\)"):
        drop_long_prompts(task, tok, cfg)


def test_max_prompt_tokens_config_checks():
    with pytest.raises(ConfigError, match="data.max_prompt_tokens=10 filters data sets read from files"):
        compose(["data.max_prompt_tokens=10"])  # arithmetic: a generated stream
    with pytest.raises(ConfigError, match="data.max_prompt_tokens=-1 must be >= 0"):
        compose(["data=jsonl", "data.path=x.jsonl", "data.max_prompt_tokens=-1"])
    with pytest.raises(ConfigError, match="data.system_prompt is a chat message, but data.chat_template=false"):
        compose(["data.system_prompt=hi", "data.chat_template=false"])
