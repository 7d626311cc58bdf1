"""What a run trains with: the task, policy, sampler, optimizer and the state they carry from step to step.

:func:`build_components` builds them once per run; the training loop (:mod:`rlft.training.loop`), rollout
collection (:mod:`rlft.training.rollout`), batch preparation (:mod:`rlft.training.prepare`), checkpoints
(:mod:`rlft.state.run_state`) and rollback (:mod:`rlft.state.failure`) take them as one :class:`Components`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rlft.data import Task, build_task
from rlft.data.chat import drop_long_prompts, prompt_room
from rlft.episodes.setup import EpisodeSetup, check_episodes, episode_setup, prompt_overhead
from rlft.errors import ConfigError
from rlft.models import Policy, build_policy
from rlft.models.critic import Critic, build_critic
from rlft.models.device import resolve_device
from rlft.models.loading import quiet_libraries
from rlft.models.precision import Precision
from rlft.models.precision import resolve as resolve_precision
from rlft.parallel.distributed import SINGLE, DataParallel, local_rank
from rlft.parallel.fsdp import shard_decoder
from rlft.rewards import resolve_reward
from rlft.rewards.judges import check_judge_model
from rlft.rewards.models import check_reward_model
from rlft.rewards.normalize import RunningMoments
from rlft.rewards.scorer import Scorer, build_scorers, gold_name
from rlft.samplers import Sampler, build_sampler, check_mergeable
from rlft.sync.verify import SyncCheck, build_check
from rlft.training.optimizer import build_optimizer

if TYPE_CHECKING:
    from rlft.config.schemas import Config


@dataclass
class Components:
    """Everything a training step needs, built once per run."""

    task: Task
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
    scorers: list[Scorer] = field(default_factory=list)
    """What the reward is the weighted sum of: reward.fns, then reward.models, then reward.judges (loaded once)."""
    gold: Scorer | None = None
    """reward.gold's checker, logged beside the learned scorers and never in the reward (None: off)."""
    episodes: EpisodeSetup | None = None
    """Multi-turn episodes' environment and limits (None: one reply per episode)."""
    sync_check: SyncCheck | None = None
    """What checks each weight sync (rlft.sync.verify; None: no check)."""


def build_components(cfg: Config, dtype: str | None = None, dp: DataParallel = SINGLE) -> Components:
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
    quiet_libraries(keep_warnings=True)  # to train.log (rlft.output.console)
    seed_everything(cfg.seed)
    task = build_task(cfg.data, cfg.seed)
    a = cfg.algo
    policy, sampler_model = build_policy(cfg.model, cfg.seed, need_reference=a.needs_reference, device=device)
    episodes = episode_setup(cfg)
    try:
        if episodes is not None:  # before any sampling: a template the episodes cannot use stops the run here
            episodes.check_template(policy.tokenizer, task, cfg.data)
        task, _, _ = drop_long_prompts(task, policy.tokenizer, cfg.data, prompt_room(cfg.sampler),  # counts: task.dropped
                                       prompt_overhead(episodes, policy.tokenizer, task, cfg.data))
        sampler = build_sampler(cfg.sampler, cfg.model, sampler_model, policy.tokenizer, cfg.seed, device)
        del sampler_model  # the hf sampler holds it; vllm loaded its own
        check_mergeable(policy, sampler)
        critic = build_critic(policy, cfg.model, cfg.seed) if a.uses_critic else None
        # Loading reward models and judges may draw random numbers (weights it initialises, model=tiny's seed):
        # the run's random stream stays as without them.
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            scorers, gold = build_scorers(cfg, device, precision.dtype)
        if cfg.trainer.strategy == "fsdp2":
            shard_decoder(policy.model, device, dp)
        total_updates = cfg.trainer.steps * a.ppo_epochs * a.num_mini_batches
        optimizer, scheduler = build_optimizer(policy, cfg, total_updates, critic)
        state = AlgoState(penalty_beta=a.penalty_beta, kl_coef=a.kl_reward_coef)
        shuffle = torch.Generator().manual_seed(cfg.seed)
        return Components(task, policy, sampler, optimizer, scheduler, shuffle, state, precision, device, critic, dp=dp,
                          scorers=scorers, gold=gold, episodes=episodes,
                          sync_check=build_check(cfg, policy, sampler, task))
    except BaseException:  # its worker processes end with the failed start
        if episodes is not None:
            episodes.close()
        raise


def preflight(cfg: Config, world: int) -> None:
    """The cheap checks of a run on ``world`` ranks, before any model loads (trainer.nproc's launcher
    makes them before starting the ranks, which would each report the same error).

    Raises:
        ConfigError: saying what to change (RewardNameError for a reward that does not resolve).
        RewardError: importing a user's reward module raised.
        ModelError: a reward model or judge path that is not the right kind of model.
    """
    for name in [*cfg.reward.fns, *filter(None, [gold_name(cfg)])]:
        resolve_reward(name)
    check_episodes(cfg)  # an episode.env or a tool that does not import
    for m in cfg.reward.models:
        check_reward_model(m)
    for i, j in enumerate(cfg.reward.judges):
        check_judge_model(j.model, f"reward.judges[{i}].model")
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
    reward_moments: RunningMoments = field(default_factory=RunningMoments)
    """Running statistics of the total reward (``reward.normalize``)."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
