"""Worker processes and the trainer's memory: ``rlft train`` on docs/results.md's tool task (SmolLM2-135M-Instruct,
LoRA, GRPO, vLLM, 4 prompts x 8 episodes, at most 3 turns of 40 tokens, the user tool that sleeps 0.5 s, so every
waiting episode's call needs a worker of its own) at the default ``trainer.micro_batch_size=16``, before (tool
workers forked from the trainer) against now (forked from the worker server, rlft/workers/server.py), and now with
``episode.worker_start=fork`` (forked from the trainer again, by choice).

    python scripts/bench_worker_memory.py [--before REV] [--out DIR] [--steps 4] [--only before|now|fork]

Each run is its own process (REV's tree extracted with ``git archive`` under DIR; now is this checkout), sampled
every half second: the trainer's resident memory, the proportional set size (PSS) of all its descendants (the
tool workers, the worker server, vLLM's helpers: what the workers cost the machine), how many there are, and the
machine's MemAvailable. Printed per run: its exit code (137: the kernel's OOM killer), the steps it finished and
their seconds, the peaks and the lowest MemAvailable. Absolute times drift with the machine: the fp32 GEMM speed
is printed beside them.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_episodes import ROOT, _task_data, extract, gemm

BEFORE = "67e6c25"
"""The last commit whose tool workers were forked from the trainer."""


def _smaps(pid: int) -> dict[str, int]:
    """/proc/PID/smaps_rollup in MB (empty when the process is gone)."""
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]
    except OSError:
        return {}
    return {k: int(v.split()[0]) // 1024 for k, v in (line.split(":", 1) for line in lines)}


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            kids = [int(c) for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
        except OSError:
            continue
        for k in kids:
            out += [k, *_descendants(k)]
    return out


def _available() -> int:
    line = next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemAvailable"))
    return int(line.split()[1]) // 1024


def run(tree: Path, data: Path, out: Path, name: str, steps: int, extra: list[str]) -> dict:
    """One training run from ``tree`` (``extra``: more overrides), watched until it ends."""
    cmd = [sys.executable, "-m", "rlft.cli", "train", "algo=grpo", "model=smollm2_135m", "data=jsonl",
           f"data.path={data}/train.jsonl", "data.num_eval=0", "tools=[scripts.bench_episodes:calculator]",
           "episode.max_turns=3", "reward.fns=[math_correct]", "sampler=vllm", "sampler.max_new_tokens=40",
           "sampler.temperature=0.7", "trainer.num_prompts=4", "sampler.n=8", f"trainer.steps={steps}",
           "episode.schedule=lockstep", f"hydra.run.dir={out / ('run_' + name)}", *extra]
    shutil.rmtree(out / f"run_{name}", ignore_errors=True)  # an earlier run of this benchmark under --out
    log = out / f"{name}.out"
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{ROOT}"}
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=f, stderr=subprocess.STDOUT)
    peak = {"trainer_rss": 0, "others_pss": 0, "others": 0, "min_available": _available()}
    while proc.poll() is None:
        others = [_smaps(p) for p in _descendants(proc.pid)]
        pss = sum(o.get("Pss", 0) for o in others)
        peak["trainer_rss"] = max(peak["trainer_rss"], _smaps(proc.pid).get("Rss", 0))
        peak["others_pss"], peak["others"] = max(peak["others_pss"], pss), max(peak["others"], len(others))
        peak["min_available"] = min(peak["min_available"], _available())
        time.sleep(0.5)
    step_s = [float(s) for s in re.findall(r"step\s+\d+ .*?step ([\d.]+)s", log.read_text())]
    return {"exit": proc.returncode, "step_s": step_s, **peak, "log": str(log)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default=BEFORE)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--only", choices=["before", "now", "fork"], default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-worker-memory-"))
    data = _task_data(out) / "calculator"
    print(f"fp32 GEMM {gemm():.0f} GFLOP/s at the start; {os.cpu_count()} CPUs, MemTotal "
          f"{int(Path('/proc/meminfo').read_text().split()[1]) // 1024} MB, MemAvailable {_available()} MB")
    trees = {"before": lambda: extract(args.before, out), "now": lambda: ROOT, "fork": lambda: ROOT}
    for name in [args.only] if args.only else ["before", "now", "fork"]:
        r = run(trees[name](), data, out, name, args.steps, ["episode.worker_start=fork"] if name == "fork" else [])
        steps = " / ".join(f"{s:.1f}" for s in r["step_s"])
        print(f"{name}: exit {r['exit']}{' (killed: out of memory)' if r['exit'] in (-9, 137) else ''}; "
              f"{len(r['step_s'])} of {args.steps} steps ({steps} s); trainer peak RSS {r['trainer_rss']} MB; "
              f"descendants' peak PSS {r['others_pss']} MB (at most {r['others']} at once); lowest MemAvailable "
              f"{r['min_available']} MB; log {r['log']}", flush=True)
    print(f"fp32 GEMM {gemm():.0f} GFLOP/s at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
