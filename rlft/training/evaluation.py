"""Held-out evaluation: greedy accuracy, and pass@k from sampled completions."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlft.data import build_task
from rlft.data.chat import drop_long_prompts, prompt_room
from rlft.data.tasks import Problem
from rlft.episodes.lockstep import Episodes
from rlft.episodes.sample import sample_problems
from rlft.episodes.setup import EpisodeSetup, episode_setup, prompt_overhead
from rlft.errors import DataError
from rlft.models import build_policy
from rlft.models.device import resolve_device
from rlft.models.loading import quiet_libraries
from rlft.models.precision import resolve as resolve_precision
from rlft.parallel.distributed import SINGLE, DataParallel
from rlft.rewards import score_samples
from rlft.rewards.functions import call_policy
from rlft.rewards.scorer import eval_reward
from rlft.samplers import Generations, Sampler, SamplingParams, build_sampler, sync_sampler
from rlft.state.resume_rules import trained_dtype
from rlft.state.run_state import load_policy_weights
from rlft.sync.verify import build_check, verify
from rlft.training.rollout import prompt_seeds

if TYPE_CHECKING:
    from rlft.config.schemas import Config
    from rlft.data import Task


def correctness(sampler: Sampler, tokenizer: Any, problems: list[Problem], cfg: Config,
                params: SamplingParams, episodes: EpisodeSetup | None = None) -> tuple[list[list[bool]], Generations]:
    """Sample ``params.n`` completions (or episodes) per problem and judge each (> 0.5) with
    :func:`eval_reward`'s function: ``reward.gold``'s checker when there is one, else the first reward function.

    Returns:
        Per problem, one bool per completion; and what was sampled.
    """
    _, gens, samples = sample_problems(sampler, tokenizer, problems, cfg.data, params, episodes)
    judge = eval_reward(cfg)
    if judge is None:
        raise DataError("evaluation needs a rule-based reward to judge correctness: set reward.gold=FN, "
                        "or put one in reward.fns")
    _, per_fn = score_samples([judge], [1.0], samples, cfg.sampler.max_new_tokens, call_policy(cfg.reward))
    out: list[list[bool]] = [[] for _ in problems]
    for i, s in zip(gens.prompt_index, per_fn[judge]):
        out[i].append(s > 0.5)
    return out, gens


def evaluate(sampler: Sampler, tokenizer: Any, problems: list[Problem], cfg: Config,
             dp: DataParallel = SINGLE, episodes: EpisodeSetup | None = None) -> dict[str, float]:
    """Greedy accuracy (``reward.gold``, else the first reward function, > 0.5) on ``problems``.

    Under data parallelism each rank evaluates a contiguous share and the counts are summed.

    Returns:
        ``eval/accuracy`` and ``eval/mean_tokens``; with episodes also ``eval/episode/turns``,
        ``eval/episode/tool_calls`` and ``eval/episode/policy_token_frac`` (means per episode).
    """
    share = -(-len(problems) // dp.world)
    mine = problems[dp.rank * share : (dp.rank + 1) * share]
    params = SamplingParams(n=1, max_new_tokens=cfg.sampler.max_new_tokens, greedy=True)
    ok, gens = correctness(sampler, tokenizer, mine, cfg, params, episodes) if mine else ([], None)
    counts = [float(sum(o[0] for o in ok)), float(gens.num_tokens if gens else 0), *_episode_counts(gens)]
    right, tokens, turns, calls, policy_tokens = dp.sum_floats(counts)
    out = {"eval/accuracy": right / len(problems), "eval/mean_tokens": tokens / len(problems)}
    if episodes is not None:
        out.update({"eval/episode/turns": turns / len(problems), "eval/episode/tool_calls": calls / len(problems),
                    "eval/episode/policy_token_frac": policy_tokens / max(tokens, 1.0)})
    return out


def _episode_counts(gens: Generations | None) -> list[float]:
    """Turns, tool calls and the policy's tokens of sampled episodes (zeros for single replies)."""
    if not isinstance(gens, Episodes):
        return [0.0, 0.0, 0.0]
    return [float(sum(gens.turns)), float(gens.events.get("tool_calls", 0)), float(sum(map(sum, gens.policy_mask)))]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def sampled_params(cfg: Config, num_problems: int, samples: int) -> SamplingParams:
    """Evaluation's sampling settings: a seed per problem, spaced as training's (``prompt_seeds``), so
    that no two samples share vLLM's per-request noise (one seed for every prompt gave sample j of
    every problem the same seed)."""
    s = cfg.sampler
    return SamplingParams(n=samples, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                          max_new_tokens=s.max_new_tokens, seed=cfg.seed,
                          prompt_seeds=prompt_seeds(cfg.seed, 0, range(num_problems), num_problems, samples))


