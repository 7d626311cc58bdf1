"""The compute dtype: ``model.dtype=auto`` measures which is faster on this CPU.

bf16 was ~5x faster than fp32 on one CPU of our machine kind and ~1.8x *slower* on another
(an Intel Xeon whose bf16 GEMM ran 74 GFLOP/s per thread against fp32's 134), so no fixed
choice is right on CPU. The probe times one GEMM of the model's MLP shape in each dtype, in
well under a second, and keeps the faster. On a CUDA learner (``trainer.device``) auto is bf16
without a probe where the GPU supports it (Ampere and newer), else fp32.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from rlft.models.loading import model_dir

TOKENS = 512  # rows of the probe GEMM: a micro-batch of RL sequences is a few hundred tokens


@dataclass(frozen=True)
class Precision:
    dtype: str
    """bf16 or fp32."""
    reason: str
    """How it was chosen, with the measured figures, for the run log."""


def gemm_gflops(dtype: torch.dtype, m: int, k: int, n: int, reps: int = 5) -> float:
    """Median GFLOP/s of an (m, k) @ (k, n) matmul in ``dtype`` on the CPU."""
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    a @ b  # warm-up: first calls pick kernels and touch memory
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * m * k * n / sorted(times)[len(times) // 2] / 1e9


def choose(requested: str, hidden: int, intermediate: int, device: str = "cpu") -> Precision:
    """Resolve ``model.dtype`` (auto, bf16 or fp32) for a model of the given widths."""
    if requested != "auto":
        return Precision(requested, f"model.dtype={requested}")
    if device.startswith("cuda"):
        if torch.cuda.is_bf16_supported(including_emulation=False):  # emulated bf16 (pre-Ampere) is slow
            return Precision("bf16", "model.dtype=auto: bf16 on CUDA")
        return Precision("fp32", f"model.dtype=auto: fp32 ({torch.cuda.get_device_name()} has no bf16 support)")
    bf16 = gemm_gflops(torch.bfloat16, TOKENS, hidden, intermediate)
    fp32 = gemm_gflops(torch.float32, TOKENS, hidden, intermediate)
    pick = "bf16" if bf16 >= fp32 else "fp32"
    return Precision(pick, f"model.dtype=auto: {pick} (GEMM {TOKENS}x{hidden}x{intermediate} on {cpu_model()}: "
                           f"bf16 {bf16:.0f} GFLOP/s, fp32 {fp32:.0f} GFLOP/s)")


def model_widths(config_dir: Path) -> tuple[int, int] | None:
    """(hidden_size, intermediate_size) from a Hugging Face config.json; None when it cannot be read
    (loading the model then reports the cause on one line)."""
    try:
        cfg = json.loads((config_dir / "config.json").read_text())
        hidden = int(cfg.get("hidden_size", 1024))
        return hidden, int(cfg.get("intermediate_size", 4 * hidden))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def cpu_model() -> str:
    """The CPU's model name (Linux), for logs next to speed figures."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def resolve(model_cfg: object, device: str = "cpu") -> Precision:
    """``choose`` for the model named by a ModelConfig (widths from its config.json, or the tiny shape)."""
    if model_cfg.dtype != "auto" or device.startswith("cuda"):
        return choose(model_cfg.dtype, 0, 0, device)
    if model_cfg.source == "tiny":
        return choose("auto", model_cfg.tiny.hidden_size, model_cfg.tiny.intermediate_size, device)
    widths = model_widths(model_dir(model_cfg))  # a missing directory is a one-line ModelError there
    if widths is None:  # loading reports what is wrong with the directory
        return Precision("bf16", "model.dtype=auto: bf16 (no readable config.json to probe)")
    return choose("auto", *widths, device)
