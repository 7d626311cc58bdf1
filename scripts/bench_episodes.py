"""Agent rollouts: the environment's share of a step, rlft's code before issue 36 (episodes stepped one after
another, user tools in workers forked per episode) against now (every waiting episode at once, workers kept).

    python scripts/bench_episodes.py [--before REV] [--out DIR] [--steps 2] [--warmup 1] [--episodes 32]
                                     [--tools sleep,python,calculator] [--sampler vllm] [--skip-steps]
    python scripts/bench_episodes.py --paired N [--tools ...] [--out DIR]

Two parts, every measurement in a process of its own, each code version imported from its own tree (REV, default
the commit before issue 36's first, is extracted with ``git archive`` under DIR; the newer one is this checkout):

1. The environment phase alone: ``--episodes`` tool episodes whose reply makes one call, stepped as the episode
   loop steps them (before: ``ToolEnv.step`` one episode after another; now: ``ToolEnv.step_batch``), for a user
   tool that sleeps 0.5 s (an API's latency) and the python tool; 3 rounds (the first one forks the workers now).
   Also the cost of an ``episode.env`` in a worker: a trivial environment stepped in the trainer against one held
   by a worker (``EnvPool``), per step.
2. Rollouts of docs/results.md's tool task, before against now with each episode.schedule (lockstep; continuous:
   an episode's next turn enters the engine as soon as its environment answers, vLLM only) (SmolLM2-135M-Instruct, LoRA, GRPO, 4 prompts x 8 episodes, at most 3
   turns of 40 tokens, T=0.7; prompts with one worked demonstration of the tool): per tool, the rollout's time,
   its sampling time and its environment time (measured the same way in both trees: the episode loop's
   environment function wrapped by a timer), warm-up rollouts dropped. The update that follows a rollout is the
   same code before and after and is not run (on this 2-core machine it takes minutes: a step is that plus this).

3. ``--paired N``: the two episode.schedule values on one vLLM engine in one process, N rollouts each of the tool
   task at the same data positions, interleaved (the order alternating), after a warm-up pair: totals of rollout
   time, engine steps and environment wait (time/env_s). The fairest comparison of the schedules: same engine,
   same moment, same problems.

4. ``--trl``: the same tool task in TRL 1.16's GRPOTrainer with ``tools=`` (``make install-bench``), in its own
   process: its step time, or what it says when it does not take the job.

Absolute times drift with the machine: the fp32 GEMM speed is printed beside them; compare the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "066dd84"
"""The last commit before issue 36's changes to the episode loop."""
TOOLS = {"sleep": "scripts.bench_episodes:calculator", "python": "python", "calculator": "calculator", "none": ""}
"""``--tools`` choices; ``none``: the same prompts without tools (part 2: the sampler alone, before against now)."""


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value (after half a second: a tool behind an API).

    Args:
        expression: Numbers with + - * / // % ** and parentheses, for example "(12 + 3) * 4 ** 2".
    """
    from rlft.tools.builtin import calculator as compute

    time.sleep(0.5)
    return compute(expression)


def gemm() -> float:
    import torch

    from rlft.models.precision import gemm_gflops

    return gemm_gflops(torch.float32, 1024, 576, 1536)


# ----------------------------------------------------------------------------------------------- children


def child_env(tool: str, episodes: int) -> dict:
    """Part 1 in this process: seconds per round of stepping ``episodes`` tool episodes."""
    from rlft.config.schemas.episode import EpisodeConfig
    from rlft.episodes.tool_env import ToolEnv
    from rlft.tools.dispatch import ToolRunner
    from rlft.tools.spec import load_tools

    cfg = EpisodeConfig()
    runner = ToolRunner(load_tools([TOOLS[tool]], cfg), cfg)
    name = "calculator" if tool == "sleep" else tool
    arguments = {"expression": "312 * 457"} if name == "calculator" else {"code": "print(312 * 457)"}
    reply = f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
    envs = [ToolEnv(runner) for _ in range(episodes)]
    rounds = []
    for _ in range(3):
        t0 = time.perf_counter()
        if hasattr(ToolEnv, "step_batch"):
            steps = [s for s, _ in ToolEnv.step_batch(envs, [reply] * episodes)]
        else:
            steps = [e.step(reply) for e in envs]
        rounds.append(time.perf_counter() - t0)
        assert all(s.messages[0]["content"].strip() == "142584" for s in steps), steps[0]
    runner.close()
    return {"rounds": rounds}


def child_env_overhead(episodes: int) -> dict:
    """Part 1: a trivial environment's step in this process against in a worker (now only)."""
    from rlft.episodes.env_pool import EnvPool
    from scripts.bench_episodes import Counter

    here = [Counter(None) for _ in range(episodes)]
    t0 = time.perf_counter()
    for _ in range(20):
        for e in here:
            e.step("reply")
    in_process = (time.perf_counter() - t0) / 20
    pool = EnvPool(Counter, "episode.env=bench", 32, 60.0)
    held = [pool.make(None) for _ in range(episodes)]
    t0 = time.perf_counter()
    pool.step(held, ["reply"] * episodes)  # forks the workers, builds the environments
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(20):
        pool.step(held, ["reply"] * episodes)
    in_workers = (time.perf_counter() - t0) / 20
    pool.close()
    return {"in_process_s": in_process, "first_s": first, "in_workers_s": in_workers}


