"""``rlft rm``'s loop: batches of preference pairs -> Bradley-Terry loss -> AdamW -> log -> checkpoint,
the held-out pairwise accuracy every ``trainer.eval_every`` steps, and the trained model exported
as a Hugging Face sequence-classification directory at the end.

Each step draws the next ``trainer.batch_size`` pairs of a seeded order (a new permutation each
epoch), so the data position is one number and a resumed run continues exactly where it stopped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rlft.algorithms.preference import PREFERENCE_LOSSES, pairwise_accuracy
from rlft.config.rm_schema import RM_KEY_CLASSES
from rlft.errors import DataError
from rlft.output.plots import plot_run
from rlft.output.tracking import Tracker
from rlft.parallel.distributed import SINGLE, DataParallel
from rlft.rm import state as rm_state
from rlft.rm.data import Encoded, encode_pairs, load_pairs, rendering
from rlft.rm.model import RewardModel, build_reward_model, save_reward_model
from rlft.state.job_start import Silent, open_outputs, run_steps, start_job
from rlft.training.optimizer import adamw

if TYPE_CHECKING:
    from rlft.config.rm_schema import RMConfig

EXPORT_DIR = "reward_model"
"""Where the end of a run writes the trained model, in its run directory."""


def train_rm(cfg: RMConfig, run_dir: Path, resolved_yaml: str) -> dict[str, float]:
    """Train (or continue, per ``trainer.resume``) a reward model; returns the last step's metrics.

    Under torchrun every rank calls this with the same ``run_dir``: each scores its share of every
    batch, the gradients are summed over the ranks (each rank's loss is its share of the batch's
    mean), so every rank takes the step one process would; rank 0 logs and writes."""

    t = cfg.trainer
    job = start_job(cfg, run_dir, resolved_yaml, RM_KEY_CLASSES)
    dp, resume, harmless, device, precision = job.dp, job.resume, job.harmless, job.device, job.precision
    notes: list[str] = []
    pairs = load_pairs(cfg.data)  # before the model: a data error costs no model load
    rm = build_reward_model(cfg.model, cfg.seed, device, notes)
    train_pairs, long_train = encode_pairs(pairs.train, rm.tokenizer, cfg.data)
    eval_pairs, long_eval = encode_pairs(pairs.eval, rm.tokenizer, cfg.data)
    if not train_pairs:
        raise DataError(f"data.max_length={cfg.data.max_length}: the prompt of every one of the {len(pairs.train)} "
                        "training pairs leaves no room for its replies; raise data.max_length")
    optimizer, scheduler = adamw([{"params": list(rm.trainable().values()), "lr": cfg.optim.lr}], cfg.optim, t.steps)
    st = rm_state.restore(rm, optimizer, scheduler, resume, dp.rank) if resume else rm_state.RMState()
    start = st.step
    out = open_outputs(dp, run_dir, cfg, resolved_yaml, st.step, resume)
    try:
        ranks = f" x {dp.world} ranks" if dp.active else ""
        out.info(f"run dir {run_dir} | reward model {cfg.model.name} "
                 f"({f'LoRA r={cfg.model.lora.r} + score head' if rm.lora else 'full'}) on {device}{ranks} | "
                 f"{len(train_pairs)} training pairs, {len(eval_pairs)} held out | {precision.reason}")
        cut = (sum(p.cut for p in train_pairs), sum(p.cut for p in eval_pairs))
        for line in notes + _dropped_lines(pairs.identical, (long_train, long_eval), cut, cfg.data.max_length):
            out.info(line)
        if resume:
            out.info(f"resumed from {resume}" + (f" (changed: {'; '.join(harmless)})" if harmless else ""))
        _loop(cfg, rm, optimizer, scheduler, st, train_pairs, eval_pairs, out, run_dir, resolved_yaml, dp)
        if st.step > start:
            path = rm_state.save(rm, optimizer, scheduler, st, run_dir, resolved_yaml, t.keep_last, precision.dtype, dp)
            out.info(f"done: final checkpoint {path}")
        if t.export and dp.main:
            exported = save_reward_model(rm, run_dir / EXPORT_DIR, rendering(cfg.data, rm.tokenizer), replace=True)
            out.info(f"exported the reward model to {exported} (AutoModelForSequenceClassification)")
    finally:
        out.close()
    if dp.main:
        plot_run(run_dir)
    return st.metrics


def _dropped_lines(identical: tuple[int, int], long: tuple[int, int], cut: tuple[int, int],
                   max_length: int) -> list[str]:
    lines = []
    if any(identical):
        lines.append(f"dropped pairs whose chosen and rejected replies are the same: {identical[0]} training, "
                     f"{identical[1]} held-out")
    if any(long):
        lines.append(f"dropped pairs whose prompt leaves no room for the replies within data.max_length={max_length} "
                     f"tokens: {long[0]} training, {long[1]} held-out")
    if any(cut):
        lines.append(f"cut the beginning of the replies of pairs longer than data.max_length={max_length} tokens "
                     f"(prompt and reply end kept): {cut[0]} training, {cut[1]} held-out")
    return lines


def _loop(cfg: RMConfig, rm: RewardModel, optimizer: torch.optim.Optimizer, scheduler: object,
          st: rm_state.RMState, train_pairs: list[Encoded], eval_pairs: list[Encoded], out: Tracker | Silent,
          run_dir: Path, resolved_yaml: str, dp: DataParallel) -> None:
    t = cfg.trainer
    loss_fn = PREFERENCE_LOSSES.get(cfg.loss)
    run_steps(cfg, st, train_pairs,
              lambda batch: train_step(rm, batch, optimizer, scheduler, t.micro_batch_size, cfg.optim.max_grad_norm,
                                       loss_fn, dp),
              (lambda: evaluate(rm, eval_pairs, t.micro_batch_size, loss_fn, dp)) if eval_pairs else None,
              lambda: rm_state.save(rm, optimizer, scheduler, st, run_dir, resolved_yaml, t.keep_last, cfg.model.dtype,
                                    dp),
              out, dp)


def _chunks(items: list[Encoded], size: int) -> Iterator[list[Encoded]]:
    for i in range(0, len(items), size):
        yield items[i: i + size]


def _pair_scores(rm: RewardModel, pairs: list[Encoded]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(r_chosen, r_rejected, margin)`` of the pairs: both replies scored in one padded pass."""
    scores = rm.scores([p.chosen for p in pairs] + [p.rejected for p in pairs])
    margin = None
    if pairs[0].margin is not None:
        margin = torch.tensor([p.margin for p in pairs], dtype=torch.float32, device=scores.device)
    return scores[: len(pairs)], scores[len(pairs):], margin


