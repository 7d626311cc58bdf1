"""model.dtype=auto: a GEMM probe picks the faster dtype on CPU; a resumed run keeps the checkpoint's."""

from __future__ import annotations

import re

import pytest

from rlft import checkpoint as ckpt
from rlft.models.precision import choose
from tests.support import ROOT, TINY, run_cli


def test_explicit_dtype_wins():
    assert choose("fp32", 576, 1536).dtype == "fp32"
    assert choose("bf16", 576, 1536).dtype == "bf16"


def test_auto_on_cpu_picks_the_faster_measured_dtype():
    p = choose("auto", 256, 512)
    bf16, fp32 = (float(x) for x in re.search(r"bf16 (\d+) GFLOP/s, fp32 (\d+) GFLOP/s", p.reason).groups())
    assert p.dtype == ("bf16" if bf16 >= fp32 else "fp32")
    assert "GEMM 512x256x512 on " in p.reason


@pytest.mark.slow  # CLI runs and a resume (~16 s)
def test_resume_trains_in_the_checkpoints_dtype(tmp_path):
    run = tmp_path / "run"
    args = ["train", *TINY, "model.dtype=auto", "trainer.steps=1", "data.num_eval=0", f"hydra.run.dir={run}"]
    r = run_cli(args, ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "model.dtype=auto: " in (run / "train.log").read_text()
    state_file = run / "checkpoints" / "step_000001" / ckpt.STATE
    chosen = re.search(r'"compute_dtype": "(\w+)"', state_file.read_text()).group(1)
    other = {"bf16": "fp32", "fp32": "bf16"}[chosen]
    # As if trained on a CPU where the other dtype was faster (same length: the manifest still holds).
    state_file.write_text(state_file.read_text().replace(f'"compute_dtype": "{chosen}"', f'"compute_dtype": "{other}"'))
    r = run_cli([*args[:-3], "trainer.steps=2", "data.num_eval=0", f"hydra.run.dir={run}", "trainer.resume=auto"],
                ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"model.dtype={other}, as in the checkpoint" in (run / "train.log").read_text()


def test_auto_with_an_unreadable_config_json_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text("")  # e.g. an interrupted download
    r = run_cli(["train", *[a for a in TINY if not a.startswith("model=")], "model=local", f"model.path={tmp_path}",
                 f"hydra.run.dir={tmp_path / 'run'}"], ROOT)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert f"model.path={tmp_path}" in r.stderr


@pytest.mark.slow  # CLI runs and resumes (~18 s)
def test_resume_accepts_auto_for_the_dtype_it_trained_in_and_refuses_another(tmp_path):
    run = tmp_path / "run"
    base = ["train", *TINY, "trainer.steps=1", "data.num_eval=0", f"hydra.run.dir={run}"]
    assert run_cli([*base, "model.dtype=bf16"], ROOT).returncode == 0
    r = run_cli([*base[:-1], "trainer.steps=2", "data.num_eval=0", f"hydra.run.dir={run}", "model.dtype=auto",
                 "trainer.resume=auto"], ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "model.dtype=bf16, as in the checkpoint" in (run / "train.log").read_text()
    r = run_cli([*base[:-1], "trainer.steps=3", "data.num_eval=0", f"hydra.run.dir={run}", "model.dtype=fp32",
                 "trainer.resume=auto"], ROOT)
    assert r.returncode == 2 and "model.dtype: bf16 -> fp32" in r.stderr
