"""reward.models: a tiny random reward model scores as the model called by hand, mixes with reward functions
by weight (TRL's None convention), normalisation and clipping match numpy, the gold checker, and the bad
inputs that end a run at start-up with one line."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlft.config import ConfigError, compose
from rlft.config.schemas.reward import RewardModelConfig
from rlft.data.chat import prompt_ids
from rlft.data.conversation import Rendering
from rlft.models import ModelError
from rlft.rewards.functions import Sample
from rlft.rewards.models import RewardModel, check_reward_model
from rlft.rewards.normalize import EPS, RunningMoments, shape_rewards
from rlft.rewards.scorer import FunctionScorer, eval_reward, gold_name, score_all
from tests.support import ROOT, TINY, one_error_line, run_cli, write_eos_model, write_reward_model

CPU = torch.device("cpu")
SAMPLES = [
    Sample("What is 2 + 3?", "5", "5", 1, False),
    Sample("What is 12 + 30? Reply with just the number.", "The answer is 42, I think.", "42", 9, False),
    Sample("Hi", "", "0", 0, True),
    Sample("What is 7 + 1?", "8", "8", 1, False, messages=[{"role": "system", "content": "Be brief."},
                                                            {"role": "user", "content": "What is 7 + 1?"}]),
    Sample("What is 9 + 9?", "eighteen, or 18 in digits, which is the sum", "18", 12, False),
]


def _rm(path, **kw) -> RewardModel:
    return RewardModel(RewardModelConfig(path=str(path), **kw), CPU, "fp32")


def _by_hand(rm: RewardModel, s: Sample) -> float:
    """Tokenize as the model's own chat template renders the conversation, forward it alone, read the
    logit at the last token (no padding: nothing else to skip)."""
    tok = rm.tokenizer
    convo = s.messages or [{"role": "user", "content": s.prompt}]
    text = tok.apply_chat_template([*convo, {"role": "assistant", "content": s.completion}], tokenize=False)
    return _forward_alone(rm, tok(text, add_special_tokens=False).input_ids)


def _forward_alone(rm: RewardModel, ids: list[int]) -> float:
    with torch.no_grad():
        return float(rm.model(input_ids=torch.tensor([ids])).logits[0, 0])


def test_scores_match_the_model_called_by_hand(reward_model_dir):
    rm = _rm(reward_model_dir, batch_size=2)  # batches of 2 mixed lengths: padding must not change a score
    got = rm.score(SAMPLES)
    want = [_by_hand(rm, s) for s in SAMPLES]
    assert np.allclose(got, want, atol=1e-5), (got, want)
    assert len(set(np.round(got, 4))) == len(SAMPLES), "a random head should tell these replies apart"
    assert rm.take_counts() == {"truncated": 0, "too_long": 0}
    assert "system" in rm.tokenizer.apply_chat_template(SAMPLES[3].messages, tokenize=False)  # messages are used
    assert rm.rendering == Rendering()  # no rlft_rendering.json: the defaults, as for a model from TRL


def test_max_length_keeps_the_prompt_and_the_reply_end(reward_model_dir):
    """Over max_length: the whole prompt part (chat header included) and the reply's last tokens, its
    beginning cut; a prompt that leaves no room for the reply is unscored (NaN) and counted."""
    rm = _rm(reward_model_dir)
    tok = rm.tokenizer
    long_reply = Sample("What is 2 + 3?", " ".join(["first"] * 40) + " so the answer is 5", "5", 50, False)
    long_prompt = Sample("Add these: " + " + ".join(map(str, range(60))), "1770", "1770", 2, False)
    short = SAMPLES[0]
    head = prompt_ids(tok, long_reply.prompt)  # the prompt as the policy saw it, up to the assistant header
    full = rm.render(long_reply)
    assert full[: len(head)] == head and len(full) > len(head) + 12
    cut = len(head) + 12
    assert len(rm.render(short)) <= cut < len(prompt_ids(tok, long_prompt.prompt))
    rm = _rm(reward_model_dir, max_length=cut, batch_size=2)
    kept = rm.fit(long_reply).ids
    assert kept == head + full[-12:] and len(kept) == cut
    assert tok.decode(kept[len(head):]) == " first" * 4 + " so the answer is 5<|im_end|>\n"  # the reply's end
    got = rm.score([long_reply, long_prompt, short])
    assert got[0] == pytest.approx(_forward_alone(rm, kept), abs=1e-5)
    assert math.isnan(got[1])
    assert got[2] == pytest.approx(_by_hand(rm, short), abs=1e-5)
    assert rm.take_counts() == {"truncated": 1, "too_long": 1}
    assert rm.take_counts() == {"truncated": 0, "too_long": 0}  # counts are per call of take_counts


def test_the_unscored_reply_leaves_the_total_to_the_other_scorers(reward_model_dir):
    rm = _rm(reward_model_dir, max_length=8)  # no prompt fits: every reply unscored by the model
    out = score_all([FunctionScorer("tests.helpers:char_count", 1.0, 32), rm], SAMPLES[:2])
    assert [math.isnan(x) for x in out.per_name[rm.name]] == [True, True]
    assert out.totals == pytest.approx(out.per_name["tests.helpers:char_count"])
    assert out.counts == {f"{rm.name}/truncated": 0, f"{rm.name}/too_long": 2}


def test_no_chat_template_scores_prompt_plus_completion(tmp_path):
    write_reward_model(tmp_path / "rm")
    (tmp_path / "rm" / "chat_template.jinja").unlink()
    rm = _rm(tmp_path / "rm")
    assert not rm.tokenizer.chat_template
    s = SAMPLES[1]
    with torch.no_grad():
        want = float(rm.model(input_ids=torch.tensor([rm.tokenizer(s.prompt + s.completion).input_ids])).logits[0, 0])
    assert math.isclose(rm.score([s])[0], want, abs_tol=1e-5)


def test_a_tokenizer_without_pad_token_pads_with_eos(tmp_path):
    write_reward_model(tmp_path / "rm", pad_token=False)
    rm = _rm(tmp_path / "rm", batch_size=5)
    assert rm.tokenizer.pad_token == rm.tokenizer.eos_token and rm.pad_id == rm.tokenizer.eos_token_id
    assert rm.notes and "no pad token" in rm.notes[0]
    assert np.allclose(rm.score(SAMPLES), [_by_hand(rm, s) for s in SAMPLES], atol=1e-5)


def test_weighted_mix_with_reward_functions_by_hand(reward_model_dir):
    """TRL's convention: the total is the weighted sum over the scorers that scored a sample."""
    rm = _rm(reward_model_dir, weight=0.5)
    char = FunctionScorer("tests.helpers:char_count", 2.0, 32)
    odd = FunctionScorer("tests.helpers:none_on_odd_length", 3.0, 32)  # None on replies of odd length
    samples = SAMPLES[:3]  # lengths 1 (odd), 26, 0
    gold = FunctionScorer("math_correct", 0.0, 32)
    out = score_all([char, rm, odd], samples, gold)
    r = rm.score(samples)
    lengths = [len(s.completion) for s in samples]
    assert out.per_name[odd.name][1:] == [2.6, 0.0] and math.isnan(out.per_name[odd.name][0])
    want = [2.0 * n / 10 + 0.5 * x + (3.0 * n / 10 if n % 2 == 0 else 0.0) for n, x in zip(lengths, r)]
    assert np.allclose(out.totals, want, atol=1e-6)
    assert np.allclose(out.per_name["model"], [0.5 * x for x in r], atol=1e-6)
    assert out.per_name["gold"] == [1.0, 1.0, 0.0]
    assert out.counts == {"rm/truncated": 0, "rm/too_long": 0}
    only_none = score_all([odd], SAMPLES[:1])
    assert math.isnan(only_none.totals[0])  # nothing scored it: unscored


