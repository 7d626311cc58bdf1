"""A few real training steps on the tiny random model, end to end through the CLI and train()."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from rlft.config import compose
from rlft.training.loop import train
from tests.support import ROOT, TINY, run_cli


def _lora_weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters() if "lora_" in k}


def test_grpo_steps_change_lora_and_log_metrics(tmp_path, monkeypatch):
    cfg, raw, _ = compose(
        TINY + ["trainer.steps=3", "trainer.eval_every=2", "optim.lr=1e-2", "reward.fns=[math_correct,tests.helpers:char_count]", "reward.weights=[1,1]"]
    )
    import rlft.training.components as components_mod

    captured = {}
    real_build = components_mod.build_policy

    def spy(*args, **kwargs):
        policy, copy = real_build(*args, **kwargs)
        captured["policy"] = policy
        captured["before"] = _lora_weights(policy.model)
        return policy, copy

    monkeypatch.setattr(components_mod, "build_policy", spy)
    last = train(cfg, tmp_path / "run", "seed: 0\n")
    after = _lora_weights(captured["policy"].model)
    before = captured["before"]
    assert before.keys() == after.keys() and len(before) > 0
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) == len(before)  # every adapter matrix moved (B starts at 0, A gets B's gradient later)

    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for r in rows[1:]:
        for key in ("reward/mean", "loss", "kl", "time/step_s", "tokens/generated"):
            assert key in r and isinstance(r[key], float), key
        assert torch.isfinite(torch.tensor(r["loss"]))
    assert "eval/accuracy" in rows[0] and "eval/accuracy" in rows[2] and "eval/accuracy" in rows[3]
    assert "eval/accuracy" not in rows[1]
    assert last["eval/accuracy"] == rows[3]["eval/accuracy"]
    ckpt = tmp_path / "run" / "checkpoints" / "step_000003"
    saved = load_file(str(ckpt / "adapter" / "adapter_model.safetensors"))
    assert any("lora_B" in k for k in saved)
    assert json.loads((ckpt / "trainer_state.json").read_text())["step"] == 3


def test_sampler_weights_follow_the_policy(tmp_path):
    """After a sync, the sampler's copy gives the same logits as the merged policy."""
    cfg, _, _ = compose(TINY)
    from rlft.models import build_policy
    from rlft.samplers import build_sampler

    policy, copy = build_policy(cfg.model, 0, need_reference=True)
    sampler = build_sampler(cfg.sampler, cfg.model, copy, policy.tokenizer, 0)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    ids = torch.tensor([[1, 5, 9, 200, 3000]])
    with torch.no_grad():
        before = sampler.model(ids).logits.float()
        sampler.load_weights(policy.sampler_weights())
        after = sampler.model(ids).logits.float()
        with policy.autocast():
            want = policy.model(input_ids=ids).logits.float()
    assert not torch.allclose(before, after, atol=1e-2)
    # bf16 weights on both sides: agreement to bf16 precision, far closer than before the sync
    assert (after - want).abs().max() < 0.1 * (before - want).abs().max()


def test_cli_train_writes_run_dir(tmp_path):
    run = tmp_path / "run"
    proc = run_cli(["train", *TINY, f"hydra.run.dir={run}", "logger.console=true"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (run / "config.yaml").read_text().count("source: tiny") == 1
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3
    log = (run / "train.log").read_text()
    assert "step    2" in log and "final checkpoint" in log
    assert "reward" in proc.stdout


def test_reward_error_exits_cleanly_and_keeps_work(tmp_path):
    (tmp_path / "badreward.py").write_text(
        "def score(prompt, completion, answer, **info):\n    raise RuntimeError('boom')\n"
    )
    run = tmp_path / "run"
    proc = run_cli(["train", *TINY, "reward.fns=[badreward:score]", f"hydra.run.dir={run}"], cwd=tmp_path)
    assert proc.returncode == 1
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "reward function 'badreward:score' raised RuntimeError: boom on sample 0" in err[0]
    assert "Traceback" not in proc.stderr


def test_bad_data_row_exits_2(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1+1", "answer": 2}\n{"prompt": "2+2"}\n')
    proc = run_cli(["train", *TINY, "data=jsonl", f"data.path={data}", f"hydra.run.dir={tmp_path / 'r'}"], cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"rlft: error: {data}:2: missing field 'answer' (has: prompt)"


def test_time_budget_stops_evaluates_and_checkpoints(tmp_path):
    run = tmp_path / "run"
    proc = run_cli(["train", *TINY, "trainer.steps=50", "trainer.max_minutes=0.00001", f"hydra.run.dir={run}"],
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert "eval/accuracy" in rows[1]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000001"]
    assert "time budget of 1e-05 min reached after step 1" in (run / "train.log").read_text()


def test_a_step_where_every_sample_scores_the_same_has_no_gradient(tmp_path):
    """Issue 23: every sample scored -0.32 (not exact in float32) logged reward/std 3e-08,
    adv/mean -0.029 and loss 0.029: a gradient where GRPO gives none."""
    run = tmp_path / "run"
    r = run_cli(["train", *TINY, "trainer.steps=1", "reward.fns=[math_correct,tests.helpers:one]",
                 "reward.weights=[1,-0.32]", f"hydra.run.dir={run}"], cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    step = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert step["reward/mean"] == pytest.approx(-0.32) and step["reward/std"] == 0.0
    assert step["adv/mean"] == step["adv/std"] == step["loss"] == 0.0, step
