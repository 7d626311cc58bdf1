"""``rlft sft``'s loop: batches of demonstrations -> the token-mean NLL of the assistant's tokens -> AdamW -> log ->
checkpoint; the held-out loss and token accuracy every ``trainer.eval_every`` steps; the trained model exported
(LoRA merged) at the end, for ``rlft train`` to start from.

Each step draws the next ``trainer.batch_size`` examples of a seeded order (a new permutation each epoch), so the
data position is one number and a resumed run continues exactly where it stopped. The log-probs come from the
learner's own pass (:func:`rlft.training.logprobs.token_logprobs`: no (B, T, V) logits), each example laid out as
an episode is: the prompt, then everything after it, the assistant's tokens in the loss.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlft.algorithms.sft import sft_loss
from rlft.config.sft_schema import SFT_KEY_CLASSES, SFT_KIND
from rlft.errors import DataError
from rlft.models.policy import build_policy
from rlft.output.plots import plot_run
from rlft.parallel.distributed import SINGLE, DataParallel
from rlft.rm import state as loop_state
from rlft.samplers.base import stop_token_ids
from rlft.sft.data import Dropped, read_conversations
from rlft.sft.render import Example, render_conversation, stop_id
from rlft.state.job_start import open_outputs, run_steps, start_job
from rlft.training.batch import RolloutBatch, pack
from rlft.training.logprobs import token_logprobs
from rlft.training.optimizer import adamw

if TYPE_CHECKING:
    from rlft.config.sft_schema import SFTConfig

EXPORT_DIR = "model"
"""Where the end of a run writes the trained model, in its run directory."""
KIND = SFT_KIND
"""``trainer_state.json``'s ``kind`` in a checkpoint of ``rlft sft``."""


@dataclass
class _Trained:
    """What the checkpoint code reads (rlft.rm.state's interface): the trained tensors by name, and their device."""

    model: Any
    device: torch.device

    def trainable(self) -> dict[str, torch.Tensor]:
        """Named as rlft train's policy tensors are (``policy/NAME``), so ``rlft export`` reads either."""
        return {f"policy/{n}": p for n, p in self.model.named_parameters() if p.requires_grad}


def train_sft(cfg: SFTConfig, run_dir: Path, resolved_yaml: str) -> dict[str, float]:
    """Train (or continue, per ``trainer.resume``) on demonstrations; returns the last step's metrics. Under torchrun
    every rank calls this: each takes its share of every batch, the gradients are summed, rank 0 writes."""
    t = cfg.trainer
    job = start_job(cfg, run_dir, resolved_yaml, SFT_KEY_CLASSES)
    dp, resume, harmless, device, precision = job.dp, job.resume, job.harmless, job.device, job.precision
    train_rows, eval_rows, dropped = _conversations(cfg)  # before the model: a data error costs no model load
    policy, _ = build_policy(cfg.model, cfg.seed, False, device)
    stop = stop_id(policy.tokenizer, stop_token_ids(policy.model.generation_config, policy.tokenizer))
    train = _encode(train_rows, policy.tokenizer, stop, cfg, dropped, "training")
    held = _encode(eval_rows, policy.tokenizer, stop, cfg, dropped, "held-out")
    if not train:
        raise DataError(f"{cfg.data.path}: no example left to train on ({'; '.join(dropped.lines()) or 'no rows'})")
    trained = _Trained(policy.model, device)
    optimizer, scheduler = adamw([{"params": policy.trainable_parameters(), "lr": cfg.optim.lr}], cfg.optim, t.steps)
    st = loop_state.restore(trained, optimizer, scheduler, resume, dp.rank) if resume else loop_state.RMState()
    start = st.step
    out = open_outputs(dp, run_dir, cfg, resolved_yaml, st.step, resume)
    try:
        ranks = f" x {dp.world} ranks" if dp.active else ""
        out.info(f"run dir {run_dir} | sft {cfg.model.name} ({f'LoRA r={cfg.model.lora.r}' if policy.lora else 'full'}) "
                 f"on {device}{ranks} | {len(train)} training examples, {len(held)} held out | {precision.reason}")
        for line in dropped.lines():
            out.info(line)
        if resume:
            out.info(f"resumed from {resume}" + (f" (changed: {'; '.join(harmless)})" if harmless else ""))
        _loop(cfg, policy, trained, optimizer, scheduler, st, train, held, out, run_dir, resolved_yaml, dp)
        if st.step > start:
            path = loop_state.save(trained, optimizer, scheduler, st, run_dir, resolved_yaml, t.keep_last,
                                   precision.dtype, dp, kind=KIND)
            out.info(f"done: final checkpoint {path}")
        if t.export and dp.main:
            out.info(f"exported the model to {_export(policy, run_dir / EXPORT_DIR)} (LoRA merged into the base)")
    finally:
        out.close()
    if dp.main:
        plot_run(run_dir)
    return st.metrics


def _conversations(cfg: SFTConfig) -> tuple[list, list, Dropped]:
    d = cfg.data
    fields = (d.prompt_field, d.completion_field, d.messages_field)
    rows, dropped = read_conversations(d.path, d.split, *fields)
    if d.eval_path or d.eval_split:
        held, more = read_conversations(d.eval_path or d.path, d.eval_split, *fields)
        dropped.merge(more)
        return rows, held, dropped
    n = d.num_eval
    if n >= len(rows):
        raise DataError(f"{d.path}: {len(rows)} usable rows leave none to train on after holding out "
                        f"data.num_eval={n}; lower it or give data.eval_path")
    return rows[: len(rows) - n], rows[len(rows) - n:] if n else [], dropped


