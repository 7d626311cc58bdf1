"""The training loop: sample -> reward -> advantage -> learn -> sync -> log -> checkpoint."""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlft.algorithms import ADV_ESTIMATORS, AdvantageInputs
from rlft.batch import RolloutBatch, pack
from rlft.checkpoint import save_checkpoint
from rlft.data import Problem, build_task
from rlft.data.chat import prompt_ids
from rlft.evaluation import evaluate
from rlft.learner import batch_logprobs, build_optimizer, update_policy
from rlft.models import Policy, build_policy
from rlft.rewards import resolve_reward, score_samples
from rlft.rewards.registry import Sample
from rlft.rollout import Generations, Sampler, SamplingParams, build_sampler
from rlft.tracking import Tracker


@dataclass
class Rollout:
    """A scored rollout and the timings of producing it."""

    batch: RolloutBatch
    gens: Generations
    metrics: dict[str, float]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def sampling_params(cfg: Any) -> SamplingParams:
    s = cfg.sampler
    return SamplingParams(
        n=s.n, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_new_tokens=s.max_new_tokens
    )


def collect_rollout(sampler: Sampler, tokenizer: Any, problems: list[Problem], cfg: Any) -> Rollout:
    """Sample a group per problem, decode and score it, and pack it into tensors."""
    prompts = [prompt_ids(tokenizer, p.prompt, cfg.data.system_prompt) for p in problems]
    t0 = time.perf_counter()
    gens = sampler.generate(prompts, sampling_params(cfg))
    t1 = time.perf_counter()
    texts = tokenizer.batch_decode(gens.completion_ids, skip_special_tokens=True)
    samples = [
        Sample(problems[i].prompt, text, problems[i].answer, len(ids), cut)
        for i, text, ids, cut in zip(gens.prompt_index, texts, gens.completion_ids, gens.truncated)
    ]
    totals, per_fn = score_samples(cfg.reward.fns, cfg.reward.weights, samples, cfg.sampler.max_new_tokens)
    t2 = time.perf_counter()
    input_ids, attn, start, length, mask = pack(
        [prompts[i] for i in gens.prompt_index], gens.completion_ids, tokenizer.pad_token_id
    )
    scores = torch.tensor(totals, dtype=torch.float32)
    batch = RolloutBatch(input_ids, attn, start, length, mask, torch.tensor(gens.prompt_index), scores)
    metrics = {
        "reward/mean": float(scores.mean()),
        "reward/std": float(scores.std()) if len(totals) > 1 else 0.0,
        **{f"reward/{name}": float(np.mean(v)) for name, v in per_fn.items()},
        "tokens/generated": float(gens.num_tokens),
        "response/mean_length": gens.num_tokens / len(texts),
        "response/truncated_frac": float(np.mean(gens.truncated)),
        "time/generate_s": t1 - t0,
        "time/reward_s": t2 - t1,
        "throughput/tokens_per_s": gens.num_tokens / max(t1 - t0, 1e-9),
    }
    return Rollout(batch, gens, metrics)


def prepare_batch(policy: Policy, batch: RolloutBatch, cfg: Any) -> dict[str, float]:
    """Fill in old/reference log-probs (only those the algorithm needs) and advantages."""
    algo, temp, micro = cfg.algo, cfg.sampler.temperature, cfg.trainer.micro_batch_size
    t0 = time.perf_counter()
    # With a single update per rollout the ratio is exp(logp - logp.detach()): no old pass needed.
    if algo.ppo_epochs > 1 or algo.num_mini_batches > 1:
        batch.old_logp = batch_logprobs(policy, policy.model, batch, temp, micro)
    if algo.beta > 0:
        with policy.reference() as ref:
            batch.ref_logp = batch_logprobs(policy, ref, batch, temp, micro)
    t1 = time.perf_counter()
    inputs = AdvantageInputs(batch.scores, batch.response_mask, batch.group_ids)
    batch.advantages, batch.returns = ADV_ESTIMATORS.get(algo.adv_estimator)(inputs, algo)
    adv_tokens = batch.advantages[batch.response_mask.bool()]
    return {
        "time/logprob_s": t1 - t0,
        "adv/mean": float(adv_tokens.mean()) if adv_tokens.numel() else 0.0,
        "adv/std": float(adv_tokens.std()) if adv_tokens.numel() > 1 else 0.0,
    }


@dataclass
class Components:
    """Everything a training step needs, built once per run."""

    task: Any
    policy: Policy
    sampler: Sampler
    optimizer: torch.optim.Optimizer
    scheduler: Any
    shuffle: torch.Generator


