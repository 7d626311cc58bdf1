"""model.dtype=auto: bf16 or fp32 by the CPU's flags and a one-thread GEMM probe, cached per CPU model, the same
pick whatever the load; a resumed run keeps the checkpoint's."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from rlft.models import precision
from rlft.models.precision import MARGIN, Probe, _decide, choose, cpu_info, cpu_model, native_bf16
from rlft.state import checkpoint as ckpt
from tests.support import ROOT, TINY, run_cli

SMOLLM2 = (576, 1536)  # hidden, intermediate
FIGURES = r"GEMM 512x576x1536 on 1 thread, best of (\d+): bf16 (\d+) GFLOP/s, fp32 (\d+) GFLOP/s"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """An empty measurement cache of this test's (as on CI), never the user's."""
    monkeypatch.setenv("RLFT_PRECISION_CACHE", str(tmp_path / "precision"))
    return tmp_path / "precision"


def test_explicit_dtype_wins():
    assert choose("fp32", 576, 1536).dtype == "fp32"
    assert choose("bf16", 576, 1536).dtype == "bf16"


def test_auto_on_cpu_measures_once_then_reuses_the_cached_measurement(cache, monkeypatch):
    first = choose("auto", *SMOLLM2)
    files = list(cache.glob("gemm-*.json"))
    assert len(files) == 1
    rounds, bf16, fp32 = (float(x) for x in re.search(FIGURES, first.reason).groups())
    native = native_bf16(cpu_info())
    assert first.dtype == _decide(Probe(bf16, fp32, int(rounds), (512, *SMOLLM2)), native)[0]
    assert first.reason.startswith(f"model.dtype=auto: {first.dtype} on {cpu_model()}, ")
    assert f"(measured now, saved to {files[0]}: GEMM 512x576x1536" in first.reason
    assert (f"native bf16 ({', '.join(native)}): bf16 unless 1.5x slower than fp32" if native
            else "no native bf16 flag: fp32 unless bf16 is 1.5x faster") in first.reason
    stored = json.loads(files[0].read_text())
    assert stored["pick"] == first.dtype and stored["key"]["cpu"] == cpu_model() and stored["key"]["shape"] == [512, 576, 1536]

    def no_probe(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(precision, "probe", no_probe)
    again = choose("auto", *SMOLLM2)
    assert again.dtype == first.dtype
    assert f"(cached measurement from {files[0]}, {stored['date']}: GEMM 512x576x1536" in again.reason
    assert re.search(FIGURES, again.reason).groups() == re.search(FIGURES, first.reason).groups()
    with pytest.raises(AssertionError, match="measured again"):  # another shape is another measurement
        choose("auto", 256, 512)


def test_the_figures_measured_now_are_those_the_cache_gives_back(cache, monkeypatch):
    """408.52 GFLOP/s was printed as 409 when measured and, stored as 408.5, as 408 from the cache (half to even:
    the test above failed now and then): the probe's figures are rounded once, to the cache's 0.1."""
    measured = Probe(408.52, 160.04, 7, (512, *SMOLLM2))
    monkeypatch.setattr(precision, "probe", lambda *a, **k: measured)
    first = choose("auto", *SMOLLM2)
    monkeypatch.setattr(precision, "probe", lambda *a, **k: pytest.fail("measured again"))
    again = choose("auto", *SMOLLM2)
    assert re.search(FIGURES, first.reason).groups() == re.search(FIGURES, again.reason).groups() == ("7", "408", "160")
    assert first.dtype == again.dtype


@pytest.mark.parametrize("content", [b"{", b"", b"[]", b'{"format": 1}', b"\xff\xfe", b"nan", b"null"])
def test_a_corrupt_cache_file_is_measured_over(cache, content):
    choose("auto", *SMOLLM2)
    (path,) = cache.glob("gemm-*.json")
    path.write_bytes(content)
    p = choose("auto", *SMOLLM2)
    assert "measured now, saved to" in p.reason
    assert json.loads(path.read_text())["pick"] == p.dtype


def test_a_cache_file_of_another_key_or_bad_figures_is_measured_over(cache):
    choose("auto", *SMOLLM2)
    (path,) = cache.glob("gemm-*.json")
    good = json.loads(path.read_text())
    for bad in ({**good, "key": {**good["key"], "torch": "0.0"}}, {**good, "bf16_gflops": float("nan")},
                {**good, "fp32_gflops": 0}, {**good, "format": 0}, {**good, "rounds": "x"}):
        path.write_text(json.dumps(bad))
        assert "measured now, saved to" in choose("auto", *SMOLLM2).reason


def test_an_unwritable_cache_is_measured_every_time_without_a_traceback(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("RLFT_PRECISION_CACHE", str(tmp_path / "file" / "precision"))
    p = choose("auto", *SMOLLM2)
    assert "measured now, not saved (" in p.reason and p.dtype in ("bf16", "fp32")


def test_the_cache_lives_under_rlft_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("RLFT_PRECISION_CACHE")
    monkeypatch.setenv("RLFT_CACHE", str(tmp_path / "c"))
    assert precision.cache_dir() == tmp_path / "c" / "precision"


XEON = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile

processor\t: 1
model name\t: Other
"""
GRAVITON3 = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd sve bf16 i8mm
CPU implementer\t: 0x41
CPU part\t: 0xd40
"""


def test_cpu_flags():
    xeon = cpu_info(XEON)
    assert cpu_model(xeon) == "Intel(R) Xeon(R) Processor" and native_bf16(xeon) == ["amx_bf16", "avx512_bf16"]
    arm = cpu_info(GRAVITON3)
    assert native_bf16(arm) == ["bf16"] and "implementer 0x41 part 0xd40" in cpu_model(arm)
    old_xeon = cpu_info("model name : Intel(R) Xeon(R) Processor\nflags : fpu avx2 avx512f avx512bw\n")
    assert native_bf16(old_xeon) == [] and native_bf16(cpu_info("")) == [] and cpu_model({})


@pytest.mark.parametrize(("native", "ratio", "pick"), [
    (["avx512_bf16"], 2.5, "bf16"),  # AMD EPYC (Zen 4)
    (["avx512_bf16"], 0.8, "bf16"),  # about as fast: the flags decide
    (["avx512_bf16"], 1 / MARGIN - 0.01, "fp32"),  # flags, but the kernels torch has are slow
    ([], 0.55, "fp32"),  # the Xeon without native bf16 (74 against 134 GFLOP/s)
    ([], 1.3, "fp32"),
    ([], MARGIN + 0.01, "bf16"),
])
def test_the_flags_decide_unless_the_probe_contradicts_them_by_the_margin(native, ratio, pick):
    assert _decide(Probe(100 * ratio, 100, 7, (512, 576, 1536)), native)[0] == pick


BUSY = ("import sys, torch\ntorch.set_num_threads(1)\na = torch.randn(1024, 1024)\na @ a\n"
        "print('ready', flush=True)\nwhile True:\n    a @ a\n")


def test_the_pick_beside_a_busy_gemm_loop_is_the_pick_alone(cache):
    """The issue: a busy other core turned bf16 400 / fp32 160 GFLOP/s into 113 / 161 and the run into fp32."""
    native = native_bf16(cpu_info())
    alone = precision.probe(*SMOLLM2)
    first = choose("auto", *SMOLLM2)  # alone: measured and cached
    busy = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout.readline().strip() == "ready"
        loaded = precision.probe(*SMOLLM2)
        again = choose("auto", *SMOLLM2)
    finally:
        busy.kill()
        busy.wait()
    assert "cached measurement from" in again.reason and again.dtype == first.dtype
    ratio = alone.bf16 / alone.fp32
    threshold = 1 / MARGIN if native else MARGIN
    if 1 / 1.25 < ratio / threshold < 1.25:  # an honest probe can land either side of the threshold
        pytest.skip(f"bf16/fp32 = {ratio:.2f} alone ({alone.text()}) is within noise of the threshold "
                    f"{threshold:.2f}: only the cache keeps the pick (asserted above)")
    assert _decide(loaded, native)[0] == _decide(alone, native)[0], (alone.text(), loaded.text())


@pytest.mark.slow  # CLI runs and a resume (~16 s)
def test_resume_trains_in_the_checkpoints_dtype(tmp_path):
    run = tmp_path / "run"
    args = ["train", *TINY, "model.dtype=auto", "trainer.steps=1", "data.num_eval=0", f"hydra.run.dir={run}"]
    r = run_cli(args, ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    log = (run / "train.log").read_text()
    assert re.search(r"learner on cpu \| model\.dtype=auto: (bf16|fp32) on .*\(measured now, saved to .*gemm-\w+\.json: "
                     r"GEMM 512x64x128 on 1 thread, best of \d+: bf16 \d+ GFLOP/s, fp32 \d+ GFLOP/s\)", log), log
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
