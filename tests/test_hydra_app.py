"""`rlft train` as a Hydra application: launchers, sweepers, callbacks, presets, help and errors."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import yaml

from rlft.output.tracking import read_metrics
from tests.support import ALGO_PRESETS, ROOT, TINY, run_cli

EVEN = ["reward.fns=[tests.helpers:answer_is_even]", "reward.weights=[1]"]  # accuracy = share of even answers


def _one_line(proc, code=2) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, proc.stderr[-3000:]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


def _jobs(root: Path) -> list[dict]:
    return [json.loads((d / "job.json").read_text()) for d in sorted(root.iterdir()) if (d / "job.json").is_file()]


# --- errors before any job runs


@pytest.mark.parametrize("args, expected", [
    (["-m", "algo=grpo,dapox"], "unknown algo 'dapox'; valid choices: " + ALGO_PRESETS),
    (["-m", "trainer.stepz=1,2"], "unknown config key 'trainer.stepz'"),
    (["-m", "trainer.steps=2,abc"], "job trainer.steps=abc: invalid value for 'trainer.steps'"),
    (["-m", "sampler.n=1,4", "algo=grpo"], "job sampler.n=1: sampler.n=1: group-relative advantages"),
    (["+experiment=nope"], "unknown experiment 'nope'; valid choices: dapo_30min, grpo_smoke"),
    (["hydra/launcher=joblib", "trainer.steps=x"], "invalid value for 'trainer.steps'"),
])
def test_config_errors_are_one_line_before_any_job(tmp_path, args, expected):
    r = run_cli(["train", *TINY, *args, f"hydra.sweep.dir={tmp_path}/sw", f"hydra.run.dir={tmp_path}/run"], ROOT)
    assert expected in _one_line(r)
    assert not (tmp_path / "sw").exists() and not (tmp_path / "run").exists()


def test_run_time_error_of_a_single_run_is_one_line(tmp_path):
    # Found only by the run (the data file is read when the task starts): one line, exit 2, and job.json says so.
    r = run_cli(["train", *TINY, "data=jsonl", f"data.path={tmp_path}/missing.jsonl", f"hydra.run.dir={tmp_path}/run"],
                ROOT)
    assert "missing.jsonl" in _one_line(r)
    status = json.loads((tmp_path / "run" / "job.json").read_text())
    assert status["status"] == "failed" and status["exit_code"] == 2 and "missing.jsonl" in status["error"]


# --- help, presets, Hydra's own flags


def test_help_lists_groups_sections_and_field_docs():
    r = run_cli(["train", "--help"], ROOT)
    assert r.returncode == 0 and "+experiment dapo_30min, grpo_smoke" in r.stdout and "hydra/launcher" in r.stdout
    algo = run_cli(["train", "--help", "algo"], ROOT).stdout
    dapo = algo.index("[DAPO: dynamic sampling and overlong handling]")
    assert algo.index("algo.dynamic_sampling = False") > dapo
    assert "Stop the remaining epochs on a rollout" in algo  # a field docstring
    trainer = run_cli(["train", "--help", "trainer"], ROOT).stdout
    assert "trainer.device = 'auto'" in trainer and "cuda when" in trainer


def test_help_shows_the_values_of_the_composed_config():
    """The values shown are those of the composed config (presets and overrides applied), not the schema's."""
    grpo = run_cli(["train", "--help", "algo"], ROOT)
    assert grpo.returncode == 0 and "algo.num_mini_batches = 2\n" in grpo.stdout and "algo.beta = 0.04\n" in grpo.stdout
    dapo = run_cli(["train", "algo=dapo", "algo.clip_eps_high=0.3", "--help", "algo"], ROOT)
    assert dapo.returncode == 0, dapo.stderr
    for line in ("algo.name = 'dapo'", "algo.beta = 0.0", "algo.dynamic_sampling = True", "algo.clip_eps_high = 0.3",
                 "values: those of `rlft train algo=dapo algo.clip_eps_high=0.3`"):
        assert line + "\n" in dapo.stdout, line
    sweep = run_cli(["train", "-m", "trainer.steps=7,9", "--help", "trainer"], ROOT)
    assert sweep.returncode == 0 and "trainer.steps = 7\n" in sweep.stdout  # a sweep: its first job


