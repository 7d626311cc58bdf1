"""rlft vs TRL's GRPOTrainer on the same job, side by side in one run.

    python scripts/compare_trl.py speed [--steps N] [--warmup N]
    python scripts/compare_trl.py learn --minutes M [--samples 8]

The job (issue 6's reference): SmolLM2-135M-Instruct, LoRA r16 on all linear layers, 4
prompts x 8 completions, at most 64 new tokens, one optimizer step per rollout, beta 0,
lr 1e-4, 2-digit additions "What is a + b? Reply with just the number.", reward 1 when the
reply's last integer is the sum. TRL runs with bf16=True (its fastest setting here) and its
defaults otherwise; rlft with its defaults for the job (vLLM sampler when installed).

``speed`` prints the mean step time of each after warm-up (rlft's measured steps bracket
TRL's: ``--steps`` before and ``--steps`` after), and rlft's phase breakdown against the
arithmetic floor at the bf16 GEMM speed measured in the same run. ``learn`` trains each for the same wall-clock budget and then
scores both on the same 200 held-out problems (greedy accuracy, and pass@1 with T=1 and
``--samples`` samples) with rlft's evaluator. Needs TRL: pip install 'rlft[bench]'.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

JOB = [
    "model=smollm2_135m", "algo=grpo", "algo.beta=0", "algo.num_mini_batches=1", "trainer.num_prompts=4",
    "sampler.n=8", "sampler.max_new_tokens=64", "optim.lr=1e-4", "data.digits=2", "reward=math",
    "logger.console=false",
]
# Issue 6's accounting of one step: generation ~0.55 TFLOP, forward+backward through the frozen
# base ~1.8 TFLOP. At the ~700 GFLOP/s bf16 the issue measured, a floor of ~3.5 s.
STEP_TFLOP = 2.4
ISSUE_GFLOPS = 700.0


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


def _trl_trainer(steps: int, out_dir: Path, budget_s: float | None, step_times: list[float], gc: bool = True):
    """A TRL GRPOTrainer on the job; ``step_times`` fills with each optimizer step's duration."""
    import datasets
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
    model = AutoModelForCausalLM.from_pretrained(model_dir)

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
        max_completion_length=64, beta=0.0, learning_rate=1e-4, bf16=True, use_cpu=True, report_to="none",
        save_strategy="no", logging_steps=1, temperature=1.0, disable_tqdm=True, seed=0,
        gradient_checkpointing=gc,  # TRL's default is on
    )
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=_reward_fn(), args=args, train_dataset=ds,
                          processing_class=tok, peft_config=lora, callbacks=[Timer()])
    return trainer


def _rlft_steps(steps: int, extra: list[str], budget_s: float | None = None):
    """Runs rlft's real training step ``steps`` times (or until the budget); returns components and metrics."""
    from rlft.trainer import build_components, train_step

    cfg, _ = _rlft_cfg(extra)
    c = build_components(cfg)
    runs, start = [], time.perf_counter()
    for i in range(steps):
        runs.append(train_step(i + 1, c, cfg))
        if budget_s is not None and time.perf_counter() - start > budget_s:
            break
    return c, cfg, runs


