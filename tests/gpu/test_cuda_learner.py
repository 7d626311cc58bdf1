"""The learner on CUDA: the same numbers as on the CPU, short real runs, and checkpoints across devices."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from safetensors.torch import load_file

from rlft.config import compose
from rlft.state import checkpoint as ckpt
from rlft.training.logprobs import token_logprobs
from rlft.training.loop import build_components
from rlft.training.rollout import collect_rollout
from tests.support import ROOT, TINY, run_cli

DEVICE = os.environ.get("RLFT_GPU_TESTS_DEVICE", "cuda")  # see tests/conftest.py: cpu dry-runs these tests


def on_cuda() -> bool:
    return DEVICE.startswith("cuda")


TRAIN = [*[a for a in TINY if not a.startswith("trainer.steps")], "trainer.steps=3",
         "reward.fns=[math_correct,tests.helpers:char_count]", "reward.weights=[1,1]", "optim.lr=1e-2"]


def _steps(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("dtype,tol", [("fp32", 2e-4), ("bf16", 0.1)])
def test_logprobs_on_the_device_match_the_cpu(dtype, tol):
    """Tolerance on |logp_device - logp_cpu|, max over tokens: fp32 2e-4 (other kernels and
    summation order, TF32 off); bf16 autocast 0.1 (8 mantissa bits through 2 layers of a vocab of 49k)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    out = {}
    for device in ("cpu", DEVICE):
        cfg, _, _ = compose(TINY + [f"trainer.device={device}", f"model.dtype={dtype}"])
        c = build_components(cfg)
        with torch.no_grad():
            for name, p in c.policy.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.2)
        if device == "cpu":
            batch = collect_rollout(c, cfg).batch  # the same tokens scored on both devices
        with torch.no_grad(), c.policy.autocast():
            logp, _ = token_logprobs(c.policy.model, batch.to(c.device), 1.0)
        out[device] = (logp.float().cpu(), batch.response_mask)
    (a, mask), (b, _) = out["cpu"], out[DEVICE]
    diff = ((a - b).abs() * mask).max().item()
    assert diff <= tol, f"max |logp diff| {diff:.2e} > {tol}"


@pytest.mark.parametrize("algo", ["grpo", "dapo", "ppo"])
def test_three_steps_with_the_hf_sampler(algo, tmp_path):
    extra = ["algo.overlong_filter=false"] if algo == "dapo" else []
    r = run_cli(["train", *TRAIN, f"algo={algo}", "sampler=hf", f"trainer.device={DEVICE}", *extra,
                 f"hydra.run.dir={tmp_path}"], ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [s for s in _steps(tmp_path) if s.get("step", 0) > 0]
    assert len(steps) == 3
    assert all(math.isfinite(s["loss"]) for s in steps if s.get("update/skipped") == 0.0)
    assert f"learner on {DEVICE}" in (tmp_path / "train.log").read_text()


@pytest.mark.skipif(not on_cuda(), reason="sleep/wake frees GPU memory only on CUDA")
def test_vllm_three_steps_and_sleep_frees_memory(tmp_path):
    pytest.importorskip("vllm")
    # enforce_eager: CUDA-graph capture would cost a minute per engine start for nothing a test checks.
    vllm = ["sampler=vllm", "sampler.vllm.gpu_memory_utilization=0.2", "sampler.vllm.enforce_eager=true"]
    r = run_cli(["train", *TRAIN, "algo=grpo", *vllm, "trainer.device=cuda", f"hydra.run.dir={tmp_path}"], ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert len([s for s in _steps(tmp_path) if s.get("step", 0) > 0]) == 3

    cfg, _, _ = compose(TINY + [*vllm, "trainer.device=cuda"])
    c = build_components(cfg)
    # vLLM allocates through its own pool, which torch.cuda.memory_allocated does not see: the
    # device-wide free memory (cudaMemGetInfo) is what sleeping must give back to the learner.
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # as _wake does: otherwise blocks it returns would count as "restored" memory
    free_awake = torch.cuda.mem_get_info()[0]
    c.sampler.sleep()
    torch.cuda.synchronize()
    free_asleep = torch.cuda.mem_get_info()[0]
    c.sampler._wake()
    torch.cuda.synchronize()
    free_woken = torch.cuda.mem_get_info()[0]
    gib = 2**30
    assert free_asleep - free_awake > 0.5 * gib, (free_awake / gib, free_asleep / gib)
    assert abs(free_woken - free_awake) < 0.25 * gib, (free_awake / gib, free_woken / gib)


def test_everything_trains_on_the_device():
    cfg, _, _ = compose(TRAIN + ["algo=ppo", f"trainer.device={DEVICE}"])
    c = build_components(cfg)
    from rlft.training.loop import train_step

    m = train_step(1, c, cfg)
    assert m["update/skipped"] == 0.0
    want = torch.device(DEVICE).type
    tensors = [*c.policy.model.parameters(), *c.critic.parameters()]
    tensors += [v for s in c.optimizer.state.values() for k, v in s.items() if k != "step"]
    assert {t.device.type for t in tensors} == {want}
    if on_cuda():
        assert c.precision.dtype == "bf16" or not torch.cuda.is_bf16_supported()
        assert next(c.sampler.model.parameters()).device.type == "cuda"


@pytest.mark.parametrize("first,second", [(DEVICE, "cpu"), ("cpu", DEVICE)])
def test_checkpoint_moves_between_devices(first, second, tmp_path):
    """Steps 1-2 on one device, checkpoint, step 3 on the other: the resumed run starts from exactly
    the saved adapter and optimizer state (and finishes)."""
    args = [*TRAIN, "trainer.save_every=1"]
    r = run_cli(["train", *args, "trainer.steps=2", f"trainer.device={first}", f"hydra.run.dir={tmp_path}"], ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    saved = load_file(str(tmp_path / "checkpoints" / ckpt.step_dir_name(2) / "trainable.safetensors"))
    r = run_cli(["train", *args, f"trainer.device={second}", "trainer.resume=auto", f"hydra.run.dir={tmp_path}"],
                ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    if first != second:
        assert "trainer.device" in (tmp_path / "train.log").read_text()  # reported as a numerics-only change
    final = load_file(str(tmp_path / "checkpoints" / ckpt.step_dir_name(3) / "trainable.safetensors"))
    assert final.keys() == saved.keys()
    assert any(not torch.equal(final[k], saved[k]) for k in saved)  # step 3 trained from the checkpoint
