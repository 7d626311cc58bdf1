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
