"""model.dtype=auto's probe, alone and beside a busy GEMM loop (issue 35 item 4).

    python scripts/bench_precision.py [--times 5] [--hidden 576] [--intermediate 1536] [--busy 1]
        [--busy-dtype float32|bfloat16] [--json OUT]

For each of ``--times`` repetitions, first alone, then with ``--busy`` processes each running
1024x1024 matmuls (``--busy-dtype``, fp32 by default) on one thread (what "a busy other core" was when the first probe flipped): the old probe
(one GEMM per dtype, median of 5, on torch's threads; ``rlft.models.precision.gemm_gflops``) and
the new one (``rlft.models.precision.probe``: one thread, dtypes alternating, best of each), with
the pick each gives on this CPU (the new one through ``_decide``: the flags, then the ratio
against ``MARGIN``). No cache is read or written. Prints one line per probe and a summary:
how many times each picked bf16, and the range of the bf16/fp32 ratio.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BUSY = "import torch\ntorch.set_num_threads(1)\na = torch.randn(1024, 1024).to(torch.{})\nwhile True:\n    a @ a\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--times", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=576)  # SmolLM2-135M
    ap.add_argument("--intermediate", type=int, default=1536)
    ap.add_argument("--busy", type=int, default=1, help="busy one-thread GEMM processes beside the probe")
    ap.add_argument("--busy-dtype", choices=["float32", "bfloat16"], default="float32", help="of the busy loops")
    ap.add_argument("--json", help="write every figure here")
    a = ap.parse_args(argv)

    import torch

    from rlft.models import precision as P

    info = P.cpu_info()
    native = P.native_bf16(info)
    m, k, n = P.probe_shape(a.hidden, a.intermediate)
    print(f"busy: {a.busy} x {a.busy_dtype} | CPU: {P.cpu_model(info)}, native bf16 flags: {native or 'none'}, torch {torch.__version__} "
          f"({torch.backends.cpu.get_cpu_capability()}), {torch.get_num_threads()} threads, GEMM {m}x{k}x{n}")
    rows = []

    def once(load: str) -> None:
        bf16 = P.gemm_gflops(torch.bfloat16, P.TOKENS, a.hidden, a.intermediate)
        fp32 = P.gemm_gflops(torch.float32, P.TOKENS, a.hidden, a.intermediate)
        old_pick = "bf16" if bf16 >= fp32 else "fp32"
        t0 = time.perf_counter()
        p = P.probe(a.hidden, a.intermediate)
        took = time.perf_counter() - t0
        new_pick, _ = P._decide(p, native)
        rows.append({"load": load, "old": {"bf16": bf16, "fp32": fp32, "pick": old_pick},
                     "new": {"bf16": p.bf16, "fp32": p.fp32, "rounds": p.rounds, "s": took, "pick": new_pick}})
        print(f"{load:6s} old: bf16 {bf16:6.0f} fp32 {fp32:6.0f} -> {old_pick} | "
              f"new: bf16 {p.bf16:6.0f} fp32 {p.fp32:6.0f} ({p.rounds} rounds, {took:.2f} s) -> {new_pick}",
              flush=True)

    for _ in range(a.times):
        once("alone")
        procs = [subprocess.Popen([sys.executable, "-c", BUSY.format(a.busy_dtype)]) for _ in range(a.busy)]
        try:
            time.sleep(1.0)  # the busy loops import torch and start
            once("busy")
        finally:
            for p in procs:
                p.kill()
                p.wait()

    print("summary (bf16 picks of all, bf16/fp32 ratio min-max):")
    for probe in ("old", "new"):
        for load in ("alone", "busy"):
            rs = [r[probe] for r in rows if r["load"] == load]
            ratios = [r["bf16"] / r["fp32"] for r in rs]
            picks = sum(r["pick"] == "bf16" for r in rs)
            print(f"  {probe} {load:6s}: bf16 {picks}/{len(rs)}, ratio {min(ratios):.2f}-{max(ratios):.2f}, "
                  f"bf16 {min(r['bf16'] for r in rs):.0f}-{max(r['bf16'] for r in rs):.0f}, "
                  f"fp32 {min(r['fp32'] for r in rs):.0f}-{max(r['fp32'] for r in rs):.0f} GFLOP/s")
    if a.json:
        Path(a.json).write_text(json.dumps({"cpu": P.cpu_model(info), "native_bf16": native, "shape": [m, k, n],
                                            "threads": torch.get_num_threads(), "busy": a.busy,
                                            "busy_dtype": a.busy_dtype, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
