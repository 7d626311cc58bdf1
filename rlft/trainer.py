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
from torch import Tensor

from rlft import checkpoint as ckpt
from rlft import failure, run_state
from rlft.algorithms import ADV_ESTIMATORS, KL_ESTIMATORS, AdvantageInputs, masked_mean
from rlft.algorithms.advantages import informative_groups, ppo_token_rewards, soft_overlong_penalty
from rlft.algorithms.kl_control import adaptive_kl_coef, penalty_beta_update
from rlft.batch import RolloutBatch, pack
from rlft.data import Problem, build_task
from rlft.data.chat import prompt_ids
from rlft.evaluation import evaluate
from rlft.learner import batch_logprobs, batch_values, build_optimizer, update_policy
from rlft.models import Policy, build_policy
from rlft.models.critic import Critic, build_critic
from rlft.models.device import resolve_device
from rlft.models.loading import quiet_libraries
from rlft.models.precision import Precision
from rlft.models.precision import resolve as resolve_precision
from rlft.plots import plot_run
from rlft.rewards import resolve_reward, score_samples
from rlft.rewards.calls import call_policy
from rlft.rewards.registry import Sample
from rlft.rollout import Generations, Sampler, SamplingParams, build_sampler, sync_sampler
from rlft.tracking import Tracker, keep_metrics_through


@dataclass
class Components:
    """Everything a training step needs, built once per run."""

    task: Any
    policy: Policy
    sampler: Sampler
    optimizer: torch.optim.Optimizer
    scheduler: Any
    shuffle: torch.Generator
    state: AlgoState
    precision: Precision
    device: torch.device
    critic: Critic | None = None
    cursor: int = 0
    """Training batches drawn so far (dynamic sampling draws several per step)."""


def build_components(cfg: Any, dtype: str | None = None) -> Components:
    """Seed, then build the task, policy, sampler and optimizer named by ``cfg``, on ``trainer.device``.

    ``model.dtype=auto`` is resolved here (and written back into ``cfg.model.dtype``), unless
    ``dtype`` gives the one a resumed checkpoint was trained in.
    """
    if cfg.trainer.threads > 0:
        torch.set_num_threads(cfg.trainer.threads)
    device = resolve_device(cfg.trainer.device)
    precision = (Precision(dtype, f"model.dtype={dtype}, as in the checkpoint") if dtype
                 else resolve_precision(cfg.model, device.type))
    cfg.model.dtype = precision.dtype
    quiet_libraries()
    seed_everything(cfg.seed)
    task = build_task(cfg.data, cfg.seed)
    for name in cfg.reward.fns:  # fail on a bad reward name before loading the model
        resolve_reward(name)
    a = cfg.algo
    policy, sampler_model = build_policy(cfg.model, cfg.seed, need_reference=a.needs_reference, device=device)
    sampler = build_sampler(cfg.sampler, cfg.model, sampler_model, policy.tokenizer, cfg.seed, device)
    del sampler_model  # the hf sampler holds it; vllm loaded its own
    critic = build_critic(policy, cfg.model, cfg.seed) if a.uses_critic else None
    total_updates = cfg.trainer.steps * a.ppo_epochs * a.num_mini_batches
    optimizer, scheduler = build_optimizer(policy, cfg, total_updates, critic)
    state = AlgoState(penalty_beta=a.penalty_beta, kl_coef=a.kl_reward_coef)
    shuffle = torch.Generator().manual_seed(cfg.seed)
    return Components(task, policy, sampler, optimizer, scheduler, shuffle, state, precision, device, critic)


@dataclass
class Rollout:
    """A scored rollout ready for advantages (None batch: nothing to train on) and its metrics."""

    batch: RolloutBatch | None
    metrics: dict[str, float]


@dataclass
class AlgoState:
    """Coefficients adapted during training (saved with checkpoints)."""

    penalty_beta: float
    kl_coef: float


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def sampling_params(cfg: Any, cursor: int) -> SamplingParams:
    """The rollout's sampling settings; the seed depends only on the run seed and the data position."""
    s = cfg.sampler
    return SamplingParams(
        n=s.n, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_new_tokens=s.max_new_tokens,
        seed=(cfg.seed * 1_000_003 + cursor) % 2**31,
    )


