"""Rollout collection: sample groups, score them, keep what the algorithm trains on.

Under data parallelism each rank samples and scores its share of the step's prompts (whole
groups). The rounds are then gathered, so every rank sees the step's whole rollout: dynamic
sampling's keep/stop decision and the metrics are computed from the same data on every rank,
as one process would, and each rank trains on a contiguous share of the kept groups. Sampling
seeds are per prompt (run seed, data position, prompt index), so the rollout is the same
whatever the world size.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from rlft.algorithms.advantages import informative_groups, soft_overlong_penalty
from rlft.config.validation import policy_budget
from rlft.data import Problem
from rlft.episodes.lockstep import Episodes, Progress, concat
from rlft.episodes.sample import sample_problems
from rlft.episodes.setup import EpisodeSetup
from rlft.parallel.distributed import SINGLE, DataParallel
from rlft.rewards.normalize import shape_rewards
from rlft.rewards.scorer import Scorer, score_all
from rlft.samplers import Generations, Sampler, SamplingParams
from rlft.training.batch import RolloutBatch, pack

if TYPE_CHECKING:
    from rlft.config.schemas import Config
    from rlft.config.schemas.sampler import SamplerConfig
    from rlft.training.components import Components


@dataclass
class Rollout:
    """A scored rollout ready for advantages, and its metrics.

    Attributes:
        batch: This rank's share of the kept groups (None: nothing kept anywhere; a batch of 0 rows:
            other ranks hold every kept group).
        metrics: Over every completion sampled this step, on all ranks.
        rows: The kept rows of all ranks (for ``logger.rollouts``).
    """

    batch: RolloutBatch | None
    metrics: dict[str, float]
    rows: list[dict[str, Any]]


def prompt_seeds(seed: int, cursor: int, indices: range, num_prompts: int, n: int) -> tuple[int, ...]:
    """One sampling seed per prompt, from the run seed, the data position and the prompt's index in the batch.

    Completion j of a prompt seeded s is seeded s + j: vLLM's rule for the n children of a
    seeded request, which the HF sampler follows. So the prompts of the run are numbered in
    sampling order (data position x ``num_prompts`` + index; a position is a step or one of
    DAPO's sampling rounds), and prompt k's completions take the seeds base + k n ... base + k n
    + n - 1, base from the run seed: no two completions of a run share a seed, even in the low 32
    bits, up to 2**32 completions. Prompt seeds 1 apart, as they were, gave (prompt i, sample j)
    the noise of (i + 1, j - 1): 16 prompts x 8 samples drew from 23 distinct seeds.
    """
    base = (seed % 2**30) * 2**32
    return tuple(base + ((cursor * num_prompts + i) * n) % 2**32 for i in indices)


def sampling_params(cfg: Config, cursor: int, indices: range | None = None) -> SamplingParams:
    """The rollout's sampling settings, seeded per prompt (``indices``: the prompts' places in the global batch)."""
    s = cfg.sampler
    indices = range(cfg.trainer.num_prompts) if indices is None else indices
    return SamplingParams(
        n=s.n, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_new_tokens=s.max_new_tokens,
        seed=(cfg.seed * 1_000_003 + cursor) % 2**31, prompt_seeds=prompt_seeds(cfg.seed, cursor, indices, cfg.trainer.num_prompts, s.n),
    )


@dataclass
class _Round:
    prompts: list[list[int]]
    gens: Generations
    task_scores: Tensor
    """The scorers' total: raw on a rank, shaped (reward.normalize, reward.clip) once merged."""
    scores: Tensor
    """What the step trains on: the shaped total plus DAPO's overlong punishment (set once merged)."""
    per_fn: dict[str, list[float]]
    counts: dict[str, float]
    """Logged events by name (``rm/truncated``, ``clipped``), summed over ranks."""
    generate_s: float
    reward_s: float
    raw: Tensor | None = None
    """The unshaped total, kept once shaped (for reward/raw_mean)."""


@dataclass
class _KeptRow:
    """One completion of a kept group: what the step trains on and logs."""

    prompt: list[int]
    completion: list[int]
    truncated: bool
    score: float
    group: int
    """The group's place among the step's kept groups."""
    logprobs: list[float] | None
    """The sampler's log-probs of the completion tokens (None: it reports none)."""
    policy_mask: list[int] | None = None
    """An episode's: 1 on the tokens the policy wrote, 0 on the environment's (None: all the policy's)."""


