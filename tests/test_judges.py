"""Generative judges (reward.judges): the reply parsers on real-looking replies, the rubric checks,
the scorer on the tiny model against a by-hand generate + parse, and a training run."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
import torch

from rlft.config import ConfigError, compose
from rlft.config.validation import vllm_available
from rlft.rewards.judges import JudgeScorer, build_judges, check_judges, judge_model_config
from rlft.rewards.registry import Sample, add_scorers, score_samples
from rlft.rewards.rubric import (
    DEFAULT_TEMPLATES,
    DEFAULT_VERDICTS,
    check_template,
    default_template,
    parse_score,
    parse_verdict,
)
from rlft.tracking import read_metrics
from tests.support import ROOT, TINY, one_error_line, run_cli

# (reply, score on [0, 10]); None: unscored.
SCORES = [
    ("The reply gives 56, which matches the reference.\nScore: 10", 10.0),
    ("The arithmetic is wrong (it says 41, the answer is 45).\n\nScore: 2", 2.0),
    ("**Score:** 7/10", 7.0),
    ("Rating: 4 out of 5", 8.0),  # a fraction is a share of the scale
    ("Overall I'd say 6/10 - correct but verbose.", 6.0),
    ("The assistant's answer is helpful. [[8]]", 8.0),
    ("[[3]] Explanation: the reply is off by one. Score: 9", 3.0),  # [[N]] is trusted over a label
    ("score = 3 at first, but after checking again, Score: 5", 5.0),  # the last labelled score
    ("The answer 42 is right. I would rate this 8.", 8.0),  # no label: the last number
    ("Score: 7.5", 7.5),
    ("SCORE: 9", 9.0),
    ("Score: 12", None),  # out of range: not clipped
    ("Score: -1", None),
    ("It is 11/10 good", None),  # a fraction above 1
    ("The reply is 45, the answer is 145.", None),  # last number out of range
    ("I cannot grade this reply.", None),
    ("", None),
    ("v2.5 says 7th", None),  # digits inside words are not numbers
    ("Score: ten", None),
]


@pytest.mark.parametrize(("reply", "expected"), SCORES)
def test_parse_score(reply, expected):
    assert parse_score(reply, 0.0, 10.0) == expected


def test_parse_score_on_another_scale():
    assert parse_score("Score: 3", 1.0, 5.0) == 3.0
    assert parse_score("Score: 0", 1.0, 5.0) is None
    assert parse_score("That is 1/2 right.", 1.0, 5.0) == 3.0  # 1 + 0.5 * (5 - 1)


VERDICTS = [
    ("The reply matches the reference.\nVerdict: correct", 1.0),
    ("Verdict: INCORRECT", 0.0),
    ("At first it looks correct... but 7 * 8 is 56, not 54. incorrect", 0.0),  # the last verdict word
    ("The reply is answered incorrectly.", None),  # whole words only
    ("I am not sure.", None),
    ("", None),
]


@pytest.mark.parametrize(("reply", "expected"), VERDICTS)
def test_parse_verdict(reply, expected):
    assert parse_verdict(reply, DEFAULT_VERDICTS) == expected


def test_parse_verdict_multi_word_and_custom_words():
    words = {"partially correct": 0.5, "correct": 1.0, "wrong": 0.0}
    assert parse_verdict("It is Partially\n correct.", words) == 0.5
    assert parse_verdict("Partially correct? No: correct.", words) == 1.0
    assert parse_verdict("[[A>B]]", {"A>B": 1.0, "B>A": 0.0}) == 1.0


def test_template_checks_name_what_is_wrong():
    check_template("Prompt {prompt}\nReply {reply}\nReference {answer}\nJSON: {{\"score\": N}}", "t")
    for kind in DEFAULT_TEMPLATES:
        check_template(default_template(kind, 0, 10, DEFAULT_VERDICTS), "t")
    with pytest.raises(ConfigError, match=r"t has no \{reply\} placeholder \(it has \{prompt\}, \{answer\}\)"):
        check_template("Q: {prompt} A: {answer} {prompt}", "t")
    with pytest.raises(ConfigError, match=r"no \{reply\} placeholder \(it has no placeholder\)"):
        check_template("Rate it.", "t")
    with pytest.raises(ConfigError, match=r"unknown placeholder \{response\}; valid: \{prompt\}, \{reply\}, \{answer\}"):
        check_template("{prompt} {response}", "t")
    with pytest.raises(ConfigError, match=r"unknown placeholder \{\}"):
        check_template("{reply} {}", "t")
    with pytest.raises(ConfigError, match=r"unknown placeholder \{\"score\"\}.*a literal brace is written twice"):
        check_template("{reply} {\"score\": 1}", "t")
    with pytest.raises(ConfigError, match="t does not format .*Single '}'"):
        check_template("{reply} }", "t")


def test_default_templates_write_the_range_and_words_in():
    text = default_template("score", 1, 5, DEFAULT_VERDICTS)
    assert "from 1 (wrong" in text and "to 5 (correct" in text and "{reply}" in text
    assert "one word of: yes or no" in default_template("verdict", 0, 10, {"yes": 1, "no": 0})


JUDGE = "{model:tiny,max_new_tokens:12}"


def _judged(*judge_overrides: str, extra: tuple[str, ...] = ()):
    return compose(TINY + ["model.dtype=fp32", f"reward.judges=[{{{','.join(('model:tiny', *judge_overrides))}}}]",
                           *extra])[0]


@pytest.mark.parametrize(("judge", "expected"), [
    ("template:'Q {prompt} {answer}'", r"reward.judges\[0\].template has no \{reply\} placeholder \(it has \{prompt\}, "),
    ("template:'{reply} {score}'", r"unknown placeholder \{score\}"),
    ("kind:rank", r"reward.judges\[0\].kind='rank'; valid choices: score, verdict"),
    ("min_score:5,max_score:5", "min_score=5 must be below max_score=5"),
    ("model:/no/such/dir", r"reward.judges\[0\].model=/no/such/dir: no such directory"),
    ("name:math_correct", "already the name of a reward function"),
    ("batch_size:0", "batch_size=0 must be at least 1"),
])
def test_check_judges(judge, expected):
    with pytest.raises(ConfigError, match=expected):
        check_judges(_judged(judge))


def test_a_model_dir_that_is_not_a_causal_lm(tmp_path):
    (tmp_path / "rm").mkdir()
    (tmp_path / "rm" / "config.json").write_text(json.dumps(
        {"model_type": "llama", "architectures": ["LlamaForSequenceClassification"]}))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"not a causal LM \(LlamaForSequenceClassification\)"):
        check_judges(_judged(f"model:{tmp_path / 'rm'}"))
    with pytest.raises(ConfigError, match="not a Hugging Face model directory"):
        check_judges(_judged(f"model:{tmp_path / 'empty'}"))
    (tmp_path / "rm" / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    check_judges(_judged(f"model:{tmp_path / 'rm'}"))


SAMPLES = [Sample(f"What is {a} + {b}?", reply, str(a + b), 4, False)
           for a, b, reply in [(2, 3, "5"), (10, 7, "The answer is 17."), (4, 4, "9"), (1, 1, ""), (6, 2, "eight")]]


@pytest.fixture(scope="module")
def tiny_judge():
    cfg = _judged("max_new_tokens:12")
    (judge,) = build_judges(cfg, "fp32")
    return cfg, judge


def test_the_tiny_random_judge_scores_or_leaves_unscored(tiny_judge):
    _, judge = tiny_judge
    scores = judge.score(SAMPLES)
    assert len(scores) == len(SAMPLES) == len(judge.replies) == len(judge.events["unparsed"])
    for s, unparsed in zip(scores, judge.events["unparsed"]):
        assert (math.isnan(s) and unparsed) or (0.0 <= s <= 1.0 and not unparsed)
    assert judge.score([]) == []


def test_scores_are_rescaled_and_verdicts_kept(tiny_judge):
    cfg, judge = tiny_judge
    one_to_five = JudgeScorer(dataclasses.replace(cfg.reward.judges[0], min_score=1, max_score=5), judge.sampler,
                              judge.tokenizer)
    assert one_to_five.parse("Good.\nScore: 4") == 0.75 and one_to_five.parse("[[1]]") == 0.0
    assert one_to_five.parse("Score: 9") is None
    verdict = JudgeScorer(dataclasses.replace(cfg.reward.judges[0], kind="verdict"), judge.sampler, judge.tokenizer)
    assert verdict.parse("Verdict: Correct") == 1.0 and verdict.parse("Score: 10") is None
    assert "one word of: correct or incorrect" in verdict.template


@pytest.fixture(scope="module")
def lively_judge():
    """The tiny judge with its matrices redrawn at std 0.3: at init (std 0.02, tied embeddings) its
    greedy reply repeats the rubric's last token, the same for every sample; now it says words."""
    from rlft.models import load_base
    from rlft.samplers.base import stop_token_ids
    from rlft.samplers.hf import HFSampler

    cfg = _judged("max_new_tokens:12", "template:'Q: {prompt} A: {reply}'", "kind:verdict")
    model, tok = load_base(judge_model_config(cfg.reward.judges[0], cfg.model, "fp32"), torch.float32, 0)
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(0)
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    sampler = HFSampler(model, tok, 0, stop_token_ids(model.generation_config, tok))
    return cfg.reward.judges[0], model, tok, sampler


