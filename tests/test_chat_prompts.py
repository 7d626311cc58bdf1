"""Chat-message prompts, the system prompt, data.chat_template=false, and data.max_prompt_tokens."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from rlft.config import ConfigError, compose
from rlft.config.schemas.data import DataConfig
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


def _vllm_sampler(max_model_len: int, max_new_tokens: int):
    from rlft.config.schemas.sampler import SamplerConfig, VLLMConfig

    return SamplerConfig(name="vllm", max_new_tokens=max_new_tokens, vllm=VLLMConfig(max_model_len=max_model_len))


def test_prompts_that_leave_no_room_for_the_completion_under_vllm_are_dropped(tmp_path, tok):
    """vLLM refuses a prompt of max_model_len tokens (a traceback at the step that draws it) and cuts a completion
    at max_model_len in all: prompts longer than max_model_len - max_new_tokens are dropped at start-up."""
    from rlft.config.schemas.sampler import SamplerConfig
    from rlft.data.chat import prompt_room

    rows = [{"prompt": "word " * n, "answer": n} for n in (1, 50, 2, 60, 3, 4, 70, 5)]
    cfg = DataConfig(name="jsonl", path=str(write_jsonl(tmp_path / "d.jsonl", rows)), template="{prompt}", num_eval=3)
    task = build_task(cfg, seed=0)  # eval: the last 3 rows (n = 4, 70, 5)
    lengths = {p.answer: len(problem_ids(tok, p, cfg)) for p in task.train_rows + task.eval_problems}
    room = prompt_room(_vllm_sampler(lengths["5"] + 16, 16))
    assert room == (lengths["5"], f"sampler.vllm.max_model_len={lengths['5'] + 16} with sampler.max_new_tokens=16 "
                                  f"(prompts up to {lengths['5']} tokens)")
    out, n_train, n_eval = drop_long_prompts(task, tok, cfg, room)
    assert (n_train, n_eval) == out.dropped == (2, 1) and out.dropped_by == room[1]
    assert [p.answer for p in out.train_rows] == ["1", "2", "3"] and [p.answer for p in out.eval_problems] == ["4", "5"]
    cfg.max_prompt_tokens = lengths["4"]  # the tighter of the two limits wins, and is named
    out, *_ = drop_long_prompts(task, tok, cfg, room)
    assert out.dropped == (2, 2) and out.dropped_by == f"data.max_prompt_tokens={lengths['4']}"
    cfg.max_prompt_tokens = 0
    with pytest.raises(DataError, match=rf"^sampler.vllm.max_model_len={lengths['1'] + 15} with sampler.max_new_tokens"
                                        rf"=16 \(prompts up to {lengths['1'] - 1} tokens\): all 5 training prompts "
                                        rf"are longer \(the shortest has {lengths['1']} tokens\)$"):
        drop_long_prompts(task, tok, cfg, prompt_room(_vllm_sampler(lengths["1"] + 15, 16)))
    assert prompt_room(SamplerConfig(name="hf")) is None  # transformers' generate has no engine length


def test_generated_prompts_that_do_not_fit_vllm_are_refused(tok):
    from rlft.data.chat import prompt_room

    cfg = DataConfig(num_eval=10)  # arithmetic: a stream, nothing to drop
    task = build_task(cfg, seed=0)
    longest = max(len(problem_ids(tok, p, cfg)) for p in task.eval_problems + task.batch(0, 32))
    assert drop_long_prompts(task, tok, cfg, prompt_room(_vllm_sampler(longest + 8, 8))) == (task, 0, 0)
    with pytest.raises(DataError, match=rf"prompts up to {longest - 1} tokens\): a data=arithmetic prompt has "
                                        rf"{longest} tokens; raise sampler.vllm.max_model_len"):
        drop_long_prompts(task, tok, cfg, prompt_room(_vllm_sampler(longest + 7, 8)))


def test_max_model_len_must_leave_room_for_a_prompt():
    from rlft.config.validation import vllm_available

    if not vllm_available():
        pytest.skip("vLLM is not installed")
    with pytest.raises(ConfigError, match=r"^sampler.vllm.max_model_len=32 leaves no room for a prompt: .* must exceed "
                                          r"sampler.max_new_tokens=32$"):
        compose(["sampler=vllm", "sampler.vllm.max_model_len=32"])


def test_a_resume_that_would_drop_other_prompts_is_refused(tmp_path, tok):
    from rlft.data.chat import prompt_room
    from rlft.state.checkpoint import CheckpointError
    from rlft.state.run_state import _check_same_problems

    rows = [{"prompt": "word " * n, "answer": n} for n in (1, 50, 2, 60, 3)]
    cfg = DataConfig(name="jsonl", path=str(write_jsonl(tmp_path / "d.jsonl", rows)), template="{prompt}", num_eval=0)
    task = build_task(cfg, seed=0)
    short = max(len(problem_ids(tok, p, cfg)) for p in task.train_rows if int(p.answer) < 10)
    dropped, *_ = drop_long_prompts(task, tok, cfg, prompt_room(_vllm_sampler(short + 8, 8)))
    _check_same_problems({"dropped_prompts": [2, 0]}, dropped, tmp_path)
    _check_same_problems({}, task, tmp_path)  # a checkpoint from before the count was saved
    with pytest.raises(CheckpointError, match=r"dropped 2 training and 0 held-out prompts as too long; this run drops "
                                              r"0 and 0 \(no limit\)"):
        _check_same_problems({"dropped_prompts": [2, 0]}, task, tmp_path)  # e.g. resumed with sampler=hf


def test_cli_train_refuses_data_with_no_prompt_that_fits_vllm_before_starting_it(tmp_path):
    from rlft.config.validation import vllm_available
    from tests.support import TINY, run_cli

    if not vllm_available():
        pytest.skip("vLLM is not installed")
    f = write_jsonl(tmp_path / "long.jsonl", [{"prompt": "word " * 40, "answer": i} for i in range(6)])
    args = [o for o in TINY if not o.startswith("sampler=")] + [
        "sampler=vllm", "data=jsonl", f"data.path={f}", "data.num_eval=2", "sampler.vllm.max_model_len=40"]
    proc = run_cli(["train", *args, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    [line] = proc.stderr.strip().splitlines()
    assert re.fullmatch(r"rlft: error: sampler.vllm.max_model_len=40 with sampler.max_new_tokens=8 \(prompts up to 32 "
                        r"tokens\): all 4 training prompts are longer \(the shortest has \d+ tokens\)", line), line


@pytest.mark.slow
def test_cli_train_under_vllm_drops_and_counts_prompts_that_do_not_fit(tmp_path):
    """A real vLLM engine: the long rows are dropped and counted at start-up, the run trains on the rest."""
    from rlft.config.validation import vllm_available
    from tests.support import TINY, run_cli

    if not vllm_available():
        pytest.skip("vLLM is not installed")
    rows = [{"prompt": "word " * n, "answer": n} for n in (1, 60, 2, 3, 70, 4, 1, 80)]
    f = write_jsonl(tmp_path / "d.jsonl", rows)
    args = [o for o in TINY if not o.startswith("sampler=")] + [
        "sampler=vllm", "sampler.vllm.kv_cache_gb=0.25", "data=jsonl", f"data.path={f}", "data.num_eval=2",
        "sampler.vllm.max_model_len=48", "trainer.steps=1"]
    proc = run_cli(["train", *args, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (tmp_path / "run" / "train.log").read_text()
    assert ("dropped prompts longer than sampler.vllm.max_model_len=48 with sampler.max_new_tokens=8 (prompts up to "
            "40 tokens): 2 training, 1 held-out") in log, log
