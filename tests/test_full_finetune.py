"""Full fine-tuning (no LoRA): every weight trains, the reference copy stays frozen."""

from __future__ import annotations

import torch

from rlft.config import compose
from rlft.training.loop import build_components, train_step
from tests.support import TINY


def test_full_finetune_updates_weights_and_keeps_reference():
    cfg, _, _ = compose(
        TINY + ["model.lora.enabled=false", "optim.lr=1e-3", "reward.fns=[math_correct,tests.helpers:char_count]",
                "reward.weights=[1,1]"]
    )
    c = build_components(cfg)
    assert not c.policy.lora and c.policy.ref_model is not None
    before = {k: v.detach().clone() for k, v in c.policy.model.named_parameters()}
    ref_before = {k: v.detach().clone() for k, v in c.policy.ref_model.named_parameters()}
    metrics = train_step(1, c, cfg)
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    moved = [k for k, v in c.policy.model.named_parameters() if not torch.equal(v, before[k])]
    assert len(moved) == len(before)
    assert all(torch.equal(v, ref_before[k]) for k, v in c.policy.ref_model.named_parameters())
    # the sampler's copy now holds the trained weights (in bf16)
    w = c.sampler.model.get_parameter("model.layers.0.mlp.up_proj.weight")
    assert torch.equal(w, c.policy.model.get_parameter("model.layers.0.mlp.up_proj.weight").detach().to(w.dtype))