def _by_hand_replies(model, tok, template: str) -> list[str]:
    """Each rubric generated alone with transformers' greedy generate."""
    from rlft.data.chat import prompt_ids

    out = []
    for s in SAMPLES:
        ids = prompt_ids(tok, template.format(prompt=s.prompt, reply=s.completion, answer=s.answer))
        gen = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             do_sample=False, max_new_tokens=12, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
        out.append(tok.decode(gen[0, len(ids):], skip_special_tokens=True))
    return out


def test_judge_equals_a_by_hand_generate_and_parse(lively_judge):
    """A verdict word the judge's greedy replies do say: the scorer must find it where the by-hand
    reply has it, and mix it into the totals by weight (NaN-aware, as reward functions are)."""
    judge_cfg, model, tok, sampler = lively_judge
    hand = _by_hand_replies(model, tok, judge_cfg.template)
    assert len(set(hand)) == len(hand)
    word = re.findall(r"(?<!\w)[A-Za-z]{4,}(?!\w)", hand[0])[0]
    verdicts = {word: 1.0}
    judge = JudgeScorer(dataclasses.replace(judge_cfg, verdicts=verdicts, weight=0.5), sampler, tok)
    scores = judge.score(SAMPLES)
    assert judge.replies == hand
    expected = [parse_verdict(h, verdicts) for h in hand]
    assert [None if math.isnan(s) else s for s in scores] == expected and expected[0] == 1.0

    totals, per_fn = score_samples(["tests.helpers:none_on_odd_length"], [2.0], SAMPLES, 8)
    mixed = add_scorers(totals, per_fn, [judge], SAMPLES)
    for fn, j, out in zip(per_fn["tests.helpers:none_on_odd_length"], expected, mixed):
        want = [x for x in ((2.0 * fn) if not math.isnan(fn) else None, 0.5 * j if j is not None else None)
                if x is not None]
        assert (math.isnan(out) and not want) or out == pytest.approx(sum(want))
    assert per_fn["judge"] == scores and per_fn["judge_unparsed_frac"] == [float(e is None) for e in expected]


