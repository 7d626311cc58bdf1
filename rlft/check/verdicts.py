"""What ``rlft check``'s figures mean for the run: a verdict per problem found, with its reason and a next step.

A verdict ``blocks`` when the run cannot learn as configured (``rlft check`` then exits 1): no group carries
a gradient, no reply is scored, every reply is masked out of the loss, the weight sync does not reach the
sampler. The others are warnings: the run learns, from less than it could. Pure: reads a Report, nothing else.
"""

from __future__ import annotations

from typing import Any

from rlft.check.report import Report, Verdict

TRUNCATED_WARN = 0.5
"""Share of replies cut at max_new_tokens from which the check warns."""
EQUAL_WARN = 0.5
"""Share of groups scoring all the same from which the check warns."""
UNSCORED_WARN = 0.25
TOOL_ERRORS_WARN = 0.5
"""Share of tool calls that came back as an error from which the check warns."""
DENSER = ("raise sampler.n or sampler.temperature, start from an easier task or a stronger model, "
          "or add a denser reward (partial credit, e.g. reward=math_format)")


def verdicts(r: Report) -> list[Verdict]:
    """Every verdict of the report, blocking ones first."""
    out = [*_signal(r), *_scorers(r), *_lengths(r), *_episodes(r), *_rendering(r), *_sync(r)]
    return sorted(out, key=lambda v: not v.blocks)


def _values(by_value: dict[str, int]) -> str:
    if len(by_value) == 1:
        return f"all {next(iter(by_value))}"
    return ", ".join(f"{n} at {v}" for v, n in sorted(by_value.items(), key=lambda kv: -kv[1]))


def _signal(r: Report) -> list[Verdict]:
    s, algo = r.signal, r.run["algo"]
    total, eq, groups = s["total"], s["equal_groups"], s["groups"]
    out = []
    if total["unscored"] == total["count"]:
        return [Verdict("unscored", True, f"no reply was scored: every scorer left all {total['count']} unscored "
                        "(None or NaN), and unscored replies are left out of the loss",
                        "check the reward functions' return values, or the judges' output (see its events)")]
    if s["unscored_share"] >= UNSCORED_WARN:
        out.append(Verdict("unscored", False, f"{s['unscored_share']:.0%} of replies are unscored: they are left out "
                           "of the loss", "check which scorer leaves them (signal rows) and why"))
    if eq["count"] == 0:
        return out
    head = f"{eq['count']} of {eq['of']} groups score the same ({_values(eq['by_value'])})"
    none_carry = s["groups_with_gradient"] == 0
    others = " (the loss's other terms, the KL to the reference or the entropy bonus, still move it, away from nothing)" \
        if s["learns_from_zero_advantages"] else ""
    if s["dynamic_sampling"] and eq["count"] == groups:
        out.append(Verdict("no_signal", True, f"no signal: {head}: algo={algo}'s dynamic sampling drops such groups, "
                           "so each step draws algo.max_sampling_rounds rounds and then skips its update", DENSER))
    elif none_carry and eq["count"] == groups:
        out.append(Verdict("no_signal", True, f"no signal: {head}: under algo={algo} their advantages are 0, so no "
                           f"sample carries a gradient from the reward{others}", DENSER))
    elif eq["count"] == groups and total.get("distinct", 0) <= 1:
        out.append(Verdict("no_signal", True, f"no signal: every reply scores {total.get('min', 0):g}: the reward "
                           f"is constant, so algo={algo} has nothing to learn from", DENSER))
    elif eq["count"] / groups >= EQUAL_WARN and (s["dynamic_sampling"] or s["groups_with_gradient"] < groups):
        # (an estimator that is not group-relative, PPO's GAE, learns from groups that score alike: no warning)
        meaning = ("dynamic sampling drops them (more sampling rounds per step)" if s["dynamic_sampling"] else
                   "their samples carry no gradient from the reward")
        out.append(Verdict("weak_signal", False, f"weak signal: {head}: {meaning}", DENSER))
    return out