@dataclass
class _Round:
    prompts: list[list[int]]
    gens: Generations
    task_scores: Tensor
    scores: Tensor
    per_fn: dict[str, list[float]]
    generate_s: float
    reward_s: float


def _sample_round(sampler: Sampler, tokenizer: Any, problems: list[Problem], cfg: Any, cursor: int) -> _Round:
    prompts = [prompt_ids(tokenizer, p.prompt, cfg.data.system_prompt) for p in problems]
    t0 = time.perf_counter()
    gens = sampler.generate(prompts, sampling_params(cfg, cursor))
    t1 = time.perf_counter()
    texts = tokenizer.batch_decode(gens.completion_ids, skip_special_tokens=True)
    samples = [
        Sample(problems[i].prompt, text, problems[i].answer, len(ids), cut)
        for i, text, ids, cut in zip(gens.prompt_index, texts, gens.completion_ids, gens.truncated)
    ]
    totals, per_fn = score_samples(cfg.reward.fns, cfg.reward.weights, samples, cfg.sampler.max_new_tokens,
                                   call_policy(cfg.reward))
    task_scores = torch.tensor(totals, dtype=torch.float32)
    scores = task_scores
    a = cfg.algo
    if a.overlong_penalty:
        lengths = torch.tensor([len(c) for c in gens.completion_ids])
        penalty = soft_overlong_penalty(lengths, cfg.sampler.max_new_tokens, a.overlong_cache)
        scores = task_scores + a.overlong_penalty_factor * penalty
        per_fn["overlong_penalty"] = penalty.tolist()
    return _Round(prompts, gens, task_scores, scores, per_fn, t1 - t0, time.perf_counter() - t1)


