"""rlft check on CUDA: docs/guide/gpu.md#memory-arithmetic-on-one-80-gb-gpu's memory arithmetic beside the allocator's measured peak (with the CPU standing
in, RLFT_GPU_TESTS_DEVICE=cpu, the row is absent: there is no allocator peak to show)."""

from __future__ import annotations

import os

from rlft.check.measure import check
from rlft.check.render import rows
from rlft.config import compose

DEVICE = os.environ.get("RLFT_GPU_TESTS_DEVICE", "cuda")


def test_the_memory_arithmetic_beside_the_measured_peak():
    cfg, _, _ = compose(["model=smollm2_135m", "sampler=hf", f"trainer.device={DEVICE}", "sampler.max_new_tokens=16"])
    report = check(cfg, 2)
    memory = report.cost["memory"]
    if not DEVICE.startswith("cuda"):
        assert memory is None and not any(k == "GPU memory, learner phase" for _, k, _ in rows(report))
        return
    est, peak = memory["estimate_gib"], memory["peak_gib"]
    print(f"check memory: {memory}")
    assert peak > memory["before_gib"] > 0 and memory["tokens"] > 0
    # The arithmetic is for the allocator's view plus a fixed overhead; on a 135M model at a few hundred
    # tokens its terms are small: within a factor of 3 of the peak either way.
    assert peak / 3 < est["total"] - est["overhead"] < peak * 3
    assert any(k == "GPU memory, learner phase" and "measured: peak" in v for _, k, v in rows(report))
