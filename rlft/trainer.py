"""The training loop: sample -> score -> learn -> sync -> log -> save.

Rollout collection lives in :mod:`rlft.rollout`, the batch preparation between rollout and
update in :mod:`rlft.prepare`, stopping and rollback in :mod:`rlft.failure`. Under torchrun
every rank runs this loop; what differs by rank is where its output goes (:mod:`rlft.outputs`:
rank 0 logs and writes, the others only take part in the collectives).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlft import checkpoint as ckpt
from rlft import failure, run_state
from rlft.config import ConfigError
from rlft.data import build_task
from rlft.data.chat import drop_long_prompts, prompt_room
from rlft.distributed import SINGLE, DataParallel, from_environment, local_rank
from rlft.evaluation import evaluate
from rlft.learner import build_optimizer, update_policy
from rlft.models import Policy, build_policy
from rlft.models.critic import Critic, build_critic
from rlft.models.device import resolve_device
from rlft.models.loading import quiet_libraries
from rlft.models.precision import Precision
from rlft.models.precision import resolve as resolve_precision
from rlft.outputs import Outputs
from rlft.prepare import adapt_coefficients, prepare_batch
from rlft.rewards import resolve_reward
from rlft.rollout import collect_rollout
from rlft.samplers import Sampler, build_sampler, sync_sampler
from rlft.sharding import shard_decoder


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
    dp: DataParallel = field(default=SINGLE)
    """This process's place among the data-parallel ranks."""


def build_components(cfg: Any, dtype: str | None = None, dp: DataParallel = SINGLE) -> Components:
    """Seed, then build the task, policy, sampler and optimizer named by ``cfg``, on ``trainer.device``
    (under torchrun: each rank's own GPU). Every rank builds the same initial weights (same seed).

    ``model.dtype=auto`` is resolved here (and written back into ``cfg.model.dtype``), unless
    ``dtype`` gives the one a resumed checkpoint was trained in.
    """
    if cfg.trainer.threads > 0:
        torch.set_num_threads(cfg.trainer.threads)
    preflight(cfg, dp.world)
    device = resolve_device(cfg.trainer.device, local_rank() if dp.active else None)
    # Rank 0 decides (auto times GEMMs, which ranks sharing the cores would each time differently).
    precision = dp.broadcast((Precision(dtype, f"model.dtype={dtype}, as in the checkpoint") if dtype
                              else resolve_precision(cfg.model, device.type)) if dp.main else None)
    cfg.model.dtype = precision.dtype
    quiet_libraries(keep_warnings=True)  # to train.log (rlft.console)
    seed_everything(cfg.seed)
    task = build_task(cfg.data, cfg.seed)
    a = cfg.algo
    policy, sampler_model = build_policy(cfg.model, cfg.seed, need_reference=a.needs_reference, device=device)
    task, _, _ = drop_long_prompts(task, policy.tokenizer, cfg.data, prompt_room(cfg.sampler))  # counts: task.dropped
    sampler = build_sampler(cfg.sampler, cfg.model, sampler_model, policy.tokenizer, cfg.seed, device)
    del sampler_model  # the hf sampler holds it; vllm loaded its own
    critic = build_critic(policy, cfg.model, cfg.seed) if a.uses_critic else None
    if cfg.trainer.strategy == "fsdp2":
        shard_decoder(policy.model, device, dp)
    total_updates = cfg.trainer.steps * a.ppo_epochs * a.num_mini_batches
    optimizer, scheduler = build_optimizer(policy, cfg, total_updates, critic)
    state = AlgoState(penalty_beta=a.penalty_beta, kl_coef=a.kl_reward_coef)
    shuffle = torch.Generator().manual_seed(cfg.seed)
    return Components(task, policy, sampler, optimizer, scheduler, shuffle, state, precision, device, critic, dp=dp)


def preflight(cfg: Any, world: int) -> None:
    """The cheap checks of a run on ``world`` ranks, before any model loads (trainer.nproc's launcher
    makes them before starting the ranks, which would each report the same error).

    Raises:
        ConfigError: saying what to change (RewardNameError for a reward that does not resolve).
        RewardError: importing a user's reward module raised.
    """
    for name in cfg.reward.fns:
        resolve_reward(name)
    if cfg.trainer.num_prompts % world:
        raise ConfigError(f"trainer.num_prompts={cfg.trainer.num_prompts} must be a multiple of the {world} ranks "
                          "(each rank samples whole groups)")
    if cfg.trainer.strategy == "fsdp2" and world == 1:
        raise ConfigError("trainer.strategy=fsdp2 shards the policy over data-parallel ranks, and this is one "
                          "process: start several (trainer.nproc=N or torchrun), or use trainer.strategy=ddp")
    if world > 1 and cfg.trainer.device.startswith("cuda:"):
        raise ConfigError(f"trainer.device={cfg.trainer.device} with several ranks would put every rank on one GPU; "
                          "use trainer.device=cuda (or auto): each rank takes cuda:LOCAL_RANK")


