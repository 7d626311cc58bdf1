"""``rlft sft [KEY=VALUE ...]``: a Hydra application like ``rlft train`` (:mod:`rlft.commands.train`), composed from
conf/sft.yaml on :class:`rlft.config.sft_schema.SFTConfig`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from rlft.commands.train import App, check_nproc, run_ranks, run_task
from rlft.commands.train import run as run_app
from rlft.config.loading import Schema, group_options, to_config
from rlft.config.sft_schema import SFT_GROUPS, SFTConfig, validate_sft

# torch, transformers and peft are imported inside the functions that need them: `rlft sft --help`
# and a wrong override are answered before they load.

SFT_SCHEMA = Schema("sft", SFTConfig, SFT_GROUPS, validate_sft, "rlft_sft_schema")


def task(raw: Any) -> float:
    """``rlft sft``'s Hydra task. Returns the final held-out loss (NaN: none), for sweepers."""
    return run_task(raw, SFT_APP)


def _job(raw: Any, run_dir: Path, in_sweep: bool, status: dict[str, Any], t0: float) -> float:
    from rlft.parallel.distributed import launched  # torch
    from rlft.sft.train import train_sft  # torch

    cfg = to_config(raw, SFT_SCHEMA)
    if cfg.trainer.nproc > 1 and not launched():
        return run_ranks(SFT_APP, cfg.trainer.nproc, run_dir, in_sweep, status, t0)
    check_nproc(cfg.trainer.nproc)
    metrics = train_sft(cfg, run_dir, OmegaConf.to_yaml(raw, resolve=True))
    return float(metrics.get("eval/sft_loss", float("nan")))


SFT_APP = App("sft", SFT_SCHEMA, task, _job, result="eval/sft_loss")


USAGE = """usage: rlft sft [KEY=VALUE ...] [-m] [HYDRA FLAGS]

Supervised fine-tuning on demonstrations (rows with prompt + completion, or messages), rendered as
rlft train renders the same conversations, from conf/sft.yaml (a Hydra application, like rlft train).
Only the assistant's tokens are trained, in every turn, its end-of-turn token included.

  rlft sft data.path=demos.jsonl                     SmolLM2-135M + LoRA, the last 32 rows held out
  rlft sft model=local model.path=DIR data.path=chats.parquet data.eval_path=test.parquet
  rlft sft ... hydra.run.dir=runs/sft1 trainer.resume=auto     continue a stopped run
  rlft sft -m optim.lr=1e-4,5e-4 data.path=demos.jsonl        a sweep
  rlft sft trainer.nproc=2 ...                       2 data-parallel ranks
  rlft sft --cfg job                                 print the composed config
  rlft train model=local model.path=RUN/model        RL from the result (it is the reference policy too)

Config groups (GROUP=OPTION): model ({models}), logger ({loggers})
Sections (SECTION.KEY=VALUE): model data trainer optim logger; top-level key: seed
Every key with its meaning: docs/reference/config.md. Exit codes as rlft train.
"""


def main(args: list[str]) -> int:
    """``rlft sft ARGS``; returns the exit code."""
    if {"-h", "--help"} & set(args):
        print(USAGE.format(models=", ".join(group_options("model")), loggers=", ".join(group_options("logger"))))
        return 0
    return run_app(args, SFT_APP)
