"""rlft rm vs TRL's RewardTrainer on the same preference pairs (issue 25).

    python scripts/compare_trl_rm.py --train PAIRS.jsonl [--eval HELD_OUT.jsonl | --num-eval 32] [--model smollm2_135m|tiny]
        [--steps 60] [--batch-size 8] [--lr 5e-4] [--warmup 5] [--seed 0] [--max-length 1024]
        [--dtype fp32|bf16] [--repeat] [--trl-path DIR] [--trl-gc] [--json OUT]

Each tool trains in its own fresh process: rlft as the ``rlft rm`` command (its run directory's
metrics.jsonl gives ``time/step_s`` and the final ``eval/rm_accuracy``), TRL 1.16 as a small
runner in this script (``--trl-runner``) that times each optimizer step with a TrainerCallback and then
scores the held-out pairs. Order: rlft, TRL, and with ``--repeat`` rlft again, so that a slow
spell of this shared machine shows as a gap between rlft's two runs. The fp32 and bf16 GEMM
speeds of the moment (``rlft.models.precision.gemm_gflops`` at 1024x576x1536) are measured
before and after all runs. Per tool: held-out pairwise accuracy at the end (r_chosen > r_rejected,
a tie is wrong), the median s/step without the first 2 steps, the sum of all step times, and the
process's wall time (imports and model loading included).

TRL is imported only in its own process: ``--trl-path DIR`` (default: $TRL_SITE) is put first on
that process's PYTHONPATH, for a TRL installed apart from the venv with
``pip install --no-deps --target DIR trl==1.16.0`` (its dependencies transformers, accelerate,
datasets and peft are rlft's own); without it TRL must be importable (``pip install 'rlft[bench]'``).

What is the same on both sides, by construction:

- the model: rlft's ``load_base`` builds it for TRL too (``AutoModelForSequenceClassification``,
  one label, the score head initialised under the same seed, same attention kernel), fp32 weights;
- the LoRA of the model group (r, alpha, dropout, target modules; the score head trained in full as
  ``modules_to_save``), initialised from the same seed (TRL seeds torch before ``get_peft_model``);
- the pairs and their order: the runner loads them with rlft's loader (identical replies and pairs
  over ``--max-length`` tokens dropped alike) and hands TRL the rows in the order rlft draws them
  (``rlft.rm.train.batch_indices``) with ``train_sampling_strategy="sequential"``, so step k of
  both tools trains on the same 8 pairs;
- the token sequences: TRL gets conversational rows (prompt = [user message], chosen/rejected =
  [assistant message]) and applies the chat template itself, as rlft does; the runner checks its
  tokenized rows against rlft's ids and the report prints how many of them match;
- AdamW with lr, betas (0.9, 0.99), eps 1e-8, no weight decay, gradient clipping at 1.0, and
  rlft's schedule (linear warm-up (k+1)/warmup, then constant; TRL's ``constant_with_warmup``
  starts at lr 0, so the runner gives TRL rlft's LambdaLR); batch = micro-batch = ``--batch-size``;
- precision: fp32 is fp32 everywhere; bf16 is rlft ``model.dtype=bf16`` (frozen base stored in bf16,
  autocast, adapter and head in fp32) against TRL ``bf16=True`` (fp32 weights, autocast);
- no gradient checkpointing on either side (TRL's default is on: ``--trl-gc`` turns it back on).

What differs: each tool's own training loop (TRL: transformers' Trainer with accelerate, its
per-step metrics; rlft: its loop), optimizer implementation (TRL: transformers' default AdamW,
rlft: ``torch.optim.AdamW``), and the held-out scoring (rlft's own evaluator inside its run, TRL's
model scored by the runner with TRL's collator, 8 pairs per pass as rlft). rlft's step time is
the step alone; TRL's is from ``on_step_begin`` to ``on_step_end`` (its batch is collated before).
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

RESULT = "compare_trl_rm result: "  # marks the one JSON line a measurement process prints for the parent
GEMM_SHAPE = (1024, 576, 1536)  # as compare_trl.py and scripts/lib.sh: SmolLM2's MLP at 1024 tokens
SKIP = 2  # steps left out of the median (first calls pick kernels and touch memory)


def overrides(a: argparse.Namespace) -> list[str]:
    """The job as ``rlft rm`` overrides; the TRL runner composes the same config to read its settings."""
    return [f"model={a.model}", f"model.dtype={a.dtype}", "model.gradient_checkpointing=false",
            f"data.path={a.train}", f"data.eval_path={a.eval}" if a.eval else f"data.num_eval={a.num_eval}",
            f"data.max_length={a.max_length}",
            f"trainer.steps={a.steps}", f"trainer.batch_size={a.batch_size}",
            f"trainer.micro_batch_size={a.batch_size}", "trainer.eval_every=0", "trainer.eval_at_start=false",
            "trainer.export=false", "trainer.device=cpu", f"optim.lr={a.lr}", f"optim.warmup_steps={a.warmup}",
            "optim.schedule=constant", f"seed={a.seed}", "logger.console=false"]


def run_rlft(a: argparse.Namespace) -> dict:
    """``rlft rm`` in a fresh process; its figures from the run directory's metrics.jsonl."""
    from rlft.output.tracking import read_metrics

    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "rlft", "rm", *overrides(a), f"hydra.run.dir={d}/run"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode:
            raise RuntimeError(f"rlft rm failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
        rows = [r for r in read_metrics(Path(d) / "run" / "metrics.jsonl") if r.get("step", 0) > 0]
    times = [r["time/step_s"] for r in rows]
    return {"tool": "rlft", "accuracy": rows[-1]["eval/rm_accuracy"], "step_times": times, "wall_s": wall,
            "final_loss": rows[-1]["rm/loss"]}


def run_trl(a: argparse.Namespace) -> dict:
    """This script's ``_trl`` runner in a fresh process, TRL on its PYTHONPATH."""
    env = dict(os.environ)
    if a.trl_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (a.trl_path, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, __file__, *sys.argv[1:], "--trl-runner"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    found = [line[len(RESULT):] for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if proc.returncode or not found:
        raise RuntimeError(f"TRL runner failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    return {**json.loads(found[-1]), "wall_s": wall}


def trl_runner(a: argparse.Namespace) -> None:
    """TRL's RewardTrainer on the job (see the module docstring); prints one RESULT line."""
    import datasets
    import torch
    import trl
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import RewardConfig, RewardTrainer
    from trl.trainer.reward_trainer import DataCollatorForPreference

    from rlft.config.loading import compose
    from rlft.data.conversation import conversation_ids
    from rlft.models.loading import load_base, quiet_libraries
    from rlft.rm.command import RM_SCHEMA
    from rlft.rm.data import load_pairs
    from rlft.rm.train import batch_indices

    cfg, _, _ = compose(overrides(a), RM_SCHEMA)
    quiet_libraries()
    model, tok = load_base(cfg.model, torch.float32, cfg.seed, "cpu", num_labels=1)
    if not getattr(tok, "chat_template", None):
        sys.exit("compare_trl_rm: the model's tokenizer has no chat template")
    pairs = load_pairs(cfg.data)

    def kept(ps):  # rlft's encode_pairs, keeping each pair with its ids
        out = []
        for p in ps:
            ids = [conversation_ids(tok, p.prompt, r) for r in (p.chosen, p.rejected)]
            if not a.max_length or max(map(len, ids)) <= a.max_length:
                out.append((p, ids))
        return out

    train, held = kept(pairs.train), kept(pairs.eval)
    order = [i for s in range(a.steps) for i in batch_indices(s * a.batch_size, a.batch_size, len(train), a.seed)]
    train_ds = datasets.Dataset.from_list([_row(train[i][0]) for i in order])

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

    class Trainer(RewardTrainer):
        def create_scheduler(self, num_training_steps, optimizer=None):  # rlft's warm-up, then constant
            if self.lr_scheduler is None:
                w = a.warmup
                self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                    optimizer or self.optimizer, lambda k: (k + 1) / w if k < w else 1.0)
            return self.lr_scheduler

    lora = cfg.model.lora
    args = RewardConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-rm-"), max_steps=a.steps, per_device_train_batch_size=a.batch_size,
        gradient_accumulation_steps=1, learning_rate=a.lr, adam_beta1=0.9, adam_beta2=0.99, adam_epsilon=1e-8,
        weight_decay=0.0, max_grad_norm=1.0, bf16=a.dtype == "bf16", use_cpu=True, report_to="none",
        save_strategy="no", eval_strategy="no", logging_steps=1, disable_tqdm=True, seed=a.seed,
        gradient_checkpointing=a.trl_gc, train_sampling_strategy="sequential", max_length=a.max_length or None)
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, processing_class=tok, callbacks=[Timer()],
                      peft_config=LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                             target_modules=list(lora.target_modules), modules_to_save=["score"],
                                             task_type="SEQ_CLS"))
    same = _same_ids(trainer.train_dataset, [train[i][1] for i in order])
    init_diff = _init_diff(trainer.model, cfg)
    trainer.train()
    held_ds = trainer._prepare_dataset(datasets.Dataset.from_list([_row(p) for p, _ in held]), tok, args, "eval")
    same_eval = _same_ids(held_ds, [ids for _, ids in held])
    acc = _accuracy(trainer.model, held_ds, DataCollatorForPreference(pad_token_id=tok.pad_token_id),
                    a.batch_size, a.dtype == "bf16")
    loss = next((h["loss"] for h in reversed(trainer.state.log_history) if "loss" in h), None)
    print(RESULT + json.dumps({
        "tool": "trl", "version": trl.__version__, "accuracy": acc, "step_times": times, "final_loss": loss,
        "same_ids": [same, len(order)], "init_max_abs_diff": init_diff, "same_eval_ids": [same_eval, len(held)],
        "optimizer": type(getattr(trainer.optimizer, "optimizer", trainer.optimizer)).__name__,
        "rows": len(trainer.train_dataset), "threads": torch.get_num_threads()}), flush=True)


