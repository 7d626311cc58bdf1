"""Fixtures and collection hooks only: what test modules import lives in tests/support.py (shared helpers)
and tests/helpers.py (reward functions named by dotted path)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


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
    of the test code on a machine without one."""
    import torch

    gpu_dir = Path(__file__).resolve().parent / "gpu"
    skip = pytest.mark.skip(reason="needs a CUDA device (or RLFT_GPU_TESTS_DEVICE=cpu for a dry run)")
    no_gpu = os.environ.get("RLFT_GPU_TESTS_DEVICE", "cuda") == "cuda" and not torch.cuda.is_available()
    for item in items:
        if Path(str(item.fspath)).resolve().parent == gpu_dir:
            item.add_marker(pytest.mark.gpu)
            if no_gpu:
                item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _precision_cache(tmp_path_factory):
    """model.dtype=auto's measurements (rlft.models.precision) go to a cache of the session's, as empty as
    CI's, never to the user's $RLFT_CACHE/precision."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLFT_PRECISION_CACHE", str(tmp_path_factory.mktemp("precision")))
        yield


@pytest.fixture(scope="session")
def reward_model_dir(tmp_path_factory):
    """A tiny random reward model (tests.support.write_reward_model), built once per session."""
    from tests.support import write_reward_model

    path = tmp_path_factory.mktemp("reward_model") / "rm"
    write_reward_model(path)
    return path
