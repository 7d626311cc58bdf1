"""The learner is one code path with the device as a parameter: checks that run on the CPU.

A tensor made without naming its device lands on torch's default device. These tests set that
default to ``meta`` (a device with shapes but no data) around the learner's work, with
``trainer.device=cpu``: every tensor the code places explicitly (on the batch's or the model's
device, or deliberately in host memory) is real, and any tensor it forgot to place is a meta
tensor, which fails the first time it meets a real one or is read. So a pass here means the
same code on ``trainer.device=cuda`` builds nothing on the CPU by accident.
"""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlft.config import compose
from rlft.data.chat import prompt_ids
from rlft.state import checkpoint as ckpt
from rlft.state.run_state import CUDA_RNG, RNG
from rlft.training.learner import update_policy
from rlft.training.logprobs import token_logprobs
from rlft.training.loop import build_components
from rlft.training.prepare import adapt_coefficients, prepare_batch
from rlft.training.rollout import collect_rollout, sampling_params
from tests.support import ROOT, TINY, run_cli

VARIED = ["reward.fns=[math_correct,tests.helpers:char_count]", "reward.weights=[1,1]", "trainer.device=cpu"]


class _DefaultDeviceIsMeta:
    def __enter__(self) -> None:
        torch.set_default_device("meta")

    def __exit__(self, *exc: object) -> None:
        torch.set_default_device(None)


def test_meta_default_catches_a_tensor_made_without_a_device():
    # The check itself: the mistake it is there to catch does fail under it.
    x = torch.ones(3)
    with _DefaultDeviceIsMeta(), pytest.raises((RuntimeError, NotImplementedError)):
        float((x + torch.zeros(3)).sum())


@pytest.mark.parametrize("overrides", [
    ["algo=grpo"],
    ["algo=dapo", "algo.overlong_filter=false"],
    ["algo=ppo"],
    ["algo=ppo", "algo.policy_loss=kl_penalty", "algo.early_stop_kl=10"],
    ["algo=grpo", "algo.beta=0.1", "model.lora.enabled=false", "model.dtype=fp32"],
    ["algo=grpo", "model.gradient_checkpointing=true", "algo.ppo_epochs=2"],
], ids=["grpo", "dapo", "ppo", "ppo-penalty-early-stop", "full-ft-kl", "grad-ckpt"])
def test_learner_builds_every_tensor_on_the_configured_device(overrides):
    cfg, _, _ = compose(TINY + VARIED + ["optim.lr=1e-2", *overrides])
    c = build_components(cfg)
    c.policy.model.eval()
    rollout = collect_rollout(c, cfg)
    c.policy.model.train()
    before = [p.detach().clone() for p in c.policy.trainable_parameters()]
    with _DefaultDeviceIsMeta():
        metrics = prepare_batch(c, rollout.batch, cfg)
        metrics.update(update_policy(c, rollout.batch, cfg))
        adapt_coefficients(c, rollout.batch, cfg, metrics)
    assert metrics["update/skipped"] == 0.0
    for k in ("loss", "grad_norm", "approx_kl", "entropy", "adv/std"):
        assert math.isfinite(metrics[k]), k
    assert any(not torch.equal(a, b) for a, b in zip(c.policy.trainable_parameters(), before))
    want = torch.device(cfg.trainer.device)
    tensors = [*c.policy.model.parameters(), *(c.critic.parameters() if c.critic else [])]
    tensors += [v for s in c.optimizer.state.values() for k, v in s.items() if k != "step"]
    tensors += [getattr(rollout.batch, k) for k in ("input_ids", "advantages", "response_mask")]
    assert {t.device for t in tensors} == {want}


def test_hf_sampler_decodes_on_its_device():
    cfg, _, _ = compose(TINY + VARIED + ["sampler.top_p=0.9", "sampler.top_k=50"])
    c = build_components(cfg)
    prompts = [prompt_ids(c.policy.tokenizer, p.prompt, None) for p in c.task.batch(0, 2)]
    with _DefaultDeviceIsMeta():
        gens = c.sampler.generate(prompts, sampling_params(cfg, 0))
    assert len(gens.completion_ids) == 2 * cfg.sampler.n
    assert all(0 < len(ids) <= cfg.sampler.max_new_tokens for ids in gens.completion_ids)
    assert next(c.sampler.model.parameters()).device == torch.device("cpu")


