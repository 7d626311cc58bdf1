"""trainer.device=cuda:N: the vLLM engine runs on GPU N, where its sleep frees memory (the last GPU,
so that on a machine with several this is not GPU 0, vLLM's own choice)."""

from __future__ import annotations

import os

import pytest
import torch

from rlft.config import compose
from rlft.training.loop import build_components
from tests.support import TINY

DEVICE = os.environ.get("RLFT_GPU_TESTS_DEVICE", "cuda")


def _worker_device(worker) -> str:
    return str(worker.device)


@pytest.mark.skipif(not DEVICE.startswith("cuda"), reason="GPU placement exists only on CUDA")
def test_the_engine_and_its_sleep_are_on_the_learners_gpu():
    pytest.importorskip("vllm")
    index = torch.cuda.device_count() - 1
    cfg, _, _ = compose(TINY + ["sampler=vllm", "sampler.vllm.gpu_memory_utilization=0.2",
                                "sampler.vllm.enforce_eager=true", f"trainer.device=cuda:{index}"])
    c = build_components(cfg)
    assert c.sampler.llm.collective_rpc(_worker_device) == [f"cuda:{index}"]
    torch.cuda.synchronize(index)
    torch.cuda.empty_cache()
    free_awake = torch.cuda.mem_get_info(index)[0]
    c.sampler.sleep()
    torch.cuda.synchronize(index)
    assert torch.cuda.mem_get_info(index)[0] - free_awake > 0.5 * 2**30  # the engine's memory left GPU index