@dataclass
class AlgoState:
    """Coefficients adapted during training (saved with checkpoints)."""

    penalty_beta: float
    kl_coef: float


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train(cfg: Any, run_dir: Path, resolved_yaml: str | None = None) -> dict[str, float]:
    """Run a full training job (or continue one, per ``trainer.resume``); returns the last step's metrics.

    Under torchrun (WORLD_SIZE > 1) every rank calls this with the same ``run_dir``.
    """
    dp = from_environment()
    dp.set_timeout(cfg.trainer.dist_timeout_s)
    resolved_yaml = resolved_yaml if resolved_yaml is not None else _to_yaml(cfg)
    resume = ckpt.resolve(cfg.trainer.resume, run_dir)
    harmless = run_state.check_compatible(resume, resolved_yaml, dp.world) if resume is not None else []
    if resume is None:
        _check_fresh(run_dir, cfg.trainer.resume)
    c = build_components(cfg, run_state.trained_dtype(resume) if resume else None, dp)
    start, last = 0, {}
    if resume is not None:
        saved = run_state.restore(c, resume)
        start, last = int(saved["step"]), saved.get("metrics", {})
        sync_sampler(c.sampler, c.policy)
    out = Outputs.open(dp, run_dir, cfg, resolved_yaml, start, resume)
    _announce(out, c, cfg, run_dir, resume, harmless)
    saved_step = start if resume is not None else -1
    done, snap = start, failure.capture(c)
    with failure.GracefulStop(hold_on_error=dp.active, grace_s=cfg.trainer.stop_grace_s) as stop:
        try:
            if cfg.trainer.eval_at_start and resume is None and c.task.eval_problems:
                last = evaluate(c.sampler, c.policy.tokenizer, c.task.eval_problems, cfg, dp)
                out.log_step(0, last)
            t_start = time.perf_counter()
            for step in range(start + 1, cfg.trainer.steps + 1):
                last = train_step(step, c, cfg, out)
                budget_over = dp.any(0 < cfg.trainer.max_minutes * 60 < time.perf_counter() - t_start)
                _maybe_evaluate(step, c, cfg, last, force=budget_over)
                out.log_step(step, last)
                done, snap = step, failure.capture(c)
                stopping = dp.any(stop.requested) and step < cfg.trainer.steps
                if stopping:
                    stop.step_done()
                every = cfg.trainer.save_every
                if step < cfg.trainer.steps and (stopping or (every > 0 and step % every == 0)):
                    out.save(c, step, last)
                    saved_step = step
                if stopping:
                    out.info(f"stopped by a signal after step {step}; saved it")
                    raise KeyboardInterrupt
                if budget_over:
                    out.info(f"time budget of {cfg.trainer.max_minutes:g} min reached after step {step}")
                    break
        except BaseException:
            failure.save_on_failure(c, out, done, saved_step, snap)
            out.close()
            raise
    path = out.save(c, done, last) if done > start else resume
    out.info(f"done: final checkpoint {path}")
    out.close(finished=True)
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
        metrics.update(evaluate(c.sampler, c.policy.tokenizer, c.task.eval_problems, cfg, c.dp))
        metrics["time/eval_s"] = time.perf_counter() - t0


def _announce(out: Outputs, c: Components, cfg: Any, run_dir: Path, resume: Path | None,
              harmless: list[str]) -> None:
    out.info(
        f"run dir {run_dir} | algo {cfg.algo.name} | model {cfg.model.name} "
        f"({f'LoRA r={cfg.model.lora.r}' if c.policy.lora else 'full'}) | "
        f"{cfg.trainer.num_prompts} prompts x {cfg.sampler.n} samples | {len(c.task.eval_problems)} eval problems"
    )
    ranks = f" x {c.dp.world} ranks" if c.dp.active else ""
    out.info(f"learner on {c.device}{ranks} | {c.precision.reason}")
    dropped = getattr(c.task, "dropped", (0, 0))
    if any(dropped):
        out.info(f"dropped prompts longer than {c.task.dropped_by}: {dropped[0]} training, {dropped[1]} held-out")
    if not c.task.eval_problems:
        why = "data.num_eval=0" if cfg.data.num_eval == 0 else "the data leaves no held-out rows (set data.eval_path)"
        out.info(f"evaluation skipped: no held-out problems ({why})")
    if resume is not None:
        out.info(f"resumed from {resume}" + (f" (changed: {'; '.join(harmless)})" if harmless else ""))


def train_step(step: int, c: Components, cfg: Any, out: Outputs | None = None) -> dict[str, float]:
    """One iteration (``step`` counts from 1); returns its metrics (over all ranks)."""
    t_start = time.perf_counter()
    c.policy.model.eval()
    rollout = collect_rollout(c, cfg, c.dp)
    if out is not None:
        out.log_rollout(step, rollout.rows)
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
    metrics.update(update_policy(c, rollout.batch, cfg))
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