class Counter:
    """A trivial environment: counts its steps."""

    def __init__(self, problem):
        self.n = 0

    def step(self, reply: str):
        from rlft.episodes.env import Step

        self.n += 1
        return Step(messages=[{"role": "user", "content": str(self.n)}])


def child_steps(tool: str, data: Path, steps: int, warmup: int, sampler: str, schedule: str) -> dict:
    """Part 2 in this process: ``warmup + steps`` rollouts of the tool task (sampling, environments, rewards; the
    update after them is the same code before and after, and is not run); the measured rollouts' times.
    ``schedule``: episode.schedule (``-``: a tree without it). The environment time of a lockstep rollout is the
    wall time of its environment phases (the episode loop's function wrapped by a timer); of a continuous one the
    time the loop waited on environments with nothing to generate (its time/env_s)."""
    import rlft.episodes.lockstep as loop
    from rlft.config import compose
    from rlft.training.loop import build_components
    from rlft.training.rollout import collect_rollout

    name = "_advance_all" if hasattr(loop, "_advance_all") else "_advance"
    inner = getattr(loop, name)
    env_s = [0.0]

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            env_s[0] += time.perf_counter() - t0

    setattr(loop, name, timed)
    cfg, _, _ = compose([
        "algo=grpo", "model=smollm2_135m", "data=jsonl", f"data.path={data}/train.jsonl", "data.num_eval=0",
        *([f"tools=[{TOOLS[tool]}]", "episode.max_turns=3"] if tool != "none" else []), "reward.fns=[math_correct]",
        f"sampler={sampler}", "sampler.max_new_tokens=40", "sampler.temperature=0.7", "trainer.num_prompts=4",
        "sampler.n=8", f"trainer.steps={steps + warmup}", "logger.console=false",
        *([f"episode.schedule={schedule}"] if schedule != "-" else [])])
    c = build_components(cfg)
    out = []
    for _ in range(warmup + steps):
        env_s[0] = 0.0
        t0 = time.perf_counter()
        m = collect_rollout(c, cfg).metrics
        out.append({"rollout_s": time.perf_counter() - t0, "generate_s": m["time/generate_s"],
                    "env_s": m.get("time/env_s", 0.0) if schedule == "continuous" else env_s[0],
                    "env_longest_s": m.get("time/env_longest_s", float("nan")),
                    "turns": m.get("episode/turns", 0.0), "tool_calls": m.get("episode/tool_calls", 0.0)})
    return {"steps": out[warmup:]}


def child_paired(tool: str, data: Path, reps: int) -> dict:
    """Part 3 in this process: the same rollouts under both schedules on one engine, interleaved (the order
    alternating from one data position to the next); the first position is a warm-up and is dropped."""
    import dataclasses

    from rlft.config import compose
    from rlft.training.loop import build_components
    from rlft.training.rollout import collect_rollout

    cfg, _, _ = compose([
        "algo=grpo", "model=smollm2_135m", "data=jsonl", f"data.path={data}/train.jsonl", "data.num_eval=0",
        f"tools=[{TOOLS[tool]}]", "episode.max_turns=3", "reward.fns=[math_correct]", "sampler=vllm",
        "sampler.max_new_tokens=40", "sampler.temperature=0.7", "trainer.num_prompts=4", "sampler.n=8",
        "logger.console=false"])
    c = build_components(cfg)
    engine, steps = c.sampler.llm.llm_engine, [0]
    inner = engine.step

    def counted():
        steps[0] += 1
        return inner()

    engine.step = counted
    base, out = c.episodes, []
    for position in range(reps + 1):
        for continuous in (True, False) if position % 2 else (False, True):
            c.cursor, c.episodes, steps[0] = position, dataclasses.replace(base, continuous=continuous), 0
            t0 = time.perf_counter()
            m = collect_rollout(c, cfg).metrics
            if position:
                out.append({"continuous": continuous, "rollout_s": time.perf_counter() - t0, "engine_steps": steps[0],
                            "env_s": m["time/env_s"], "tokens": m["tokens/generated"],
                            "tool_calls": m.get("episode/tool_calls", 0.0)})
    return {"rollouts": out}


