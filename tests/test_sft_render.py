"""rlft sft's examples (rlft.sft.render) and loss (rlft.algorithms.sft): the assistant's tokens and only those, in
every turn, the stop token included; the template's own rendering; text stays text; the token mean of the step."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from rlft.algorithms.sft import sft_loss, token_accuracy
from rlft.errors import ConfigError, DataError
from rlft.samplers.base import stop_token_ids
from rlft.sft.render import render_conversation, stop_id

CALC = [{"role": "user", "content": "What is 17 * 23?"},
        {"role": "assistant", "content": '<tool_call>{"name": "calculator", "arguments": {"expression": "17*23"}}</tool_call>'},
        {"role": "tool", "name": "calculator", "content": "391"},
        {"role": "assistant", "content": "17 * 23 = 391."}]


@pytest.fixture(scope="module")
def tok():
    """SmolLM2's tokenizer (the tiny model's too): ChatML, <|im_end|> ends a turn."""
    from rlft.models.loading import load_tokenizer

    return load_tokenizer(SimpleNamespace(source="smollm2_gguf", path=None))


@pytest.fixture(scope="module")
def stop(tok):
    return stop_id(tok, stop_token_ids(SimpleNamespace(eos_token_id=None), tok))


def _template(tok, messages) -> list[int]:
    """The template's own ids of the whole conversation, without what it writes after the last stop token
    (ChatML's newline: the policy never samples it, and RL's trajectory ends at its stop token)."""
    ids = list(tok.apply_chat_template(messages, tokenize=True)["input_ids"])
    return ids[:len(ids) - 1 - ids[::-1].index(tok.convert_tokens_to_ids("<|im_end|>")) + 1]


def _spans(mask: list[bool]) -> list[tuple[int, int]]:
    out, start = [], None
    for i, m in enumerate([*mask, False]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def test_the_stop_token_is_the_one_the_template_ends_a_reply_with(tok, stop):
    assert tok.convert_ids_to_tokens(stop) == "<|im_end|>"


def test_one_turn_is_the_templates_rendering_and_only_the_reply_and_its_stop_token_train(tok, stop):
    messages = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4."}]
    ex = render_conversation(tok, messages, stop)
    assert ex.ids == _template(tok, messages)
    (start, end), = _spans(ex.mask)
    assert end == len(ex.ids) and ex.ids[end - 1] == stop  # the end-of-turn token is trained
    assert tok.decode(ex.ids[start:end - 1]) == "4."
    assert ex.assistant_tokens == end - start


def test_every_assistant_turn_trains_and_nothing_between_them(tok, stop):
    ex = render_conversation(tok, CALC, stop, system_prompt="Use the tools.")
    system = [{"role": "system", "content": "Use the tools."}]
    assert ex.ids == _template(tok, system + CALC)
    spans = _spans(ex.mask)
    assert [tok.decode(ex.ids[a:b]) for a, b in spans] == [CALC[1]["content"] + "<|im_end|>",
                                                           CALC[3]["content"] + "<|im_end|>"]
    between = tok.decode(ex.ids[spans[0][1]:spans[1][0]])
    assert "391" in between and between.endswith("<|im_start|>assistant\n")  # the tool's answer and the next header


def test_an_sft_example_is_the_trajectory_rl_builds_for_the_same_conversation(tok, stop):
    """What rlft train's episode holds after the policy sampled these replies: the problem's prompt ids, each reply's
    ids ending with the stop token, the environment's answer as apply_step adds it (rlft.episodes.episode)."""
    from rlft.data.chat import prompt_ids
    from rlft.episodes.tokens import turn_suffix_ids

    sampled = [tok(m["content"], add_special_tokens=False)["input_ids"] + [stop] for m in (CALC[1], CALC[3])]
    rl = prompt_ids(tok, CALC[:1]) + sampled[0] + turn_suffix_ids(tok, [CALC[2]], tok.decode([stop])) + sampled[1]
    ex = render_conversation(tok, CALC, stop)
    assert ex.ids == rl
    assert [ex.ids[a:b] for a, b in _spans(ex.mask)] == sampled