def speed(args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    n = args.warmup + args.steps
    gflops = [matmul_gflops()]
    c, cfg, runs = _rlft_steps(n, args.rlft)
    measured = runs[args.warmup :]
    rlft_rss = _peak_rss_gb()  # before TRL runs in this process
    trl_times: list[float] = []
    if not args.skip_trl:
        with tempfile.TemporaryDirectory() as d:
            _trl_trainer(n, Path(d), None, trl_times, gc=not args.trl_no_gc).train()
        # The machine's speed drifts by up to 2x within minutes: rlft's steps bracket TRL's,
        # before and after, so a slow spell does not land on one tool only.
        from rlft.trainer import train_step

        measured += [train_step(n + i + 1, c, cfg) for i in range(args.steps)]
    gflops.append(matmul_gflops())
    rlft_step = statistics.mean(r["time/step_s"] for r in measured)
    console = Console()
    table = Table(title="step time after warm-up (same job, this machine, one run)")
    for col in ("", "mean step s", "steps"):
        table.add_column(col)
    halves = [statistics.mean(r["time/step_s"] for r in part) for part in (measured[: args.steps], measured[args.steps :]) if part]
    table.add_row("rlft" + (" (before / after TRL: " + " / ".join(f"{h:.2f}" for h in halves) + ")" if len(halves) > 1 else ""),
                  f"{rlft_step:.2f}", str(len(measured)))
    if trl_times:
        trl_step = statistics.mean(trl_times[args.warmup :])
        table.add_row(f"TRL 1.16 GRPOTrainer (bf16{', no grad ckpt' if args.trl_no_gc else ''})", f"{trl_step:.2f}", str(len(trl_times[args.warmup:])))
        table.add_row("ratio TRL / rlft", f"{trl_step / rlft_step:.2f}x", "")
    console.print(table)
    rate = statistics.mean(gflops)
    floor_s = STEP_TFLOP * 1e3 / rate
    console.print(f"bf16 GEMM now: {gflops[0]:.0f} GFLOP/s before, {gflops[-1]:.0f} after (issue 6 assumed "
                  f"{ISSUE_GFLOPS:.0f}); floor of the step's {STEP_TFLOP} TFLOP at {rate:.0f}: {floor_s:.1f} s "
                  f"({STEP_TFLOP * 1e3 / ISSUE_GFLOPS:.1f} s at {ISSUE_GFLOPS:.0f})")
    phases = Table(title=f"rlft step breakdown (floor {floor_s:.1f} s at the measured {rate:.0f} GFLOP/s)")
    for col in ("phase", "seconds", "share"):
        phases.add_column(col)
    for label, key in [("generate", "time/generate_s"), ("reward", "time/reward_s"),
                       ("log-prob/reference", "time/logprob_s"), ("update", "time/update_s"),
                       ("weight sync", "time/sync_s")]:
        v = statistics.mean(r[key] for r in measured)
        phases.add_row(label, f"{v:.2f}", f"{100 * v / rlft_step:.0f}%")
    phases.add_row("step", f"{rlft_step:.2f}", f"{rlft_step / floor_s:.1f}x floor")
    console.print(phases)
    tokens = statistics.mean(r["tokens/generated"] for r in measured)
    length = statistics.mean(r["response/mean_length"] for r in measured)
    console.print(f"rlft: {tokens:.0f} generated tokens/step, {length:.1f} mean completion length; peak RSS "
                  f"{rlft_rss:.2f} GB (incl. the vLLM engine and its KV cache, sampler.vllm.kv_cache_gb)")
    if trl_times:
        console.print(f"peak RSS after TRL ran in the same process: {_peak_rss_gb():.2f} GB")


def matmul_gflops(reps: int = 50) -> float:
    """bf16 GEMM throughput now, at the job's commonest large shape: 1024 tokens x 576 -> 1536
    (the MLP of SmolLM2-135M). Median of ``reps``; this machine's speed drifts between days."""
    import torch

    x = torch.randn(1024, 576, dtype=torch.bfloat16)
    w = torch.randn(1536, 576, dtype=torch.bfloat16)
    times = []
    for i in range(reps + 3):
        t = time.perf_counter()
        torch.nn.functional.linear(x, w)
        if i >= 3:
            times.append(time.perf_counter() - t)
    return 2 * 1024 * 576 * 1536 / statistics.median(times) / 1e9


def _peak_rss_gb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def _held_out(model_dir: str | None, checkpoint_policy, samples: int) -> dict:
    from rlft.config import compose
    from rlft.evaluation import run_eval

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
        from rlft.tracking import read_metrics
        from rlft.trainer import train

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
    from rlft.checkpoint import latest_checkpoint

    return latest_checkpoint(run).name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    sp = sub.add_parser("speed")
    sp.add_argument("--steps", type=int, default=3)
    sp.add_argument("--warmup", type=int, default=2)
    ln = sub.add_parser("learn")
    ln.add_argument("--minutes", type=float, default=7.0)
    ln.add_argument("--samples", type=int, default=8)
    for p in (sp, ln):
        p.add_argument("--skip-trl", action="store_true", help="only rlft")
        p.add_argument("--trl-no-gc", action="store_true", help="TRL without gradient checkpointing")
        p.add_argument("--rlft", nargs="*", default=[], help="extra rlft overrides")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    speed(args) if args.mode == "speed" else learn(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
