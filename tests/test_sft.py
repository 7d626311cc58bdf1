"""rlft sft end to end on the tiny model: the run directory, the loss it learns, micro-batches that change nothing,
exact resume, bad rows, the command line, and RL starting from its result."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.support import one_error_line, run_cli

FAST = ["model=tiny", "model.dtype=fp32", "trainer.threads=1", "trainer.eval_every=0", "trainer.eval_at_start=false",
        "trainer.batch_size=4", "optim.lr=1e-2", "optim.warmup_steps=0", "logger.console=false",
        "trainer.export=false", "data.num_eval=2"]


def write_demos(path, n: int) -> None:
    """Additions and their answers, as prompt-completion rows."""
    rows = [{"prompt": f"What is {a} + {a + 1}?", "completion": f"{a} + {a + 1} = {2 * a + 1}."} for a in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def sft_compose(*overrides: str):
    from omegaconf import OmegaConf

    from rlft.config.loading import compose
    from rlft.sft.command import SFT_SCHEMA

    cfg, raw, _ = compose(list(overrides), SFT_SCHEMA)
    return cfg, OmegaConf.to_yaml(raw, resolve=True)


def train(run_dir, *overrides: str) -> dict:
    from rlft.sft.train import train_sft

    cfg, text = sft_compose(*overrides)
    return train_sft(cfg, run_dir, text)


def records(run_dir) -> list[dict]:
    from rlft.output.tracking import read_metrics

    return read_metrics(run_dir / "metrics.jsonl")


def test_a_run_learns_its_demonstrations_and_writes_its_run_directory(tmp_path):
    write_demos(tmp_path / "d.jsonl", 10)
    train(tmp_path / "run", *FAST, f"data.path={tmp_path / 'd.jsonl'}", "trainer.steps=12", "trainer.export=true",
          "trainer.eval_every=6", "model.lora.enabled=false", "optim.lr=3e-3")  # a random model: LoRA learns slowly
    rows = records(tmp_path / "run")
    losses = [r["sft/loss"] for r in rows if "sft/loss" in r]
    assert len(losses) == 12 and losses[-1] < 0.75 * losses[0], losses  # from ln(vocab) = 10.8 for the random model
    held = {r["step"]: r["eval/sft_loss"] for r in rows if "eval/sft_loss" in r}
    assert sorted(held) == [6, 12] and held[12] < held[6]
    assert all(r["sft/tokens"] > 0 and r["sft/tokens_per_s"] > 0 for r in rows if "sft/loss" in r)
    run = tmp_path / "run"
    assert (run / "config.yaml").is_file() and (run / "checkpoints" / "step_000012").is_dir()
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(str(run / "model"))  # LoRA merged: a plain model directory
    assert not any("lora" in n for n, _ in exported.named_parameters())


def test_micro_batches_give_the_step_the_whole_batch_gives(tmp_path):
    """The loss is the token mean of the step: micro-batches of 1 and 2 rows end the step where the whole batch of 4
    does (fp32 rounding), though the rows hold different numbers of tokens."""
    write_demos(tmp_path / "d.jsonl", 10)
    for micro in (1, 2, 4):
        train(tmp_path / f"m{micro}", *FAST, f"data.path={tmp_path / 'd.jsonl'}", "trainer.steps=1",
              f"trainer.micro_batch_size={micro}", "model.lora.dropout=0")
    w = {m: load_file(str(tmp_path / f"m{m}" / "checkpoints/step_000001/trainable.safetensors")) for m in (1, 2, 4)}
    for m in (1, 2):
        for k in w[4]:
            torch.testing.assert_close(w[m][k], w[4][k], rtol=1e-5, atol=1e-6)


def test_resume_continues_exactly(tmp_path):
    write_demos(tmp_path / "d.jsonl", 9)
    common = [*FAST, f"data.path={tmp_path / 'd.jsonl'}", "trainer.batch_size=3", "trainer.micro_batch_size=2",
              "model.lora.dropout=0.1"]
    train(tmp_path / "a", *common, "trainer.steps=4")
    train(tmp_path / "b", *common, "trainer.steps=2")  # stopped after step 2 (its final checkpoint)
    train(tmp_path / "b", *common, "trainer.steps=4", "trainer.resume=auto")
    wa, wb = (load_file(str(tmp_path / d / "checkpoints/step_000004/trainable.safetensors")) for d in "ab")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    ra, rb = ({r["step"]: r["sft/loss"] for r in records(tmp_path / d) if "sft/loss" in r} for d in "ab")
    assert ra == rb and sorted(ra) == [1, 2, 3, 4]


def test_unusable_rows_are_counted_and_a_long_one_is_dropped_not_cut(tmp_path):
    from rlft.sft.train import _conversations, _encode

    path = tmp_path / "d.jsonl"
    write_demos(path, 6)
    with path.open("a") as f:
        f.write(json.dumps({"prompt": "empty", "completion": ""}) + "\n")
        f.write(json.dumps({"prompt": "long", "completion": "word " * 300}) + "\n")
    cfg, _ = sft_compose(*FAST, f"data.path={path}", "data.num_eval=0", "data.max_length=64")
    rows, held, dropped = _conversations(cfg)
    assert len(rows) == 7 and held == [] and dropped.counts == {"empty completion": 1}
    from rlft.models.loading import load_tokenizer

    tok = load_tokenizer(cfg.model)
    examples = _encode(rows, tok, tok.convert_tokens_to_ids("<|im_end|>"), cfg, dropped, "training")
    assert len(examples) == 6 and all(len(e.ids) <= 64 for e in examples)
    (line,) = [x for x in dropped.lines() if "max_length" in x]
    assert f"{path}:8" in line and "dropped, not cut" in line


def test_the_command_line(tmp_path):
    out = run_cli(["sft", "--help"], tmp_path)
    assert out.returncode == 0 and "rlft sft" in out.stdout and "model (" in out.stdout
    line = one_error_line(run_cli(["sft", "model=tiny", "trainer.stepz=3"], tmp_path), 2)
    assert "trainer.stepz" in line
    line = one_error_line(run_cli(["sft", "model=tiny"], tmp_path), 2)
    assert "data.path" in line
    (tmp_path / "bad.jsonl").write_text('{"messages": [{"content": "no role"}]}\n')
    line = one_error_line(run_cli(["sft", *FAST, "data.path=bad.jsonl"], tmp_path), 2)
    assert "bad.jsonl:1" in line and "no role" in line


def test_rl_starts_from_the_sft_model(tmp_path):
    """rlft train model=local model.path=RUN/model: the SFT model is RL's base and reference."""
    write_demos(tmp_path / "d.jsonl", 6)
    run = run_cli(["sft", *[a for a in FAST if a != "trainer.export=false"], "data.path=d.jsonl", "trainer.steps=2",
                   "hydra.run.dir=sft"], tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    from tests.support import TINY

    rl = run_cli(["train", *[a for a in TINY if not a.startswith("model=")], "model=local", "model.path=sft/model",
                  "trainer.steps=1", "hydra.run.dir=rl"], tmp_path)
    assert rl.returncode == 0, rl.stderr[-2000:]
    assert (tmp_path / "rl" / "checkpoints" / "step_000001").is_dir()
    exported = run_cli(["export", "sft", "again"], tmp_path)  # a checkpoint of rlft sft exports as rlft train's do
    assert exported.returncode == 0, exported.stderr[-2000:]
    from transformers import AutoModelForCausalLM

    a, b = (AutoModelForCausalLM.from_pretrained(str(tmp_path / d)) for d in ("sft/model", "again"))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    line = one_error_line(run_cli(["eval", "sft"], tmp_path), 2)
    assert "rlft sft checkpoint" in line and "model.path=" in line


@pytest.mark.slow
def test_two_ranks_train_what_one_process_trains(tmp_path):
    """trainer.nproc=2 (torch's launcher, gloo): each rank takes half of each batch, the token count and gradients
    are summed over the ranks, so the weights and losses are one process's, to float summation order."""
    write_demos(tmp_path / "d.jsonl", 12)
    args = ["sft", *FAST, "data.path=d.jsonl", "trainer.steps=3", "trainer.micro_batch_size=1"]
    for name, extra in (("one", []), ("two", ["trainer.nproc=2"])):
        proc = run_cli([*args, *extra, f"hydra.run.dir={name}"], tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
    w1, w2 = (load_file(str(tmp_path / d / "checkpoints/step_000003/trainable.safetensors")) for d in ("one", "two"))
    assert w1.keys() == w2.keys()
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=1e-5)
    l1, l2 = ([r["sft/loss"] for r in records(tmp_path / d) if "sft/loss" in r] for d in ("one", "two"))
    assert len(l1) == 3 and l2 == pytest.approx(l1, rel=1e-5)


@pytest.mark.slow
def test_resume_after_kill_is_exact(tmp_path):
    """kill -9 between checkpoints, resume: the same weights and losses as an uninterrupted run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from rlft.state import checkpoint as ckpt

    write_demos(tmp_path / "d.jsonl", 16)
    args = ["sft", *FAST, "data.path=d.jsonl", "trainer.save_every=2", "model.lora.dropout=0.1"]
    ref = run_cli([*args, "trainer.steps=10", "hydra.run.dir=ref"], tmp_path)
    assert ref.returncode == 0, ref.stderr[-2000:]
    proc = subprocess.Popen([sys.executable, "-m", "rlft.cli", *args, "trainer.steps=1000", "hydra.run.dir=b"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while ckpt.latest_checkpoint(tmp_path / "b") is None and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    killed_at = ckpt.checkpoint_step(ckpt.latest_checkpoint(tmp_path / "b"))
    assert killed_at is not None and killed_at < 10
    resumed = run_cli([*args, "trainer.steps=10", "trainer.resume=auto", "hydra.run.dir=b"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    wa, wb = (load_file(str(tmp_path / d / "checkpoints/step_000010/trainable.safetensors")) for d in ("ref", "b"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    ra, rb = ({r["step"]: r["sft/loss"] for r in records(tmp_path / d) if "sft/loss" in r} for d in ("ref", "b"))
    assert ra == rb and len(ra) == 10
