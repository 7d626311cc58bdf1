"""`rlft train` as a Hydra application: ``hydra.main`` runs every job, so Hydra's own flags
(``-m``, ``--cfg job``, ``--info``, ``--shell-completion``), launchers and sweepers work unchanged.

Before Hydra sees the command line, the overrides are checked (and each job of a plain sweep
composed), so a typo, a bad value or an unknown group option is one line naming the key and
the valid choices, exit 2. Errors that only the run itself finds (a cross-field check, a data
file, a reward that raises) end a single run with one line; inside a sweep they fail that job
only, which is recorded in its ``job.json`` and in the sweep summary, and the others go on.
"""

from __future__ import annotations

import atexit
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from rlft.commands.jobs import JOB_STATUS, JobState, failed, write_status  # noqa: F401  (JOB_STATUS: re-exported)
from rlft.config import check_overrides, compose, conf_dir
from rlft.config.loading import TRAIN, Schema, register_schema, to_config
from rlft.errors import ConfigError, RlftError, fail
from rlft.output.console import run_log
from rlft.parallel.launch import final_accuracy, launch, rank_args, rank_status, without
from rlft.parallel.preflight import run_elsewhere
from rlft.paths import quote_home, user_path
from rlft.sweep import expand

# torch (rlft.parallel.distributed, rlft.training.loop) and transformers are imported inside the functions that
# need them: a wrong override is reported before they load, in a fraction of their seconds.

# Hydra flags that take the next argument as their value.
_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                "--config-dir", "-cd", "--shell-completion", "-sc", "--experimental-rerun"}
_CFG_CHOICES = ("job", "hydra", "all")


@dataclass(frozen=True)
class App:
    """One Hydra command of rlft (``rlft train``, ``rlft rm``): what :func:`run` composes and runs."""

    command: str
    """The word after ``rlft``, for messages."""
    schema: Schema
    """Its root config (conf/NAME.yaml), schema, groups and cross-field checks."""
    task: Callable[[Any], float]
    """The Hydra task function: a module-level function (launchers pickle it) calling :func:`run_task`."""
    job: Callable[[Any, Path, bool, dict[str, Any], float], float]
    """``job(raw, run_dir, in_sweep, status, t0)``: one job on the composed config; returns its result for
    sweepers; raises an RlftError (one line) or KeyboardInterrupt as ``rlft train``'s does. It sets
    ``status[REPORTED]`` when it wrote the job's status itself (trainer.nproc's ranks: :func:`run_ranks`)."""
    result: str = "eval/accuracy"
    """The metric a job returns to sweepers (its last value in metrics.jsonl)."""


REPORTED = "_reported"


def split_args(args: list[str]) -> tuple[list[str], list[str]]:
    """``(overrides, hydra_flags)``. A bare ``--cfg`` (rlft's older flag) means ``--cfg job --resolve``: the
    config the run will use, interpolations filled in (Hydra's ``--cfg job`` alone prints them as written)."""
    overrides, flags, i = [], [], 0
    while i < len(args):
        a = args[i]
        if a in _VALUE_FLAGS:
            value = args[i + 1] if i + 1 < len(args) else None
            if a in ("--cfg", "-c") and value not in _CFG_CHOICES:
                flags += [a, "job"] + ([] if "--resolve" in args else ["--resolve"])
                i += 1
                continue
            flags += [a] + ([value] if value is not None else [])
            i += 2
            continue
        (flags if a.startswith("-") else overrides).append(a)
        i += 1
    return overrides, flags


def _expand_home(override: str) -> str:
    """``hydra.run.dir=~/x`` as an absolute path: Hydra would make a directory named '~'."""
    key, sep, value = override.partition("=")
    if sep and key.lstrip("+") in ("hydra.run.dir", "hydra.sweep.dir") and value.strip("'\"").startswith("~"):
        return f"{key}='{user_path(value.strip(chr(39) + chr(34)))}'"
    return override


def precheck(overrides: list[str], multirun: bool, schema: Schema = TRAIN) -> None:
    """Compose what will run before any job starts: every job of a plain sweep (one Hydra compose
    each), the first choice of each swept key under another sweeper (Optuna's ranges are drawn later).

    Raises:
        ConfigError: naming the job when one of a sweep's combinations is wrong.
    """
    parsed = check_overrides(overrides, schema)
    if not multirun:
        compose(overrides, schema)
        return
    custom_sweeper = any(ov.key_or_group == "hydra/sweeper" for ov in parsed)
    fixed, combos = expand([o for o in overrides if not o.startswith("hydra.sweeper.")], schema)
    for combo in combos[:1] if custom_sweeper else combos:
        try:
            compose(fixed + combo, schema)
        except ConfigError as e:
            raise ConfigError(f"job {','.join(combo) or 'job'}: {e}") from None


