"""What a run's episodes are made of (``episode.*``, ``tools``), built once at start-up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlft.config.validation import resolve_sampler_name
from rlft.episodes.env import load_env
from rlft.episodes.run import Limits

if TYPE_CHECKING:
    from rlft.config.schemas import Config
    from rlft.data import Problem


@dataclass(frozen=True)
class EpisodeSetup:
    env_class: Any
    """Called with a problem, it gives that episode's environment."""
    name: str
    """How errors name the environment (``episode.env=...``)."""
    limits: Limits

    def make(self, problem: Problem) -> Any:
        return self.env_class(problem)


def episode_setup(cfg: Config) -> EpisodeSetup | None:
    """The run's episodes; None when each episode is one reply (no ``episode.env``)."""
    e = cfg.episode
    if not e.env:
        return None
    max_tokens = e.max_tokens or 2**62
    context = cfg.sampler.vllm.max_model_len if resolve_sampler_name(cfg.sampler.name) == "vllm" else None
    return EpisodeSetup(load_env(e.env), f"episode.env={e.env}", Limits(e.max_turns, max_tokens, context))


def policy_budget(cfg: Config) -> int:
    """The most tokens the policy can write in an episode (DAPO's overlong punishment's L_max)."""
    return cfg.sampler.max_new_tokens * (cfg.episode.max_turns if cfg.episode.env else 1)