def _sample_round(sampler: Sampler, tokenizer: Any, scorers: list[Scorer], gold: Scorer | None, problems: list[Problem],
                  cfg: Config, cursor: int, indices: range, episodes: EpisodeSetup | None = None,
                  progress: Progress | None = None) -> _Round:
    t0 = time.perf_counter()
    prompts, gens, samples = sample_problems(sampler, tokenizer, problems, cfg.data,
                                             sampling_params(cfg, cursor, indices), episodes, progress)
    t1 = time.perf_counter()
    scored = score_all(scorers, samples, gold)
    per_fn = scored.per_name
    if cfg.algo.overlong_penalty:
        lengths = torch.tensor([s.num_tokens for s in samples])  # an episode's: the tokens the policy wrote
        per_fn["overlong_penalty"] = soft_overlong_penalty(lengths, policy_budget(cfg),
                                                           cfg.algo.overlong_cache).tolist()
    totals = torch.tensor(scored.totals, dtype=torch.float32)
    return _Round(prompts, gens, totals, totals, per_fn, dict(scored.counts), t1 - t0, time.perf_counter() - t1)


def _shape(r: _Round, c: Components, cfg: Config) -> _Round:
    """The merged round's totals whitened and clipped (the same on every rank: all ranks' scores, in
    one order), then DAPO's overlong punishment added."""
    rc = cfg.reward
    r.raw = r.task_scores
    r.task_scores, clipped = shape_rewards(r.task_scores, c.state.reward_moments, rc.normalize, rc.clip)
    if rc.clip > 0:
        r.counts["clipped"] = float(clipped)
    r.scores = r.task_scores
    if cfg.algo.overlong_penalty:
        penalty = torch.tensor(r.per_fn["overlong_penalty"], dtype=torch.float32)
        r.scores = r.task_scores + cfg.algo.overlong_penalty_factor * penalty
    return r


def _merge(parts: list[_Round]) -> _Round:
    """The ranks' rounds as one, prompts in rank order (the order one process would sample them in)."""
    if len(parts) == 1:
        return parts[0]
    index, offset = [], 0
    for p in parts:
        index += [offset + i for i in p.gens.prompt_index]
        offset += len(p.prompts)
    gens = concat(index, [p.gens for p in parts])
    return _Round([x for p in parts for x in p.prompts], gens, torch.cat([p.task_scores for p in parts]),
                  torch.cat([p.scores for p in parts]),
                  {k: [v for p in parts for v in p.per_fn[k]] for k in parts[0].per_fn},
                  {k: sum(p.counts.get(k, 0) for p in parts) for k in parts[0].counts},
                  max(p.generate_s for p in parts), max(p.reward_s for p in parts))


def collect_rollout(c: Components, cfg: Config, dp: DataParallel = SINGLE, progress: Progress | None = None) -> Rollout:
    """Sample groups, score them, and (DAPO) keep only informative groups, sampling more rounds
    until ``trainer.num_prompts`` groups are kept or ``algo.max_sampling_rounds`` is reached.

    ``c`` is the trainer's Components (task, sampler, policy, cursor, device); ``progress`` is told this rank's
    episode counts as they change (multi-turn episodes only).
    """
    a, want = cfg.algo, cfg.trainer.num_prompts
    share = want // dp.world
    mine = range(dp.rank * share, (dp.rank + 1) * share)
    rows: list[_KeptRow] = []
    seen: list[_Round] = []
    kept = 0
    while True:
        problems = c.task.batch(c.cursor, want)
        own = _sample_round(c.sampler, c.policy.tokenizer, c.scorers, c.gold, problems[mine.start : mine.stop], cfg,
                            c.cursor, mine, c.episodes, progress)
        r = _shape(_merge(dp.all_gather(own)), c, cfg)
        c.cursor += 1
        seen.append(r)
        group_ids = torch.tensor(r.gens.prompt_index)
        groups = informative_groups(r.task_scores, group_ids) if a.dynamic_sampling else torch.unique(group_ids)
        for g in groups.tolist():
            if kept == want:
                break
            for j in (group_ids == g).nonzero().squeeze(-1).tolist():
                lp = r.gens.logprobs[j] if r.gens.logprobs is not None else None
                mask = r.gens.policy_mask[j] if isinstance(r.gens, Episodes) else None
                rows.append(_KeptRow(r.prompts[g], r.gens.completion_ids[j], r.gens.truncated[j], float(r.scores[j]),
                                     kept, lp, mask))
            kept += 1
        if not a.dynamic_sampling or kept == want or len(seen) >= a.max_sampling_rounds:
            break
    metrics = _rollout_metrics(seen)
    if cfg.reward.normalize or cfg.reward.clip > 0:
        metrics.update(_shaping_metrics(seen, c, cfg))
    if a.dynamic_sampling:
        sampled = len(seen) * want
        metrics.update({"dynamic/rounds": float(len(seen)), "dynamic/kept_frac": float(kept) / sampled,
                        "dynamic/groups": float(kept)})
    if not rows:
        return Rollout(None, metrics, [])
    logged = [{"group": k.group, "prompt_ids": k.prompt, "completion_ids": k.completion, "score": k.score,
               "truncated": k.truncated, **({"policy_mask": k.policy_mask} if k.policy_mask is not None else {})}
              for k in rows]
    batch = _pack_rows(rows, c.policy.tokenizer.pad_token_id, cfg)
    if dp.active:
        batch = batch.select(rank_rows(batch.group_ids, dp.rank, dp.world))
    return Rollout(batch.to(c.device), metrics, logged)


