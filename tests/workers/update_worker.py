"""One rank of a data-parallel update (started by torchrun from tests/test_data_parallel.py).

Builds the components of the config given on the command line (the same seed on every rank:
the same initial weights), takes this rank's groups of a saved, prepared rollout batch, runs one
``update_policy`` over the ranks, and on rank 0 writes the trained tensors.

    torchrun --nproc-per-node N tests/workers/update_worker.py BATCH_FILE OUT_FILE OVERRIDE...
"""

from __future__ import annotations

import sys

import torch
from safetensors.torch import load_file, save_file

from rlft.config import compose
from rlft.parallel.distributed import from_environment
from rlft.parallel.fsdp import full_named
from rlft.state.run_state import trainable_tensors
from rlft.training.batch import RolloutBatch
from rlft.training.learner import update_policy
from rlft.training.loop import build_components
from rlft.training.rollout import rank_rows


def main() -> None:
    batch_file, out_file, *overrides = sys.argv[1:]
    cfg, _, _ = compose(overrides)
    dp = from_environment()
    c = build_components(cfg, dp=dp)
    batch = RolloutBatch(**load_file(batch_file))
    batch = batch.select(rank_rows(batch.group_ids, dp.rank, dp.world))
    c.policy.model.train()
    metrics = update_policy(c, batch, cfg)
    whole = full_named(trainable_tensors(c).items())  # under FSDP2 gathered from the shards: every rank takes part
    if dp.main:
        tensors = {k: v.detach().float().contiguous() for k, v in whole.items()}
        tensors["metric/loss"] = torch.tensor(metrics["loss"])
        tensors["metric/grad_norm"] = torch.tensor(metrics["grad_norm"])
        save_file(tensors, out_file)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