def run(args: list[str], app: App | None = None) -> int:
    """Run ``rlft train ARGS`` (or another :class:`App`'s command) through Hydra; returns the exit code."""
    from rlft.parallel.distributed import launched  # torch

    app = app or TRAIN_APP
    overrides, flags = split_args(args)
    overrides = [_expand_home(o) for o in quote_home(overrides)]
    multirun = "-m" in flags or "--multirun" in flags
    if launched() and multirun:
        return fail("-m under torchrun: every rank would run the whole sweep; run the sweep outside torchrun and give "
                    "each job its ranks with trainer.nproc=N")
    hydra_only = {"--info", "-i", "--hydra-help", "--shell-completion", "-sc", "--version"} & set(flags)
    try:
        if not hydra_only:
            precheck(overrides, multirun, app.schema)
    except RlftError as e:  # a ConfigError: composing is all precheck does
        return fail(str(e), e.exit_code)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if launched() and not hydra_only:
        overrides = _rank_overrides(overrides)
    JobState.failed_jobs = 0
    JobState.flags = flags
    saved_argv = sys.argv
    sys.argv = ["rlft", *flags, *overrides]  # Hydra's completion script registers for argv[0]
    try:
        _hydra_main(app)
    except SystemExit as e:  # a single run's one-line error, or Hydra's own exit
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:  # Ctrl-C in a sweep: the running job saved its step; later jobs never started
        return fail(f"sweep interrupted; resume a job with: rlft {app.command} <its overrides> hydra.run.dir=SWEEP_DIR/N "
                    "trainer.resume=auto", 130)
    finally:
        sys.argv = saved_argv
    return 1 if JobState.failed_jobs else 0


def _rank_overrides(overrides: list[str]) -> list[str]:
    """Under torchrun: join the process group now, so that the ranks can agree on rank 0's run
    directory (``${now:}`` in ``hydra.run.dir`` resolves on each rank at its own second); the other
    ranks give Hydra a scratch directory and write no ``.hydra`` of their own."""
    from rlft.parallel.distributed import from_environment  # torch

    if from_environment().main:
        return overrides
    scratch = tempfile.mkdtemp(prefix="rlft-rank-")
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    return [*without(overrides, "hydra.run.dir", "hydra.output_subdir"), f"hydra.run.dir={scratch}",
            "hydra.output_subdir=null"]


def _hydra_main(app: App) -> None:
    register_schema(app.schema)
    hydra.main(config_path=str(conf_dir()), config_name=app.schema.config_name, version_base=None)(app.task)()


def task(raw: Any) -> float:
    """One job: train on the composed config in Hydra's output directory (other libraries' output
    goes to its train.log: :mod:`rlft.output.console`).

    Returns:
        The final ``eval/accuracy`` (NaN when the job failed or ran no evaluation), for sweepers
        such as Optuna to optimise.
    """
    return run_task(raw, TRAIN_APP)


def run_task(raw: Any, app: App) -> float:
    """One job of ``app`` in Hydra's output directory (other libraries' output goes to its train.log:
    :mod:`rlft.output.console`); returns what ``app.job`` returns (NaN when the job failed)."""
    import transformers  # seconds to import, as torch below: only a job needs them

    import rlft.training.loop  # noqa: F401  (torch's loggers exist before run_log routes them)
    from rlft.parallel.distributed import from_environment  # torch

    transformers.utils.logging.get_logger("transformers")  # its library logger takes its console handler now

    hc = HydraConfig.get()
    dp = from_environment()
    run_dir = Path(dp.broadcast(hc.runtime.output_dir))
    verbose = bool(OmegaConf.select(raw, "logger.verbose", default=False))
    fns = OmegaConf.select(raw, "reward.fns", default=None)
    fns = [str(f) for f in fns] if isinstance(fns, (list, tuple)) or OmegaConf.is_list(fns) else []
    with run_log(run_dir / "train.log", verbose, dp.rank if dp.active else None, fns):
        return _job(raw, hc.mode == RunMode.MULTIRUN, dp, run_dir, app)


def _train_job(raw: Any, run_dir: Path, in_sweep: bool, status: dict[str, Any], t0: float) -> float:
    """``rlft train``'s :attr:`App.job`: this process's ranks, or trainer.nproc ranks through the launcher."""
    from rlft.parallel.distributed import launched  # torch

    cfg = to_config(raw)
    if cfg.trainer.nproc > 1 and not launched():  # the launcher: it waits for its ranks, loads nothing
        run_elsewhere(OmegaConf.to_yaml(raw, resolve=True), cfg.trainer.nproc)
        return run_ranks(TRAIN_APP, cfg.trainer.nproc, run_dir, in_sweep, status, t0)
    from rlft.training.loop import train  # torch, transformers

    check_nproc(cfg.trainer.nproc)
    metrics = train(cfg, run_dir, OmegaConf.to_yaml(raw, resolve=True))
    return final_accuracy(metrics)