def rank_rows(group_ids: Tensor, rank: int, world: int) -> Tensor:
    """A rank's rows: a contiguous share of the groups (a group never spans ranks)."""
    mine = torch.unique(group_ids).tensor_split(world)[rank]
    return torch.isin(group_ids, mine).nonzero().squeeze(-1)


def _pack_rows(rows: list[_KeptRow], pad_id: int, cfg: Config) -> RolloutBatch:
    input_ids, start, length, mask = pack([k.prompt for k in rows], [k.completion for k in rows], pad_id)
    batch = RolloutBatch(
        input_ids, start, length, mask, torch.tensor([k.group for k in rows]),
        torch.tensor([k.score for k in rows], dtype=torch.float32),
        torch.tensor([k.truncated for k in rows], dtype=torch.bool),
    )
    for i, k in enumerate(rows):
        if k.policy_mask is not None:  # an episode: the environment's tokens are context, outside the loss
            mask[i, : len(k.policy_mask)] = torch.tensor(k.policy_mask, dtype=mask.dtype)
    lps = [k.logprobs for k in rows]
    if all(lp is not None for lp in lps) and untruncated(cfg.sampler):
        batch.sampler_logp = torch.zeros_like(mask)
        for i, lp in enumerate(lps):
            batch.sampler_logp[i, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
    return batch


def untruncated(s: SamplerConfig) -> bool:
    """Sampling from the full softmax: only then do the sampler's log-probs (vLLM reports them after
    top-p/top-k, renormalised over the kept tokens) compare with the learner's over the whole vocabulary."""
    return s.top_p >= 1.0 and s.top_k <= 0


def _rollout_metrics(rounds: list[_Round]) -> dict[str, float]:
    """Over every completion sampled this step (kept or not). A mean over no scored completion is
    left out (metrics.jsonl holds numbers only)."""
    scores = torch.cat([r.scores for r in rounds])
    # NaN: unscored (every reward function returned None). float64: equal scores have a std of exactly 0.
    scored = scores[scores.isfinite()].double()
    lengths = [len(x) for r in rounds for x in r.gens.completion_ids]
    tokens = float(sum(lengths))
    out = {"reward/mean": float(scored.mean())} if scored.numel() else {}
    out.update({
        "reward/std": float(scored.std()) if scored.numel() > 1 else 0.0,
        "reward/unscored_frac": 1.0 - scored.numel() / scores.numel(),
        "tokens/generated": tokens,
        "response/mean_length": tokens / len(lengths),
        "response/truncated_frac": float(np.mean([t for r in rounds for t in r.gens.truncated])),
        "time/generate_s": sum(r.generate_s for r in rounds),
        "time/reward_s": sum(r.reward_s for r in rounds),
        "throughput/tokens_per_s": tokens / max(sum(r.generate_s for r in rounds), 1e-9),
    })
    for name in rounds[0].per_fn:
        values = np.array([v for r in rounds for v in r.per_fn[name]], dtype=float)
        if not np.isnan(values).all():
            out[f"reward/{name}"] = float(np.mean(values[~np.isnan(values)]))
    for name in dict.fromkeys(k for r in rounds for k in r.counts):
        out[f"reward/{name}_frac"] = sum(r.counts.get(name, 0) for r in rounds) / len(lengths)
    if isinstance(rounds[0].gens, Episodes):
        out.update(_episode_metrics([r.gens for r in rounds]))
    return out


def _episode_metrics(eps: list[Episodes]) -> dict[str, float]:
    """Per episode means over every episode sampled this step (docs/reference/metrics.md: ``episode/*``)."""
    count = sum(len(e.turns) for e in eps)
    tokens = sum(len(m) for e in eps for m in e.policy_mask)
    out = {"episode/turns": sum(sum(e.turns) for e in eps) / count,
           "episode/tokens": tokens / count,
           "episode/policy_token_frac": sum(sum(m) for e in eps for m in e.policy_mask) / max(tokens, 1)}
    for name in sorted({k for e in eps for k in e.events}):
        out[f"episode/{name}"] = sum(e.events.get(name, 0) for e in eps) / count
    out["time/env_s"] = sum(e.env_s for e in eps)
    out["time/env_longest_s"] = max(s for e in eps for s in e.env_seconds)
    return out


def _shaping_metrics(rounds: list[_Round], c: Components, cfg: Config) -> dict[str, float]:
    """With reward.normalize or reward.clip: the total before shaping, and the running statistics."""
    rc, out = cfg.reward, {}
    raw = torch.cat([r.raw for r in rounds if r.raw is not None])
    raw = raw[raw.isfinite()].double()
    if raw.numel():
        out["reward/raw_mean"] = float(raw.mean())
    if rc.normalize:
        m = c.state.reward_moments
        out.update({"reward/running_mean": m.mean, "reward/running_std": m.std})
    return out