@pytest.mark.parametrize("args, expected", [
    (["--help", "nosection"], "rlft train --help: no section 'nosection'; valid: algo, model, sampler"),
    (["algo.bta=1", "--help", "algo"], "unknown config key 'algo.bta'"),
])
def test_help_with_bad_arguments_is_one_line_exit_2(args, expected):
    assert expected in _one_line(run_cli(["train", *args], ROOT))


def test_every_algo_field_belongs_to_one_section():
    import dataclasses

    from rlft.config import ALGO_SECTIONS
    from rlft.config.schemas.algo import AlgoConfig

    listed = [k for _, keys in ALGO_SECTIONS for k in keys]
    assert len(listed) == len(set(listed))
    assert set(listed) == {f.name for f in dataclasses.fields(AlgoConfig)} - {"name"}


def test_experiment_presets_compose():
    from rlft.config import compose

    cfg, _, _ = compose(["+experiment=dapo_30min"])
    assert (cfg.algo.name, cfg.trainer.max_minutes, cfg.trainer.save_every, cfg.model.name) == ("dapo", 30, 20,
                                                                                                 "smollm2_135m")
    assert cfg.algo.dynamic_sampling and cfg.algo.clip_eps_high == 0.28
    cfg, _, _ = compose(["+experiment=grpo_smoke", "trainer.steps=7"])  # later overrides win
    assert (cfg.model.source, cfg.sampler.name, cfg.trainer.steps) == ("tiny", "hf", 7)


def test_hydra_flags_work(tmp_path):
    r = run_cli(["train", *TINY, "--cfg", "job", "--resolve"], ROOT)
    assert r.returncode == 0 and "source: tiny" in r.stdout and "steps: 2" in r.stdout
    info = run_cli(["train", "--info", "searchpath"], ROOT)
    assert info.returncode == 0 and "conf" in info.stdout and "Config search path" in info.stdout


# --- launchers and sweepers (slow: real jobs)