def build_components(cfg: Any) -> Components:
    """Seed, then build the task, policy, sampler and optimizer named by ``cfg``."""
    if cfg.trainer.threads > 0:
        torch.set_num_threads(cfg.trainer.threads)
    _quiet_libraries()
    seed_everything(cfg.seed)
    task = build_task(cfg.data, cfg.seed)
    for name in cfg.reward.fns:  # fail on a bad reward name before loading the model
        resolve_reward(name)
    policy, sampler_model = build_policy(cfg.model, cfg.seed, need_reference=cfg.algo.beta > 0)
    sampler = build_sampler(cfg.sampler, sampler_model, policy.tokenizer, cfg.seed)
    total_updates = cfg.trainer.steps * cfg.algo.ppo_epochs * cfg.algo.num_mini_batches
    optimizer, scheduler = build_optimizer(policy, cfg, total_updates)
    return Components(task, policy, sampler, optimizer, scheduler, torch.Generator().manual_seed(cfg.seed))


def train(cfg: Any, run_dir: Path, resolved_yaml: str | None = None) -> dict[str, float]:
    """Run a full training job; returns the last step's metrics (with the last eval)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if resolved_yaml is not None:
        (run_dir / "config.yaml").write_text(resolved_yaml)
    c = build_components(cfg)
    tok, policy = c.policy.tokenizer, c.policy
    tracker = Tracker(run_dir, cfg, cfg.trainer.steps, cfg.logger.console, _as_dict(resolved_yaml))
    tracker.info(
        f"run dir {run_dir} | algo {cfg.algo.name} | model {cfg.model.name} "
        f"({f'LoRA r={cfg.model.lora.r}' if policy.lora else 'full'}) | "
        f"{cfg.trainer.num_prompts} prompts x {cfg.sampler.n} samples | {len(c.task.eval_problems)} eval problems"
    )
    last: dict[str, float] = {}
    step = 0
    try:
        if cfg.trainer.eval_at_start:
            last = evaluate(c.sampler, tok, c.task.eval_problems, cfg)
            tracker.log_step(0, last)
        for step in range(1, cfg.trainer.steps + 1):
            last = train_step(step, c, cfg)
            every = cfg.trainer.eval_every
            if step == cfg.trainer.steps or (every > 0 and step % every == 0):
                t0 = time.perf_counter()
                last.update(evaluate(c.sampler, tok, c.task.eval_problems, cfg))
                last["time/eval_s"] = time.perf_counter() - t0
            tracker.log_step(step, last)
            if cfg.trainer.save_every > 0 and step % cfg.trainer.save_every == 0 and step < cfg.trainer.steps:
                save_checkpoint(run_dir, step, policy, {"metrics": last})
    except BaseException:
        if step > 1:  # keep the work done so far
            path = save_checkpoint(run_dir, step - 1, policy, {"interrupted": True})
            tracker.info(f"stopped at step {step}; saved {path}")
        tracker.close()
        raise
    path = save_checkpoint(run_dir, cfg.trainer.steps, policy, {"metrics": last})
    tracker.info(f"done: final checkpoint {path}")
    tracker.close()
    return last


def train_step(step: int, c: Components, cfg: Any) -> dict[str, float]:
    """One iteration (``step`` counts from 1); returns its metrics."""
    t_start = time.perf_counter()
    policy, sampler = c.policy, c.sampler
    policy.model.eval()
    rollout = collect_rollout(sampler, policy.tokenizer, c.task.batch(step - 1, cfg.trainer.num_prompts), cfg)
    metrics = dict(rollout.metrics)
    metrics.update(prepare_batch(policy, rollout.batch, cfg))
    policy.model.train()
    t0 = time.perf_counter()
    metrics.update(update_policy(policy, c.optimizer, c.scheduler, rollout.batch, cfg, c.shuffle))
    t1 = time.perf_counter()
    sampler.load_weights(policy.sampler_weights())
    t2 = time.perf_counter()
    metrics["time/update_s"] = t1 - t0
    metrics["time/sync_s"] = t2 - t1
    metrics["time/step_s"] = t2 - t_start
    return metrics


def _quiet_libraries() -> None:
    """Our own progress bar is the one users should see."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


def _as_dict(resolved_yaml: str | None) -> dict:
    if not resolved_yaml:
        return {}
    import yaml

    return json.loads(json.dumps(yaml.safe_load(resolved_yaml)))
