"""Shared fixtures: a tiny config and the run of the CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

TINY = [
    "sampler=hf",
    "model=tiny",
    "trainer.steps=2",
    "trainer.num_prompts=2",
    "sampler.n=4",
    "sampler.max_new_tokens=8",
    "data.num_eval=8",
    "trainer.eval_every=0",
    "logger.console=false",
]


def run_cli(args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "rlft.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def compose_cfg():
    from rlft.config import compose

    def _compose(*overrides: str):
        cfg, _, _ = compose(list(overrides))
        return cfg

    return _compose


def pytest_collection_modifyitems(config, items):
    """tests/gpu: marked ``gpu`` and skipped without CUDA (``make test-gpu``). ``RLFT_GPU_TESTS_DEVICE=cpu``
    runs them with the CPU standing in for the GPU (their CUDA-only checks skip themselves): a dry run
    of the test code on a machine without one. (No conftest.py in tests/gpu: a second module named
    conftest would shadow this one for ``from conftest import ...``.)"""
    import torch

    gpu_dir = ROOT / "tests" / "gpu"
    skip = pytest.mark.skip(reason="needs a CUDA device (or RLFT_GPU_TESTS_DEVICE=cpu for a dry run)")
    no_gpu = os.environ.get("RLFT_GPU_TESTS_DEVICE", "cuda") == "cuda" and not torch.cuda.is_available()
    for item in items:
        if Path(str(item.fspath)).resolve().parent == gpu_dir:
            item.add_marker(pytest.mark.gpu)
            if no_gpu:
                item.add_marker(skip)
