"""rlft check's GPU memory arithmetic (rlft/check/memory.py) against docs/guide/gpu.md#memory-arithmetic-on-one-80-gb-gpu's table, recomputed term by term
from the page's formulas and Qwen2.5's config.json shapes."""

from __future__ import annotations

import pytest

from rlft.check.memory import Shapes, gib, learner_parts, lora_params, micro_batch_tokens

QWEN = {  # layers, hidden, intermediate, heads, kv heads, head dim, vocabulary, parameters (docs/guide/gpu.md#memory-arithmetic-on-one-80-gb-gpu)
    "0.5B": Shapes(24, 896, 4864, 14, 2, 64, 151936, 494_032_768),
    "1.5B": Shapes(28, 1536, 8960, 12, 2, 128, 151936, 1_543_714_304),
    "7B": Shapes(28, 3584, 18944, 28, 4, 128, 152064, 7_615_616_512),
}
N = 8 * 1024
# docs/guide/gpu.md#memory-arithmetic-on-one-80-gb-gpu's table, GiB, one decimal: (learner phase without checkpointing, with checkpointing)
TABLE = {("0.5B", "LoRA"): (13.1, 3.5), ("0.5B", "FT"): (24.4, 12.9), ("1.5B", "LoRA"): (27.1, 6.7),
         ("1.5B", "FT"): (58.8, 34.6), ("7B", "LoRA"): (65.6, 21.2), ("7B", "FT"): (205.8, 152.6)}


def test_lora_parameter_counts_are_the_pages():
    assert [lora_params(QWEN[m], 16) for m in ("0.5B", "1.5B", "7B")] == [8_798_208, 18_464_768, 40_370_176]


@pytest.mark.parametrize("model, kind", list(TABLE))
def test_the_learner_phase_matches_the_pages_table(model, kind):
    s = QWEN[model]
    lora = lora_params(s, 16) if kind == "LoRA" else None
    plain, checkpointed = (gib(learner_parts(s, N, lora, c, reference=True))["total"] for c in (False, True))
    assert (round(plain, 1), round(checkpointed, 1)) == TABLE[(model, kind)]


def test_parts_by_hand_for_the_smallest():
    """0.5B LoRA without checkpointing, each part from the page's formula written out here."""
    s, lora = QWEN["0.5B"], 8_798_208
    parts = learner_parts(s, N, lora, checkpointing=False, reference=True)
    assert parts["weights"] == 2 * 494_032_768
    assert parts["trainable state"] == 16 * lora
    assert parts["reference"] == 0  # LoRA: the base with the adapter off
    assert parts["activations"] == 25 * (20 * 896 + 8 * 4864) * N
    assert parts["log-prob head"] == 10 * 128 * 151936 + 10 * 896 * N
    assert parts["autocast casts"] == 0
    assert parts["total"] == sum(v for k, v in parts.items() if k != "total")
    ft = learner_parts(s, N, None, checkpointing=False, reference=False)
    assert ft["reference"] == 0 and ft["weights"] == 4 * 494_032_768


def test_micro_batch_tokens():
    assert micro_batch_tokens(32, 100, 16) == 1600 and micro_batch_tokens(4, 100, 16) == 400