def test_running_normalisation_and_clip_match_numpy_over_three_steps():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, 8), rng.normal(-1.0, 0.5, 5), rng.normal(10.0, 4.0, 6)]
    batches[1][2] = np.nan  # unscored: left out of the statistics, stays NaN
    batches = [b.astype(np.float32).astype(np.float64) for b in batches]  # the values the tensors hold
    moments, seen = RunningMoments(), []
    for b in batches:
        seen += [x for x in b if not np.isnan(x)]
        got, clipped = shape_rewards(torch.tensor(b, dtype=torch.float32), moments, normalize=True, clip=1.2)
        mean, std = np.mean(seen), np.std(seen, ddof=1)
        white = (b - mean) / (std + EPS)
        assert math.isclose(moments.mean, mean, rel_tol=1e-12) and math.isclose(moments.std, std, rel_tol=1e-12)
        assert np.allclose(got.numpy(), np.clip(white, -1.2, 1.2), atol=1e-6, equal_nan=True)
        assert clipped == int(np.sum(np.abs(white[~np.isnan(white)]) > 1.2)) and clipped > 0
    assert moments.count == len(seen) == 18
    again = RunningMoments.from_json(moments.to_json())
    assert again == moments  # what a checkpoint holds restores the same numbers
    raw, n = shape_rewards(torch.tensor([5.0, -5.0]), RunningMoments(), normalize=False, clip=2.0)
    assert raw.tolist() == [2.0, -2.0] and n == 2


def test_gold_and_evaluation_reward(compose_cfg, reward_model_dir):
    rm = f"reward.models=[{{path: {reward_model_dir}}}]"
    cfg = compose_cfg(rm)
    assert gold_name(cfg) == "math_correct" and eval_reward(cfg) == "math_correct"
    assert gold_name(compose_cfg()) is None and eval_reward(compose_cfg()) == "math_correct"  # no models: as before
    assert gold_name(compose_cfg(rm, "reward.gold=null")) is None
    assert gold_name(compose_cfg(rm, "reward.gold=none")) is None
    cfg = compose_cfg(rm, "data=countdown", "reward.fns=[]", "reward.weights=[]")  # the model alone is enough
    assert gold_name(cfg) == "countdown_correct" and eval_reward(cfg) == "countdown_correct"
    cfg = compose_cfg(rm, "reward=model", "reward.gold=null")
    assert cfg.reward.fns == [] and eval_reward(cfg) is None  # evaluation is skipped


