"""``rlft check [KEY=VALUE ...] [--prompts N] [--json FILE]``: ``rlft train``'s Hydra application (the same
config, groups, overrides, ``--cfg``, one-line errors), whose job is :func:`rlft.check.measure.check`.

Where its output goes: the table to the console, the report to ``--json FILE`` when given. Nothing else stays:
Hydra's run directory (the job's log of other libraries' output, job.json) is a temporary directory removed
at the end, unless ``hydra.run.dir=DIR`` is given, which keeps them there. Under ``-m`` the sweep directory is
Hydra's, as for ``rlft train -m`` (each job's log and job.json, the sweep summary). No checkpoint is written.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from rlft.commands.train import App, run_task
from rlft.commands.train import run as run_app
from rlft.config.loading import TRAIN, to_config
from rlft.errors import fail
from rlft.paths import user_path

USAGE = """usage: rlft check [KEY=VALUE ...] [--prompts N] [--json FILE] [-m] [HYDRA FLAGS]

Before a long run, whether it can learn: loads what `rlft train` with the same overrides would load, samples
N prompts' groups with the run's sampler (sampler.n each, its tools and environment), scores them with the
run's reward, times one update on them (the weights and optimizer are restored afterwards), runs the weight
sync check, and prints one table: the reward's signal, lengths, the first prompt as the policy reads it, the
dtype and the projected time of trainer.steps, and verdicts with a next step.

  rlft check                                  the default job
  rlft check data=countdown reward=countdown algo=dapo sampler.n=8
  rlft check ... --prompts 16 --json check.json
  rlft check -m sampler.temperature=0.7,1.0   one check per configuration

  --prompts N   prompts to sample (default 8; each gets sampler.n samples)
  --json FILE   also write the report as JSON

Exit codes: 0 nothing blocks learning (warnings may be shown), 1 a verdict says the run cannot learn
(or a reward function or environment failed, as in rlft train), 2 a config, data or model error.
Nothing is written but --json: Hydra's run directory is temporary unless hydra.run.dir=DIR is given
(under -m the sweep directory is Hydra's, as for rlft train -m, with the jobs' summary).
Details: docs/guide/before-a-long-run.md.
"""


class Options:
    """What the command line gave beyond Hydra's overrides, for the job (Hydra calls the job with its config only)."""

    prompts: int = 8
    json: Path | None = None
    blocked: int = 0
    """Checks (jobs) whose verdict blocks learning."""


def task(raw: Any) -> float:
    """``rlft check``'s Hydra task; returns 1.0 when a verdict blocks learning, else 0.0 (NaN: the job failed)."""
    return run_task(raw, CHECK_APP)


def _job(raw: Any, run_dir: Path, in_sweep: bool, status: dict[str, Any], t0: float) -> float:
    from rlft.check.measure import check  # torch, transformers
    from rlft.check.render import print_report, write_json

    cfg = to_config(raw)
    report = check(cfg, Options.prompts)
    print_report(report)
    if Options.json is not None:
        path = Options.json
        if in_sweep:  # one file per job: check.json -> check_0.json, check_1.json, ...
            from hydra.core.hydra_config import HydraConfig

            path = path.with_name(f"{path.stem}_{HydraConfig.get().job.num}{path.suffix}")
        write_json(report, path)
        print(f"wrote {path}")
    Options.blocked += report.blocked
    return 1.0 if report.blocked else 0.0


CHECK_APP = App("check", TRAIN, task, _job, result="check/blocked")


def _take(args: list[str], flag: str) -> tuple[str | None, list[str]]:
    """The value of ``flag VALUE`` or ``flag=VALUE`` in ``args``, and the args without it."""
    out, value, i = [], None, 0
    while i < len(args):
        a = args[i]
        if a == flag:
            if i + 1 >= len(args):
                raise ValueError(f"{flag} needs a value")
            value, i = args[i + 1], i + 2
            continue
        if a.startswith(flag + "="):
            value = a.split("=", 1)[1]
        else:
            out.append(a)
        i += 1
    return value, out


def main(args: list[str]) -> int:
    """``rlft check ARGS``; returns the exit code."""
    if {"-h", "--help"} & set(args):
        print(USAGE)
        return 0
    try:
        prompts, args = _take(args, "--prompts")
        json_file, args = _take(args, "--json")
        Options.prompts = int(prompts) if prompts is not None else 8
    except ValueError as e:
        return fail(str(e) if "needs a value" in str(e) else f"--prompts {prompts}: give a whole number >= 1")
    if Options.prompts < 1 or (prompts is not None and not prompts.strip().isdigit()):
        return fail(f"--prompts {prompts}: give a whole number >= 1")
    Options.json = user_path(json_file).absolute() if json_file else None
    if Options.json is not None and Options.json.is_dir():
        return fail(f"--json {json_file} is a directory: give a file name")
    Options.blocked = 0
    scratch = None
    keys = {a.split("=", 1)[0].lstrip("+") for a in args if "=" in a}
    multirun = bool({"-m", "--multirun"} & set(args))
    # A sweep keeps Hydra's sweep directory, as rlft train -m: its summary (from each job's .hydra and job.json)
    # counts the failed jobs.
    if not multirun and "hydra.run.dir" not in keys:
        scratch = tempfile.mkdtemp(prefix="rlft-check-")
        args = [*args, f"hydra.run.dir={scratch}", "hydra.output_subdir=null"]
    try:
        code = run_app(args, CHECK_APP)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return 1 if code == 0 and Options.blocked else code