TRAIN_APP = App("train", TRAIN, task, _train_job)


def _job(raw: Any, in_sweep: bool, dp: Any, run_dir: Path, app: App) -> float:
    """:func:`run_task`'s job, with third-party output going to the run's train.log."""
    hc = HydraConfig.get()
    status: dict[str, Any] = {"overrides": list(hc.overrides.task), "status": "ok", "exit_code": 0,
                              "started": time.time()}
    t0 = time.perf_counter()
    try:
        result = app.job(raw, run_dir, in_sweep, status, t0)
        if status.pop(REPORTED, False):
            return result
    except RlftError as e:  # any of them: its one line, its class's exit code
        status.update(failed(e))
        result = math.nan
    except Exception as e:
        if not (dp.active and _peer_lost(e)):
            raise
        status.update(status="failed", exit_code=1, error=f"rank {dp.rank}: {_peer_lost(e)} ({_first_line(e)})")
        result = math.nan
    except KeyboardInterrupt as e:
        why = f" ({e})" if str(e) else ""  # the stop's deadline passed (rlft.state.failure.GracefulStop)
        status.update(status="interrupted", exit_code=130, **({"error": f"interrupted{why}"} if why else {}))
        if not dp.main:
            raise SystemExit(130) from None
        write_status(run_dir, status, t0)
        if in_sweep:
            raise  # Ctrl-C stops the whole sweep
        print(f"rlft: error: interrupted{why}; continue with: rlft {app.command} ... hydra.run.dir={run_dir} "
              "trainer.resume=auto", file=sys.stderr)
        raise SystemExit(130) from None
    if not dp.main:  # rank 0 writes the job's status; another rank only reports its own error
        if status["status"] != "ok":
            print(f"rlft: error: {status['error']}", file=sys.stderr)
            raise SystemExit(status["exit_code"])
        return result
    write_status(run_dir, status, t0)
    if status["status"] != "ok":
        where = f"job {hc.job.num} ({run_dir}) failed: " if in_sweep else ""
        print(f"rlft: error: {where}{status['error']}", file=sys.stderr)
        if not in_sweep:
            raise SystemExit(status["exit_code"])
    return result


def check_nproc(nproc: int) -> None:
    from rlft.parallel.distributed import launched  # torch

    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if launched() and nproc not in (1, local):
        raise ConfigError(f"trainer.nproc={nproc} but torchrun started {local} processes on this node; "
                          "leave trainer.nproc=1 under torchrun (its --nproc-per-node decides)")


def _peer_lost(e: BaseException) -> str:
    """What happened when a collective failed because another rank is gone (its error, kill -9, a lost
    node) or stopped answering (trainer.dist_timeout_s passed); '' for any other error."""
    import torch.distributed as dist  # (seconds)

    text = str(e)
    timeouts = ("Timed out waiting", "timed out in blocking wait", "Watchdog caught collective operation timeout")
    if isinstance(e, (RuntimeError, dist.DistError)) and any(s in text for s in timeouts):  # gloo, NCCL, NCCL
        return "another rank did not answer within trainer.dist_timeout_s (it died or hangs)"
    lost = isinstance(e, dist.DistError) or (isinstance(e, RuntimeError) and any(
        s in text for s in ("Connection closed by peer", "Connection reset by peer", "Broken pipe")))
    return "another rank stopped" if lost else ""


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def run_ranks(app: App, nproc: int, run_dir: Path, in_sweep: bool, status: dict[str, Any], t0: float) -> float:
    """``trainer.nproc=N``: this job's N ranks through torch's launcher (rlft.parallel.launch); rank 0 writes job.json."""
    status[REPORTED] = True  # the launcher's rank 0 (or the lines below) writes job.json
    overrides = list(HydraConfig.get().overrides.task)
    code, result = launch(nproc, rank_args(overrides, JobState.flags, run_dir, app.command), run_dir, app.result)
    if not rank_status(run_dir):
        status.update(status="ok" if code == 0 else "failed", exit_code=code,
                      error="" if code == 0 else f"a rank exited with code {code}")
        write_status(run_dir, status, t0)
    if code == 0:
        return result
    if code in (130, 143) and in_sweep:  # Ctrl-C / SIGTERM stops the whole sweep, as without trainer.nproc
        raise KeyboardInterrupt
    if in_sweep:  # the sweep summary counts it from job.json
        return math.nan
    raise SystemExit(code)
