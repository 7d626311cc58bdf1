"""The compute dtype: ``model.dtype=auto`` picks bf16 or fp32 for this CPU, the same way whatever the load.

No fixed choice is right on CPU: bf16 GEMMs ran ~2.5x faster than fp32 on an AMD EPYC (Zen 4,
avx512_bf16), 3.4-6.5x faster on one thread of an Intel Xeon with AMX, and ~1.8x *slower* on an
Intel Xeon without native bf16 (74 against 134 GFLOP/s per thread). The pick must also not depend on what else runs:
the first probe (one GEMM per dtype, median of 5, on all threads) picked bf16 on a quiet EPYC
(bf16 ~400, fp32 ~160 GFLOP/s) and fp32 on the same EPYC with a busy other core (bf16 113,
fp32 161): oneDNN's bf16 kernel splits the GEMM between the two threads and waits for the
descheduled one. Three things make the pick a property of the CPU rather than of the moment:

- **The probe** times the GEMM on *one* thread (nothing to wait for), alternating the dtypes
  over up to ``ROUNDS`` rounds (a slow spell hits both), and compares the *best* time of each
  (the least disturbed; load only ever adds time). No round starts after ``PROBE_BUDGET_S``
  (0.1-0.7 s in all, measured under load).
- **CPU features**: with native bf16 dot products (x86 ``avx512_bf16`` / ``amx_bf16``, ARM
  ``bf16``) bf16 is kept unless the probe finds it ``MARGIN`` times slower; without them fp32 is
  kept unless bf16 is ``MARGIN`` times faster. A CPU whose two dtypes run about as fast is decided
  by its flags, not by noise.
- **A cache**: the first measurement on a CPU model (name, the flags above, torch version, GEMM
  shape) is stored under ``$RLFT_CACHE/precision`` and later runs reuse it, so the same command on
  the same machine picks the same dtype. Delete the file to measure again. An unreadable file is
  measured over.

The reason, with the figures and where they come from, goes to the run log (train.log). On a CUDA
learner (``trainer.device``) auto is bf16 without a probe where the GPU supports it (Ampere and
newer), else fp32.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from rlft.models.loading import cache_root, model_dir

TOKENS = 512  # rows of the probe GEMM: a micro-batch of RL sequences is a few hundred tokens
MAX_WIDTH = 2048  # wider models probe a 2048 x 2048 block: the same kernels, and the probe stays short
ROUNDS = 7  # bf16/fp32 rounds at most ...
MIN_ROUNDS = 3  # ... and at least, whatever the budget
PROBE_BUDGET_S = 0.5  # no new round starts past this (the warm-up included)
MARGIN = 1.5  # the measured speed ratio that overrides the flags (see _decide)
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")  # x86 AMX, x86 AVX-512, ARM (FEAT_BF16)
FORMAT = 1  # of the cache files; another value is measured over


@dataclass(frozen=True)
class Precision:
    dtype: str
    """bf16 or fp32."""
    reason: str
    """How it was chosen, with the measured figures, for the run log."""


@dataclass(frozen=True)
class Probe:
    """Best GFLOP/s of each dtype on one thread, over ``rounds`` alternating rounds."""
    bf16: float
    fp32: float
    rounds: int
    shape: tuple[int, int, int]

    def text(self) -> str:
        m, k, n = self.shape
        return (f"GEMM {m}x{k}x{n} on 1 thread, best of {self.rounds}: bf16 {self.bf16:.0f} GFLOP/s, "
                f"fp32 {self.fp32:.0f} GFLOP/s")


def gemm_gflops(dtype: torch.dtype, m: int, k: int, n: int, reps: int = 5) -> float:
    """Median GFLOP/s of an (m, k) @ (k, n) matmul in ``dtype`` on the CPU, on torch's threads as set
    (a figure of the moment for benchmarks; ``model.dtype=auto`` uses :func:`probe`)."""
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    a @ b  # warm-up: first calls pick kernels and touch memory
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * m * k * n / sorted(times)[len(times) // 2] / 1e9


def probe_shape(hidden: int, intermediate: int) -> tuple[int, int, int]:
    return TOKENS, max(1, min(hidden, MAX_WIDTH)), max(1, min(intermediate, MAX_WIDTH))


def probe(hidden: int, intermediate: int, rounds: int = ROUNDS, budget_s: float = PROBE_BUDGET_S) -> Probe:
    """Time the MLP-shaped GEMM in bf16 and fp32 alternately on one thread; keep each dtype's best.

    One thread: a multi-threaded GEMM runs at the pace of its most descheduled thread, and the bf16
    kernels suffered most (113 against 400 GFLOP/s beside a busy core); one thread's speed is the
    kernel's. Alternating: a slow spell of the machine lands on both dtypes. Best, not median:
    load only adds time, so the fastest round is the least disturbed one."""
    m, k, n = shape = probe_shape(hidden, intermediate)
    g = torch.Generator().manual_seed(0)
    operands = {dt: (torch.randn(m, k, generator=g).to(dt), torch.randn(k, n, generator=g).to(dt))
                for dt in (torch.bfloat16, torch.float32)}
    best = {dt: float("inf") for dt in operands}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        start = time.perf_counter()
        for a, b in operands.values():
            a @ b  # warm-up: kernel selection (oneDNN's JIT, AMX state), first touch of the memory
        done = 0
        while done < rounds and (done < MIN_ROUNDS or time.perf_counter() - start < budget_s):
            for dt, (a, b) in operands.items():
                t0 = time.perf_counter()
                a @ b
                best[dt] = min(best[dt], time.perf_counter() - t0)
            done += 1
    finally:
        torch.set_num_threads(threads)
    flop = 2 * m * k * n / 1e9
    return Probe(flop / best[torch.bfloat16], flop / best[torch.float32], done, shape)


def cpu_info(text: str | None = None) -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (or of ``text``; empty where there is none, e.g. macOS)."""
    info: dict[str, str] = {}
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            return info
    for line in text.splitlines():
        if not line.strip():
            if info:
                break  # one processor is enough: they are alike
            continue
        key, sep, value = line.partition(":")
        if sep:
            info.setdefault(key.strip(), value.strip())
    return info


