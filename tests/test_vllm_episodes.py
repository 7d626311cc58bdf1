"""Multi-turn episodes sampled by the real vLLM engine: each later turn continues from the exact
token ids, and the sampler's log-probs of the policy's tokens match the learner's on every turn."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlft.config.validation import vllm_available
from tests.support import ROOT, TINY, dist_env, write_eos_model

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")]

# One engine per process (vLLM's globals), so the episodes run in a child process that prints
# what the test checks: per sampled episode, its ids, policy mask, turns, the sampler's log-probs and the
# learner's; and for every later turn of greedy episodes, that turn and a fresh greedy generate from its
# exact context.
PROBE = """
import json, sys
import torch
from rlft.episodes.lockstep import Limits, run_episodes
from rlft.training.logprobs import token_logprobs
from rlft.training.rollout import _KeptRow, _pack_rows
from rlft.samplers import SamplingParams
from tests import envs

cfg, policy, sampler, prompts = envs.probe_engine(json.loads(sys.argv[1]))
tok = policy.tokenizer
params = SamplingParams(n=4, max_new_tokens=8, temperature=1.0)
eps = run_episodes(sampler, tok, prompts, params, lambda i: envs.EchoEnv(None), Limits(3, 200))
# Packed by the rollout's own code: the environment's tokens outside the loss, inside the context.
batch = _pack_rows([_KeptRow(prompts[p], c, False, 0.0, p, lp, m) for p, c, lp, m in zip(
    eps.prompt_index, eps.completion_ids, eps.logprobs, eps.policy_mask)], tok.pad_token_id, cfg)
with torch.no_grad(), policy.autocast():
    learner, _ = token_logprobs(policy.model, batch, cfg.sampler.temperature)
# Greedy episodes, each later turn replayed greedily from its exact context (a replay of a sampled turn
# would need its own seed: the log-prob check above covers the sampled ones; tests/test_vllm_continuous.py their seeds).
greedy = SamplingParams(n=1, max_new_tokens=8, greedy=True)
geps = run_episodes(sampler, tok, prompts, greedy, lambda i: envs.EchoEnv(None), Limits(3, 200))
replays = []
for k, (c, m) in enumerate(zip(geps.completion_ids, geps.policy_mask)):
    pos = m.index(0) if 0 in m else len(m)
    while pos < len(c):
        begin = pos + m[pos:].index(1)
        end = begin + (m[begin:].index(0) if 0 in m[begin:] else len(m) - begin)
        again = sampler.generate([prompts[k] + c[:begin]], SamplingParams(
            n=1, max_new_tokens=end - begin, greedy=True)).completion_ids[0]
        replays.append([c[begin:end], again])
        pos = end
print("EPISODES", json.dumps({"ids": eps.completion_ids, "mask": eps.policy_mask, "turns": eps.turns,
                              "sampler": eps.logprobs, "learner": learner.tolist(), "replays": replays}))
"""


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    path = tmp_path_factory.mktemp("eos") / "model"
    write_eos_model(path, eos_logit=14.0)
    overrides = [a for a in TINY if not a.startswith(("model=", "sampler="))] + [
        "model=local", f"model.path={path}", "model.dtype=fp32", "sampler=vllm", "sampler.vllm.kv_cache_gb=0.25",
        "sampler.vllm.max_model_len=256", "sampler.vllm.sync=merged"]
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(overrides)], cwd=ROOT, env=dist_env(),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("EPISODES "))
    return json.loads(line[len("EPISODES "):])


def _turns(mask: list[int]) -> list[tuple[int, int]]:
    """(begin, end) of each run of the policy's tokens."""
    runs, begin = [], None
    for i, m in enumerate([*mask, 0]):
        if m and begin is None:
            begin = i
        elif not m and begin is not None:
            runs.append((begin, i))
            begin = None
    return runs


def test_vllm_episodes_continue_from_their_exact_ids(episodes):
    assert max(episodes["turns"]) == 3 and len(episodes["replays"]) >= 2
    for turn, again in episodes["replays"]:
        assert turn == again  # the engine, given this turn's exact context, writes this turn again


def test_vllm_logprobs_match_the_learner_on_every_turn(episodes):
    gaps: dict[int, list[float]] = {}
    for k, mask in enumerate(episodes["mask"]):
        sampler, learner = episodes["sampler"][k], episodes["learner"][k]
        assert all(sampler[i] == 0.0 for i, m in enumerate(mask) if not m)  # the environment's tokens
        for turn, (begin, end) in enumerate(_turns(mask), start=1):
            gaps.setdefault(turn, []).extend(abs(sampler[i] - learner[i]) for i in range(begin, end))
    assert set(gaps) == {1, 2, 3}
    # fp32 on both sides: as close on the third turn (after ~40 tokens of context) as on the first
    first = max(gaps[1])
    for turn, g in gaps.items():
        assert max(g) < 2e-3 and sum(g) / len(g) < max(4 * sum(gaps[1]) / len(gaps[1]), 2e-4), (turn, max(g), first)