@pytest.mark.parametrize(("overrides", "message"), [
    (["reward.fns=[]", "reward.weights=[]"], "reward.fns, reward.models and reward.judges are empty"),
    (["reward.models=[{weight: 1.0}]"], "has no path"),
    (["reward.models=[{path: /x/rm, dtype: fp16}]"], "dtype='fp16'"),
    (["reward.models=[{path: /x/rm, batch_size: 0}]"], "batch_size=0 must be >= 1"),
    (["reward.models=[{path: /x/gold}]"], "reward/gold) is a metric rlft logs itself"),
    (["reward.models=[{path: /x/rm}, {path: /y/rm}]"], "is taken by another scorer"),
    (["reward.clip=-1"], "reward.clip=-1"),
])
def test_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        compose(overrides)


def test_two_models_with_names_and_the_preset_compose(reward_model_dir):
    cfg, _, _ = compose(["reward=model", f"reward.models=[{{path: {reward_model_dir}, name: a}}, "
                                         f"{{path: {reward_model_dir}, name: b, weight: 0.3}}]"])
    assert [m.label for m in cfg.reward.models] == ["a", "b"] and cfg.reward.models[1].weight == 0.3


def test_start_up_checks_of_the_path(tmp_path):
    write_reward_model(tmp_path / "two", num_labels=2)
    write_eos_model(tmp_path / "lm")  # a causal LM, not a classifier
    (tmp_path / "empty").mkdir()
    for path, message in [(tmp_path / "nowhere", "no such directory"), (tmp_path / "empty", "no config.json"),
                          (tmp_path / "two", "has 2 labels"), (tmp_path / "lm", "not a sequence-classification")]:
        with pytest.raises(ModelError, match=message):
            check_reward_model(RewardModelConfig(path=str(path)))


@pytest.mark.parametrize("case", ["missing", "two_labels"])
def test_bad_reward_model_is_one_line_at_start_up(tmp_path, case):
    path = tmp_path / "rm"
    if case == "two_labels":
        write_reward_model(path, num_labels=2)
    r = run_cli(["train", *TINY, f"reward.models=[{{path: {path}, weight: 1.0}}]", f"hydra.run.dir={tmp_path / 'run'}"],
                ROOT)
    line = one_error_line(r, 2)
    assert ("no such directory" if case == "missing" else "has 2 labels; a reward model has one") in line
    assert str(path) in line


def test_plot_shows_model_against_gold(tmp_path):
    import json

    from matplotlib.image import imread

    from rlft.output.plots import plot_run

    for run, extra in (("plain", {}), ("rm", {"reward/model": 0.5, "reward/gold": 0.25})):
        (tmp_path / run).mkdir()
        rows = [{"step": s, "reward/mean": 0.1 * s, "eval/accuracy": 0.2, **extra} for s in range(3)]
        (tmp_path / run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    widths = {run: imread(plot_run(tmp_path / run)).shape[1] for run in ("plain", "rm")}
    assert widths == {"plain": 1000, "rm": 1500}  # a third panel, 5 inches at 100 dpi


@pytest.mark.parametrize("stored", ["fp32", "bf16"])
def test_bf16_scoring_reads_the_head_in_fp32(tmp_path, stored):
    """Issue 35 item 6: under dtype=bf16 the backbone runs in bf16 but the score is the bf16 hidden state times
    the head as stored (fp32 kept, a bf16 head upcast), in fp32: not rounded to bf16's 2^-8 of its size."""
    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification

    write_reward_model(tmp_path / "fp32")
    path = tmp_path / stored
    if stored == "bf16":  # a model from the hub saved in bf16, head included
        AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "fp32"), dtype=torch.bfloat16).save_pretrained(path)
        for f in (tmp_path / "fp32").iterdir():  # the tokenizer's files
            if not (path / f.name).exists():
                (path / f.name).write_bytes(f.read_bytes())
    head = load_file(str(path / "model.safetensors"))["score.weight"]
    assert head.dtype == (torch.float32 if stored == "fp32" else torch.bfloat16)
    rm = RewardModel(RewardModelConfig(path=str(path), batch_size=1), CPU, "bf16")
    seen = []
    rm.model.score.register_forward_hook(lambda _m, args, _out: seen.append(args[0][0, -1]))
    got = [rm.score([s])[0] for s in SAMPLES]
    assert len(seen) == len(SAMPLES) and all(h.dtype == torch.bfloat16 for h in seen)  # the backbone ran in bf16
    want = [float(h.double() @ head.double()[0]) for h in seen]
    assert np.allclose(got, want, rtol=1e-6, atol=1e-5), (got, want)
