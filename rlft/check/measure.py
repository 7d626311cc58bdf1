"""``check(cfg) -> Report``: what the run would load, a few of its groups sampled, scored and learned from once.

The parts are the run's own: :func:`rlft.training.components.build_components` (the model, sampler, task, reward,
episodes and tools, the optimizer), :func:`rlft.episodes.sample.sample_problems` and
:func:`rlft.rewards.scorer.score_all` (as a rollout samples and scores), :func:`rlft.training.learner.learn`
(the step's learning: log-probs, advantages, one update, timed), :func:`rlft.samplers.sync_sampler` and the sync
check (:func:`rlft.sync.verify.verify`). Nothing is written: no run directory, no checkpoint. The update runs
on the components the check built, after a host copy of their training state (rlft.state.failure.capture: the
trainable weights, the optimizer's moments, the scheduler, the random states), which is put back afterwards
(a warm-up update on one group runs and is undone first, so that the timed one is a steady step's);
so ``check`` leaves the policy as it found it, and the sampler holding the updated weights (it is discarded).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from typing import TYPE_CHECKING, Any

import torch

from rlft.algorithms.advantages import soft_overlong_penalty
from rlft.check.memory import learner_memory, peak_start
from rlft.check.report import (
    CostSection,
    LengthsSection,
    RenderingSection,
    Report,
    RunSection,
    SignalSection,
    distribution,
    equal_groups,
    lengths,
    share,
)
from rlft.check.verdicts import verdicts
from rlft.config.validation import policy_budget, resolve_sampler_name
from rlft.data.chat import chat_messages, prompt_room, templated
from rlft.episodes.lockstep import Episodes
from rlft.episodes.sample import sample_problems
from rlft.episodes.tokens import turn_suffix_ids
from rlft.errors import RlftError, SyncError
from rlft.rewards.normalize import shape_rewards
from rlft.rewards.scorer import score_all
from rlft.samplers import sync_sampler
from rlft.samplers.base import stop_token_ids
from rlft.state import failure
from rlft.state.run_state import Snapshot
from rlft.sync.verify import verify
from rlft.training.batch import RolloutBatch, pack
from rlft.training.components import Components, build_components
from rlft.training.learner import learn
from rlft.training.rollout import sampling_params, untruncated

if TYPE_CHECKING:
    from rlft.config.schemas import Config


def check(cfg: Config, prompts: int = 8, components: Components | None = None) -> Report:
    """Check the run ``cfg`` describes on its first ``prompts`` prompts (``sampler.n`` samples each), with
    ``components`` built from ``cfg`` (None: built here, and the setup timed).

    Raises:
        RlftError: what ``rlft train`` would stop on (a config, data or model problem, a reward function
            that raises); a failed sync check is a verdict, not an error.
    """
    t0 = time.perf_counter()
    steps, num_prompts = cfg.trainer.steps, cfg.trainer.num_prompts
    cfg = copy.deepcopy(cfg)  # the caller's stays as given (building the components resolves model.dtype in it)
    if cfg.trainer.strategy == "fsdp2":  # the check is one process: nothing to shard over
        cfg.trainer.strategy = "ddp"
    c = components or build_components(cfg)
    setup_s = time.perf_counter() - t0
    try:
        return _measure(c, cfg, prompts, num_prompts, steps, setup_s)
    finally:
        if components is None and c.episodes is not None:  # the caller's components are the caller's to close
            c.episodes.close()


def _measure(c: Components, cfg: Config, prompts: int, num_prompts: int, steps: int, setup_s: float) -> Report:
    sync = {"start-up": _sync_check(c, "at start-up")}
    problems = c.task.batch(0, prompts)
    tok = c.policy.tokenizer
    c.policy.model.eval()
    params = sampling_params(cfg, 0, range(len(problems)))
    tw = time.perf_counter()
    # A first call pays for warming up (measured on SmolLM2 under vLLM: 16 s, then 5 s): one short completion first.
    sample_problems(c.sampler, tok, problems[:1], cfg.data, dataclasses.replace(
        params, n=1, max_new_tokens=min(params.max_new_tokens, 16),
        prompt_seeds=params.prompt_seeds[:1] if params.prompt_seeds else None), c.episodes)
    warm_sampling = time.perf_counter() - tw
    t1 = time.perf_counter()
    prompt_ids, gens, samples = sample_problems(c.sampler, tok, problems, cfg.data, params, c.episodes)
    t2 = time.perf_counter()
    scored = score_all(c.scorers, samples, c.gold)
    t3 = time.perf_counter()
    snap = failure.capture(c)
    raw = torch.tensor(scored.totals, dtype=torch.float32)
    scores, per_name = _shaped(c, cfg, raw, [s.num_tokens for s in samples], scored.per_name)
    batch = _batch(c, cfg, prompt_ids, gens, scores)
    warm_update = _warm_up(c, cfg, batch, snap)
    t4 = time.perf_counter()
    before = peak_start(c.device)
    update = learn(c, batch, cfg)  # the step's own learning, as train_step runs it
    t5 = time.perf_counter()
    memory = learner_memory(c.policy, cfg, batch.input_ids.shape[0], batch.input_ids.shape[1], before)
    moved = update["update/skipped"] == 0.0
    sync_s = 0.0
    if moved:
        sync_sampler(c.sampler, c.policy)
        sync_s = time.perf_counter() - t5
        sync["after the update"] = _sync_check(c, "after the check's update")
    failure.restore(c, snap)
    signal_rows = (batch.advantages * batch.response_mask).ne(0).any(1).tolist()
    groups = gens.prompt_index
    report = Report(
        run=_run(cfg, num_prompts, len(problems), steps),
        signal=_signal(cfg, scored.per_name | per_name, scored.totals, groups, signal_rows, scored.counts, update),
        lengths=_lengths(c, cfg, prompt_ids, samples, gens),
        rendering=_rendering(c, cfg, problems[0], prompt_ids[0], samples[0].completion if samples else ""),
        cost=_cost(c, cfg, sync, {"setup": setup_s, "sampling": t2 - t1, "scoring": t3 - t2,
                                  "update": t5 - t4, "logprobs": update.get("time/logprob_s", 0.0), "sync": sync_s,
                                  "warm_up": warm_sampling + warm_update},
                   num_prompts, len(problems), steps, groups, scored.totals) | {"memory": memory},
    )
    report.verdicts = verdicts(report)
    return report


def _warm_up(c: Components, cfg: Config, batch: RolloutBatch, snap: Snapshot) -> float:
    """One update on the first group, undone: the first backward pass pays for setting up (measured on SmolLM2,
    bf16: the first step's log-probs and update took 107 s, the second's 17 s); returns its seconds."""
    t0 = time.perf_counter()
    first = (batch.group_ids.cpu() == int(batch.group_ids[0])).nonzero().squeeze(-1)
    learn(c, batch.select(first), cfg)
    failure.restore(c, snap)
    c.policy.model.eval()
    return time.perf_counter() - t0


def _sync_check(c: Components, when: str) -> dict[str, Any]:
    """The sync check's figures and its message when it failed (under sampler.sync_check=off: ``{"off": True}``)."""
    warned: list[str] = []
    try:
        metrics = verify(c.sync_check, c.sampler, c.policy, c.dp, when, warned.append)
    except SyncError as e:
        return {"passed": False, "message": str(e)}
    if not metrics:
        return {"off": True}
    out: dict[str, Any] = {"passed": not warned, "logp_abs_diff_mean": metrics.get("sync/logp_abs_diff_mean"),
                           "weights_read": int(metrics["sync/weights_read"]),
                           "weights_differ": int(metrics["sync/weights_differ"]), "seconds": metrics["time/sync_check_s"]}
    if warned:
        out["message"] = warned[0]
    return out