def test_gradient_checkpointing_gives_the_same_logprobs_and_gradients():
    # Under checkpointing each row runs whole (the shared prompt cache is off): same numbers.
    grads, logps = [], []
    for ckpt_on in (False, True):
        cfg, _, _ = compose(TINY + VARIED + ["model.dtype=fp32", f"model.gradient_checkpointing={ckpt_on}"])
        c = build_components(cfg)
        with torch.no_grad():
            for name, p in c.policy.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.2, generator=torch.Generator().manual_seed(len(name)))
        c.policy.model.eval()
        batch = collect_rollout(c, cfg).batch
        c.policy.model.train()
        assert bool(getattr(c.policy.model, "is_gradient_checkpointing", False)) == ckpt_on
        logp, _ = token_logprobs(c.policy.model, batch, 1.0)
        (logp * batch.response_mask).sum().backward()
        logps.append(logp.detach())
        grads.append(torch.cat([p.grad.flatten() for p in c.policy.trainable_parameters()]))
    torch.testing.assert_close(logps[1], logps[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-3, atol=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a machine without CUDA gives")
def test_cuda_device_without_cuda_is_one_line(tmp_path):
    r = run_cli(["train", *TINY, "trainer.device=cuda", f"hydra.run.dir={tmp_path}/run"], ROOT)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "trainer.device=cuda" in lines[0] and "no CUDA device" in lines[0], r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("value", ["gpu", "cuda:x", "tpu"])
def test_unknown_device_names_the_choices(compose_cfg, value):
    from rlft.config import ConfigError

    with pytest.raises(ConfigError, match="valid choices: auto, cpu, cuda, cuda:N"):
        compose_cfg(*TINY, f"trainer.device={value}")


def test_flash_attention_on_the_cpu_learner_is_refused(compose_cfg):
    from rlft.config import ConfigError

    with pytest.raises(ConfigError, match="flash"):
        compose_cfg(*TINY, "trainer.device=cpu", "model.attn_implementation=flash_attention_2")


@pytest.mark.slow  # several CLI runs; kept out of make test's 10 minutes
def test_checkpoint_from_a_cuda_run_resumes_on_the_cpu(tmp_path):
    # A CUDA run's checkpoint differs from a CPU one in exactly one place: rng.safetensors also holds
    # the CUDA generator's state (tensor files are always written from host copies). Adding that
    # entry to a CPU checkpoint makes one as a CUDA run writes it; the CPU run must resume from it
    # and finish exactly as from the plain checkpoint (the CPU-side random states are the same).
    args = [*[a for a in TINY if not a.startswith("trainer.steps")], "trainer.steps=3", "trainer.save_every=1",
            "trainer.device=cpu", "reward.fns=[tests.helpers:char_count]", "reward.weights=[1]", "optim.lr=1e-2"]
    first = tmp_path / "first"
    r = run_cli(["train", *args, "trainer.steps=2", f"hydra.run.dir={first}"], ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    finals = []
    for with_cuda_rng in (False, True):
        run = tmp_path / f"resumed-{with_cuda_rng}"
        step2 = run / "checkpoints" / ckpt.step_dir_name(2)
        step2.parent.mkdir(parents=True)
        import shutil

        shutil.copytree(first / "checkpoints" / ckpt.step_dir_name(2), step2)
        shutil.copy(first / "metrics.jsonl", run / "metrics.jsonl")
        if with_cuda_rng:
            rng = load_file(str(step2 / RNG))
            rng[CUDA_RNG] = torch.arange(16, dtype=torch.uint8)  # a Philox seed and offset, as CUDA saves them
            save_file(rng, str(step2 / RNG))
            assert CUDA_RNG in load_file(str(step2 / RNG))
        r = run_cli(["train", *args, "trainer.resume=auto", f"hydra.run.dir={run}"], ROOT)
        assert r.returncode == 0, r.stderr[-2000:]
        finals.append(load_file(str(run / "checkpoints" / ckpt.step_dir_name(3) / "trainable.safetensors")))
    assert finals[0].keys() == finals[1].keys()
    for k in finals[0]:
        assert torch.equal(finals[0][k], finals[1][k]), k