@pytest.mark.slow
def test_joblib_launcher_runs_jobs_concurrently(tmp_path):
    root = tmp_path / "sw"
    r = run_cli(["train", "-m", *TINY, "seed=0,1", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                 f"hydra.sweep.dir={root}"], ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = _jobs(root)
    assert a["status"] == b["status"] == "ok"
    assert a["started"] < b["ended"] and b["started"] < a["ended"], "the two jobs' wall-clock intervals overlap"
    assert [row["status"] for row in csv.DictReader((root / "summary.csv").open())] == ["ok", "ok"]


@pytest.mark.slow
def test_submitit_local_launcher(tmp_path):
    root = tmp_path / "sw"
    r = run_cli(["train", "-m", *TINY, "seed=0,1", "hydra/launcher=submitit_local", f"hydra.sweep.dir={root}"], ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    for job in ("0", "1"):  # docs/guide/sweeps-and-scale.md#sweeps-hydras-multirun-launchers-and-sweepers: each job in SWEEP_DIR/N, submitit's own logs in SWEEP_DIR/.submitit
        assert (root / job / "checkpoints" / "step_000002").is_dir()
        assert [m["step"] for m in read_metrics(root / job / "metrics.jsonl")] == [0, 1, 2]
    assert any((root / ".submitit").rglob("*_log.out"))
    assert len(list(csv.DictReader((root / "summary.csv").open()))) == 2


@pytest.mark.slow
def test_optuna_sweeper_optimises_the_returned_accuracy(tmp_path):
    root = tmp_path / "sw"
    r = run_cli(["train", "-m", *TINY, *EVEN, "hydra/sweeper=optuna", "hydra.sweeper.n_trials=3",
                 "hydra.sweeper.direction=maximize", "optim.lr=interval(1e-4,1e-2)", f"hydra.sweep.dir={root}"], ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    result = yaml.safe_load((root / "optimization_results.yaml").read_text())
    jobs = sorted(d for d in root.iterdir() if (d / "job.json").is_file())
    assert len(jobs) == 3
    accuracy = [read_metrics(d / "metrics.jsonl")[-1]["eval/accuracy"] for d in jobs]
    lrs = [float(next(o for o in json.loads((d / "job.json").read_text())["overrides"]
                      if o.startswith("optim.lr=")).split("=")[1]) for d in jobs]
    assert all(1e-4 <= lr <= 1e-2 for lr in lrs) and len(set(lrs)) == 3
    assert 0 < result["best_value"] == max(accuracy) and not math.isnan(result["best_value"])
    assert result["best_params"]["optim.lr"] in lrs


@pytest.mark.slow
def test_resume_a_multirun_job_through_hydra(tmp_path):
    root = tmp_path / "sw"
    r = run_cli(["train", "-m", *TINY, "seed=0,1", f"hydra.sweep.dir={root}"], ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    job = root / "1"
    steps = [a for a in TINY if not a.startswith("trainer.steps")]
    r = run_cli(["train", *steps, "seed=1", "trainer.steps=3", "trainer.resume=auto", f"hydra.run.dir={job}"], ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [m["step"] for m in read_metrics(job / "metrics.jsonl")] == [0, 1, 2, 3]
    assert "resumed from" in (job / "train.log").read_text() and (job / "checkpoints" / "step_000003").is_dir()


def test_tab_completion_through_hydra():
    import os
    import subprocess
    import sys

    line = "rlft train algo="
    env = dict(os.environ, COMP_LINE=line, COMP_POINT=str(len(line)))
    r = subprocess.run([sys.executable, "-m", "rlft.cli", "-sc", "query=bash"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    want = sorted(f"algo={f.stem}" for f in (ROOT / "conf" / "algo").glob("*.yaml"))
    assert len(want) >= 10 and r.stdout.split() == want, r.stderr
    install = run_cli(["train", "-sc", "install=bash"], ROOT).stdout
    assert "-F hydra_bash_completion rlft" in install


def test_a_sweep_under_torchrun_is_refused_in_one_line(tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, WORLD_SIZE="2", RANK="0")
    r = subprocess.run([sys.executable, "-m", "rlft.cli", "train", "-m", *TINY, "seed=1,2",
                        f"hydra.sweep.dir={tmp_path}/sweep"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "trainer.nproc" in _one_line(r) and not (tmp_path / "sweep").exists()


def test_sweep_summary_console_keeps_bracketed_values(tmp_path, capsys, monkeypatch):
    """rich reads '[...]' as markup: list-valued overrides vanished from the job names on the console."""
    from omegaconf import OmegaConf

    from rlft.sweep import SweepSummary

    root = tmp_path / "sw"
    jobs = [("reward.fns=[math_correct]", "ok", 0), ("reward.fns=[my_pkg.rewards:raises]", "failed", 1)]
    for i, (override, status, code) in enumerate(jobs):
        (root / str(i) / ".hydra").mkdir(parents=True)
        (root / str(i) / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["seed=0", override]))
        (root / str(i) / "job.json").write_text(json.dumps({"status": status, "exit_code": code, "seconds": 1.0}))
    monkeypatch.setenv("COLUMNS", "200")
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(root)}}}))
    out = capsys.readouterr().out
    assert "reward.fns=[math_correct] " in out and "reward.fns=[my_pkg.rewards:raises] " in out, out
    assert [r["job"] for r in csv.DictReader((root / "summary.csv").open())] == [o for o, _, _ in jobs]