def _shaped(c: Components, cfg: Config, raw: torch.Tensor, num_tokens: list[int],
            per_name: dict[str, list[float]]) -> tuple[torch.Tensor, dict[str, list[float]]]:
    """What the step trains on, as the rollout makes it: the total whitened and clipped (reward.normalize,
    reward.clip), plus DAPO's soft overlong punishment; and the punishment's own scores by name."""

    scores, _ = shape_rewards(raw.clone(), c.state.reward_moments, cfg.reward.normalize, cfg.reward.clip)
    extra: dict[str, list[float]] = {}
    if cfg.algo.overlong_penalty and "overlong_penalty" not in per_name:
        penalty = soft_overlong_penalty(torch.tensor(num_tokens), policy_budget(cfg), cfg.algo.overlong_cache)
        extra["overlong_penalty"] = penalty.tolist()
        scores = scores + cfg.algo.overlong_penalty_factor * penalty.float()
    return scores, extra


def _batch(c: Components, cfg: Config, prompt_ids: list[list[int]], gens: Any, scores: torch.Tensor) -> RolloutBatch:
    """Every sampled group as one rollout batch (dynamic sampling would keep only the informative groups:
    the update is timed on a full batch, as a step whose batch filled)."""
    rows = range(len(gens.completion_ids))
    input_ids, start, length, mask = pack([prompt_ids[gens.prompt_index[j]] for j in rows], gens.completion_ids,
                                          c.policy.tokenizer.pad_token_id)
    if isinstance(gens, Episodes):  # the environment's tokens are context, outside the loss
        for i, m in enumerate(gens.policy_mask):
            mask[i, : len(m)] = torch.tensor(m, dtype=mask.dtype)
    batch = RolloutBatch(input_ids, start, length, mask, torch.tensor(gens.prompt_index), scores.float(),
                         torch.tensor(gens.truncated, dtype=torch.bool))
    if gens.logprobs is not None and untruncated(cfg.sampler):
        batch.sampler_logp = torch.zeros_like(mask)
        for i, lp in enumerate(gens.logprobs):
            batch.sampler_logp[i, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
    return batch.to(c.device)


def _run(cfg: Config, num_prompts: int, prompts: int, steps: int) -> RunSection:
    return {"algo": cfg.algo.name, "model": cfg.model.name, "data": cfg.data.name,
            "sampler": resolve_sampler_name(cfg.sampler.name), "n": cfg.sampler.n, "num_prompts": num_prompts,
            "prompts": prompts, "samples": prompts * cfg.sampler.n, "steps": steps,
            "overlong_filter": cfg.algo.overlong_filter,
            "reward": list(cfg.reward.fns) + [f"model:{m}" for m in cfg.reward.models]
            + [f"judge:{j.name or j.model}" for j in cfg.reward.judges]}


def _signal(cfg: Config, per_name: dict[str, list[float]], totals: list[float], groups: list[int],
            signal_rows: list[bool], counts: dict[str, int], update: dict[str, float]) -> SignalSection:
    n = len(totals)
    carrying = {g for g, s in zip(groups, signal_rows) if s}
    return {
        "total": distribution(totals),
        "scorers": {name: distribution(values) for name, values in per_name.items()},
        "equal_groups": equal_groups(totals, groups),
        "groups_with_gradient": len(carrying),
        "groups": len(set(groups)),
        "learns_from_zero_advantages": cfg.algo.learns_from_zero_advantages,
        "dynamic_sampling": cfg.algo.dynamic_sampling,
        "unscored_share": share(sum(math.isnan(t) for t in totals), n),
        "timed_out_share": share(sum(v for k, v in counts.items() if k.endswith("/timed_out")),
                                 n * len(cfg.reward.fns))
        if cfg.reward.on_timeout is not None else None,
        "events": {k: v for k, v in counts.items()},
        "events_share": {k: share(v, n) for k, v in counts.items()},
        "update_skipped": bool(update["update/skipped"]),
    }


def _lengths(c: Components, cfg: Config, prompt_ids: list[list[int]], samples: list[Any], gens: Any) -> LengthsSection:
    room = prompt_room(cfg.sampler)
    replies = [s.num_tokens for s in samples]
    out: LengthsSection = {
        "prompt_tokens": lengths([len(p) for p in prompt_ids]),
        "max_prompt_tokens": cfg.data.max_prompt_tokens,
        "sampler_room": room[0] if room else None,
        "dropped": {"train": c.task.dropped[0], "eval": c.task.dropped[1], "by": getattr(c.task, "dropped_by", None)}
        if any(getattr(c.task, "dropped", (0, 0))) else None,
        "reply_tokens": lengths(replies),
        "max_new_tokens": cfg.sampler.max_new_tokens,
        "truncated_share": share(sum(gens.truncated), len(gens.truncated)),
        "stopped_share": share(sum(1 for ids, cut in zip(gens.completion_ids, gens.truncated)
                                   if not cut and ids and ids[-1] in set(_stops(c))), len(gens.truncated)),
    }
    if isinstance(gens, Episodes):
        n = len(gens.turns)
        out["episodes"] = {"count": n, "turns": lengths(gens.turns), "max_turns": cfg.episode.max_turns,
                           "tools": [t.name for t in c.episodes.tools] if c.episodes else [],
                           "events": dict(sorted(gens.events.items())),
                           "per_episode": {k: v / n for k, v in sorted(gens.events.items())}}
    return out


def _stops(c: Components) -> list[int]:
    return stop_token_ids(c.policy.model.generation_config, c.policy.tokenizer)


def _rendering(c: Components, cfg: Config, problem: Any, first: list[int], reply: str) -> RenderingSection:
    """The first prompt as the policy reads it, its first reply as the reward reads it, the stop tokens, whether
    the template opens the reply's turn, and (episodes) what follows a reply before the next turn."""
    tok = c.policy.tokenizer
    chat = templated(tok, cfg.data.chat_template)
    out: RenderingSection = {"first_prompt": tok.decode(first, skip_special_tokens=False), "chat_template": chat,
                           "system_prompt": cfg.data.system_prompt,
                           "first_reply": reply, "stop_tokens": [tok.decode([i]) for i in _stops(c)],
                           "generation_prompt": None}
    if chat:
        messages = chat_messages(problem.model_input, cfg.data.system_prompt)
        try:
            with_prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            without = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
            out["generation_prompt"] = with_prompt != without
            out["generation_prompt_text"] = with_prompt[len(without):] if with_prompt.startswith(without) else None
        except Exception:  # noqa: BLE001  (the prompt rendered above; this comparison is only informative)
            pass
    if c.episodes is not None and first:
        stop = _stops(c)
        try:
            suffix = turn_suffix_ids(tok, c.episodes.probe_messages(), tok.decode([stop[0]]) if stop else "")
            out["turn_suffix"] = tok.decode(suffix, skip_special_tokens=False)
        except RlftError as e:
            out["turn_suffix_error"] = str(e)
    return out


def _cost(c: Components, cfg: Config, sync: dict[str, Any], seconds: dict[str, float], num_prompts: int,
          prompts: int, steps: int, groups: list[int], totals: list[float]) -> CostSection:
    """The measured seconds, and a step's projected from them: sampling, scoring and the update scale with the
    number of groups (trainer.num_prompts over the prompts checked); under dynamic sampling, a step draws
    rounds until enough groups differ (1 / the informative share, at most algo.max_sampling_rounds), and with
    none informative it skips its update. Under trainer.max_minutes the run ends after the step that crosses it.
    Evaluations are not included."""
    scale = num_prompts / max(prompts, 1)
    informative = equal_groups(totals, groups)
    kept = share(informative["of"] - informative["count"], informative["of"])
    rounds = 1
    if cfg.algo.dynamic_sampling:
        rounds = cfg.algo.max_sampling_rounds if kept == 0 else min(cfg.algo.max_sampling_rounds, math.ceil(1 / kept))
    check_s = sum(s.get("seconds", 0.0) for s in sync.values()) / max(len(sync), 1)
    skipped = cfg.algo.dynamic_sampling and kept == 0  # no group kept: the step skips its update and sync
    step = {"sampling": seconds["sampling"] * scale * rounds, "scoring": seconds["scoring"] * scale * rounds,
            "update": 0.0 if skipped else seconds["update"] * scale, "sync": 0.0 if skipped else seconds["sync"] + check_s}
    step_s = sum(step.values())
    budget = cfg.trainer.max_minutes * 60
    if budget > 0 and step_s > 0:  # the run stops after the step that crosses trainer.max_minutes
        steps = min(steps, math.floor(budget / step_s) + 1)
    return {"dtype": c.precision.dtype, "dtype_reason": c.precision.reason, "device": str(c.device),
            "sync_check": sync, "seconds": seconds, "rounds": rounds, "skips_update": skipped, "step": step, "step_s": step_s,
            "steps": steps, "projected_s": steps * step_s, "budget_s": budget if budget > 0 else None}