def test_training_with_a_judge(tmp_path):
    """A judge-only reward (the reward function scores nothing): the tiny random judge's unparsed
    replies are the unscored samples, and the run completes."""
    proc = run_cli(["train", *TINY, "trainer.steps=1", "reward.fns=[tests.helpers:batched_none]",
                    f"reward.judges=[{JUDGE}]", f"hydra.run.dir={tmp_path}"], ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "reward/unscored_frac" in r]
    assert len(rows) == 1
    for r in rows:
        assert r["reward/unscored_frac"] == r["reward/judge_unparsed_frac"]
        assert ("reward/judge" in r) == (r["reward/unscored_frac"] < 1)


def test_a_template_without_reply_is_one_line_at_start_up(tmp_path):
    proc = run_cli(["train", *TINY, "reward.judges=[{model:tiny,template:'Rate {prompt}'}]",
                    f"hydra.run.dir={tmp_path}"], ROOT)
    line = one_error_line(proc, 2)
    assert "reward.judges[0].template has no {reply} placeholder (it has {prompt})" in line


needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")


@pytest.mark.slow
@needs_vllm
def test_a_vllm_judge_says_what_the_hf_judge_says(lively_judge):
    """The same judge weights through a vLLM engine (fp32): the same greedy replies; a rubric longer
    than the engine's room is unscored and counted, not sent."""
    from rlft.data.chat import prompt_room
    from rlft.samplers import build_sampler

    judge_cfg, model, tok, hf_sampler = lively_judge
    verdicts = {"subconscious": 1.0, "growing": 0.5}
    judge_cfg = dataclasses.replace(judge_cfg, verdicts=verdicts)
    hf = JudgeScorer(judge_cfg, hf_sampler, tok)
    want = hf.score(SAMPLES)
    rubric_lengths = [len(hf.rubric_ids(s)) for s in SAMPLES]
    cfg = _judged("max_new_tokens:12", extra=("sampler.vllm.kv_cache_gb=0.25",
                                              f"sampler.vllm.max_model_len={max(rubric_lengths) + 11}"))
    sampler_cfg = dataclasses.replace(cfg.sampler, name="vllm", n=1, max_new_tokens=12)
    model_cfg = judge_model_config(judge_cfg, cfg.model, "fp32")
    room = prompt_room(sampler_cfg)[0]
    vllm = JudgeScorer(judge_cfg, build_sampler(sampler_cfg, model_cfg, model, tok, 0), tok, room)
    got = vllm.score(SAMPLES)
    longest = rubric_lengths.index(max(rubric_lengths))
    assert vllm.events["too_long"] == [i == longest for i in range(len(SAMPLES))] and math.isnan(got[longest])
    for i, (a, b) in enumerate(zip(hf.replies, vllm.replies)):
        if i != longest:
            assert a == b
            assert (math.isnan(want[i]) and math.isnan(got[i])) or want[i] == got[i]