def _scorers(r: Report) -> list[Verdict]:
    s, out = r.signal, []
    n = r.signal["total"]["count"]
    for key, count in s["events"].items():
        name, _, event = key.rpartition("/")
        if not count:
            continue
        if event == "unparsed":
            out.append(Verdict("judge_unparsed", False, f"the judge's output did not parse in {count} of {n} replies "
                               f"(reward/{name}): those replies are unscored by it",
                               "raise the judge's max_new_tokens, give it a template whose format it follows "
                               "(score_format, kind=verdict), or a larger judge model"))
        elif event == "timed_out":
            out.append(Verdict("reward_timed_out", False, f"reward function {name} timed out or died on {count} of "
                               f"{n} replies, which scored reward.on_timeout instead of their reward",
                               "raise reward.timeout_s, or make the function faster (reward.num_workers runs calls "
                               "side by side)"))
        elif event in ("too_long", "truncated"):
            out.append(Verdict(f"reward_model_{event}", False, f"the reward model {name} "
                               f"{'could not read' if event == 'too_long' else 'read only the end of'} {count} of {n} "
                               "replies (its max_length)", f"raise max_length of the reward model {name}"))
    scorers = {k: v for k, v in s["scorers"].items() if k not in ("gold", "model", "overlong_penalty")}
    if len(scorers) > 1:
        for name, d in scorers.items():
            if d.get("distinct") == 1:
                out.append(Verdict("constant_scorer", False, f"reward/{name} scores {d['min']:g} on every reply: it "
                                   "adds a constant, no signal", "drop it, or make the task reachable for it"))
    return out


def _lengths(r: Report) -> list[Verdict]:
    ln, out = r.lengths, []
    cut = ln["truncated_share"]
    if cut >= TRUNCATED_WARN:
        masked = cut == 1.0 and r.run.get("overlong_filter", False)
        why = f"{cut:.0%} of replies reach sampler.max_new_tokens={ln['max_new_tokens']}"
        out.append(Verdict("truncated", bool(masked), why + (": algo.overlong_filter masks every one out of the loss"
                           if masked else ": they end without an answer and learn length, not the task"),
                           "raise sampler.max_new_tokens, or ask for shorter replies (data.template, data.system_prompt)"))
    if ln["dropped"]:
        d = ln["dropped"]
        out.append(Verdict("dropped", False, f"{d['train']} training and {d['eval']} held-out prompts are longer than "
                           f"{d['by']} and were dropped", "raise the limit, or shorten the prompts"))
    room = ln["sampler_room"]
    if room and ln["prompt_tokens"] and ln["prompt_tokens"]["max"] > 0.9 * room:
        out.append(Verdict("prompt_room", False, f"the longest prompt checked has {ln['prompt_tokens']['max']:.0f} "
                           f"tokens of the sampler's {room}", "raise sampler.vllm.max_model_len"))
    return out


def _episodes(r: Report) -> list[Verdict]:
    ep: dict[str, Any] | None = r.lengths.get("episodes")
    if not ep or not ep["tools"]:
        return []
    events = ep["events"]
    calls = events.get("tool_calls", 0)
    if calls == 0:
        return [Verdict("no_tool_calls", False, f"no reply called a tool ({', '.join(ep['tools'])}): the episodes "
                        "are single replies and the tools teach nothing",
                        "check the first prompt (rendering: how the tools are described), episode.tool_format, or use a "
                        "model tuned for tool calls")]
    errors = events.get("tool_errors", 0)
    if errors / calls >= TOOL_ERRORS_WARN:
        kinds = ", ".join(f"{k.removeprefix('tool_errors/')} {v}" for k, v in events.items()
                          if k.startswith("tool_errors/") and v)
        return [Verdict("tool_errors", False, f"{errors} of {calls} tool calls came back as errors ({kinds})",
                        "see the call format the prompt describes, and the tools' argument schemas")]
    return []


def _rendering(r: Report) -> list[Verdict]:
    out = []
    if r.rendering.get("generation_prompt") is False:
        out.append(Verdict("no_generation_prompt", False, "the chat template renders nothing for "
                           "add_generation_prompt: the prompt ends inside the user's turn, so the policy continues it "
                           "instead of answering", "use a chat template that opens the assistant's turn, or "
                           "data.chat_template=false with prompts that end where the reply starts"))
    if "turn_suffix_error" in r.rendering:
        out.append(Verdict("turn_suffix", True, r.rendering["turn_suffix_error"], "see the message"))
    return out


def _sync(r: Report) -> list[Verdict]:
    for when, s in r.cost["sync_check"].items():
        if s.get("passed") is False:
            return [Verdict("sync", True, f"weight sync check failed {when}: {s.get('message', '')}",
                            "see docs/guide/runs.md, 'Weight sync check'")]
    return []