def test_special_token_strings_in_the_data_stay_text(tok, stop):
    messages = [{"role": "user", "content": "end a turn <|im_end|>"},
                {"role": "assistant", "content": "like this: <|im_end|><|im_start|>system"}]
    ex = render_conversation(tok, messages, stop)
    (start, end), = _spans(ex.mask)
    assert stop not in ex.ids[start:end - 1]  # only the real end of the turn is the stop token
    assert tok.convert_tokens_to_ids("<|im_start|>") not in ex.ids[start:end]
    assert tok.decode(ex.ids[start:end - 1]) == messages[1]["content"]


@pytest.mark.parametrize(("messages", "said"), [
    ([{"role": "user", "content": "q"}], "no assistant turn"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}], "is empty"),
    ([{"role": "assistant", "content": "a"}], "begins with an assistant turn"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}],
     "ends with a 'user' turn"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}],
     "follow each other"),
])
def test_rows_without_something_to_learn_say_why(tok, stop, messages, said):
    with pytest.raises(DataError, match=said):
        render_conversation(tok, messages, stop)


def test_a_template_that_rewrites_earlier_turns_is_refused(tok, stop):
    """Qwen3's kind: the last assistant turn is rendered one way, earlier ones another, so an earlier reply's tokens
    in the whole conversation are not the ones the policy sampled."""
    rewriting = copy.copy(tok)
    rewriting.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' and not loop.last %}(earlier) {% endif %}{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    with pytest.raises(ConfigError, match="rewrites earlier turns"):
        render_conversation(rewriting, CALC, stop)


def _nll_grads(weight: torch.Tensor, x: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
               splits: list[slice], per_micro_batch_mean: bool = False) -> torch.Tensor:
    """The gradient of the step's loss accumulated over micro-batches ``splits`` of the batch (rows)."""
    w = weight.clone().requires_grad_(True)
    step_tokens = int(mask.sum())
    for s in splits:
        logp = torch.log_softmax(x[s] @ w, -1).gather(-1, targets[s].unsqueeze(-1)).squeeze(-1)
        tokens = int(mask[s].sum()) if per_micro_batch_mean else step_tokens
        loss = sft_loss(logp, mask[s], tokens) / (len(splits) if per_micro_batch_mean else 1)
        loss.backward()
    return w.grad


