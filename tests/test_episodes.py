"""Multi-turn episodes (rlft.episodes): the ids between turns, token-exact trajectories from a real
sampler (the tiny model, hf), masks, limits, environment errors, and whole training runs."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from rlft.config import compose
from rlft.data import Problem
from rlft.episodes.env import Step
from rlft.episodes.lockstep import Limits, run_episodes
from rlft.episodes.tokens import turn_suffix_ids
from rlft.errors import EnvError
from rlft.models import build_policy
from rlft.samplers import SamplingParams, build_sampler
from tests import envs
from tests.support import TINY, one_error_line, run_cli, write_eos_model

BASE = [a for a in TINY if not a.startswith("model=")] + ["model.dtype=fp32"]


@pytest.fixture(scope="module")
def eos_model(tmp_path_factory):
    """The tiny model with EOS made likely (tests.support.write_eos_model): its replies end, so episodes
    go on for several turns (the plain random model never stops)."""
    path = tmp_path_factory.mktemp("eos") / "model"
    write_eos_model(path, eos_logit=14.0)
    return path


@pytest.fixture(scope="module")
def tiny(eos_model):
    cfg, _, _ = compose(BASE + ["model=local", f"model.path={eos_model}"])
    policy, copy = build_policy(cfg.model, 0, need_reference=False)
    return build_sampler(cfg.sampler, cfg.model, copy, policy.tokenizer, 0), policy.tokenizer


def _ids(tok, messages, generation_prompt=True):
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _prompt(tok, text="What is 2 + 3?"):
    return _ids(tok, [{"role": "user", "content": text}])


def _params(n=2, max_new_tokens=6, seed=11):
    return SamplingParams(n=n, max_new_tokens=max_new_tokens, temperature=1.0, prompt_seeds=(seed * 1000,))


def test_suffix_is_the_templates_text_after_the_stop_token(tiny):
    _, tok = tiny
    ids = turn_suffix_ids(tok, [{"role": "tool", "content": "42"}], "<|im_end|>")
    assert tok.decode(ids) == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    # prompt + the policy's reply (ending with its stop token) + suffix is the whole conversation, templated
    reply = tok("5<|im_end|>", add_special_tokens=False)["input_ids"]
    whole = _ids(tok, [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "5"},
                       {"role": "tool", "content": "42"}])
    assert _prompt(tok) + reply + ids == whole


def test_a_three_turn_episode_is_the_samplers_own_ids_turn_after_turn(tiny):
    sampler, tok = tiny
    prompt = _prompt(tok)
    params = _params(n=8, max_new_tokens=8)
    eps = run_episodes(sampler, tok, [prompt], params, lambda i: envs.EchoEnv(None), Limits(3, 200))
    assert eps.prompt_index == [0] * 8 and all(eps.truncated)  # EchoEnv never ends an episode
    assert 3 in eps.turns and sum(eps.events.values()) == sum(eps.turns) - sum(_cut_last(eps, tok))
    firsts = sampler.generate([prompt], params).completion_ids
    for k in range(8):
        ids, mask = eps.completion_ids[k], eps.policy_mask[k]
        assert len(ids) == len(mask) and ids[: len(firsts[k])] == firsts[k]
        # Replay: each later turn is what the sampler gives for the exact context before it, same seed.
        pos, turn, context = len(firsts[k]), 1, prompt + firsts[k]
        while pos < len(ids):
            env_len = mask[pos:].index(1)
            reply = eps.transcripts[k][2 * turn - 2]["content"]
            assert ids[pos: pos + env_len] == turn_suffix_ids(
                tok, [{"role": "user", "content": f"turn {turn}: {len(reply)} chars"}], "<|im_end|>")
            context += ids[pos: pos + env_len]
            again = sampler.generate([context], SamplingParams(n=1, max_new_tokens=8, prompt_seeds=(
                (11 * 1000 + k) ^ (turn << 40),))).completion_ids[0]
            start = pos + env_len
            assert ids[start: start + len(again)] == again and set(mask[start: start + len(again)]) == {1}
            pos, turn, context = start + len(again), turn + 1, context + again
        assert turn == eps.turns[k]
    three = eps.turns.index(3)
    assert [m["role"] for m in eps.transcripts[three]] == ["assistant", "user", "assistant", "user", "assistant"]


def _cut_last(eps, tok) -> list[bool]:
    """Episodes whose last reply was cut at its token cap (the environment never saw it)."""
    return [ids[-1] != tok.eos_token_id for ids in eps.completion_ids]


def test_a_two_turn_episode_masks_the_tool_message_and_sums_step_rewards(tiny):
    sampler, tok = tiny
    prompt = _prompt(tok)
    params = _params(n=8, max_new_tokens=6)
    told = []
    eps = run_episodes(sampler, tok, [prompt], params, lambda i: envs.TwoTurnEnv(Problem("q", "5")), Limits(4, 1000),
                       progress=lambda *counts: told.append(counts))
    firsts = sampler.generate([prompt], params).completion_ids
    # The progress line's counts (done, generating, waiting on the environment): all 8 wait on it after turn 1,
    # those the environment sends back generate, all are done at the end; always 8 in all.
    assert told[0] == (0, 0, 8) and told[-1] == (8, 0, 0) and all(sum(c) == 8 for c in told)
    again = sum(t >= 2 for t in eps.turns)
    assert told[1] == (8 - again, again, 0) and again > 0
    assert len(eps.env_seconds) == 8 and all(s >= 0 for s in eps.env_seconds) and eps.env_s >= max(eps.env_seconds)
    suffix = turn_suffix_ids(tok, [{"role": "tool", "content": "42"}], "<|im_end|>")
    for k, first in enumerate(firsts):
        ids, mask = eps.completion_ids[k], eps.policy_mask[k]
        if first[-1] != tok.eos_token_id:  # cut at its cap: no second turn, no step reward
            assert (eps.turns[k], eps.truncated[k], mask, eps.env_rewards[k]) == (1, True, [1] * len(first), None)
            continue
        second = len(ids) - len(first) - len(suffix)
        assert mask == [1] * len(first) + [0] * len(suffix) + [1] * second and ids[len(first):][: len(suffix)] == suffix
        ended = ids[-1] == tok.eos_token_id
        seen = any("5" in m["content"] for m in eps.transcripts[k] if m["role"] == "assistant")
        assert eps.turns[k] == 2 and eps.truncated[k] == (not ended)
        assert eps.env_rewards[k] == (0.5 + 0.5 + float(seen) if ended else 0.5)
    assert 2 in eps.turns


def test_packed_rows_take_the_policy_mask():
    from rlft.training.rollout import _KeptRow, _pack_rows

    cfg, _, _ = compose(BASE)
    rows = [_KeptRow([1, 2], [5, 6, 7, 8, 9], False, 1.0, 0, None, [1, 1, 0, 0, 1]),
            _KeptRow([1, 2, 3], [5, 6], True, 0.0, 0, None)]
    batch = _pack_rows(rows, 0, cfg)
    assert batch.response_mask.tolist() == [[1, 1, 0, 0, 1], [1, 1, 0, 0, 0]]
    assert batch.input_ids[0, :7].tolist() == [1, 2, 5, 6, 7, 8, 9] and batch.resp_len.tolist() == [5, 2]


def test_budget_ends_an_episode_truncated_before_it_overflows(tiny):
    sampler, tok = tiny
    eps = run_episodes(sampler, tok, [_prompt(tok)], _params(n=4, max_new_tokens=5),
                       lambda i: envs.EchoEnv(None), Limits(max_turns=10, max_tokens=30))
    assert all(len(ids) <= 30 for ids in eps.completion_ids)
    assert all(eps.truncated) and max(eps.turns) < 10


def test_the_budget_bounds_the_first_turn_too(tiny):
    """episode.max_tokens below sampler.max_new_tokens: the first turn takes at most the budget (it took
    max_new_tokens), and an episode cut there ends truncated, its environment not shown the cut reply."""
    sampler, tok = tiny
    eps = run_episodes(sampler, tok, [_prompt(tok)], _params(n=8, max_new_tokens=6),
                       lambda i: envs.EchoEnv(None), Limits(max_turns=3, max_tokens=3))
    assert max(len(ids) for ids in eps.completion_ids) == 3
    assert all(t or len(ids) < 3 for ids, t in zip(eps.completion_ids, eps.truncated))
    assert all(turns == 1 for turns in eps.turns)  # no room for the environment's answer and a second turn


@pytest.mark.parametrize("env, words", [
    (envs.RaisingEnv, r"episode.env=x: step\(\) on the reply '.*' raised KeyError: 'no such room'"),
    (envs.JunkEnv, "returned dict"),
    (envs.ExitingEnv, r"step\(\) on the reply '.*' raised SystemExit: 0"),
    (envs.HangingEnv, r"step\(\) on the reply '.*' ran past episode.env_timeout_s=0.5s"),
])
def test_an_environment_that_fails_is_one_error(tiny, env, words):
    import signal
    import time

    sampler, tok = tiny
    start = time.monotonic()
    with pytest.raises(EnvError, match=words):
        run_episodes(sampler, tok, [_prompt(tok)], _params(n=8, max_new_tokens=8), lambda i: env(None),
                     Limits(3, 100, env_timeout_s=0.5), "episode.env=x")
    assert time.monotonic() - start < 30
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_worker_environments_of_all_episodes_step_at_once_and_keep_their_state(tiny):
    from rlft.episodes.env_pool import EnvPool

    sampler, tok = tiny
    pool = EnvPool(envs.SlowEnv, "episode.env=x", 32, 10.0)
    try:
        eps = run_episodes(sampler, tok, [_prompt(tok), _prompt(tok, "What is 4 + 4?")],
                           dataclasses.replace(_params(n=8, max_new_tokens=6), prompt_seeds=(11000, 12000)),
                           lambda i: pool.make(None), Limits(3, 200), "episode.env=x")
    finally:
        pool.close()
    steps = sum(t - (1 if cut else 0) for t, cut in zip(eps.turns, _cut_last(eps, tok)))
    assert steps >= 16 and max(eps.turns) == 3
    # one after another: steps x 0.5 s (at least 8 s); all at once: about one step a turn
    assert eps.env_s < 4.0 and eps.env_s < steps * 0.5 / 3, (eps.env_s, steps)
    assert max(eps.env_seconds) >= 0.45 * (max(eps.turns) - 1)
    for transcript in eps.transcripts:  # each episode's environment counted its own steps, in one worker
        said = [m["content"].split() for m in transcript if m["role"] == "user"]
        assert [int(w[3]) for w in said] == list(range(1, len(said) + 1)) and len({w[1] for w in said}) <= 1


def test_step_defaults():
    s = Step()
    assert s.messages == [] and not s.done and s.reward is None and s.events == {}


# ---------------------------------------------------------------------------------------
# Whole runs


RUN = [*BASE, "model=local", "sampler.n=4", "sampler.max_new_tokens=6", "trainer.num_prompts=2",
       "episode.max_turns=3", "logger.rollouts=true", "data.num_eval=2", "trainer.eval_every=0", "logger.console=false"]


def test_grpo_trains_on_episodes_with_environment_tokens_out_of_the_loss(tmp_path, eos_model):
    from safetensors.torch import load_file

    proc = run_cli(["train", *RUN, f"model.path={eos_model}", "episode.env=tests.envs:TwoTurnEnv", "reward.fns=[env_reward]",
                    "hydra.run.dir=run"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "run/rollouts.jsonl").read_text().splitlines()]
    assert rows and all("policy_mask" in r for r in rows)
    assert any(0 in r["policy_mask"] for r in rows)  # a second turn after the environment's message
    metrics = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    step = [m for m in metrics if m.get("step", 0) >= 1]
    assert all(1 <= m["episode/turns"] <= 2 and 0 < m["episode/policy_token_frac"] <= 1 for m in step)
    assert all(0 <= m["time/env_longest_s"] <= m["time/env_s"] < m["time/generate_s"] for m in step)
    assert all(m["reward/env_reward"] >= 0.5 for m in step)
    assert 1 <= metrics[-1]["eval/episode/turns"] <= 2 and 0 < metrics[-1]["eval/episode/policy_token_frac"] <= 1
    w = load_file(str(tmp_path / "run/checkpoints/step_000002/trainable.safetensors"))
    assert all(torch.isfinite(t).all() for t in w.values())


def test_ppo_trains_on_episodes(tmp_path, eos_model):
    proc = run_cli(["train", *RUN, f"model.path={eos_model}", "algo=ppo", "episode.env=tests.envs:EchoEnv", "reward.fns=[tests.helpers:char_count]",
                    "hydra.run.dir=run"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert all(m["episode/turns"] > 1 and m["episode/echoes"] >= 1 for m in metrics if m.get("step", 0) >= 1)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["drgrpo", "gspo", "reinforce_pp"])
def test_other_algorithms_train_on_episodes(tmp_path, eos_model, algo):
    proc = run_cli(["train", *RUN, f"model.path={eos_model}", f"algo={algo}", "episode.env=tests.envs:TwoTurnEnv",
                    "reward.fns=[env_reward]", "trainer.steps=1", "hydra.run.dir=run"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()][-1]
    assert m["step"] == 1 and m["episode/turns"] > 1 and torch.isfinite(torch.tensor(m["loss"]))


@pytest.mark.slow
def test_environment_errors_end_the_run_in_one_line(tmp_path, eos_model):
    proc = run_cli(["train", *RUN, f"model.path={eos_model}", "episode.env=tests.envs:RaisingEnv", "hydra.run.dir=run"], tmp_path)
    assert "raised KeyError: 'no such room'" in one_error_line(proc, 1)
    proc = run_cli(["train", *RUN, f"model.path={eos_model}", "episode.env=tests.envs:Nope", "hydra.run.dir=run2"], tmp_path)
    assert "has no attribute 'Nope'" in one_error_line(proc, 2)
    # os._exit in an environment ended the run with the environment's exit code and no error line; now its worker
    proc = run_cli(["train", *RUN, f"model.path={eos_model}", "episode.env=tests.envs:HardExitEnv", "hydra.run.dir=run3"],
                   tmp_path)
    assert "episode.env=tests.envs:HardExitEnv: step() on the reply" in one_error_line(proc, 1)
    assert "ended its worker process (exited with code 7)" in one_error_line(proc, 1)


# ---------------------------------------------------------------------------------------
# Tools as the environment


def _tool_env(*names: str, max_tool_calls: int = 3):
    from rlft.config.schemas.episode import EpisodeConfig
    from rlft.episodes.tool_env import ToolEnv
    from rlft.tools.dispatch import ToolRunner
    from rlft.tools.spec import load_tools

    cfg = EpisodeConfig(tool_timeout_s=5.0, max_tool_calls=max_tool_calls)
    return ToolEnv(ToolRunner(load_tools(list(names), cfg), cfg))


def test_tool_env_answers_calls_with_tool_messages_and_ends_on_a_plain_reply():
    env = _tool_env("calculator")
    step = env.step('Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "123*456"}}'
                    '</tool_call>')
    assert not step.done and step.messages == [{"role": "tool", "name": "calculator", "content": "56088"}]
    assert step.events["tool_calls"] == 1 and step.events["tool_errors"] == 0
    bad = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>'
                   '<tool_call>{"name": "nope", "arguments": {}}</tool_call><tool_call>{oops</tool_call>')
    assert len(bad.messages) == 3 and bad.events["tool_calls"] == 3 and bad.events["tool_errors"] == 3
    assert bad.events["tool_errors/unknown_tool"] == 1 and bad.events["tool_errors/malformed"] == 1
    assert env.step("The answer is 56088.") == Step(done=True, events={"tool_calls": 0})


def test_calls_past_max_tool_calls_are_not_run_and_read_an_error():
    calls = "".join(f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{n}*{n}"}}}}</tool_call>'
                    for n in range(1, 6))
    step = _tool_env("calculator", max_tool_calls=2).step(calls)
    assert [m["content"] for m in step.messages[:2]] == ["1", "4"]  # the first two ran
    assert [m["content"] for m in step.messages[2:]] == [
        f"Error: call {n} of this reply was not run: only the first 2 tool calls of a reply are run; call it again "
        "after reading these results" for n in (3, 4, 5)]
    assert step.events["tool_calls"] == 5 and step.events["tool_errors"] == 3
    assert step.events["tool_errors/too_many_calls"] == 3 and not step.done
    # The default (1, as verl's max_parallel_calls): a malformed first call takes the one place.
    one = _tool_env("calculator", max_tool_calls=1).step("<tool_call>oops</tool_call>" + calls)
    assert one.messages[0]["content"].startswith("Error: malformed tool call: the call is not valid JSON")
    assert one.messages[1]["content"].startswith("Error: call 2 of this reply was not run: ")
    assert "only one tool call of a reply is run" in one.messages[1]["content"]
    assert one.events["tool_errors/too_many_calls"] == 5 and one.events["tool_errors/malformed"] == 1


def test_the_first_prompt_describes_the_tools_in_rlfts_format(tiny):
    from rlft.episodes.setup import EpisodeSetup
    from rlft.tools.spec import load_tools

    _, tok = tiny
    cfg, _, _ = compose(BASE + ["data.system_prompt=Be brief."])
    setup = EpisodeSetup(None, "tools", Limits(2, 100), load_tools(["calculator"], cfg.episode))
    text = tok.decode(setup.prompt_ids(tok, Problem("What is 2 + 3?", "5"), cfg.data))
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou can call tools.") and '"calculator"' in text
    assert "several calls in one reply" in text  # no cap given; a run's setup tells episode.max_tool_calls
    capped = EpisodeSetup(None, "tools", Limits(2, 100), load_tools(["calculator"], cfg.episode), "rlft",
                          cfg.episode.max_tool_calls)
    assert "write one call per reply" in tok.decode(capped.prompt_ids(tok, Problem("What is 2 + 3?", "5"), cfg.data))
    assert text.endswith("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")


def test_a_run_with_tools_shows_them_and_logs_the_tool_metrics(tmp_path, eos_model):
    proc = run_cli(["train", *RUN, f"model.path={eos_model}", "tools=[calculator]", "reward.fns=[math_correct]",
                    "trainer.steps=1", "hydra.run.dir=run"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(eos_model))
    rows = [json.loads(line) for line in (tmp_path / "run/rollouts.jsonl").read_text().splitlines()]
    assert "<tools>" in tok.decode(rows[0]["prompt_ids"]) and all("policy_mask" in r for r in rows)
    m = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()][-1]
    # the random model writes no call: one turn each, and the count says so
    assert m["episode/turns"] == 1.0 and m["episode/tool_calls"] == 0.0
    assert m["eval/episode/turns"] == 1.0 and m["eval/episode/tool_calls"] == 0.0
    assert m["eval/episode/policy_token_frac"] == 1.0  # one reply: no tool tokens


def test_prompt_length_checks_count_the_tools_description(tiny, tmp_path, eos_model):
    from rlft.data import build_task
    from rlft.data.chat import drop_long_prompts, problem_ids
    from rlft.episodes.setup import episode_setup, prompt_overhead
    from rlft.errors import DataError

    _, tok = tiny
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(6)))
    cfg, _, _ = compose(BASE + ["model=local", f"model.path={eos_model}", "data=jsonl", f"data.path={data}",
                                "data.num_eval=2", "tools=[calculator]"])
    task, setup = build_task(cfg.data, 0), episode_setup(cfg)
    extra = prompt_overhead(setup, tok, task, cfg.data)
    p = task.eval_problems[0]
    plain = len(problem_ids(tok, p, cfg.data))
    assert extra == len(setup.prompt_ids(tok, p, cfg.data)) - plain and extra > 50
    cfg.data.max_prompt_tokens = plain + extra
    assert drop_long_prompts(task, tok, cfg.data, None, extra)[1:] == (0, 0)
    cfg.data.max_prompt_tokens = plain + extra - 1
    with pytest.raises(DataError, match="all 4 training prompts are longer"):
        drop_long_prompts(task, tok, cfg.data, None, extra)


@pytest.mark.slow
def test_episodes_are_the_same_on_two_ranks_and_after_a_resume(tmp_path, eos_model):
    """DAPO on TwoTurnEnv episodes (dynamic sampling keeps informative groups): 2 ranks give one process's
    episodes token for token and its weights; a run stopped after step 2 and resumed ends as an unbroken one."""
    from safetensors.torch import load_file

    args = [*RUN, f"model.path={eos_model}", "episode.env=tests.envs:TwoTurnEnv", "reward.fns=[env_reward]",
            "algo=dapo", "algo.overlong_filter=false", "algo.max_sampling_rounds=2", "trainer.threads=1",
            "optim.lr=1e-2", "trainer.steps=3"]
    for name, extra in (("one", []), ("two", ["trainer.nproc=2"]), ("cut", ["trainer.steps=2"])):
        proc = run_cli(["train", *args, *extra, f"hydra.run.dir={name}"], tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
    proc = run_cli(["train", *args, "trainer.resume=auto", "hydra.run.dir=cut"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]

    def rollouts(d):
        return [json.loads(line) for line in (tmp_path / d / "rollouts.jsonl").read_text().splitlines()]

    assert rollouts("one") == rollouts("two") == rollouts("cut")
    assert any(0 in r["policy_mask"] for r in rollouts("one"))
    w = {d: load_file(str(tmp_path / d / "checkpoints/step_000003/trainable.safetensors")) for d in ("one", "two", "cut")}
    assert all(torch.equal(w["one"][k], w["cut"][k]) for k in w["one"])
    for k, a in w["one"].items():
        assert float((a - w["two"][k]).norm() / a.norm().clamp(min=1e-12)) < 1e-5, k


def test_dapos_overlong_cache_fits_the_policys_budget_over_the_turns():
    from rlft.config.validation import policy_budget
    from rlft.errors import ConfigError

    args = [*BASE, "algo=dapo", "sampler.max_new_tokens=6", "algo.overlong_cache=8"]
    with pytest.raises(ConfigError, match=r"overlong_cache=8 must be in \(0, sampler.max_new_tokens=6\]"):
        compose(args)
    cfg, _, _ = compose([*args, "episode.env=tests.envs:EchoEnv", "episode.max_turns=3"])
    assert policy_budget(cfg) == 18
    with pytest.raises(ConfigError, match=r"must be in \(0, sampler.max_new_tokens x episode.max_turns = 18\]"):
        compose([*args, "episode.env=tests.envs:EchoEnv", "episode.max_turns=3", "algo.overlong_cache=19"])


class _OneAtATime:
    """The hf sampler behind the continuous loop's interface (submit / step / running / abort), one request a step,
    with an abort that raises as a dead engine's does."""

    def __init__(self, sampler):
        self.sampler, self.pending = sampler, []

    def submit(self, key, prompt, params):
        self.pending.append((key, prompt, params))

    @property
    def running(self):
        return len(self.pending)

    def step(self):
        key, prompt, params = self.pending.pop(0)
        return [(key, self.sampler.generate([prompt], params))]

    def abort(self):
        raise RuntimeError("the engine is dead")


