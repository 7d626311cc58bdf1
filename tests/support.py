"""What test modules share: the tiny config, the CLI in a subprocess, data and run-reading helpers.
Imported as ``tests.support`` (pytest's ``pythonpath`` puts the checkout on sys.path), never from conftest.py
or another test module: those would be imported a second time under another name. The reward functions that
runs name by dotted path are in tests/helpers.py, which CLI subprocesses and reward workers import: this module
imports pytest, that one must not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from rlft.output.tracking import read_metrics
from rlft.state import checkpoint as ckpt

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

# conf/algo/'s presets, as an unknown algo's error lists them.
ALGO_PRESETS = "cispo, dapo, drgrpo, gmpo, grpo, gspo, ppo, reinforce_pp, reinforce_pp_baseline, rloo"

# The real GSM8K (MIT) lives beside the checkout; the package does not ship it.
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"
needs_gsm8k = pytest.mark.skipif(not (GSM8K / "train.jsonl").is_file(), reason=f"GSM8K not found at {GSM8K}")

DIST_STEPS = 3
# Whole runs on several ranks (test_distributed_run, test_rank_timeout). DAPO with one sampling round per
# step: about half the groups (odd answers) score all 0 and are dropped, so the cap is hit and the kept
# groups split unevenly over two ranks (or all on one).
DIST_ARGS = ["sampler=hf", "model=tiny", "model.dtype=fp32", "trainer.threads=1", f"trainer.steps={DIST_STEPS}",
             "trainer.num_prompts=4", "sampler.n=4", "sampler.max_new_tokens=8", "algo=dapo",
             "algo.overlong_filter=false", "algo.max_sampling_rounds=1",
             "reward.fns=[tests.helpers:char_count_on_even]", "data.num_eval=4", "trainer.eval_every=0",
             "logger.rollouts=true", "optim.lr=1e-2", "logger.console=false"]


def run_cli(args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    # tests.helpers / tests.envs must import from any cwd, as a user's package on PYTHONPATH would.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path)
    return subprocess.run(
        [sys.executable, "-m", "rlft.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def dist_env(**extra: str) -> dict[str, str]:
    """The environment of a launcher run, without the variables of a rank this process might be."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    return dict(env, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", **extra)


def one_error_line(proc, code: int) -> str:
    assert proc.returncode == code, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlft: error: "), proc.stderr[-2000:]
    return lines[0]


def comparable_metrics(run_dir: Path) -> list[dict]:
    """Per-step metrics without wall-clock ones."""
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))}
            for r in read_metrics(run_dir / "metrics.jsonl")]


def saved_weights(run_dir: Path, step: int) -> dict:
    """The trainable tensors of a run's checkpoint at ``step``."""
    return load_file(str(run_dir / "checkpoints" / ckpt.step_dir_name(step) / "trainable.safetensors"))


def write_eos_model(path, eos_logit: float = 12.0) -> None:
    """The tiny random model, saved as a local HF directory, with its (tied) EOS embedding pointed
    along the mean final hidden state: about half its 8-token completions then end with EOS, where
    the plain random model never stops. For tests of the overlong filter and of stopping."""
    import torch

    from rlft.config import compose
    from rlft.models.loading import load_base

    cfg, _, _ = compose(TINY)
    model, tok = load_base(cfg.model, torch.float32, 0)
    ids = torch.randint(5, 3000, (16, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        mean = model.get_decoder()(input_ids=ids).last_hidden_state.reshape(-1, model.config.hidden_size).mean(0)
        model.get_output_embeddings().weight[tok.eos_token_id] = eos_logit * mean / (mean @ mean)
    model.save_pretrained(path)
    tok.save_pretrained(path)


def write_reward_model(path, num_labels: int = 1, pad_token: bool = True, seed: int = 0, tokenizer=None) -> None:
    """A tiny random-weight ``LlamaForSequenceClassification`` (the tiny model's shape and tokenizer, or
    ``tokenizer``) saved as a local HF directory: a reward model for tests. ``pad_token=False``: its
    tokenizer and config have no pad token (rlft then pads with EOS)."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from rlft.config import compose
    from rlft.models.loading import load_tokenizer

    cfg, _, _ = compose(TINY)
    tok, t = tokenizer or load_tokenizer(cfg.model), cfg.model.tiny
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
        num_hidden_layers=t.num_layers, num_attention_heads=t.num_heads, num_key_value_heads=t.num_kv_heads,
        head_dim=t.hidden_size // t.num_heads, num_labels=num_labels, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id if pad_token else None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForSequenceClassification(config)
        torch.nn.init.normal_(model.score.weight, std=1.0)  # scores of order 1, not 0.02
    if not pad_token:
        tok.pad_token = None
    model.save_pretrained(path)
    tok.save_pretrained(path)
def leaf_keys(cls: type, prefix: str = "") -> list[str]:
    """Every leaf key of a config schema (``algo.beta``, ``sampler.vllm.sync``, ``seed``)."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        sub = hints[f.name]
        is_section = isinstance(sub, type) and dataclasses.is_dataclass(sub)
        out += leaf_keys(sub, f"{prefix}{f.name}.") if is_section else [f"{prefix}{f.name}"]
    return out
