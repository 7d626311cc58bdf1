"""GPU checks: every test here is marked ``gpu`` and skipped without CUDA (``make test-gpu`` runs them).

``RLFT_GPU_TESTS_DEVICE=cpu`` runs the same tests with the CPU standing in for the GPU (the
CUDA-only assertions skip themselves): a dry run of the test code on a machine without one.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    skip = pytest.mark.skip(reason="needs a CUDA device (or RLFT_GPU_TESTS_DEVICE=cpu for a dry run)")
    for item in items:
        if Path(str(item.fspath)).resolve().parent == here:
            item.add_marker(pytest.mark.gpu)
            if os.environ.get("RLFT_GPU_TESTS_DEVICE", "cuda") == "cuda" and not torch.cuda.is_available():
                item.add_marker(skip)