def _encode(rows: list, tokenizer: Any, stop: int, cfg: SFTConfig, dropped: Dropped, which: str) -> list[Example]:
    out = []
    for where, messages in rows:
        try:
            ex = render_conversation(tokenizer, messages, stop, cfg.data.system_prompt)
        except DataError as e:
            dropped.add(str(e).split(":")[0], where, str(e))
            continue
        if cfg.data.max_length and len(ex.ids) > cfg.data.max_length:
            dropped.add(f"{which}: over data.max_length={cfg.data.max_length} tokens", where,
                        f"{len(ex.ids)} tokens (dropped, not cut)")
            continue
        out.append(ex)
    return out


def _loop(cfg: SFTConfig, policy: Any, trained: _Trained, optimizer: torch.optim.Optimizer, scheduler: Any,
          st: loop_state.RMState, train: list[Example], held: list[Example], out: Any, run_dir: Path,
          resolved_yaml: str, dp: DataParallel) -> None:
    t = cfg.trainer
    run_steps(cfg, st, train,
              lambda batch: train_step(policy, batch, optimizer, scheduler, t.micro_batch_size, cfg.optim.max_grad_norm,
                                       dp),
              (lambda: evaluate(policy, held, t.micro_batch_size, dp)) if held else None,
              lambda: loop_state.save(trained, optimizer, scheduler, st, run_dir, resolved_yaml, t.keep_last,
                                      cfg.model.dtype, dp, kind=KIND),
              out, dp)


def as_batch(examples: list[Example], pad_id: int, device: torch.device) -> RolloutBatch:
    """Examples laid out as episodes are: the prompt (up to the first assistant token), then the rest of the
    conversation, the assistant's tokens in the loss."""
    firsts = [ex.mask.index(True) for ex in examples]
    prompts = [ex.ids[:f] for ex, f in zip(examples, firsts)]
    rests = [ex.ids[f:] for ex, f in zip(examples, firsts)]
    input_ids, start, length, mask = pack(prompts, rests, pad_id)
    for i, (ex, f) in enumerate(zip(examples, firsts)):
        mask[i, : len(ex.ids) - f] = torch.tensor(ex.mask[f:], dtype=mask.dtype)
    n = len(examples)
    return RolloutBatch(input_ids, start, length, mask, torch.arange(n), torch.zeros(n),
                        torch.zeros(n, dtype=torch.bool)).to(device)


def train_step(policy: Any, batch: list[Example], optimizer: torch.optim.Optimizer, scheduler: Any,
               micro_batch_size: int, max_grad_norm: float, dp: DataParallel = SINGLE) -> dict[str, float]:
    """One optimizer step over ``batch``: each micro-batch's summed NLL divided by the assistant tokens of the whole
    step (over all ranks), so the gradient is the step's token mean whatever the split; returns its metrics."""
    t0 = time.perf_counter()
    policy.model.train()
    optimizer.zero_grad(set_to_none=True)
    mine = dp.share(batch)
    step_tokens = int(dp.sum_floats([float(sum(ex.assistant_tokens for ex in mine))])[0])
    nll = hits = entropy = 0.0
    for i in range(0, len(mine), micro_batch_size):
        rb = as_batch(mine[i: i + micro_batch_size], policy.tokenizer.pad_token_id, policy.device)
        with policy.autocast():
            logp, ent = token_logprobs(policy.model, rb, 1.0)
        loss = sft_loss(logp, rb.response_mask, step_tokens)
        loss.backward()
        nll += float(loss.detach()) * step_tokens
        hits += float(((logp.detach() > -0.6931471805599453) * rb.response_mask).sum())  # p > 1/2: the argmax
        entropy += float((ent.detach() * rb.response_mask).sum())
    params = policy.trainable_parameters()
    dp.sum_gradients(params)
    nll, hits, entropy = dp.sum_floats([nll, hits, entropy])
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else float("inf"))
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    n = max(step_tokens, 1)
    return {"sft/loss": nll / n, "sft/token_accuracy_lb": hits / n, "sft/entropy": entropy / n,
            "sft/tokens": float(step_tokens), "sft/tokens_per_s": step_tokens / max(time.perf_counter() - t0, 1e-9),
            "sft/grad_norm": float(norm), "sft/lr": lr}


@torch.no_grad()
def evaluate(policy: Any, examples: list[Example], micro_batch_size: int, dp: DataParallel = SINGLE
             ) -> dict[str, float]:
    """The held-out token-mean NLL of the assistant's tokens; each rank scores its share."""
    policy.model.eval()
    nll = tokens = 0.0
    mine = dp.share(examples)
    for i in range(0, len(mine), micro_batch_size):
        rb = as_batch(mine[i: i + micro_batch_size], policy.tokenizer.pad_token_id, policy.device)
        with policy.autocast():
            logp, _ = token_logprobs(policy.model, rb, 1.0)
        nll -= float((logp * rb.response_mask).sum())
        tokens += float(rb.response_mask.sum())
    policy.model.train()
    nll, tokens = dp.sum_floats([nll, tokens])
    return {"eval/sft_loss": nll / max(tokens, 1.0)}


def _export(policy: Any, out: Path) -> Path:
    """The trained model with its adapter merged, and its tokenizer, as a Hugging Face directory."""
    model = copy.deepcopy(policy.model)
    if policy.lora:
        model = model.merge_and_unload()
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.float32).save_pretrained(str(out), safe_serialization=True)
    policy.tokenizer.save_pretrained(str(out))
    return out
