"""Compare sampler=vllm with sampler=hf on the same rollout batch, in one run.

    python scripts/bench_samplers.py [--steps N] [--adapter] [KEY=VALUE ...]

Builds both samplers from the same config, then for each measured step samples the same
prompts with each (alternating, so machine noise hits both alike) and runs a full training
step with each sampler. Prints rollout tokens/s, full step time and weight-sync share.
``--adapter`` adds a third engine, vLLM serving the LoRA adapter (``sampler.vllm.sync=adapter``).

Then, rollouts only, on one fixed batch: each sampler and transformers' own ``generate()``
(on the hf sampler's model, the stock path TRL's GRPOTrainer takes), alternating per round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="measured steps per sampler")
    parser.add_argument("--adapter", action="store_true", help="also time vLLM serving the adapter")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table

    from rlft.config import ConfigError, compose
    from rlft.training.loop import build_components, train_step

    samplers = {"vllm": ["sampler=vllm"], "hf": ["sampler=hf"]}
    if args.adapter:
        samplers["vllm-adapter"] = ["sampler=vllm", "sampler.vllm.sync=adapter"]
    runs = {}
    for name, extra in samplers.items():
        try:
            cfg, _, _ = compose(args.overrides + extra + [f"trainer.steps={args.steps + 1}"])
        except ConfigError as e:
            print(f"bench_samplers: error: {e}", file=sys.stderr)
            return 2
        t0 = time.perf_counter()
        c = build_components(cfg)
        runs[name] = {"cfg": cfg, "c": c, "setup": time.perf_counter() - t0, "steps": []}
        train_step(1, c, cfg)  # warm-up
    for step in range(2, args.steps + 2):
        for r in runs.values():  # alternate: same prompts (same step index), same noise
            r["steps"].append(train_step(step, r["c"], r["cfg"]))

    def mean(name: str, key: str) -> float:
        return statistics.mean(m[key] for m in runs[name]["steps"])

    table = Table(title="sampler=vllm vs sampler=hf, same config and prompts")
    for col in ("sampler", "rollout tok/s", "generate s", "sync s", "step s", "sync share", "setup s"):
        table.add_column(col, justify="right")
    for name in runs:
        table.add_row(
            name, f"{mean(name, 'throughput/tokens_per_s'):.0f}", f"{mean(name, 'time/generate_s'):.2f}",
            f"{mean(name, 'time/sync_s'):.2f}", f"{mean(name, 'time/step_s'):.2f}",
            f"{100 * mean(name, 'time/sync_s') / mean(name, 'time/step_s'):.1f}%", f"{runs[name]['setup']:.1f}",
        )
    console = Console()
    console.print(table)
    speed = mean("vllm", "throughput/tokens_per_s") / mean("hf", "throughput/tokens_per_s")
    step = mean("hf", "time/step_s") / mean("vllm", "time/step_s")
    console.print(f"vllm/hf rollout tokens/s: {speed:.2f}x | hf/vllm step time: {step:.2f}x | "
                  f"mean over {args.steps} steps each after 1 warm-up")
    rollout_only(runs, args.steps, console)
    return 0


def rollout_only(runs: dict, rounds: int, console) -> None:
    """Rollout tokens/s of each sampler and of stock ``generate()`` on one batch, ``rounds`` times each."""
    from rich.table import Table

    from rlft.data.chat import prompt_ids
    from rlft.training.rollout import sampling_params

    c, cfg = runs["hf"]["c"], runs["hf"]["cfg"]
    tokenizer = c.policy.tokenizer
    prompts = [prompt_ids(tokenizer, p.prompt, cfg.data.system_prompt) for p in c.task.batch(0, cfg.trainer.num_prompts)]
    params = sampling_params(cfg, 0)
    timers = {name: lambda r=r: r["c"].sampler.generate(prompts, params).num_tokens for name, r in runs.items()}
    timers["transformers generate()"] = lambda: stock_generate(c.sampler.model, tokenizer, prompts, params)
    seconds: dict[str, list[float]] = {name: [] for name in timers}
    tokens: dict[str, list[int]] = {name: [] for name in timers}
    for _ in range(rounds + 1):  # the first round is warm-up
        for name, fn in timers.items():
            t0 = time.perf_counter()
            tokens[name].append(fn())
            seconds[name].append(time.perf_counter() - t0)
    # Sampled lengths differ between rounds: rate over the same measured rounds for both.
    rate = {name: sum(tokens[name][1:]) / sum(seconds[name][1:]) for name in timers}
    table = Table(title=f"rollouts only: {len(prompts)} prompts x {params.n}, {params.max_new_tokens} new tokens")
    for col in ("path", "s / rollout", "tokens (mean)", "tok/s", "vllm speed-up"):
        table.add_column(col, justify="right")
    for name in timers:
        table.add_row(name, f"{statistics.mean(seconds[name][1:]):.2f}", f"{statistics.mean(tokens[name][1:]):.0f}",
                      f"{rate[name]:.0f}", f"{rate['vllm'] / rate[name]:.2f}x")
    console.print(table)


def stock_generate(model, tokenizer, prompts: list[list[int]], params) -> int:
    """transformers' ``generate()`` on left-padded prompts; returns the tokens generated up to each EOS."""
    import torch

    pad, width = tokenizer.pad_token_id, max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=params.temperature, top_p=params.top_p,
            top_k=params.top_k or None, max_new_tokens=params.max_new_tokens, num_return_sequences=params.n,
            pad_token_id=pad,
        )[:, width:]
    eos = (out == tokenizer.eos_token_id).int()
    # tokens up to and including the first EOS (generate pads finished rows; those are not output)
    before_eos = (eos.cumsum(-1) - eos) == 0
    return int(before_eos.sum())


if __name__ == "__main__":
    sys.exit(main())
