"""``trainer``: the loop (steps, batch, checkpoints, resume, devices and ranks) and ``optim``: AdamW and its
schedule."""

from __future__ import annotations

from dataclasses import dataclass

from rlft.config.schemas.fields import CHECKPOINTING, EVAL_ONLY, HARMFUL, HARMLESS, NUMERICS, OPTIMIZER, WAITING, knob

STEPS = (HARMLESS, "where to stop; with optim.schedule=constant no LR depends on it")
MICRO_BATCH = (NUMERICS, "float summation order and padding of the gradient accumulation")


@dataclass
class LoopConfig:
    """The ``trainer`` keys that ``rlft train`` (:class:`TrainerConfig`) and ``rlft rm``
    (:class:`rlft.config.rm_schema.RMTrainerConfig`) share; each adds its own."""

    eval_every: int = knob(10, EVAL_ONLY, range="[0, inf)")
    """Evaluate on the held-out split (rlft rm: pairwise accuracy) every N steps (0: only at the end)."""
    eval_at_start: bool = knob(True, EVAL_ONLY)
    """Evaluate before the first update, as the baseline."""
    save_every: int = knob(0, CHECKPOINTING, range="[0, inf)")
    """Write a checkpoint every N steps (0: only the final one)."""
    keep_last: int = knob(0, CHECKPOINTING, range="[0, inf)")
    """Keep only the newest K checkpoints (0: keep all)."""
    resume: str = knob("", CHECKPOINTING)
    """'' starts fresh; auto continues from the newest complete checkpoint in the run directory
    (fresh if none); a path continues from that checkpoint (or the newest one in that run directory)."""
    threads: int = knob(0, (NUMERICS, "float rounding of CPU kernels that split work by thread"), range="[0, inf)")
    """torch intra-op threads (0: torch's default)."""
    device: str = knob("auto", (NUMERICS, "rounding of another device's kernels (a checkpoint maps onto any device)"))
    """Where the learner (the trained model, its optimizer and batches; in rlft train also the reference and
    critic) runs: auto (cuda when available, else cpu), cpu, cuda or cuda:N."""
    stop_grace_s: float = knob(300.0, WAITING, range="[0, inf)")
    """After the first Ctrl-C/SIGTERM, how long the current step may take to finish (it is then saved)
    before it is aborted as by a second signal (the step before it is saved); 0: wait however long it takes."""
    dist_timeout_s: float = knob(300.0, WAITING, range="(0, inf)")
    """Under several ranks: how long a collective may wait for the other ranks before this rank ends
    with one line saying another rank stopped answering (a rank that died or hangs; gloo and NCCL)."""


@dataclass
class TrainerConfig(LoopConfig):
    steps: int = knob(30, STEPS, range="[1, inf)")
    """Rollout/update iterations."""
    nproc: int = knob(1, (NUMERICS, "the order of the gradient sum over ranks (rollouts are seeded per prompt)"),
                      range="[1, inf)")
    """Data-parallel ranks to start on this machine through torch's launcher (1: this process only;
    under torchrun leave it 1: --nproc-per-node decides). trainer.num_prompts must be a multiple of the ranks."""
    strategy: str = knob(
        "ddp", (NUMERICS, "the order of the gradient sum over ranks; checkpoints hold whole tensors either way"))
    """How the ranks hold the learner: ddp (every rank a full replica, gradients all-reduced) or fsdp2
    (the decoder's layers sharded over the ranks with fully_shard; LoRA only; needs several ranks)."""
    num_prompts: int = knob(4, (HARMFUL, "the batch size"), range="[1, inf)")
    """Prompts per rollout batch (each sampled sampler.n times)."""
    micro_batch_size: int = knob(16, MICRO_BATCH, range="[1, inf)")
    """Sequences per forward/backward pass (gradient accumulation inside a mini-batch)."""
    max_minutes: float = knob(0.0, (HARMLESS, "where to stop; the steps run are unchanged"), range="[0, inf)")
    """Wall-clock budget: stop after the step that crosses it, then evaluate and checkpoint (0: off)."""


@dataclass
class OptimConfig:
    lr: float = knob(2e-4, OPTIMIZER, range="(0, inf)")
    """AdamW learning rate."""
    weight_decay: float = knob(0.0, OPTIMIZER, range="[0, inf)")
    """AdamW weight decay."""
    betas: list[float] = knob(resume=OPTIMIZER, factory=lambda: [0.9, 0.99], range="[0, 1)")
    """AdamW betas."""
    warmup_steps: int = knob(3, OPTIMIZER, range="[0, inf)")
    """Linear warm-up, in optimizer steps."""
    schedule: str = knob("constant", OPTIMIZER)
    """After warm-up: constant, linear (to 0) or cosine (to 0)."""
    max_grad_norm: float = knob(1.0, OPTIMIZER, range="[0, inf)")
    """Gradient clipping by global norm (0: off)."""