def train_step(rm: RewardModel, batch: list[Encoded], optimizer: torch.optim.Optimizer, scheduler: object,
               micro_batch_size: int, max_grad_norm: float, loss_fn: object,
               dp: DataParallel = SINGLE) -> dict[str, float]:
    """One optimizer step over ``batch`` (gradients accumulated over micro-batches, each weighted by its
    share of the pairs, so the step is that of the batch's mean loss); returns its metrics. Under several
    ranks each scores its share of ``batch`` (the same batch on every rank) and the gradients and sums
    are added over the ranks."""
    rm.model.train()
    optimizer.zero_grad(set_to_none=True)
    loss_sum = acc_sum = margin_sum = 0.0
    for chunk in _chunks(dp.share(batch), micro_batch_size):
        r_c, r_r, margin = _pair_scores(rm, chunk)
        loss = loss_fn(r_c, r_r, margin)
        (loss * (len(chunk) / len(batch))).backward()
        loss_sum += loss.item() * len(chunk)
        acc_sum += pairwise_accuracy(r_c, r_r).item() * len(chunk)
        margin_sum += (r_c - r_r).sum().item()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    dp.sum_gradients(params)
    loss_sum, acc_sum, margin_sum = dp.sum_floats([loss_sum, acc_sum, margin_sum])
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else float("inf"))
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    n = len(batch)
    return {"rm/loss": loss_sum / n, "rm/accuracy": acc_sum / n, "rm/margin": margin_sum / n,
            "rm/grad_norm": float(norm), "rm/lr": lr}


@torch.no_grad()
def evaluate(rm: RewardModel, pairs: list[Encoded], micro_batch_size: int, loss_fn: object,
             dp: DataParallel = SINGLE) -> dict[str, float]:
    """Held-out pairwise accuracy (a tie counts as wrong), loss and mean score gap; each rank scores its
    share of ``pairs``."""
    rm.model.eval()
    loss_sum = acc_sum = margin_sum = 0.0
    for chunk in _chunks(dp.share(pairs), micro_batch_size):
        r_c, r_r, margin = _pair_scores(rm, chunk)
        loss_sum += loss_fn(r_c, r_r, margin).item() * len(chunk)
        acc_sum += pairwise_accuracy(r_c, r_r).item() * len(chunk)
        margin_sum += (r_c - r_r).sum().item()
    rm.model.train()
    loss_sum, acc_sum, margin_sum = dp.sum_floats([loss_sum, acc_sum, margin_sum])
    n = len(pairs)
    return {"eval/rm_accuracy": acc_sum / n, "eval/rm_loss": loss_sum / n, "eval/rm_margin": margin_sum / n}
