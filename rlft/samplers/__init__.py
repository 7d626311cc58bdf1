"""Samplers: generate groups of completions from the current policy."""

from rlft.samplers.base import Generations, Sampler, SamplingParams, check_mergeable, sync_sampler
from rlft.samplers.build import build_sampler

__all__ = ["Generations", "Sampler", "SamplingParams", "build_sampler", "check_mergeable", "sync_sampler"]
