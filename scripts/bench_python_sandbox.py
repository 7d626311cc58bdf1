"""What the python tool's sandbox costs and what it stops (docs/results.md "The python tool's sandbox").

1. Cost per call: the same programs through episode.python_sandbox=bwrap and =process, interleaved call by
   call (so the machine's drift hits both alike): median and p90 wall time of a call, for `print(1)` and for a
   program that imports numpy. With the fp32 GEMM speed of the moment.
2. The attack battery (tests/sandbox_attacks.py) at both levels, as this user and, when this user is root, as
   uid 65534 (setpriv): one row per attack, one column per level and user. At the process level two attacks are
   tamed so the machine survives (no kill(-1), a 64-child fork bomb) and the trainer-killing one runs alone.

    .venv/bin/python scripts/bench_python_sandbox.py [--calls 40] [--no-battery]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlft.tools import cgroup, sandbox  # noqa: E402
from rlft.tools.builtin import python_tool  # noqa: E402

PROGRAMS = {"print(1)": "print(1)", "import numpy": "import numpy\nprint(numpy.ones(3).sum())"}
KILLER = "kill the trainer and its siblings"


def gemm() -> float:
    import torch

    from rlft.models.precision import gemm_gflops
    return gemm_gflops(torch.float32, 1024, 576, 1536)


def cost(calls: int) -> dict[str, dict[str, list[float]]]:
    tools = {level: python_tool(SimpleNamespace(python_sandbox=level, python_memory_mb=1024, python_max_procs=16,
                                                tool_timeout_s=30.0, tool_output_chars=2000))
             for level in ("bwrap", "process")}
    times: dict[str, dict[str, list[float]]] = {p: {lv: [] for lv in tools} for p in PROGRAMS}
    for name, code in PROGRAMS.items():
        for tool in tools.values():  # one untimed call each: the page cache, as in a run
            tool(code)
        for _ in range(calls):
            for level, tool in tools.items():
                start = time.perf_counter()
                out = tool(code)
                times[name][level].append(time.perf_counter() - start)
                assert "exited" not in out, out
    return times


def battery(level: str, user: str) -> dict[str, dict]:
    folder = Path(tempfile.mkdtemp(prefix="rlft-battery-"))
    folder.chmod(0o755)
    answers = folder / "answers.jsonl"
    answers.write_text('{"answer": "ANSWER-42"}\n')
    answers.chmod(0o644)
    path = os.pathsep.join([os.path.dirname(sandbox.bwrap_binary() or "/usr/bin/bwrap"), "/usr/bin", "/bin"])
    prefix = ["setpriv", f"--reuid={sandbox.NOBODY}", f"--regid={sandbox.NOBODY}", "--clear-groups"] if user != "me" \
        else []
    python = sys.executable if user == "me" else "/usr/bin/python3"
    base = [*prefix, "env", "-i", f"PATH={path}", "RLFT_BATTERY_SECRET=bench-secret-1", python,
            str(ROOT / "tests" / "sandbox_attacks.py"), level, f"data.path={answers}"]
    try:
        if level == "bwrap":
            return _json(subprocess.run(base, capture_output=True, text=True, timeout=600, cwd=folder))
        names = _names()
        out = _json(subprocess.run([*base, "--only", ",".join(n for n in names if n != KILLER)], capture_output=True,
                                   text=True, timeout=600, cwd=folder))
        answers.write_text('{"answer": "ANSWER-42"}\n')
        killed = subprocess.run([*base, "--only", KILLER], capture_output=True, text=True, timeout=600, cwd=folder)
        out[KILLER] = ({"stopped": False, "detail": f"the trainer died (exit {killed.returncode})"}
                       if killed.returncode else _json(killed)[KILLER])
        return out
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _names() -> list[str]:
    spec = importlib.util.spec_from_file_location("attacks", ROOT / "tests" / "sandbox_attacks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    stand = SimpleNamespace(answers="/a", ckpt=Path("/c"), home=Path("/h"), buffer_hex="", tcp=SimpleNamespace(
        getsockname=lambda: ("", 0)), unix_name="", victim=SimpleNamespace(pid=0))
    return list(module.attacks(stand, "process"))


def _json(proc: subprocess.CompletedProcess) -> dict:
    if proc.returncode:
        raise SystemExit(f"the battery failed (exit {proc.returncode}): {proc.stderr[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--no-battery", action="store_true")
    args = ap.parse_args()
    sandbox.check_sandbox()
    print(f"user {'root' if os.geteuid() == 0 else os.geteuid()}, cgroup {cgroup.kind() or 'none'}, "
          f"bwrap {sandbox.bwrap_binary()}; GEMM fp32 {gemm():.0f} GFLOP/s before")
    times = cost(args.calls)
    print(f"\n{args.calls} calls each, interleaved:\n\n| program | bwrap median (p90) | process median (p90) | "
          "bwrap - process |\n|---|---|---|---|")
    for name, by_level in times.items():
        med = {lv: statistics.median(t) * 1e3 for lv, t in by_level.items()}
        p90 = {lv: statistics.quantiles(t, n=10)[-1] * 1e3 for lv, t in by_level.items()}
        print(f"| `{name}` | {med['bwrap']:.0f} ms ({p90['bwrap']:.0f}) | {med['process']:.0f} ms "
              f"({p90['process']:.0f}) | {med['bwrap'] - med['process']:+.0f} ms |")
    print(f"GEMM fp32 {gemm():.0f} GFLOP/s after")
    if args.no_battery:
        return
    users = ["me", "uid 65534"] if os.geteuid() == 0 and shutil.which("setpriv") else ["me"]
    me = "root" if os.geteuid() == 0 else "you"
    columns = {(level, user): battery(level, user) for level in ("bwrap", "process") for user in users}
    heads = [f"{level}, {me if user == 'me' else user}" for level, user in columns]
    print("\n| attack | " + " | ".join(heads) + " |\n|---|" + "---|" * len(heads))
    for name in next(iter(columns.values())):
        cells = []
        for result in columns.values():
            r = result.get(name)
            word = "-" if r is None else "stopped" if r["stopped"] else "**not stopped**"
            cells.append(word if r is None else f"{word}: {r['detail'][:50]}".replace("|", "/"))
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