def _init_diff(model, cfg) -> float:
    """Largest difference between TRL's trainable tensors before training and those rlft builds for the
    same config and seed (LoRA A and B, score head): 0 when both start from the same model."""
    import torch

    from rlft.rm.model import build_reward_model

    ours = build_reward_model(cfg.model, cfg.seed, torch.device("cpu")).trainable()
    theirs = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if ours.keys() != theirs.keys():
        return float("inf")
    return max(float((ours[n].float() - theirs[n].float()).abs().max()) for n in ours)


def _row(pair) -> dict:
    """A pair as TRL's conversational preference row (TRL applies the chat template to prompt + reply)."""
    prompt = [{"role": "user", "content": pair.prompt}] if isinstance(pair.prompt, str) else pair.prompt
    return {"prompt": prompt, **{k: [{"role": "assistant", "content": v}] if isinstance(v, str) else v
                                 for k, v in (("chosen", pair.chosen), ("rejected", pair.rejected))}}


def _same_ids(ds, rlft_ids: list[list[list[int]]]) -> int:
    """How many of TRL's tokenized rows equal rlft's ids, chosen and rejected."""
    return sum(list(c) == ids[0] and list(r) == ids[1]
               for c, r, ids in zip(ds["chosen_ids"], ds["rejected_ids"], rlft_ids))