def native_bf16(info: dict[str, str]) -> list[str]:
    """The flags that mean bf16 dot products in hardware (x86 ``flags``, ARM ``Features``)."""
    flags = set((info.get("flags") or info.get("Features") or "").split())
    return [f for f in NATIVE_BF16_FLAGS if f in flags]


def cpu_model(info: dict[str, str] | None = None) -> str:
    """The CPU's model name (Linux), for logs next to speed figures."""
    info = cpu_info() if info is None else info
    if info.get("model name"):
        return info["model name"]
    if info.get("CPU part"):  # ARM: no model name; implementer and part number name the core
        return f"{platform.machine()} implementer {info.get('CPU implementer', '?')} part {info['CPU part']}"
    return platform.processor() or platform.machine() or "unknown CPU"


def _decide(p: Probe, native: list[str]) -> tuple[str, str]:
    """The dtype and the rule that gave it. The flags decide unless the measurement contradicts them
    by ``MARGIN``. Every CPU we measured lies well outside that band (bf16/fp32 0.55, 2.5, 3.4 and
    more), while load moved the probe's ratio 2-4x on one CPU (3.4-6.5 alone, up to 15 beside busy
    GEMM loops: scripts/bench_precision.py, docs/reference/internals/models-and-precision.md#precision). So a CPU whose two
    dtypes run about as fast is decided by its flags, not by noise, and a CPU whose flags promise
    kernels this torch build lacks is still caught."""
    ratio = p.bf16 / p.fp32
    if native:
        pick = "bf16" if ratio * MARGIN >= 1 else "fp32"
        return pick, f"native bf16 ({', '.join(native)}): bf16 unless {MARGIN:g}x slower than fp32"
    pick = "bf16" if ratio >= MARGIN else "fp32"
    return pick, f"no native bf16 flag: fp32 unless bf16 is {MARGIN:g}x faster"