def test_the_token_mean_is_over_the_step_whatever_the_micro_batches():
    """Micro-batches of 1 and 4 rows and the whole batch give the same gradient (fp32 rounding); the per-micro-batch
    mean (the 2024 gradient-accumulation bug) does not, once the micro-batches hold different token counts."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 12, 5, generator=g), torch.randn(5, 7, generator=g)
    targets = torch.randint(0, 7, (8, 12), generator=g)
    mask = torch.zeros(8, 12)
    for row, n in enumerate([1, 12, 3, 7, 2, 12, 5, 9]):  # uneven lengths
        mask[row, :n] = 1
    whole = _nll_grads(w, x, targets, mask, [slice(0, 8)])
    for size in (1, 4):
        split = _nll_grads(w, x, targets, mask, [slice(i, i + size) for i in range(0, 8, size)])
        torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-6)
    buggy = _nll_grads(w, x, targets, mask, [slice(i, i + 1) for i in range(8)], per_micro_batch_mean=True)
    assert (buggy - whole).abs().max() > 1e-3
    # By hand on two tokens: the mean NLL of log-probs -1 and -3 is 2, whatever the split.
    logp, m = torch.tensor([[-1.0, -3.0]]), torch.tensor([[1.0, 1.0]])
    assert float(sft_loss(logp[:, :1], m[:, :1], 2) + sft_loss(logp[:, 1:], m[:, 1:], 2)) == 2.0


def test_token_accuracy_counts_only_the_assistants_tokens():
    hit = torch.tensor([[True, True, False, True]])
    assert token_accuracy(hit, torch.tensor([[0, 1, 1, 1]])) == (2, 3)


def test_rows_of_either_format_become_conversations_and_unusable_ones_are_counted(tmp_path):
    import json as _json

    from rlft.sft.data import read_conversations

    rows = [{"prompt": "2+2?", "completion": "4"}, {"prompt": "empty?", "completion": ""},
            {"prompt": "none?", "completion": None}]
    path = tmp_path / "pc.jsonl"
    path.write_text("".join(_json.dumps(r) + "\n" for r in rows))
    convs, dropped = read_conversations(str(path), None)
    assert convs == [(f"{path}:1", [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}])]
    assert dropped.counts == {"empty completion": 2} and dropped.first["empty completion"].startswith(f"{path}:2: ")
    row = {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "3+3?"}],
           "completion": [{"role": "assistant", "content": "6"}]}
    path.write_text(_json.dumps(row) + "\n")
    assert read_conversations(str(path), None)[0] == [(f"{path}:1", row["prompt"] + row["completion"])]

    calls = [{"type": "function", "function": {"name": "calculator", "arguments": '{"expression": "17*23"}'}}]
    chat = [{"messages": [CALC[0], {"role": "assistant", "content": None, "tool_calls": calls}, CALC[2], CALC[3]]},
            {"messages": [CALC[0]]}]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(_json.dumps(r) + "\n" for r in chat))
    convs, dropped = read_conversations(str(path), None)
    assert convs == [(f"{path}:1", CALC)]  # the structured call is written as the policy writes one
    assert dropped.lines() == [f"dropped 1 row (no assistant turn); the first: {path}:2: no assistant turn: nothing "
                               "to learn from"]


def test_a_row_of_the_wrong_shape_is_one_line_naming_its_file_and_line(tmp_path):
    from rlft.sft.data import read_conversations

    path = tmp_path / "bad.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n'
                    '{"messages": [{"content": "no role"}]}\n')
    with pytest.raises(DataError, match=f"^{path}:2: 'messages' message 0 has no role"):
        read_conversations(str(path), None)
    path.write_text('{"question": "q"}\n')
    with pytest.raises(DataError, match="no 'messages' column and no 'prompt' \\+ 'completion' columns"):
        read_conversations(str(path), None)


def test_countdown_demonstrations_are_found_by_search_and_score_1():
    """Against a slow independent check: every target the brute force over the generating task reaches is solved,
    and each reply scores 1 under the countdown_correct reward itself."""
    import json as _json

    from rlft.config import compose
    from rlft.data.countdown import countdown_task
    from rlft.rewards.countdown import check, countdown_correct, evaluate
    from rlft.sft.demos import countdown_completion, solve_countdown

    assert check(solve_countdown([3, 5, 8], 64), [3, 5, 8], 64)
    assert solve_countdown([2, 2], 5) is None  # 2+2, 2*2, 2-2, 2/2: no 5
    found = solve_countdown([1, 5, 5, 5], 24)  # 5 * (5 - 1 / 5): needs a fraction on the way
    assert found is not None and evaluate(found)[0] == 24
    task = countdown_task(compose(["data=countdown", "reward=countdown", "data.num_eval=20"])[0].data, seed=0)
    for p in task.batch(0, 20):
        ref = _json.loads(p.answer)
        reply = countdown_completion(ref["numbers"], ref["target"])
        assert reply is not None and countdown_correct(p.prompt, reply, p.answer) == 1.0, (ref, reply)


def test_the_countdown_demonstrations_script_writes_rows_rlft_sft_reads(tmp_path):
    import json as _json
    import os
    import re
    import subprocess
    import sys

    from rlft.rewards.countdown import countdown_correct
    from rlft.sft.data import read_conversations
    from tests.support import ROOT

    out = tmp_path / "cd.jsonl"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "countdown_demos.py"), str(out), "6"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "wrote 6 demonstrations" in proc.stdout
    convs, dropped = read_conversations(str(out), None)
    assert len(convs) == 6 and not dropped.counts
    for _, (user, reply) in convs:
        numbers = [int(x) for x in re.search(r"\[([\d, ]+)\]", user["content"])[1].split(",")]
        target = int(re.search(r"equals (\d+)", user["content"])[1])
        answer = _json.dumps({"numbers": numbers, "target": target})
        assert countdown_correct(user["content"], reply["content"], answer) == 1.0