def test_a_failing_cleanup_neither_hides_the_first_error_nor_skips_the_rest(tiny, caplog):
    """The continuous loop fails (an environment raises): the engine's abort raises too, and so does the first
    environment pool's abandon; the environment's error is the one reported, and the other pool's workers still
    go."""
    from rlft.episodes.env_pool import EnvPool

    class BrokenPool(EnvPool):
        def abandon(self):
            super().abandon()
            raise OSError("its pipes are gone")

    sampler, tok = tiny
    first, second = BrokenPool(envs.EchoEnv, "episode.env=a", 1, 30.0), EnvPool(envs.EchoEnv, "episode.env=b", 1, 30.0)
    make = {0: lambda: first.make(None), 1: lambda: second.make(None), 2: lambda: envs.RaisingEnv(None)}
    try:
        with pytest.raises(EnvError, match="no such room"):
            params = SamplingParams(n=1, max_new_tokens=48, temperature=1.0, prompt_seeds=(1, 2, 3))
            run_episodes(_OneAtATime(sampler), tok, [_prompt(tok)] * 3, params,
                         lambda i: make[i](), Limits(3, 200), "episode.env=x", continuous=True)
        assert not second.workers  # stopped although the cleanup before it raised
        said = caplog.text
        assert "aborting the engine's requests raised RuntimeError: the engine is dead" in said
        assert "dropping the steps of BrokenPool raised OSError: its pipes are gone" in said
    finally:
        first.close()
        second.close()
