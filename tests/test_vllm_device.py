"""trainer.device=cuda:N in one process puts the vLLM engine on GPU N too (vLLM alone would take GPU 0).
The placement is computed on the CPU; tests/gpu runs an engine through it."""

from __future__ import annotations

import pytest
import torch

from rlft.config import ConfigError
from rlft.config.validation import vllm_available
from rlft.samplers.vllm import engine_placement

pytestmark = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")


@pytest.mark.parametrize("device", ["cpu", "cuda", None])
def test_without_an_index_vllm_places_the_engine_itself(device):
    assert engine_placement(device) == {}


def test_under_torchrun_the_rank_gpu_comes_from_local_rank(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert engine_placement("cuda:1") == {}


@pytest.mark.parametrize("index", [0, 3])
def test_cuda_n_gives_the_engine_worker_local_rank_n(index):
    """The executor's worker takes ``cuda:<local rank>`` (vllm.v1.worker.gpu_worker); vLLM's own
    executor derives that rank from its index-less device: 0."""
    from types import SimpleNamespace

    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    executor = engine_placement(torch.device(f"cuda:{index}"))["distributed_executor_backend"]
    assert issubclass(executor, UniProcExecutor)
    pinned = object.__new__(executor)
    pinned.vllm_config = SimpleNamespace(device_config=SimpleNamespace(device=torch.device("cuda")))
    _, rank, local_rank = executor._distributed_args(pinned)
    assert (rank, local_rank) == (0, index)
    stock = object.__new__(UniProcExecutor)
    stock.vllm_config = pinned.vllm_config
    assert UniProcExecutor._distributed_args(stock)[2] == 0  # the bug: every cuda:N engine on GPU 0


def test_cuda_n_with_a_tensor_parallel_engine_is_refused():
    with pytest.raises(ConfigError, match="tensor_parallel_size=2.*CUDA_VISIBLE_DEVICES"):
        engine_placement("cuda:1", tensor_parallel_size=2)


ENGINE = """
import os, sys, tempfile
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
import torch
from vllm import LLM, SamplingParams
from rlft.config import compose
from rlft.models.loading import load_base
from rlft.samplers.vllm import pinned_executor

cfg, _, _ = compose(["model=tiny"])
model, tok = load_base(cfg.model, torch.float32, 0)
path = tempfile.mkdtemp()
model.save_pretrained(path)
tok.save_pretrained(path)
llm = LLM(model=path, distributed_executor_backend=pinned_executor(0), kv_cache_memory_bytes=2**28,
          enforce_eager=True, max_model_len=128, dtype="float32")
out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)
print("EXECUTOR", type(llm.llm_engine.engine_core.engine_core.model_executor).__name__, len(out[0].outputs[0].token_ids))
"""


@pytest.mark.slow  # starts a vLLM engine (~14 s)
def test_vllm_runs_an_engine_through_the_pinned_executor():
    """vLLM takes the executor class and samples with it (on the CPU: worker 0), in a process of its own
    (a second engine in the test process would share vLLM's globals with tests/test_vllm.py's)."""
    import os
    import subprocess
    import sys

    from tests.support import ROOT

    r = subprocess.run([sys.executable, "-c", ENGINE], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0 and "EXECUTOR PinnedExecutor 4" in r.stdout, r.stderr[-3000:]
