"""The training loop: sample -> score -> learn -> sync -> log -> save.

What it trains with is built in :mod:`rlft.training.components`. Rollout collection lives in
:mod:`rlft.training.rollout`, the batch preparation between rollout and update in :mod:`rlft.training.prepare`,
stopping and rollback in :mod:`rlft.state.failure`. Under torchrun every rank runs this loop; what
differs by rank is where its output goes (:mod:`rlft.output.writer`: rank 0 logs and writes, the others
only take part in the collectives).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from rlft.output.writer import Outputs
from rlft.parallel.distributed import DataParallel, from_environment
from rlft.rewards.scorer import eval_reward
from rlft.samplers import sync_sampler
from rlft.state import checkpoint as ckpt
from rlft.state import failure, resume_rules, run_state
from rlft.sync.verify import verify
from rlft.training.components import Components, build_components
from rlft.training.evaluation import evaluate
from rlft.training.learner import learn
from rlft.training.rollout import collect_rollout

if TYPE_CHECKING:
    from rlft.config.schemas import Config


def train(cfg: Config, run_dir: Path, resolved_yaml: str | None = None) -> dict[str, float]:
    """Run a full training job (or continue one, per ``trainer.resume``); returns the last step's metrics.

    Under torchrun (WORLD_SIZE > 1) every rank calls this with the same ``run_dir``.
    """
    dp = from_environment()
    dp.set_timeout(cfg.trainer.dist_timeout_s)
    resolved_yaml = resolved_yaml if resolved_yaml is not None else _to_yaml(cfg)
    resume = ckpt.resolve(cfg.trainer.resume, run_dir)
    harmless = resume_rules.check_compatible(resume, resolved_yaml, dp.world) if resume is not None else []
    if resume is None:
        ckpt.check_fresh(run_dir, cfg.trainer.resume)
    c = build_components(cfg, resume_rules.trained_dtype(resume) if resume else None, dp)
    try:
        return _run(c, cfg, run_dir, resolved_yaml, resume, harmless, dp)
    finally:  # each job of a sweep (one process) ends with its worker processes
        if c.episodes is not None:
            c.episodes.close()


def _run(c: Components, cfg: Config, run_dir: Path, resolved_yaml: str, resume: Path | None, harmless: list[str],
         dp: DataParallel) -> dict[str, float]:
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
            # The sampler's weights were set apart from the learner's (loaded from the model's files, or the
            # checkpoint's pushed in): check them before the first rollout.
            checked = verify(c.sync_check, c.sampler, c.policy, dp, "after the resume" if resume else "at start-up",
                             _warner(out))
            if cfg.trainer.eval_at_start and resume is None and _evaluates(c, cfg):
                last = evaluate(c.sampler, c.policy.tokenizer, c.task.eval_problems, cfg, dp, c.episodes)
                out.log_step(0, {**last, **checked})
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


def _maybe_evaluate(step: int, c: Components, cfg: Config, metrics: dict[str, float], force: bool = False) -> None:
    every = cfg.trainer.eval_every
    if not _evaluates(c, cfg):
        return
    if force or step == cfg.trainer.steps or (every > 0 and step % every == 0):
        t0 = time.perf_counter()
        metrics.update(evaluate(c.sampler, c.policy.tokenizer, c.task.eval_problems, cfg, c.dp, c.episodes))
        metrics["time/eval_s"] = time.perf_counter() - t0


def _evaluates(c: Components, cfg: Config) -> bool:
    """Held-out problems, and a rule-based reward to judge them by."""
    return bool(c.task.eval_problems) and eval_reward(cfg) is not None


def _announce(out: Outputs, c: Components, cfg: Config, run_dir: Path, resume: Path | None,
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
    out.info("reward: " + " + ".join(s.describe() for s in c.scorers) + (f" | gold: {c.gold.name}" if c.gold else ""))
    for note in (n for s in c.scorers for n in getattr(s, "notes", [])):
        out.info(note)
    if not c.task.eval_problems:
        why = "data.num_eval=0" if cfg.data.num_eval == 0 else "the data leaves no held-out rows (set data.eval_path)"
        out.info(f"evaluation skipped: no held-out problems ({why})")
    elif eval_reward(cfg) is None:
        out.info("evaluation skipped: no rule-based reward to judge correctness (set reward.gold=FN)")
    if c.episodes is not None and c.episodes.workers:
        out.info(c.episodes.workers)
    if resume is not None:
        out.info(f"resumed from {resume}" + (f" (changed: {'; '.join(harmless)})" if harmless else ""))


def train_step(step: int, c: Components, cfg: Config, out: Outputs | None = None) -> dict[str, float]:
    """One iteration (``step`` counts from 1); returns its metrics (over all ranks)."""
    t_start = time.perf_counter()
    c.policy.model.eval()
    rollout = collect_rollout(c, cfg, c.dp, out.episodes if out is not None else None)
    if out is not None:
        out.log_rollout(step, rollout.rows)
    c.sampler.sleep()  # GPU: give the engine's memory to the learner until the next sync
    metrics = dict(rollout.metrics)
    if rollout.batch is None:  # dynamic sampling found no informative group within its cap
        metrics["update/skipped"] = 1.0
        metrics["time/step_s"] = time.perf_counter() - t_start
        return metrics
    metrics.update(learn(c, rollout.batch, cfg))
    moved = metrics["update/skipped"] == 0.0  # no loss token anywhere: the weights were left alone
    t1 = time.perf_counter()
    if moved:
        sync_sampler(c.sampler, c.policy)
    t2 = time.perf_counter()
    if moved:
        metrics.update(verify(c.sync_check, c.sampler, c.policy, c.dp, f"after the step {step} sync", _warner(out)))
    metrics["penalty_beta"] = c.state.penalty_beta
    metrics["kl_coef"] = c.state.kl_coef
    metrics["time/sync_s"] = t2 - t1
    metrics["time/step_s"] = time.perf_counter() - t_start
    return metrics


def _warner(out: Outputs | None) -> Callable[[str], None] | None:
    """Where a sync check under sampler.sync_check=warn reports (None: stderr)."""
    return (lambda message: out.info(f"warning: {message}")) if out is not None else None


def _to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
