"""Samplers: generate groups of completions from the current policy."""

from rlft.samplers.base import Generations, Sampler, SamplingParams, build_sampler, sync_sampler

__all__ = ["Generations", "Sampler", "SamplingParams", "build_sampler", "sync_sampler"]
