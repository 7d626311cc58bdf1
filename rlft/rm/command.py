"""``rlft rm [KEY=VALUE ...]``: a Hydra application like ``rlft train`` (:mod:`rlft.commands.train`), composed from
conf/rm.yaml on :class:`rlft.config.rm_schema.RMConfig`; and ``rlft export`` of its checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from rlft.commands.train import App, check_nproc, run_ranks, run_task
from rlft.commands.train import run as run_app
from rlft.config.loading import Schema, compose_on, group_options, to_config
from rlft.config.rm_schema import RM_GROUPS, RMConfig, validate_rm
from rlft.rm.data import rendering

# torch, transformers and peft are imported inside the functions that need them: `rlft rm --help`
# and a wrong override are answered before they load.

RM_SCHEMA = Schema("rm", RMConfig, RM_GROUPS, validate_rm, "rlft_rm_schema")


def task(raw: Any) -> float:
    """``rlft rm``'s Hydra task. Returns the final held-out pairwise accuracy (NaN: none), for sweepers."""
    return run_task(raw, RM_APP)


def _job(raw: Any, run_dir: Path, in_sweep: bool, status: dict[str, Any], t0: float) -> float:
    from rlft.parallel.distributed import launched  # torch
    from rlft.rm.train import train_rm  # torch

    cfg = to_config(raw, RM_SCHEMA)
    if cfg.trainer.nproc > 1 and not launched():
        return run_ranks(RM_APP, cfg.trainer.nproc, run_dir, in_sweep, status, t0)
    check_nproc(cfg.trainer.nproc)
    metrics = train_rm(cfg, run_dir, OmegaConf.to_yaml(raw, resolve=True))
    return float(metrics.get("eval/rm_accuracy", float("nan")))


RM_APP = App("rm", RM_SCHEMA, task, _job, result="eval/rm_accuracy")


USAGE = """usage: rlft rm [KEY=VALUE ...] [-m] [HYDRA FLAGS]

Train a Bradley-Terry reward model on preference pairs (rows with prompt, chosen, rejected), from
conf/rm.yaml (a Hydra application, like rlft train).

  rlft rm data.path=pairs.jsonl                      SmolLM2-135M + LoRA, the last 64 pairs held out
  rlft rm model=local model.path=DIR data.path=pairs.parquet data.eval_path=test.parquet
  rlft rm model=tiny model.lora.enabled=false ...    full fine-tuning
  rlft rm ... hydra.run.dir=runs/rm1 trainer.resume=auto     continue a stopped run
  rlft rm -m optim.lr=1e-4,5e-4 data.path=pairs.jsonl        a sweep
  rlft rm trainer.nproc=2 ...                        2 data-parallel ranks (or: torchrun --nproc-per-node 2 -m rlft rm ...)
  rlft rm --cfg job                                  print the composed config
  rlft export runs/rm1 rm_out/                       a checkpoint as a sequence-classification directory

Config groups (GROUP=OPTION): model ({models}), logger ({loggers})
Sections (SECTION.KEY=VALUE): model data trainer optim logger; top-level keys: loss seed
Every key with its meaning: docs/guide/reward-models.md, "Training a reward model". Exit codes as rlft train.
"""


def main(args: list[str]) -> int:
    """``rlft rm ARGS``; returns the exit code."""
    if {"-h", "--help"} & set(args):
        print(USAGE.format(models=", ".join(group_options("model")), loggers=", ".join(group_options("logger"))))
        return 0
    return run_app(args, RM_APP)


def export_checkpoint(path: Path, out: Path) -> None:
    """A reward-model checkpoint as a Hugging Face sequence-classification directory at ``out`` (new or empty).

    Raises:
        CheckpointError: ``out`` is not new or empty, or the checkpoint does not fit its config's model.
        ConfigError, ModelError: the checkpoint's config or model cannot be used.
    """
    import torch  # as the module says

    from rlft.models.loading import quiet_libraries  # torch
    from rlft.rm.model import build_reward_model, save_reward_model  # torch
    from rlft.rm.state import load_weights  # torch
    from rlft.state import checkpoint as ckpt  # torch
    from rlft.state.run_state import CONFIG  # torch

    quiet_libraries()
    cfg = compose_on((path / CONFIG).read_text(), [], RM_SCHEMA)
    cfg.model.dtype = ckpt.read_json(path, ckpt.STATE).get("compute_dtype", "fp32")
    rm = build_reward_model(cfg.model, cfg.seed, torch.device("cpu"))
    load_weights(rm, path)
    save_reward_model(rm, out, rendering(cfg.data, rm.tokenizer))