def child_trl(data: Path) -> dict:
    """Part 4 in this process: the tool task in TRL 1.16's GRPOTrainer with ``tools=`` (the sleeping calculator,
    at most 3 turns: two tool-calling iterations), on the CPU; what it says if it does not take the job, else the
    time of its steps and of its tool calls."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from rlft.models.loading import smollm2_dir

    rows = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()][:64]
    model_dir = str(smollm2_dir())
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    def reward(completions, answer, **kw):
        return [float(a in str(c[-1].get("content", ""))) for c, a in zip(completions, answer)]

    args = GRPOConfig(output_dir=str(data / "trl"), max_steps=2, per_device_train_batch_size=32, num_generations=8,
                      max_completion_length=120, max_tool_calling_iterations=2, beta=0.0, learning_rate=1e-4,
                      bf16=False, use_cpu=True, report_to="none", save_strategy="no", logging_steps=1,
                      temperature=0.7, disable_tqdm=True, seed=0)
    try:
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, processing_class=tok, tools=[calculator],
                              train_dataset=datasets.Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]}
                                                                        for r in rows]))
    except Exception as e:  # noqa: BLE001  (what TRL says is the result)
        return {"refused": f"{type(e).__name__}: {e}"}
    t0 = time.perf_counter()
    trainer.train()
    return {"train_s": time.perf_counter() - t0, "log": trainer.state.log_history}


# ------------------------------------------------------------------------------------------------- parent


def run_child(tree: Path, args: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{ROOT}", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts/bench_episodes.py"), "--child", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode or not lines:
        raise SystemExit(f"bench_episodes: child {args} failed (exit {proc.returncode}): {proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def extract(rev: str, out: Path) -> Path:
    tree = out / f"rlft-{rev}"
    if not (tree / "rlft").exists():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", rev, "rlft", "conf"], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default=BEFORE)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--tools", default="sleep,python,calculator")
    parser.add_argument("--sampler", default="vllm")
    parser.add_argument("--skip-steps", action="store_true", help="part 1 only")
    parser.add_argument("--skip-env", action="store_true", help="skip part 1")
    parser.add_argument("--paired", type=int, default=0, metavar="N",
                        help="part 3 only: N rollouts per schedule, interleaved on one vLLM engine")
    parser.add_argument("--trl", action="store_true", help="part 4 only: the tool task in TRL's GRPOTrainer (tools=)")
    parser.add_argument("--child", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "env":
            result = child_env(rest[0], int(rest[1]))
        elif kind == "trl":
            result = child_trl(Path(rest[0]))
        elif kind == "paired":
            result = child_paired(rest[0], Path(rest[1]), int(rest[2]))
        elif kind == "overhead":
            result = child_env_overhead(int(rest[0]))
        else:
            result = child_steps(rest[0], Path(rest[1]), int(rest[2]), int(rest[3]), rest[4], rest[5])
        import rlft

        print(json.dumps({**result, "rlft": rlft.__file__}))
        return 0

    out = args.out or Path(tempfile.mkdtemp(prefix="bench-episodes-"))
    if args.paired:
        part_three(args.tools.split(","), out, args.paired)
        return 0
    if args.trl:
        result = run_child(ROOT, ["trl", str(_task_data(out) / "calculator")])
        print("4. TRL 1.16 GRPOTrainer, tools=[the sleeping calculator], SmolLM2-135M-Instruct on the CPU: " +
              (f"refused the job: {result['refused']}" if "refused" in result else
               f"2 steps in {result['train_s']:.1f} s; log {result['log']}"))
        return 0
    trees = {"before": extract(args.before, out), "now": ROOT}
    tools = args.tools.split(",")
    print(f"fp32 GEMM {gemm():.0f} GFLOP/s at the start; before = {args.before}, now = {_head()}; "
          f"{os.cpu_count()} CPUs")
    if not args.skip_env:
        part_one(trees, tools, args.episodes)
    if args.skip_steps:
        return 0
    part_two(trees, tools, out, args.steps, args.warmup, args.sampler)
    print(f"fp32 GEMM {gemm():.0f} GFLOP/s at the end")
    return 0


def part_one(trees: dict[str, Path], tools: list[str], episodes: int) -> None:
    print(f"\n1. the environment phase alone: {episodes} episodes, one call each; seconds per round "
          "(3 rounds; now: the first forks the workers)")
    print("| tool | before (one episode after another) | now (all at once) | before / now (rounds 2-3) |")
    print("|---|---|---|---|")
    for tool in [t for t in tools if t in ("sleep", "python")]:
        r = {k: run_child(tree, ["env", tool, str(episodes)])["rounds"] for k, tree in trees.items()}
        ratio = statistics.mean(r["before"][1:]) / statistics.mean(r["now"][1:])
        print(f"| {tool} | {' / '.join(f'{x:.2f}' for x in r['before'])} | {' / '.join(f'{x:.2f}' for x in r['now'])} "
              f"| {ratio:.1f}x |")
    o = run_child(ROOT, ["overhead", str(episodes)])
    print(f"\nepisode.env in workers, {episodes} episodes of a trivial environment, one step each: in the trainer "
          f"{1000 * o['in_process_s']:.2f} ms, in workers {1000 * o['in_workers_s']:.1f} ms a step of all "
          f"({1000 * o['in_workers_s'] / episodes:.2f} ms an episode); the first step (forking the workers, "
          f"building the environments) {1000 * o['first_s']:.0f} ms")
    print(f"fp32 GEMM {gemm():.0f} GFLOP/s")


def part_two(trees: dict[str, Path], tools: list[str], out: Path, steps: int, warmup: int, sampler: str) -> None:
    data = _task_data(out)
    print(f"\n2. rollouts of the tool task, 4 prompts x 8 episodes, at most 3 turns of 40 tokens, {sampler} "
          f"sampler; mean of {steps} rollouts after {warmup} warm-up, seconds")
    print("| tool | code | rollout | sampling (generate_s, env included) | environment | env share of the rollout | "
          "longest episode's env | turns / episode | calls / episode |")
    print("|---|---|---|---|---|---|---|---|---|")
    variants = [("before", trees["before"], "-")] + [(f"now, {s}", trees["now"], s) for s in ("lockstep", "continuous")
                                                     if sampler == "vllm" or s == "lockstep"]
    for tool in tools:
        task = data / ("python" if tool == "python" else "calculator")
        # no tools: one reply per prompt, the sampler alone (before and now alternating, twice each)
        for label, tree, schedule in variants if tool != "none" else [("before", trees["before"], "-"),
                                                                      ("now", trees["now"], "-")] * 2:
            s = run_child(tree, ["steps", tool, str(task), str(steps), str(warmup), sampler, schedule])["steps"]

            def mean(key: str, rows: list[dict] = s) -> float:
                return statistics.mean(row[key] for row in rows)

            print(f"| {tool} | {label} | {mean('rollout_s'):.1f} | {mean('generate_s'):.1f} | {mean('env_s'):.2f} | "
                  f"{100 * mean('env_s') / mean('rollout_s'):.0f}% | {mean('env_longest_s'):.2f} | {mean('turns'):.2f} | "
                  f"{mean('tool_calls'):.2f} |")


def part_three(tools: list[str], out: Path, reps: int) -> None:
    data = _task_data(out)
    print(f"fp32 GEMM {gemm():.0f} GFLOP/s at the start; {_head()}; {os.cpu_count()} CPUs")
    print(f"\n3. the schedules on one engine: {reps} rollouts each of the tool task (SmolLM2-135M, vLLM, 4 prompts x 8 "
          "episodes, at most 3 turns of 40 tokens), interleaved after a warm-up pair; totals")
    print("| tool | schedule | rollouts | engine steps | environment wait | tokens | calls / episode |")
    print("|---|---|---|---|---|---|---|")
    for tool in tools:
        rows = run_child(ROOT, ["paired", tool, str(data / ("python" if tool == "python" else "calculator")),
                                str(reps)])["rollouts"]
        for continuous in (False, True):
            mine = [r for r in rows if r["continuous"] == continuous]
            print(f"| {tool} | {'continuous' if continuous else 'lockstep'} | {sum(r['rollout_s'] for r in mine):.1f} s | "
                  f"{sum(r['engine_steps'] for r in mine)} | {sum(r['env_s'] for r in mine):.2f} s | "
                  f"{sum(r['tokens'] for r in mine):.0f} | {statistics.mean(r['tool_calls'] for r in mine):.2f} |")
    print(f"fp32 GEMM {gemm():.0f} GFLOP/s at the end")


def _task_data(out: Path) -> Path:
    data = out / "data"
    for tool in ("calculator", "python"):
        if not (data / tool / "train.jsonl").exists():
            subprocess.run([sys.executable, str(ROOT / "scripts/tool_task.py"), str(data / tool), "--train", "200",
                            "--eval", "10", "--tool", tool], check=True, capture_output=True)
    return data


def _head() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