def _accuracy(model, ds, collate, batch: int, bf16: bool) -> float:
    """Share of held-out pairs whose chosen reply scores strictly higher, ``batch`` pairs per padded pass."""
    import torch

    model.eval()
    right = 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        for i in range(0, len(ds), batch):
            rows = [ds[j] for j in range(i, min(i + batch, len(ds)))]
            inputs = collate(rows)
            scores = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits[:, 0]
            r_c, r_r = scores.float().chunk(2)
            right += int((r_c > r_r).sum())
    return right / len(ds)


def gemm() -> dict[str, float]:
    import torch

    from rlft.models.precision import gemm_gflops

    return {"fp32": gemm_gflops(torch.float32, *GEMM_SHAPE), "bf16": gemm_gflops(torch.bfloat16, *GEMM_SHAPE)}


def summary(res: dict) -> dict:
    t = res["step_times"]
    return {"accuracy": res["accuracy"], "median_s": statistics.median(t[SKIP:] or t), "train_s": sum(t),
            "steps": len(t), "wall_s": res["wall_s"]}


def compare(a: argparse.Namespace) -> None:
    import torch

    from rlft.models.precision import cpu_model

    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads", flush=True)
    g0 = gemm()
    print(f"GEMM before: fp32 {g0['fp32']:.0f}, bf16 {g0['bf16']:.0f} GFLOP/s", flush=True)
    plan = ["rlft", "trl"] + (["rlft"] if a.repeat else [])
    runs = []
    for i, tool in enumerate(plan, 1):
        res = (run_rlft if tool == "rlft" else run_trl)(a)
        res["summary"] = s = summary(res)
        runs.append(res)
        print(f"[{i}/{len(plan)}] {tool}: held-out accuracy {s['accuracy']:.3f}, median {s['median_s']:.3f} s/step, "
              f"{s['train_s']:.1f} s in steps, {s['wall_s']:.0f} s in all, final loss {res['final_loss']}", flush=True)
    g1 = gemm()
    print(f"GEMM after: fp32 {g1['fp32']:.0f}, bf16 {g1['bf16']:.0f} GFLOP/s")
    trl = next(r for r in runs if r["tool"] == "trl")
    (s, n), (se, ne) = trl["same_ids"], trl["same_eval_ids"]
    print(f"TRL {trl['version']} ({trl['optimizer']}): token sequences equal to rlft's: training rows {s}/{n} "
          f"({trl['rows']} rows after TRL's length filter), held-out {se}/{ne}; initial trainable tensors "
          f"(LoRA, score head) against rlft's: max |diff| {trl['init_max_abs_diff']:.2g}")
    rl = [r["summary"]["median_s"] for r in runs if r["tool"] == "rlft"]
    print(f"median s/step, TRL / rlft (rlft: mean of its runs): {trl['summary']['median_s'] / statistics.mean(rl):.2f}x")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "gemm": {"before": g0, "after": g1}, "cpu": cpu_model(),
                                            "plan": plan, "runs": runs}, indent=1))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", required=True, help="training pairs (jsonl: prompt, chosen, rejected)")
    p.add_argument("--eval", help="held-out pairs (same columns; default: the last --num-eval rows of --train)")
    p.add_argument("--num-eval", type=int, default=32, help="rows held out of --train when --eval is not given")
    p.add_argument("--model", default="smollm2_135m", help="rlft's model group: smollm2_135m, or tiny for a check")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=8, help="pairs per optimizer step (one pass, no accumulation)")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--warmup", type=int, default=5, help="linear warm-up steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-length", type=int, default=1024, help="drop pairs longer than this many tokens")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--repeat", action="store_true", help="run rlft again after TRL (drift shows)")
    p.add_argument("--trl-path", default=os.environ.get("TRL_SITE"),
                   help="a directory holding TRL (pip install --target), first on the TRL process's PYTHONPATH "
                        "(default: $TRL_SITE; none: TRL must be importable)")
    p.add_argument("--trl-gc", action="store_true", help="TRL with gradient checkpointing (its default)")
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--trl-runner", action="store_true", help=argparse.SUPPRESS)  # internal: the TRL process
    a = p.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    trl_runner(a) if a.trl_runner else compare(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