def evaluate_sampled(sampler: Sampler, tokenizer: Any, problems: list[Problem], cfg: Config,
                     samples: int, episodes: EpisodeSetup | None = None) -> dict[str, float]:
    """pass@1 and pass@``samples`` at the sampler's temperature, seeded by ``cfg.seed``."""
    ok, _ = correctness(sampler, tokenizer, problems, cfg, sampled_params(cfg, len(problems), samples), episodes)
    out = {}
    for k in sorted({1, samples}):
        out[f"eval/pass@{k}"] = sum(pass_at_k(len(o), sum(o), k) for o in ok) / len(ok)
    return out


def run_eval(cfg: Config, checkpoint: Path | None, samples: int) -> dict[str, Any]:
    """Evaluate the base model named by ``cfg.model`` or, given one, a checkpoint's policy."""
    quiet_libraries()
    if eval_reward(cfg) is None:
        raise DataError("nothing judges correctness: reward.fns is empty and reward.gold is off; set reward.gold=FN")
    task = build_task(cfg.data, cfg.seed)
    problems = task.eval_problems
    if not problems:
        raise DataError("no held-out problems to evaluate (data.num_eval=0, or a data file too small to split: "
                        "set data.eval_path or pass --data FILE)")
    if checkpoint is not None and cfg.model.dtype == "auto":  # evaluate in the dtype the policy was trained in
        cfg.model.dtype = trained_dtype(checkpoint) or "auto"
    device = resolve_device(cfg.trainer.device)
    cfg.model.dtype = resolve_precision(cfg.model, device.type).dtype
    policy, sampler_model = build_policy(cfg.model, cfg.seed, need_reference=False, device=device)
    episodes = episode_setup(cfg)
    try:
        return _run_eval(cfg, checkpoint, samples, task, policy, sampler_model, device, episodes)
    finally:
        if episodes is not None:
            episodes.close()


def _run_eval(cfg: Config, checkpoint: Path | None, samples: int, task: Task, policy: Any, sampler_model: Any,
              device: Any, episodes: EpisodeSetup | None) -> dict[str, Any]:
    if episodes is not None:  # before any sampling: a template the episodes cannot use stops the run here
        episodes.check_template(policy.tokenizer, task, cfg.data)
    task = drop_long_prompts(task, policy.tokenizer, cfg.data, prompt_room(cfg.sampler),
                             prompt_overhead(episodes, policy.tokenizer, task, cfg.data))[0]
    problems = task.eval_problems
    if not problems:
        raise DataError(f"every held-out prompt is longer than {task.dropped_by}")
    sampler = build_sampler(cfg.sampler, cfg.model, sampler_model, policy.tokenizer, cfg.seed, device)
    if checkpoint is not None:
        load_policy_weights(policy.model, checkpoint)
        sync_sampler(sampler, policy)
    checked = verify(build_check(cfg, policy, sampler, task), sampler, policy, SINGLE, "before evaluation")
    result: dict[str, Any] = {"model": str(checkpoint) if checkpoint else cfg.model.name, "problems": len(problems),
                              "temperature": cfg.sampler.temperature, "samples": samples}
    result.update((k, v) for k, v in checked.items() if not k.startswith("time/"))
    result.update(evaluate(sampler, policy.tokenizer, problems, cfg, episodes=episodes))
    if samples > 0:
        result.update(evaluate_sampled(sampler, policy.tokenizer, problems, cfg, samples, episodes))
    return result


def write_result(result: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
