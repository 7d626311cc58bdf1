"""``rlft check``'s report as one rich table (signal, lengths, rendering, cost, verdicts) and as JSON."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rlft.check.report import CostSection, LengthsSection, RenderingSection, Report, RunSection, SignalSection, Verdict

FIRST_PROMPT_CHARS = 600
"""The first prompt is shown whole up to this many characters (the JSON has all of it)."""


def to_json(report: Report) -> dict[str, Any]:
    return {**dataclasses.asdict(report), "blocked": report.blocked}


def write_json(report: Report, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(report), indent=2, default=str) + "\n")


def _num(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def _dist(d: dict[str, Any]) -> str:
    if "mean" not in d:
        return f"all {d['count']} unscored"
    spread = f"mean {_num(d['mean'])}, std {_num(d['std'])}, min {_num(d['min'])}, max {_num(d['max'])}"
    if d.get("values") is not None:
        spread += f"; values {', '.join(f'{v:g}' for v in d['values'])}"
    return spread + (f"; {d['unscored']} of {d['count']} unscored" if d["unscored"] else "")


def _lens(d: dict[str, float], unit: str = "tokens") -> str:
    return f"mean {d['mean']:.1f}, min {d['min']:.0f}, max {d['max']:.0f} {unit}" if d else "-"


def _seconds(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    return f"{s / 60:.1f} min" if s >= 120 else f"{s:.1f} s"


def rows(r: Report) -> list[tuple[str, str, str]]:
    """``(section, item, value)`` rows of the table, in order."""
    return [*_run_rows(r.run), *_signal_rows(r.signal), *_length_rows(r.lengths), *_rendering_rows(r.rendering),
            *_cost_rows(r.cost, r.run), *_verdict_rows(r.verdicts)]


def _run_rows(run: RunSection) -> list[tuple[str, str, str]]:
    return [("run", "checked", f"algo={run['algo']} model={run['model']} data={run['data']} sampler={run['sampler']}: "
            f"{run['prompts']} prompts x sampler.n={run['n']} = {run['samples']} samples "
            f"(the run: {run['num_prompts']} prompts a step, {run['steps']} steps)")]


def _signal_rows(s: SignalSection) -> list[tuple[str, str, str]]:
    out = [("signal", "reward (total)", _dist(s["total"]))]
    for name, d in s["scorers"].items():
        out.append(("signal", f"reward/{name}", _dist(d)))
    eq = s["equal_groups"]
    meaning = ("dynamic sampling drops them" if s["dynamic_sampling"] else
               "no gradient from the reward" if s["groups_with_gradient"] < s["groups"] else "no contrast within them")
    out.append(("signal", "groups scoring all the same", f"{eq['count']} of {eq['of']}"
                + (f" ({', '.join(f'{n} at {v}' for v, n in eq['by_value'].items())}): {meaning}" if eq["count"] else "")))
    out.append(("signal", "groups carrying a gradient", f"{s['groups_with_gradient']} of {s['groups']}"
                + (" (the update was skipped: nothing to learn)" if s["update_skipped"] else "")))
    out.append(("signal", "unscored", f"{s['unscored_share']:.0%}"))
    out.append(("signal", "timed out", "reward.on_timeout unset: a reward call past reward.timeout_s stops the run"
                if s.get("timed_out_share") is None else f"{s['timed_out_share']:.0%} of reward function "
                "scores (one per reply and function) were reward.on_timeout's"))
    for key, count in s["events"].items():
        out.append(("signal", f"reward/{key}", f"{count} of {s['total']['count']}"))
    return out


def _length_rows(ln: LengthsSection) -> list[tuple[str, str, str]]:
    out = []
    pt = ln["prompt_tokens"]
    limits = [f"data.max_prompt_tokens={ln['max_prompt_tokens'] or 'off'}",
              f"sampler room {ln['sampler_room'] if ln['sampler_room'] is not None else 'unlimited (hf)'}"]
    out.append(("lengths", "prompt tokens", f"{_lens(pt)}; {', '.join(limits)}"))
    if ln["dropped"]:
        d = ln["dropped"]
        out.append(("lengths", "prompts dropped", f"{d['train']} training, {d['eval']} held-out ({d['by']})"))
    out.append(("lengths", "reply tokens", _lens(ln["reply_tokens"])))
    out.append(("lengths", "cut at max_new_tokens", f"{ln['truncated_share']:.0%} (sampler.max_new_tokens="
                f"{ln['max_new_tokens']}); ended by a stop token {ln['stopped_share']:.0%}"))
    ep = ln.get("episodes")
    if ep:
        out.append(("lengths", "episode turns", f"{_lens(ep['turns'], 'turns')} (episode.max_turns={ep['max_turns']})"))
        if ep["tools"]:
            ev = ep["events"]
            kinds = ", ".join(f"{k.removeprefix('tool_errors/')} {v}" for k, v in ev.items()
                              if k.startswith("tool_errors/") and v) or "none"
            out.append(("lengths", "tool calls", f"{ev.get('tool_calls', 0)} over {ep['count']} episodes "
                        f"({', '.join(ep['tools'])}); errors {ev.get('tool_errors', 0)}: {kinds}"))
    return out


def _rendering_rows(rd: RenderingSection) -> list[tuple[str, str, str]]:
    out = []
    prompt = rd["first_prompt"]
    shown = prompt if len(prompt) <= FIRST_PROMPT_CHARS else prompt[:FIRST_PROMPT_CHARS] + f" ... ({len(prompt)} chars)"
    how = "chat template" if rd["chat_template"] else "raw text (no chat template)"
    if rd["generation_prompt"] is False:
        how += ", NO assistant header (add_generation_prompt renders nothing)"
    out.append(("rendering", f"first prompt ({how})", repr(shown)))
    reply = rd.get("first_reply", "")
    out.append(("rendering", "its first reply (as the reward reads it)",
                repr(reply if len(reply) <= FIRST_PROMPT_CHARS else reply[:FIRST_PROMPT_CHARS] + " ...")))
    out.append(("rendering", "stop tokens", ", ".join(repr(t) for t in rd["stop_tokens"])))
    if "turn_suffix" in rd:
        out.append(("rendering", "after a reply, before the next turn", repr(rd["turn_suffix"])))
    return out


def _cost_rows(c: CostSection, run: RunSection) -> list[tuple[str, str, str]]:
    out = [("cost", "dtype", f"{c['dtype']} on {c['device']}: {c['dtype_reason']}")]
    for when, sc in c["sync_check"].items():
        if sc.get("off"):
            text = "off (sampler.sync_check=off)"
        elif sc.get("passed"):
            probe = sc.get("logp_abs_diff_mean")
            text = (f"passed: log-prob diff {'not probed (sampler.sync_probe_every)' if probe is None else f'{probe:.2g}'}"
                    f", {sc['weights_differ']} of {sc['weights_read']} served weights differ ({sc['seconds']:.2f} s)")
        else:
            text = f"FAILED: {sc.get('message', '')}"
        out.append(("cost", f"sync check {when}", text))
    if c.get("memory"):
        m, est = c["memory"], c["memory"]["estimate_gib"]
        terms = ", ".join(f"{k} {v:.1f}" for k, v in est.items() if k != "total" and v)
        out.append(("cost", "GPU memory, learner phase", f"docs/guide/gpu.md's arithmetic {est['total']:.1f} GiB for "
                    f"micro-batches of {m['tokens']} tokens ({terms}); measured: peak {m['peak_gib']:.1f} GiB "
                    f"allocated over the update, {m['before_gib']:.1f} GiB before it (the overhead term is outside "
                    "the allocator)"))
    sec = c["seconds"]
    out.append(("cost", "measured", f"setup {_seconds(sec['setup'])}, warm-up {sec.get('warm_up', 0):.1f} s; "
                f"on {run['prompts']} prompts: sampling "
                f"{sec['sampling']:.2f} s, scoring {sec['scoring']:.2f} s, update {sec['update']:.2f} s "
                f"(log-probs {sec['logprobs']:.2f} s), sync {sec['sync']:.2f} s"))
    st = c["step"]
    rounds = f" x {c['rounds']} sampling rounds" if c["rounds"] > 1 else ""
    out.append(("cost", "a step, projected", f"{_seconds(c['step_s'])} for {run['num_prompts']} prompts{rounds}: "
                f"sampling {st['sampling']:.1f} s, scoring {st['scoring']:.1f} s, update {st['update']:.1f} s, "
                f"sync {st['sync']:.1f} s" + (" (no group differs: the update is skipped)" if c.get("skips_update") else "")))
    budget = (f"; trainer.max_minutes={c['budget_s'] / 60:g} ends it after {c['steps']} of trainer.steps="
              f"{run['steps']}" if c["budget_s"] and c["steps"] < run["steps"] else "")
    out.append(("cost", "the run, projected", f"{_seconds(c['projected_s'])} for {c['steps']} steps{budget} "
                "(evaluations not included)"))
    return out


def _verdict_rows(verdicts: list[Verdict]) -> list[tuple[str, str, str]]:
    out = []
    for v in verdicts:
        out.append(("verdict", "BLOCKS" if v.blocks else "warning", f"{v.message}; next: {v.fix}"))
    if not verdicts:
        out.append(("verdict", "ok", "nothing found that keeps this run from learning"))
    return out


def print_report(r: Report, console: Console | None = None) -> None:
    table = Table(title=Text("rlft check: " + ("the run cannot learn as configured" if r.blocked else
                                               "nothing blocks learning")), show_lines=False)
    table.add_column("section", style="bold")
    table.add_column("what")
    table.add_column("found", overflow="fold")
    last = None
    for section, item, value in rows(r):
        if last is not None and section != last:
            table.add_section()
        style = "red" if item == "BLOCKS" else "yellow" if item == "warning" else None
        table.add_row(section if section != last else "", Text(item, style=style or ""), Text(value))
        last = section
    (console or Console()).print(table)