def cache_dir() -> Path:
    """Where measurements are kept: $RLFT_PRECISION_CACHE, else $RLFT_CACHE/precision (~/.cache/rlft/precision)."""
    return Path(os.environ.get("RLFT_PRECISION_CACHE") or cache_root() / "precision")


def cache_key(info: dict[str, str], shape: tuple[int, int, int]) -> dict:
    """What the measurement depends on: the CPU model, its bf16 flags, the kernels (torch) and the shape."""
    return {"cpu": cpu_model(info), "machine": platform.machine(), "native_bf16": native_bf16(info),
            "capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
            "shape": list(shape)}


def cache_file(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"gemm-{digest}.json"


def _read_cache(path: Path, key: dict) -> tuple[Probe, str] | None:
    """The stored probe and its date; None when absent, unreadable, of another format or key."""
    try:
        data = json.loads(path.read_text())
        if data["format"] != FORMAT or data["key"] != key:
            return None
        p = Probe(float(data["bf16_gflops"]), float(data["fp32_gflops"]), int(data["rounds"]),
                  tuple(int(x) for x in key["shape"]))
        if not (p.bf16 > 0 and p.fp32 > 0):  # also refuses NaN
            return None
        return p, str(data["date"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _write_cache(path: Path, key: dict, p: Probe, pick: str) -> str | None:
    """Store the measurement (atomically: a concurrent run reads the old file or the new); the error on failure."""
    data = {"format": FORMAT, "key": key, "bf16_gflops": p.bf16, "fp32_gflops": p.fp32,
            "rounds": p.rounds, "pick": pick, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        return f"{type(e).__name__}: {e.strerror or e}"
    return None


def measure(hidden: int, intermediate: int) -> Precision:
    """``model.dtype=auto`` on CPU: the cached measurement of this CPU model, else a probe now (then cached)."""
    info = cpu_info()
    native = native_bf16(info)
    key = cache_key(info, probe_shape(hidden, intermediate))
    path = cache_file(key)
    cached = _read_cache(path, key)
    if cached:
        p, date = cached
        pick, rule = _decide(p, native)
        source = f"cached measurement from {path}, {date}"
    else:
        # To 0.1 GFLOP/s, as the cache stores it: the pick and the figures printed now are those the cache gives
        # back (rounded twice, 408.52 was printed as 409 now and, stored as 408.5, as 408 from the cache).
        p = probe(hidden, intermediate)
        p = dataclasses.replace(p, bf16=round(p.bf16, 1), fp32=round(p.fp32, 1))
        pick, rule = _decide(p, native)
        error = _write_cache(path, key, p, pick)
        source = f"measured now, saved to {path}" if error is None else f"measured now, not saved ({error})"
    return Precision(pick, f"model.dtype=auto: {pick} on {key['cpu']}, {rule} ({source}: {p.text()})")


def choose(requested: str, hidden: int, intermediate: int, device: str = "cpu") -> Precision:
    """Resolve ``model.dtype`` (auto, bf16 or fp32) for a model of the given widths."""
    if requested != "auto":
        return Precision(requested, f"model.dtype={requested}")
    if device.startswith("cuda"):
        if torch.cuda.is_bf16_supported(including_emulation=False):  # emulated bf16 (pre-Ampere) is slow
            return Precision("bf16", "model.dtype=auto: bf16 on CUDA")
        return Precision("fp32", f"model.dtype=auto: fp32 ({torch.cuda.get_device_name()} has no bf16 support)")
    return measure(hidden, intermediate)


def model_widths(config_dir: Path) -> tuple[int, int] | None:
    """(hidden_size, intermediate_size) from a Hugging Face config.json; None when it cannot be read
    (loading the model then reports the cause on one line)."""
    try:
        cfg = json.loads((config_dir / "config.json").read_text())
        hidden = int(cfg.get("hidden_size", 1024))
        return hidden, int(cfg.get("intermediate_size", 4 * hidden))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


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