def collect_rollout(c: Components, cfg: Any) -> Rollout:
    """Sample groups, score them, and (DAPO) keep only informative groups, sampling more rounds
    until ``trainer.num_prompts`` groups are kept or ``algo.max_sampling_rounds`` is reached."""
    a, want = cfg.algo, cfg.trainer.num_prompts
    rows: list[tuple[list[int], list[int], bool, float, int, list[float] | None]] = []
    seen: list[_Round] = []
    kept = 0
    while True:
        problems = c.task.batch(c.cursor, want)
        r = _sample_round(c.sampler, c.policy.tokenizer, problems, cfg, c.cursor)
        c.cursor += 1
        seen.append(r)
        group_ids = torch.tensor(r.gens.prompt_index)
        groups = informative_groups(r.task_scores, group_ids) if a.dynamic_sampling else torch.unique(group_ids)
        for g in groups.tolist():
            if kept == want:
                break
            for j in (group_ids == g).nonzero().squeeze(-1).tolist():
                lp = r.gens.logprobs[j] if r.gens.logprobs is not None else None
                rows.append((r.prompts[g], r.gens.completion_ids[j], r.gens.truncated[j], float(r.scores[j]), kept, lp))
            kept += 1
        if not a.dynamic_sampling or kept == want or len(seen) >= a.max_sampling_rounds:
            break
    metrics = _rollout_metrics(seen)
    if a.dynamic_sampling:
        sampled = len(seen) * want
        metrics.update({"dynamic/rounds": float(len(seen)), "dynamic/kept_frac": float(kept) / sampled,
                        "dynamic/groups": float(kept)})
    if not rows:
        return Rollout(None, metrics)
    prompts, comps, cut, scores, gid, lps = (list(x) for x in zip(*rows))
    input_ids, start, length, mask = pack(prompts, comps, c.policy.tokenizer.pad_token_id)
    batch = RolloutBatch(
        input_ids, start, length, mask, torch.tensor(gid), torch.tensor(scores, dtype=torch.float32),
        torch.tensor(cut, dtype=torch.bool),
    )
    if all(lp is not None for lp in lps) and untruncated(cfg.sampler):
        batch.sampler_logp = torch.zeros_like(mask)
        for i, lp in enumerate(lps):
            batch.sampler_logp[i, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
    return Rollout(batch.to(c.device), metrics)


def untruncated(s: Any) -> bool:
    """Sampling from the full softmax: only then do the sampler's log-probs (vLLM reports them after
    top-p/top-k, renormalised over the kept tokens) compare with the learner's over the whole vocabulary."""
    return s.top_p >= 1.0 and s.top_k <= 0


def _rollout_metrics(rounds: list[_Round]) -> dict[str, float]:
    """Over every completion sampled this step (kept or not)."""
    scores = torch.cat([r.scores for r in rounds])
    lengths = [len(x) for r in rounds for x in r.gens.completion_ids]
    tokens = float(sum(lengths))
    out = {
        "reward/mean": float(scores.mean()),
        "reward/std": float(scores.std()) if scores.numel() > 1 else 0.0,
        "tokens/generated": tokens,
        "response/mean_length": tokens / len(lengths),
        "response/truncated_frac": float(np.mean([t for r in rounds for t in r.gens.truncated])),
        "time/generate_s": sum(r.generate_s for r in rounds),
        "time/reward_s": sum(r.reward_s for r in rounds),
        "throughput/tokens_per_s": tokens / max(sum(r.generate_s for r in rounds), 1e-9),
    }
    for name in rounds[0].per_fn:
        out[f"reward/{name}"] = float(np.mean([v for r in rounds for v in r.per_fn[name]]))
    return out


def prepare_batch(c: Components, batch: RolloutBatch, cfg: Any) -> dict[str, float]:
    """Mask, old/reference log-probs and values (only what the algorithm needs), and advantages."""
    a, temp, micro = cfg.algo, cfg.sampler.temperature, cfg.trainer.micro_batch_size
    policy = c.policy
    t0 = time.perf_counter()
    if a.overlong_filter:
        batch.response_mask = batch.response_mask * (~batch.truncated).float()[:, None]
    # With a single update per rollout the ratio is exp(logp - logp.detach()): no old pass needed.
    if a.ppo_epochs > 1 or a.num_mini_batches > 1 or a.uses_critic:
        batch.old_logp = batch_logprobs(policy, policy.model, batch, temp, micro)
    if a.needs_reference:
        with policy.reference() as ref:
            batch.ref_logp = batch_logprobs(policy, ref, batch, temp, micro)
    token_rewards = None
    if c.critic is not None:
        batch.values = batch_values(policy, c.critic, batch, micro)
        token_rewards = ppo_token_rewards(batch.scores, batch.old_logp, batch.ref_logp, batch.response_mask,
                                          c.state.kl_coef)
    t1 = time.perf_counter()
    inputs = AdvantageInputs(batch.scores, batch.response_mask, batch.group_ids, token_rewards, batch.values)
    batch.advantages, batch.returns = ADV_ESTIMATORS.get(a.adv_estimator)(inputs, a)
    mask = batch.response_mask.bool()
    adv_tokens = batch.advantages[mask]
    out = {
        "time/logprob_s": t1 - t0,
        "adv/mean": float(adv_tokens.mean()) if adv_tokens.numel() else 0.0,
        "adv/std": float(adv_tokens.std()) if adv_tokens.numel() > 1 else 0.0,
        "response/loss_tokens": float(batch.response_mask.sum()),
    }
    if batch.ref_logp is not None and batch.old_logp is not None:
        seq_kl = ((batch.old_logp - batch.ref_logp) * batch.response_mask).sum(1)
        out["kl/seq_ref"] = float(seq_kl.mean())
    if batch.values is not None:
        out["value/explained_var"] = explained_variance(batch.values, batch.returns, batch.response_mask)
    return out


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 - Var(R - V) / Var(R) over the masked tokens (1: perfect critic, <= 0: no better than a constant)."""
    m = mask.bool()
    var_r = returns[m].var()
    if m.sum() < 2 or var_r == 0:
        return 0.0
    return float(1.0 - (returns[m] - values[m]).var() / var_r)


def adapt_coefficients(c: Components, batch: RolloutBatch, cfg: Any, metrics: dict[str, float]) -> None:
    """After an update: PPO-Penalty's beta from the new KL(old || new), and the adaptive in-reward KL coef."""
    a = cfg.algo
    if a.policy_loss == "kl_penalty":
        new_logp = batch_logprobs(c.policy, c.policy.model, batch, cfg.sampler.temperature,
                                  cfg.trainer.micro_batch_size)
        kl = float(masked_mean(KL_ESTIMATORS.get("k3")(batch.old_logp, new_logp), batch.response_mask))
        metrics["penalty_kl_after"] = kl
        c.state.penalty_beta = penalty_beta_update(c.state.penalty_beta, kl, a.penalty_target_kl)
    if a.uses_critic and a.kl_ctrl == "adaptive" and "kl/seq_ref" in metrics:
        c.state.kl_coef = adaptive_kl_coef(c.state.kl_coef, metrics["kl/seq_ref"], a.kl_target, batch.size,
                                           a.kl_horizon)


def train(cfg: Any, run_dir: Path, resolved_yaml: str | None = None) -> dict[str, float]:
    """Run a full training job (or continue one, per ``trainer.resume``); returns the last step's metrics."""
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved_yaml = resolved_yaml if resolved_yaml is not None else _to_yaml(cfg)
    resume = ckpt.resolve(cfg.trainer.resume, run_dir)
    harmless = run_state.check_compatible(resume, resolved_yaml) if resume is not None else []
    if resume is None:
        _check_fresh(run_dir, cfg.trainer.resume)
        keep_metrics_through(run_dir / "metrics.jsonl", -1)
    (run_dir / "config.yaml").write_text(resolved_yaml)
    c = build_components(cfg, run_state.trained_dtype(resume) if resume else None)
    start, last = 0, {}
    if resume is not None:
        saved = run_state.restore(c, resume)
        start, last = int(saved["step"]), saved.get("metrics", {})
        sync_sampler(c.sampler, c.policy)
        keep_metrics_through(run_dir / "metrics.jsonl", start, resume.parent.parent / "metrics.jsonl")
    tracker = Tracker(run_dir, cfg, cfg.trainer.steps, cfg.logger.console, _as_dict(resolved_yaml), start)
    _announce(tracker, c, cfg, run_dir, resume, harmless)
    saved_step = start if resume is not None else -1
    done, snap = start, None
    with failure.GracefulStop(tracker) as stop:
        try:
            if cfg.trainer.eval_at_start and resume is None and c.task.eval_problems:
                last = evaluate(c.sampler, c.policy.tokenizer, c.task.eval_problems, cfg)
                tracker.log_step(0, last)
            t_start = time.perf_counter()
            for step in range(start + 1, cfg.trainer.steps + 1):
                snap = failure.capture(c)
                last = train_step(step, c, cfg)
                budget_over = 0 < cfg.trainer.max_minutes * 60 < time.perf_counter() - t_start
                _maybe_evaluate(step, c, cfg, last, force=budget_over)
                tracker.log_step(step, last)
                done, snap = step, None
                every = cfg.trainer.save_every
                if step < cfg.trainer.steps and (stop.requested or (every > 0 and step % every == 0)):
                    run_state.save(c, run_dir, step, resolved_yaml, cfg.trainer.keep_last, last)
                    saved_step = step
                if stop.requested and step < cfg.trainer.steps:
                    tracker.info(f"stopped by a signal after step {step}; saved it")
                    raise KeyboardInterrupt
                if budget_over:
                    tracker.info(f"time budget of {cfg.trainer.max_minutes:g} min reached after step {step}")
                    break
        except BaseException:
            _save_on_failure(c, run_dir, resolved_yaml, cfg, tracker, done, saved_step, snap)
            tracker.close()
            raise
    path = run_state.save(c, run_dir, done, resolved_yaml, cfg.trainer.keep_last, last) if done > start else resume
    tracker.info(f"done: final checkpoint {path}")
    tracker.close()
    plot_run(run_dir)
    return last


def _check_fresh(run_dir: Path, spec: str) -> None:
    """A fresh start must not bury an earlier run's checkpoints under new ones."""
    found = ckpt.latest_checkpoint(run_dir)
    if found is not None and spec != "auto":
        raise ckpt.CheckpointError(
            f"{run_dir} already holds checkpoints (newest: {found.name}): pass trainer.resume=auto to continue "
            "that run, or choose another hydra.run.dir"
        )


def _maybe_evaluate(step: int, c: Components, cfg: Any, metrics: dict[str, float], force: bool = False) -> None:
    every = cfg.trainer.eval_every
    if not c.task.eval_problems:
        return
    if force or step == cfg.trainer.steps or (every > 0 and step % every == 0):
        t0 = time.perf_counter()
        metrics.update(evaluate(c.sampler, c.policy.tokenizer, c.task.eval_problems, cfg))
        metrics["time/eval_s"] = time.perf_counter() - t0


def _announce(tracker: Tracker, c: Components, cfg: Any, run_dir: Path, resume: Path | None,
              harmless: list[str]) -> None:
    tracker.info(
        f"run dir {run_dir} | algo {cfg.algo.name} | model {cfg.model.name} "
        f"({f'LoRA r={cfg.model.lora.r}' if c.policy.lora else 'full'}) | "
        f"{cfg.trainer.num_prompts} prompts x {cfg.sampler.n} samples | {len(c.task.eval_problems)} eval problems"
    )
    tracker.info(f"learner on {c.device} | {c.precision.reason}")
    if not c.task.eval_problems:
        why = "data.num_eval=0" if cfg.data.num_eval == 0 else "the data leaves no held-out rows (set data.eval_path)"
        tracker.info(f"evaluation skipped: no held-out problems ({why})")
    if resume is not None:
        tracker.info(f"resumed from {resume}" + (f" (changed: {'; '.join(harmless)})" if harmless else ""))


def _save_on_failure(c: Components, run_dir: Path, resolved_yaml: str, cfg: Any, tracker: Tracker, done: int,
                     saved_step: int, snap: failure.Snapshot | None) -> None:
    """Keep the work done so far when a run stops on an error or an abort.

    A step that did not complete (``snap`` is its starting state) is rolled back, so the saved
    state is that of the last logged step, whatever the step was doing when it failed.
    """
    if done <= saved_step or done == 0:
        return
    try:
        if snap is not None:
            failure.restore(c, snap)
        path = run_state.save(c, run_dir, done, resolved_yaml, cfg.trainer.keep_last)
    except Exception as e:  # noqa: BLE001  (the original error is the one to report)
        tracker.info(f"stopped after step {done} but could not save it ({type(e).__name__}: {e}); "
                     f"resume from step {saved_step}")
        return
    tracker.info(f"stopped after step {done}; saved {path} (resume with trainer.resume=auto)")


def train_step(step: int, c: Components, cfg: Any) -> dict[str, float]:
    """One iteration (``step`` counts from 1); returns its metrics."""
    t_start = time.perf_counter()
    c.policy.model.eval()
    rollout = collect_rollout(c, cfg)
    if hasattr(c.sampler, "sleep"):
        c.sampler.sleep()  # GPU: give the engine's memory to the learner until the next sync
    metrics = dict(rollout.metrics)
    if rollout.batch is None:  # dynamic sampling found no informative group within its cap
        metrics["update/skipped"] = 1.0
        metrics["time/step_s"] = time.perf_counter() - t_start
        return metrics
    metrics.update(prepare_batch(c, rollout.batch, cfg))
    c.policy.model.train()
    t0 = time.perf_counter()
    metrics.update(update_policy(c.policy, c.optimizer, c.scheduler, rollout.batch, cfg, c.shuffle, c.critic,
                                 c.state.penalty_beta))
    moved = metrics["update/skipped"] == 0.0  # no loss token anywhere: the weights were left alone
    if moved:
        adapt_coefficients(c, rollout.batch, cfg, metrics)
    t1 = time.perf_counter()
    if moved:
        sync_sampler(c.sampler, c.policy)
    t2 = time.perf_counter()
    metrics["penalty_beta"] = c.state.penalty_beta
    metrics["kl_coef"] = c.state.kl_coef
    metrics["time/update_s"] = t1 - t0
    metrics["time/sync_s"] = t2 - t1
    metrics["time/step_s"] = t2 - t_start
    return metrics


def _to_yaml(cfg: Any) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def _as_dict(resolved_yaml: str | None) -> dict:
    if not resolved_yaml:
        return {}
    import yaml

    return json.loads(json.dumps(yaml.safe_load(resolved_yaml)))