@pytest.mark.slow
@needs_vllm
def test_training_with_vllm_policy_and_vllm_judge(tmp_path):
    """Two engines in one process: the policy's weight syncs reach its own engine (its log-probs
    still match the learner's after large updates), the judge's engine scores."""
    proc = run_cli(["train", *[o for o in TINY if o != "sampler=hf"], "sampler=vllm", "sampler.vllm.kv_cache_gb=0.25",
                    "sampler.vllm.max_model_len=512", "trainer.steps=3", "optim.lr=1e-2", "optim.warmup_steps=0",
                    "reward.fns=[tests.helpers:char_count]", f"reward.judges=[{JUDGE}]",
                    f"hydra.run.dir={tmp_path}"], ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "reward/unscored_frac" in r]
    assert len(rows) == 3 and all("reward/judge_unparsed_frac" in r and "reward/judge_too_long_frac" in r
                                  for r in rows)
    assert rows[0]["grad_norm"] > 0 and rows[-1]["rollout/logp_abs_diff_mean"] < 0.02


@pytest.mark.slow
def test_resume_is_exact_with_a_judge_from_a_directory(lively_judge, tmp_path):
    """A judge loaded from a model directory (the lively weights, whose greedy replies differ per
    sample) mixed with a reward function: a run stopped after step 2 and resumed equals one run."""
    from rlft.models.loading import save_model_dir
    from tests.support import comparable_metrics, saved_weights

    _, model, tok, _ = lively_judge
    save_model_dir(model, tok, tmp_path / "judge")
    run = [*[o for o in TINY if not o.startswith(("trainer.steps", "trainer.eval_every"))], "trainer.eval_every=2",
           "trainer.save_every=1", "optim.lr=1e-2",
           "reward.fns=[tests.helpers:char_count]", "logger.rollouts=true",
           f"reward.judges=[{{model:{tmp_path / 'judge'},kind:verdict,verdicts:{{joyce:1,nationwide:0.5}},weight:0.3}}]"]
    a, b = tmp_path / "a", tmp_path / "b"
    for args in ([f"hydra.run.dir={a}", "trainer.steps=4"], [f"hydra.run.dir={b}", "trainer.steps=2"],
                 [f"hydra.run.dir={b}", "trainer.steps=4", "trainer.resume=auto"]):
        r = run_cli(["train", *run, *args], ROOT)
        assert r.returncode == 0, r.stderr[-2000:]
    ma, mb = comparable_metrics(a), comparable_metrics(b)
    assert ma == mb and len(ma) == 5
    unparsed = [m["reward/judge_unparsed_frac"] for m in ma[1:]]
    assert min(unparsed) < 1, "the judge scored nothing"  # its replies say "Joyce" about half the time
    assert (tmp_path / "a" / "rollouts.jsonl").read_text() == (tmp_path / "b" / "rollouts.jsonl").read_text()
    wa, wb = saved_weights(a, 4), saved_weights(b, 4)
    assert all(bool((wa[k] == wb[k]).all()) for k in wa)
