"""Integration on the real SmolLM2-135M-Instruct (slow: run with `make test-slow`)."""

from __future__ import annotations

import json
import math

import pytest

from tests.support import run_cli

pytestmark = pytest.mark.slow


def test_smollm2_grpo_short_run(tmp_path):
    run = tmp_path / "run"
    proc = run_cli(
        [
            "train", "trainer.steps=2", "trainer.num_prompts=2", "sampler.n=4", "sampler.max_new_tokens=16",
            "data.num_eval=40", "data.digits=1", f"hydra.run.dir={run}",
        ],
        cwd=tmp_path, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    # The instruct model already adds 1-digit numbers well (83.5% greedy on 200 problems here).
    assert rows[0]["eval/accuracy"] >= 0.5
    for r in rows[1:]:
        assert all(math.isfinite(r[k]) for k in ("loss", "kl", "reward/mean", "entropy", "grad_norm"))
        assert r["tokens/generated"] > 0
    assert (run / "checkpoints" / "step_000002" / "adapter" / "adapter_model.safetensors").is_file()


def test_wandb_offline_run(tmp_path):
    run = tmp_path / "run"
    proc = run_cli(
        ["train", "model=tiny", "trainer.steps=1", "trainer.num_prompts=2", "sampler.n=2",
         "sampler.max_new_tokens=4", "data.num_eval=4", "logger.wandb.enabled=true", f"hydra.run.dir={run}"],
        cwd=tmp_path, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    offline = list((run / "wandb").glob("offline-run-*"))
    assert len(offline) == 1
    assert list(offline[0].glob("*.wandb"))
